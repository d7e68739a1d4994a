"""Learners on polynomial features: one preconditioned kernel-GD step, block-coordinate descent, and
least squares on the monomials (Sun, Jadbabaie, Azizan 2025, Sec. 3.2 and 4.1).

All three fit f(x) = vᵀφ(x) to the context by the squared loss R(v) = (1/2n) Σ_i (vᵀφ(x_i) − y_i)² and
return +ŷ = f(x_q). Preconditioners are written in the GD direction: v ← v − A ∇R(v). The
transformer constructions use the paper's Γ, which reads A = −Γᵀ (:mod:`iclab.constructions.bilinear`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.tasks.polynomial import block_features, monomial_set, monomials, quadratic_features

FEATURES = ("quadratic", "linear")


def _xy(owner: str, episode: Episode) -> tuple[Tensor, Tensor]:
    if episode.y is None:
        raise ValueError(f"{owner} needs a regression episode (float labels y); got a classification episode")
    return episode.x, episode.y


def features(x: Tensor, kind: str) -> Tensor:
    """(..., d) -> (..., p): ``quadratic`` = x̄ of eq. (7) (p = C(d+2, 2)); ``linear`` = (1, x) (p = d + 1)."""
    if kind == "quadratic":
        return quadratic_features(x)
    if kind == "linear":
        return torch.cat([torch.ones_like(x[..., :1]), x], dim=-1)
    raise ValueError(f"features: kind must be one of {FEATURES}; got {kind!r}")


@dataclass(frozen=True)
class KernelGD:
    """One preconditioned GD step from v = 0 on polynomial features (Thm 2, Sec. 3.2):

        ŷ = φ(x_q)ᵀ A (1/n) Σ_i φ(x_i) y_i = (1/n) Σ_i κ(x_q, x_i) y_i,   κ(x, x') = φ(x)ᵀ A φ(x')

    ``preconditioner`` A is (p, p) with p the feature count (C(d+2, 2) for ``quadratic``). A = Λ⁻¹,
    Λ = E[φφᵀ], is the paper's choice (Γ = −Λ⁻¹).
    """

    preconditioner: Tensor
    kind: str = "quadratic"

    def __post_init__(self) -> None:
        require(self, "kind", self.kind in FEATURES, f"one of {FEATURES}")
        A = torch.as_tensor(self.preconditioner)
        require(self, "preconditioner", A.dim() == 2 and A.shape[0] == A.shape[1], "a (p, p) matrix", tuple(A.shape))

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the kernel-GD steps."""
        x, y = _xy("KernelGD", episode)
        phi, phq = features(x, self.kind), features(episode.x_query, self.kind)  # (B, n, p), (B, p)
        A = torch.as_tensor(self.preconditioner).to(x)
        require("KernelGD", "preconditioner", A.shape[0] == phi.shape[-1], f"({phi.shape[-1]}, {phi.shape[-1]}) for d = {episode.d} and kind = {self.kind!r}", tuple(A.shape))  # fmt: skip
        h = torch.einsum("bnp,bn->bp", phi, y) / episode.n  # (B, p): −∇R(0)
        return torch.einsum("bp,bp->b", phq, h @ A.T)


@dataclass(frozen=True)
class BlockCoordinateDescent:
    """L steps of preconditioned block-coordinate descent (eq. 9) with the blocks of Thm 6 / eq. (10):

        block ℓ = 1, 2, …: features φ_ℓ(x) = (1, x, x[ℓ%d]·x) ∈ R^{2d+1} (cyclic over the d variables)
        r_i ← y_i − f(x_i),  v_ℓ = A_ℓ (1/n) Σ_i φ_ℓ(x_i) r_i,  f ← f + v_ℓᵀ φ_ℓ

    ``preconditioners`` (L, 2d+1, 2d+1). The paper's W^{(ℓ)} of Thm 6 is −f (its label row holds the
    residual y + f_paper, its read-out ≈ −y_q). ``iterates`` returns f(x_q) after every step.
    """

    preconditioners: Tensor

    def __post_init__(self) -> None:
        A = torch.as_tensor(self.preconditioners)
        ok = A.dim() == 3 and A.shape[-1] == A.shape[-2] and A.shape[-1] % 2 == 1 and A.shape[-1] >= 3
        require(self, "preconditioners", ok, "an (L, 2d+1, 2d+1) tensor", tuple(A.shape))

    def iterates(self, episode: Episode) -> Tensor:
        """(L+1, B): f(x_q) after ℓ = 0, …, L block steps."""
        x, y = _xy("BlockCoordinateDescent", episode)
        A = torch.as_tensor(self.preconditioners).to(x)
        d = episode.d
        require("BlockCoordinateDescent", "preconditioners", A.shape[-1] == 2 * d + 1, f"(L, {2 * d + 1}, {2 * d + 1}) for d = {d}", tuple(A.shape))  # fmt: skip
        xs = torch.cat([x, episode.x_query.unsqueeze(1)], dim=1)  # (B, n+1, d)
        f = torch.zeros(xs.shape[:2], dtype=x.dtype, device=x.device)  # (B, n+1)
        out = [f[:, -1]]
        for ell in range(1, A.shape[0] + 1):
            phi = block_features(xs, ell)  # (B, n+1, 2d+1)
            r = y - f[:, :-1]  # (B, n)
            v = torch.einsum("bnp,bn->bp", phi[:, :-1], r) / episode.n @ A[ell - 1].T  # (B, 2d+1)
            f = f + torch.einsum("btp,bp->bt", phi, v)
            out.append(f[:, -1])
        return torch.stack(out)

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the block-coordinate-descent steps."""
        return self.iterates(episode)[-1]


@dataclass(frozen=True)
class FeatureLeastSquares:
    """Minimum-norm least squares on the raw monomials: v = Φ⁺y, ŷ = φ(x_q)ᵀv.

    With the task's own monomial set and w ~ N(0, I) (noiseless) this is the Bayes posterior mean
    E[y_q | context]: the minimum-ℓ2 interpolant is the posterior mean under an isotropic Gaussian
    prior. ``monomials``: ``"quadratic"``, ``"sparse_cubic"``, a degree or an (M, d) table
    (:func:`iclab.tasks.polynomial.monomial_set`); ``ridge`` > 0 adds λ‖v‖² (per-example scaling).
    """

    monomials: str | int | Tensor = "quadratic"
    ridge: float = 0.0

    def __post_init__(self) -> None:
        require(self, "ridge", self.ridge >= 0, "a float >= 0")

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) of least squares on the polynomial features."""
        x, y = _xy("FeatureLeastSquares", episode)
        a = monomial_set(episode.d, self.monomials, owner="FeatureLeastSquares")
        phi, phq = monomials(x, a), monomials(episode.x_query, a)  # (B, n, M), (B, M)
        if self.ridge > 0:
            M = phi.shape[-1]
            gram = phi.transpose(1, 2) @ phi / episode.n + self.ridge * torch.eye(M, dtype=x.dtype, device=x.device)
            v = torch.linalg.solve(gram, torch.einsum("bnm,bn->bm", phi, y) / episode.n)
        else:
            v = (torch.linalg.pinv(phi) @ y.unsqueeze(-1)).squeeze(-1)  # (B, M)
        return torch.einsum("bm,bm->b", phq, v)
