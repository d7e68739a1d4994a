"""In-context principal component regression (Zhang, Singh, Latham, Saxe 2025, Sec. 4, eq. 22).

An ATTN_S model on the saddle M_m (m eigenvectors of Λ learned) predicts

    ŷ_q = βᵀ Σ_{d≤m} λ_d⁻¹ (1 + (1 + tr Λ/λ_d)/N)⁻¹ e_d e_dᵀ x_q,     β = (1/N) Σ_n y_n x_n      (22)

which as N → ∞ is wᵀ Σ_{d≤m} e_d e_dᵀ x_q: regression on the top-m principal components. m = D is
the algorithm at the global minimum, βᵀ(Λ + (Λ + tr Λ I)/N)⁻¹ x_q (eq. 11). Three variants:

* ``"fixed_point"``     eq. (22) exactly: the function of every model on M_m (population λ_d, e_d and
                        the finite-N shrinkage; ``inv_n`` = E(1/N), default 1/n of the episode).
* ``"population_pcs"``  least squares on the scores of the top-m population PCs:
                        ŵ = E_m (E_mᵀ Λ̂ E_m)⁺ E_mᵀ β with Λ̂ = (1/N) Σ_n x_n x_nᵀ (eq. 27).
* ``"sample_pcs"``      classical PCR without an oracle: the PCs are the top-m eigenvectors of the
                        in-context Λ̂, ŵ = Σ_{j≤m} μ_j⁻¹ u_j u_jᵀ β (μ_j > 0); m = D is least squares.

All three agree as N → ∞. The first two read Λ from ``covariance`` or, if None, from the
episode's oracle entry ``task['Sigma']``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int

Variant = Literal["fixed_point", "population_pcs", "sample_pcs"]
VARIANTS = ("fixed_point", "population_pcs", "sample_pcs")


def _top_eigvecs(S: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Top-m eigenvalues and eigenvectors (columns) of symmetric (..., d, d) matrices, descending."""
    mu, V = torch.linalg.eigh(S)
    return mu.flip(-1)[..., :m], V.flip(-1)[..., :m]


@dataclass(frozen=True)
class PCR:
    """In-context principal component regression with ``n_components`` = m PCs (eq. 22); see the module doc."""

    n_components: int
    variant: Variant = "fixed_point"
    covariance: Tensor | None = None  # (d, d) Λ; None reads the episode's task['Sigma']
    inv_n: float | None = None  # E(1/N) of eq. (22)/(26); None: 1/n of the episode ("fixed_point" only)

    def __post_init__(self) -> None:
        require_int(self, "n_components", self.n_components, 0)
        require(self, "variant", self.variant in VARIANTS, f"one of {VARIANTS}")
        if self.inv_n is not None:
            require(self, "inv_n", 0.0 <= self.inv_n <= 1.0, "None or a float in [0, 1]")
        if self.covariance is not None:
            c = self.covariance
            require(
                self,
                "covariance",
                c.dim() == 2 and c.shape[0] == c.shape[1] and c.shape[0] >= self.n_components,
                f"a (d, d) matrix with d >= n_components = {self.n_components}",
                tuple(c.shape),
            )

    def _lambda(self, episode: Episode) -> Tensor:
        cov = self.covariance if self.covariance is not None else episode.task.get("Sigma")
        if cov is None:
            raise ValueError(f"PCR(variant={self.variant!r}) needs covariance, or an episode whose task has 'Sigma'")
        require(
            self,
            "covariance",
            tuple(cov.shape) == (episode.d, episode.d),
            f"one population covariance of shape ({episode.d}, {episode.d}) shared by the batch",
            tuple(cov.shape),
        )
        return cov.to(dtype=episode.dtype, device=episode.device)

    def matrix(self, episode: Episode) -> Tensor:
        """The effective matrix W with ŷ_q = βᵀ W x_q, (d, d) or (B, d, d) for ``"sample_pcs"``/``"population_pcs"``."""
        if episode.y is None:
            raise ValueError("PCR needs a regression episode (float labels y); got a classification episode")
        m, n = self.n_components, episode.n
        require(self, "n_components", m <= episode.d, f"an int <= d = {episode.d}")
        if self.variant == "sample_pcs":
            lam_hat = episode.x.mT @ episode.x / n  # (B, d, d) Λ̂, eq. (27)
            mu, V = _top_eigvecs(lam_hat, m)  # (B, m), (B, d, m)
            tol = mu[..., :1].abs() * episode.d * torch.finfo(episode.dtype).eps
            inv = torch.where(mu > tol, 1 / mu.clamp_min(torch.finfo(episode.dtype).tiny), torch.zeros_like(mu))
            return (V * inv[..., None, :]) @ V.mT
        Lambda = self._lambda(episode)
        lam, E = _top_eigvecs(Lambda, m)  # (m,), (d, m)
        if self.variant == "fixed_point":
            inv_n = 1.0 / n if self.inv_n is None else self.inv_n
            shrink = 1 + inv_n * (1 + torch.diagonal(Lambda).sum() / lam)  # (m,) a_d/λ_d²
            return (E / (lam * shrink)) @ E.mT
        lam_hat = episode.x.mT @ episode.x / n  # (B, d, d)
        core = torch.linalg.pinv(E.mT @ lam_hat @ E, hermitian=True)  # (B, m, m)
        return E @ core @ E.mT

    def predict(self, episode: Episode) -> Tensor:
        """The principal-component-regression prediction (B,) at the query."""
        W = self.matrix(episode)
        beta = torch.einsum("bnd,bn->bd", episode.x, episode.y) / episode.n  # (B, d), eq. (4)
        W = W.expand(episode.batch_size, *W.shape[-2:])  # (B, d, d)
        return torch.einsum("bi,bij,bj->b", beta, W, episode.x_query)
