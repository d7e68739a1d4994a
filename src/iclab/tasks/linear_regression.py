"""In-context linear regression with Gaussian covariates (Ahn et al. 2023, Sec. 2 and Table 1).

x ~ N(0, Σ) with Σ = UᵀDU, w⋆ ~ N(0, I) or N(0, Σ⁻¹), y = ⟨w⋆, x⟩ (+ optional N(0, σ²) noise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.numerics import haar_orthogonal, is_psd, sym_inv_sqrt, sym_sqrt

WeightPrior = Literal["identity", "inverse_covariance"]
WEIGHT_PRIORS = ("identity", "inverse_covariance")

AHN2023_SPECTRUM = (1.0, 1.0, 0.25, 0.0625, 1.0)
"""The spectrum of Σ in every experiment of Ahn et al. 2023 (Sec. 4.3): D = diag(1, 1, 1/4, 1/16, 1)."""


def check_batch_n(owner: str, batch: int, n: int) -> None:
    """The shared check of every sampler's ``batch`` and ``n`` arguments."""
    require_int(owner, "batch", batch, 1)
    require_int(owner, "n", n, 1, note="number of context pairs")


def rotated_covariance(
    spectrum: Tensor | tuple[float, ...],
    *,
    generator: torch.Generator,
    rotation: Literal["haar", "svd-uniform", "none"] = "haar",
) -> Tensor:
    """Σ = UᵀDU with D = diag(spectrum) and U a random orthogonal matrix, in float64 on CPU.

    ``rotation='haar'`` draws U from the Haar measure; ``'svd-uniform'`` takes the left singular
    vectors of a Uniform[−1, 1] matrix as the authors' code does (not exactly Haar, see
    docs/errata.md); ``'none'`` gives Σ = D.
    """
    D = torch.as_tensor(spectrum, dtype=torch.float64)
    require(
        "rotated_covariance",
        "spectrum",
        D.dim() == 1 and D.numel() >= 1 and bool((D > 0).all()),
        "a non-empty vector of positive eigenvalues",
        spectrum,
    )
    d = D.numel()
    if rotation == "haar":
        U = (
            haar_orthogonal(d, generator=generator, device="cpu")
            if generator.device.type == "cpu"
            else haar_orthogonal(d, generator=generator).cpu()
        )
    elif rotation == "svd-uniform":
        a = torch.rand(d, d, generator=generator, dtype=torch.float64, device=generator.device).cpu() * 2 - 1
        U = torch.linalg.svd(a).U.T  # the paper's Σ = UᵀDU (Ahn et al. 2023, §4.3): its U is the code's Uᵀ
    elif rotation == "none":
        U = torch.eye(d, dtype=torch.float64)
    else:
        require("rotated_covariance", "rotation", False, "one of 'haar', 'svd-uniform', 'none'", rotation)
    return U.T @ torch.diag(D) @ U


@dataclass(frozen=True, kw_only=True)
class LinearRegression:
    """Episodes y = ⟨w⋆, x⟩ + ε with x ~ N(0, Σ), w⋆ ~ N(0, I) or N(0, Σ⁻¹), ε ~ N(0, noise_std²).

    ``covariance`` is a fixed (d, d) SPD matrix (default I). Use :meth:`random_rotation` for the
    paper's Σ = UᵀDU with a seeded random U. The episode's ``task`` dict holds ``w (B, d)``,
    ``Sigma (d, d)``, ``w_cov (d, d)`` and ``noise_var ()`` for oracle learners.
    """

    d: int = 5
    covariance: Tensor | None = None  # (d, d) float64; None means I
    weight_prior: WeightPrior = "identity"
    noise_std: float = 0.0
    _factors: dict[str, Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        require(self, "weight_prior", self.weight_prior in WEIGHT_PRIORS, f"one of {WEIGHT_PRIORS}")
        require(self, "noise_std", self.noise_std >= 0, "a float >= 0")
        cov = (
            torch.eye(self.d, dtype=torch.float64)
            if self.covariance is None
            else torch.as_tensor(self.covariance, dtype=torch.float64)
        )
        require(
            self, "covariance", tuple(cov.shape) == (self.d, self.d), f"a ({self.d}, {self.d}) matrix", tuple(cov.shape)
        )
        require(
            self,
            "covariance",
            bool(torch.allclose(cov, cov.T, atol=1e-12 * max(1.0, float(cov.abs().max())))),
            "a symmetric matrix",
            "a non-symmetric matrix",
        )
        require(
            self,
            "covariance",
            is_psd(cov, strict=True),
            "symmetric positive definite (all eigenvalues > 0)",
            f"eigenvalues {torch.linalg.eigvalsh((cov + cov.T) / 2).tolist()}",
        )
        object.__setattr__(self, "covariance", cov)
        self._factors["sqrt"] = sym_sqrt(cov)  # x = g Σ^{1/2}
        w_cov = (
            torch.linalg.inv(cov)
            if self.weight_prior == "inverse_covariance"
            else torch.eye(self.d, dtype=torch.float64)
        )
        self._factors["w_cov"] = w_cov
        self._factors["w_sqrt"] = sym_inv_sqrt(cov) if self.weight_prior == "inverse_covariance" else w_cov

    @classmethod
    def random_rotation(
        cls,
        spectrum: tuple[float, ...] | Tensor = AHN2023_SPECTRUM,
        *,
        generator: torch.Generator,
        rotation: Literal["haar", "svd-uniform", "none"] = "haar",
        weight_prior: WeightPrior = "inverse_covariance",
        noise_std: float = 0.0,
    ) -> LinearRegression:
        """The paper's problem: Σ = UᵀDU with U drawn from ``generator`` (Ahn et al. 2023, Sec. 4.3)."""
        cov = rotated_covariance(spectrum, generator=generator, rotation=rotation)
        return cls(d=cov.shape[0], covariance=cov, weight_prior=weight_prior, noise_std=noise_std)

    @property
    def Sigma(self) -> Tensor:
        """Covariance of x, (d, d) float64."""
        assert self.covariance is not None
        return self.covariance

    @property
    def w_cov(self) -> Tensor:
        """Prior covariance of w⋆, (d, d) float64."""
        return self._factors["w_cov"]

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        """``batch`` episodes with ``n`` context pairs on ``generator.device``."""
        check_batch_n(type(self).__name__, batch, n)
        dev = generator.device
        S = self._factors["sqrt"].to(dev, dtype)
        x_all = torch.randn(batch, n + 1, self.d, generator=generator, device=dev, dtype=dtype) @ S  # (B, n+1, d)
        w = torch.randn(batch, self.d, generator=generator, device=dev, dtype=dtype) @ self._factors["w_sqrt"].to(
            dev, dtype
        )  # (B, d)
        y_all = torch.einsum("btd,bd->bt", x_all, w)  # (B, n+1)
        if self.noise_std > 0:
            y_all = y_all + self.noise_std * torch.randn(batch, n + 1, generator=generator, device=dev, dtype=dtype)
        task = {
            "w": w,
            "Sigma": self.Sigma.to(dev, dtype),
            "w_cov": self.w_cov.to(dev, dtype),
            "noise_var": torch.tensor(self.noise_std**2, device=dev, dtype=dtype),
        }
        return Episode(
            x=x_all[:, :n], y=y_all[:, :n], x_query=x_all[:, n], y_query=y_all[:, n], task=task, batched=("w",)
        )

    def zero_predictor_loss(self) -> float:
        """E[y_q²] = tr(Σ Σ_w) + σ²: the loss of predicting 0 (of A = 0)."""
        return float(torch.trace(self.Sigma @ self.w_cov)) + self.noise_std**2
