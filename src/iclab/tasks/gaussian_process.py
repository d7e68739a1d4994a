"""In-context regression with Gaussian-process labels (Cheng, Chen, Sra 2024, Def. 3.3, Ex. 4-8).

Covariates x_i = Σ^{1/2} u_i with whitened points u_i, drawn

* ``sphere``    (default; App. H.1): u_i uniform on the unit sphere S^{d-1};
* ``gaussian``  (Ex. 4): u_i ~ N(0, I);
* ``clustered`` (Ex. 5; not iid): one centre μ_c ~ N(0, I) per cluster and prompt, each point in a
  uniformly drawn cluster c_i, u_i = μ_{c_i} + ξ_i with ξ_i ~ N(0, I) (``n_clusters = 1`` is Ex. 5).

Labels (y_1, …, y_n, y_{n+1}) ~ N(0, K₊(U)) jointly on all n + 1 points, where K(U)_{ij} = κ(u_i, u_j)
is the kernel on the *whitened* points (Ex. 7, the version the theory and the authors' code use; see
docs/errata.md) and K₊ = U|D|Uᵀ flips negative eigenvalues (Def. 3.3; needed for relu). No label
noise unless ``jitter`` > 0, which adds N(0, jitter) to every label (covariance K₊ + jitter·I).

Sampling is batched on the generator's device with no loop over prompts. The covariance factor is
the cheapest exact one: for the plain linear kernel y = ⟨θ, u⟩ with θ ~ N(0, I) (Ex. 6); for PSD
kernels a batched Cholesky (prompts where it fails fall back to eigh); otherwise one batched eigh of
the (B, n+1, n+1) Gram matrices, y = U|D|^{1/2} g.

:class:`TwoLayerReLUNetwork` is Ex. 8: y_i = ⟨θ₂, relu(θ₁ u_i)⟩ with θ₁ (m × d), θ₂ (m,) entrywise
N(0, 1); given X its label covariance over θ is m · arccos(u_i, u_j) (the first-order arc-cosine
kernel, :func:`iclab.core.kernels.gram`), but the labels are not Gaussian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.kernels import CompositeKernel, Kernel, KernelLike, as_kernel, uses_softmax
from iclab.core.numerics import is_psd, sym_inv_sqrt, sym_sqrt
from iclab.core.symabs import abs_sample, cholesky_sample
from iclab.tasks.linear_regression import check_batch_n, rotated_covariance

Covariates = Literal["sphere", "gaussian", "clustered"]
COVARIATES = ("sphere", "gaussian", "clustered")
Method = Literal["auto", "eigh"]
METHODS = ("auto", "eigh")

CHENG2024_SPECTRUM = (1.0, 1.0, 0.25, 2.25, 1.0)
"""The spectrum D of Σ = UᵀDU in every experiment of Cheng, Chen, Sra 2024 (App. H.1), d = 5."""
CODE_EXP_SIGMA = math.sqrt(2.0)
"""The authors' code's exp kernel is exp(⟨u, w⟩/2), i.e. σ = √2 here (the paper: σ = 1); docs/errata.md."""
LABEL_PART = 4096
"""Prompts per torch thread whose Gram matrices a draw without K₊ makes and factors at a time (16 MB at n = 30 in
float32): :meth:`GaussianProcess.sample`."""


def _covariance(owner: object, d: int, covariance: Tensor | None) -> Tensor:
    cov = torch.eye(d, dtype=torch.float64) if covariance is None else torch.as_tensor(covariance, dtype=torch.float64)
    require(owner, "covariance", tuple(cov.shape) == (d, d), f"a ({d}, {d}) matrix", tuple(cov.shape))
    require(
        owner,
        "covariance",
        is_psd(cov, strict=True),
        "symmetric positive definite",
        f"eigenvalues {torch.linalg.eigvalsh((cov + cov.T) / 2).tolist()}",
    )
    return cov


def _whitened_points(
    batch: int,
    n_points: int,
    d: int,
    covariates: str,
    n_clusters: int,
    generator: torch.Generator,
    dtype: torch.dtype,
) -> Tensor:
    """(B, n_points, d) whitened covariates u_i (module docstring)."""
    dev = generator.device
    g = torch.randn(batch, n_points, d, generator=generator, device=dev, dtype=dtype)
    if covariates == "sphere":
        norm: Tensor = g.norm(dim=-1, keepdim=True)  # Tensor.norm is unannotated
        return g / norm
    if covariates == "gaussian":
        return g
    centres = torch.randn(batch, n_clusters, d, generator=generator, device=dev, dtype=dtype)  # (B, C, d)
    which = torch.randint(n_clusters, (batch, n_points), generator=generator, device=dev)  # (B, n_points)
    return g + torch.gather(centres, 1, which.unsqueeze(-1).expand(-1, -1, d))


@dataclass(frozen=True, kw_only=True)
class GaussianProcess:
    """Episodes with labels ~ N(0, K₊) of a kernel on the whitened covariates (Cheng et al. Ex. 7).

    ``kernel`` is a name from :data:`iclab.core.kernels.KERNELS` (with ``sigma``), a
    :class:`~iclab.core.kernels.Kernel` or a :class:`~iclab.core.kernels.CompositeKernel` (Prop. D.1,
    Fig. 4); softmax is not a kernel and is refused. ``covariance`` Σ (d, d) SPD, default I; use
    :meth:`random_rotation` for the paper's Σ = UᵀDU. The episode's ``task`` holds ``Sigma (d, d)``,
    ``Sigma_inv_sqrt (d, d)`` (the whitening map, for FGD's Σ^{-1/2} form), and per prompt
    ``K_plus (B, n+1, n+1)``: the exact label covariance (query last) that the Bayes oracle
    :class:`iclab.algorithms.GaussianProcessPosterior` reads; for the plain linear kernel also
    ``w (B, d)`` with y = ⟨w, x⟩.
    """

    d: int = 5
    kernel: KernelLike = "exp"
    sigma: float = 1.0  # bandwidth when ``kernel`` is a name: exp(uᵀw/σ²); the authors' code: σ = √2
    covariance: Tensor | None = None  # (d, d) Σ; None means I
    covariates: Covariates = "sphere"
    n_clusters: int = 1  # ``clustered`` only
    jitter: float = 0.0  # label-noise variance added to K₊ (0: noiseless, as in the paper)
    method: Method = "auto"  # "eigh" forces the eigendecomposition factor for every kernel
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        kern = as_kernel(type(self).__name__, self.kernel, self.sigma)
        require(self, "kernel", not uses_softmax(kern), "a kernel (softmax is an attention score, not a kernel)")
        require(self, "covariates", self.covariates in COVARIATES, f"one of {COVARIATES}")
        require_int(self, "n_clusters", self.n_clusters, 1)
        require(self, "jitter", float(self.jitter) >= 0, "a float >= 0")
        require(self, "method", self.method in METHODS, f"one of {METHODS}")
        cov = _covariance(self, self.d, self.covariance)
        object.__setattr__(self, "covariance", cov)
        self._cache.update(kernel=kern, sqrt=sym_sqrt(cov), inv_sqrt=sym_inv_sqrt(cov))

    @classmethod
    def random_rotation(
        cls,
        spectrum: tuple[float, ...] | Tensor = CHENG2024_SPECTRUM,
        *,
        generator: torch.Generator,
        rotation: Literal["haar", "svd-uniform", "none"] = "haar",
        **kwargs: Any,
    ) -> GaussianProcess:
        """The paper's problem: Σ = UᵀDU, D = diag(1, 1, 0.25, 2.25, 1), U from ``generator`` (App. H.1)."""
        cov = rotated_covariance(spectrum, generator=generator, rotation=rotation)
        return cls(d=cov.shape[0], covariance=cov, **kwargs)

    @property
    def Sigma(self) -> Tensor:
        """Covariance Σ of the covariate map x = Σ^{1/2}u, (d, d) float64."""
        assert self.covariance is not None
        return self.covariance

    @property
    def kernel_fn(self) -> Kernel | CompositeKernel:
        """The label kernel as a callable (a name is turned into ``Kernel(name, sigma)``)."""
        kern: Kernel | CompositeKernel = self._cache["kernel"]
        return kern

    def _linear_weights(self) -> Kernel | None:
        k = self.kernel_fn
        if self.method == "auto" and isinstance(k, Kernel) and k.name == "linear" and float(k.weight) >= 0:
            return k
        return None

    def sample(
        self,
        batch: int,
        n: int,
        *,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
        with_K_plus: bool = True,
    ) -> Episode:
        """``batch`` episodes with ``n`` context pairs on ``generator.device``. ``with_K_plus`` False: the task holds no
        ``K_plus`` (the label covariance, read by the Bayes oracle and the theory, never by a training loss) and an
        indefinite kernel's draw does not form it (B · (n+1)² reals: 115 MB a batch of 30 000 at n = 30) and takes y
        alone from the QL kernel (:func:`iclab.core.symabs.abs_sample`, ≈ 2.7× the draw at n = 30): the same labels
        to rounding (the same bits where no eigendecomposition runs)."""
        check_batch_n(type(self).__name__, batch, n)
        dev = generator.device
        u = _whitened_points(batch, n + 1, self.d, self.covariates, self.n_clusters, generator, dtype)  # (B, n+1, d)
        x = u @ self._cache["sqrt"].to(dev, dtype)  # (B, n+1, d) rows x_i = Σ^{1/2} u_i
        kern = self.kernel_fn
        task: dict[str, Tensor] = {}
        lin = self._linear_weights()
        if lin is not None:  # Ex. 6: y = √α ⟨θ, G u⟩, θ ~ N(0, I), covariance α uᵀGᵀG u = K exactly
            mapped = lin.map(u)  # (B, n+1, d')
            theta = torch.randn(batch, mapped.shape[-1], generator=generator, device=dev, dtype=dtype)
            y = math.sqrt(float(lin.weight)) * torch.einsum("btd,bd->bt", mapped, theta)  # (B, n+1)
            K_plus: Tensor | None = kern(u, u) if with_K_plus else None  # (B, n+1, n+1)
            if lin.transform is None:
                task["w"] = math.sqrt(float(lin.weight)) * theta @ self._cache["inv_sqrt"].to(dev, dtype)
        else:
            g = torch.randn(batch, n + 1, generator=generator, device=dev, dtype=dtype)  # (B, n+1)
            y, K_plus = self._labels(u, g, with_K_plus)
        if self.jitter > 0:
            y = y + math.sqrt(self.jitter) * torch.randn(batch, n + 1, generator=generator, device=dev, dtype=dtype)
        task.update(Sigma=self.Sigma.to(dev, dtype), Sigma_inv_sqrt=self._cache["inv_sqrt"].to(dev, dtype))
        if with_K_plus:
            assert K_plus is not None  # _factor_sample forms it when asked
            task["K_plus"] = (
                K_plus + self.jitter * torch.eye(n + 1, dtype=dtype, device=dev) if self.jitter > 0 else K_plus
            )
        batched = tuple(k for k in ("K_plus", "w") if k in task)
        return Episode(x=x[:, :n], y=y[:, :n], x_query=x[:, n], y_query=y[:, n], task=task, batched=batched)

    def _labels(self, u: Tensor, g: Tensor, with_K_plus: bool) -> tuple[Tensor, Tensor | None]:
        """y = K₊^{1/2} g for the Gram matrices K = κ(u, u), and K₊ (None unless ``with_K_plus``). Without K₊ the
        batch goes in parts of :data:`LABEL_PART` prompts per torch thread, each part's K made and factored before the
        next: the same numbers (every prompt's K and y are its own), without a (B, n+1, n+1) tensor per operation
        (115 MB each at 30 000 prompts of n = 30, float32, most of whose time on a CPU is the first touch of fresh
        pages)."""
        kern, psd = self.kernel_fn, self.kernel_fn.is_psd and self.method == "auto"
        part = LABEL_PART * max(1, torch.get_num_threads())
        if with_K_plus or u.shape[0] <= part:
            return self._factor_sample(kern(u, u), g, psd=psd, with_abs=with_K_plus)
        ys = [
            self._factor_sample(kern(u[s : s + part], u[s : s + part]), g[s : s + part], psd=psd, with_abs=False)[0]
            for s in range(0, u.shape[0], part)
        ]
        return torch.cat(ys), None

    @staticmethod
    def _factor_sample(K: Tensor, g: Tensor, *, psd: bool, with_abs: bool = True) -> tuple[Tensor, Tensor | None]:
        """y = F g with F Fᵀ = K₊, and K₊ itself (None unless ``with_abs``): Cholesky where it succeeds (PSD kernels;
        on a CPU the C kernel of :func:`iclab.core.symabs.cholesky_sample`), else eigh."""
        if psd:
            y, bad = cholesky_sample(K, g)
            if not bool(bad.any()):
                return y, K
            y_bad, K_bad = GaussianProcess._eigh_sample(K[bad], g[bad])  # the rare K not numerically positive definite
            assert K_bad is not None  # formed by default
            y, K = y.clone(), K.clone()
            y[bad], K[bad] = y_bad, K_bad
            return y, K
        return GaussianProcess._eigh_sample(K, g, with_abs=with_abs)

    @staticmethod
    def _eigh_sample(K: Tensor, g: Tensor, *, with_abs: bool = True) -> tuple[Tensor, Tensor | None]:
        """y = |K|^{1/2} g = U|D|^{1/2}Uᵀ g and K₊ = U|D|Uᵀ from K = UDUᵀ (:func:`iclab.core.symabs.abs_sample`).
        The spectrum is needed (K₊ flips the negative eigenvalues; every relu Gram matrix of the paper's set-up is
        indefinite, so no Cholesky shortcut applies). The symmetric square root makes y the same whichever
        eigenvectors a solver returns; on a CPU the batched Jacobi kernel runs (2-5x torch's eigh in float32 at
        n = 30 / 14), elsewhere torch's eigh split over torch's threads."""
        return abs_sample(K, g, with_abs=with_abs)


@dataclass(frozen=True, kw_only=True)
class TwoLayerReLUNetwork:
    """Episodes y_i = ⟨θ₂, relu(θ₁ u_i)⟩ of a random two-layer ReLU network (Cheng et al. Ex. 8).

    θ₁ ∈ R^{m×d} (the paper prints d×m, a typo) and θ₂ ∈ R^m have iid N(0, 1) entries, one draw per
    prompt, on the whitened covariates u_i = Σ^{-1/2} x_i (so Asm. 4.2 holds). Given X the labels
    have mean 0 and covariance m · arccos(u_i, u_j) over θ (:attr:`label_kernel`), but they are not
    Gaussian. ``task`` holds ``theta1 (B, m, d)``, ``theta2 (B, m)``, ``Sigma`` and ``Sigma_inv_sqrt``.
    """

    d: int = 5
    width: int = 100
    covariance: Tensor | None = None
    covariates: Covariates = "sphere"
    n_clusters: int = 1
    _cache: dict[str, Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        require_int(self, "width", self.width, 1, note="hidden width m")
        require(self, "covariates", self.covariates in COVARIATES, f"one of {COVARIATES}")
        require_int(self, "n_clusters", self.n_clusters, 1)
        cov = _covariance(self, self.d, self.covariance)
        object.__setattr__(self, "covariance", cov)
        self._cache.update(sqrt=sym_sqrt(cov), inv_sqrt=sym_inv_sqrt(cov))

    @property
    def label_kernel(self) -> Kernel:
        """E_θ[y_i y_j | X] = m · arccos(u_i, u_j) (derived for Ex. 8's ReLU network, m = width)."""
        return Kernel("arccos", weight=float(self.width))

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        """``batch`` episodes of ``n`` context pairs whose labels are a random two-layer ReLU network of the covariates."""
        check_batch_n(type(self).__name__, batch, n)
        dev = generator.device
        u = _whitened_points(batch, n + 1, self.d, self.covariates, self.n_clusters, generator, dtype)  # (B, n+1, d)
        x = u @ self._cache["sqrt"].to(dev, dtype)
        theta1 = torch.randn(batch, self.width, self.d, generator=generator, device=dev, dtype=dtype)  # (B, m, d)
        theta2 = torch.randn(batch, self.width, generator=generator, device=dev, dtype=dtype)  # (B, m)
        y = torch.einsum("btm,bm->bt", torch.relu(u @ theta1.transpose(1, 2)), theta2)  # (B, n+1)
        task = {
            "theta1": theta1,
            "theta2": theta2,
            "Sigma": cast(Tensor, self.covariance).to(dev, dtype),  # __post_init__ set it
            "Sigma_inv_sqrt": self._cache["inv_sqrt"].to(dev, dtype),
        }
        return Episode(
            x=x[:, :n], y=y[:, :n], x_query=x[:, n], y_query=y[:, n], task=task, batched=("theta1", "theta2")
        )
