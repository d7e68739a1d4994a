"""Gradient-descent learners on the in-context least-squares loss.

R(w) = (1/2n) Σ_i (⟨w, x_i⟩ − y_i)²,  ∇R(w) = Σ̂ w − (1/n) Xᵀy,  Σ̂ = XᵀX/n  (Ahn et al. 2023, eq. 9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, require
from iclab.core.numerics import as_vector


def _regression(owner: str, episode: Episode) -> tuple[Tensor, Tensor]:
    if episode.y is None:
        raise ValueError(f"{owner} needs a regression episode (float labels y); got a classification episode")
    return episode.x, episode.y


@dataclass(frozen=True)
class PGD:
    """L steps of preconditioned GD from w_0 = 0: w_{ℓ+1} = w_ℓ − Γ_ℓ ∇R(w_ℓ) (eq. 9).

    ``preconditioners`` is (L, d, d), or (L, B, d, d) for one preconditioner per prompt.
    Prediction ⟨w_L, x_q⟩. Lemma 1: the eq.-(8) transformer with A_ℓ = Γ_ℓᵀ computes exactly this.
    """

    preconditioners: Tensor

    def __post_init__(self) -> None:
        p = self.preconditioners
        require(
            self,
            "preconditioners",
            p.dim() in (3, 4) and p.shape[-1] == p.shape[-2],
            "an (L, d, d) or (L, B, d, d) tensor",
            tuple(p.shape),
        )

    def weights(self, episode: Episode) -> Tensor:
        """The iterates w_0 … w_L, (L+1, B, d)."""
        x, y = _regression("PGD", episode)
        require(
            "PGD",
            "preconditioners",
            self.preconditioners.shape[-1] == episode.d,
            f"(…, {episode.d}, {episode.d}) to match the episode's d",
            tuple(self.preconditioners.shape),
        )
        p = self.preconditioners
        if p.dim() == 4 and p.shape[1] != episode.batch_size:
            raise ShapeError(
                f"PGD.preconditioners has one preconditioner per prompt for a batch of {p.shape[1]}; got an episode with batch {episode.batch_size}"
            )
        n = episode.n
        gram = x.transpose(1, 2) @ x / n  # (B, d, d) Σ̂
        xty = torch.einsum("bnd,bn->bd", x, y) / n  # (B, d)
        w = torch.zeros_like(xty)
        ws = [w]
        for gamma in self.preconditioners.to(x):
            grad = torch.einsum("bij,bj->bi", gram, w) - xty  # (B, d) ∇R(w)
            w = w - (grad @ gamma.transpose(-1, -2) if gamma.dim() == 2 else torch.einsum("bij,bj->bi", gamma, grad))
            ws.append(w)
        return torch.stack(ws)

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the preconditioned GD steps from w = 0."""
        return torch.einsum("bd,bd->b", self.weights(episode)[-1], episode.x_query)


def pgd(preconditioner: Tensor, step_sizes: Tensor | list[float]) -> PGD:
    """PGD with one fixed preconditioner Γ and per-step scalars: Γ_ℓ = η_ℓ Γ."""
    steps = as_vector("pgd", "step_sizes", step_sizes)
    return PGD(preconditioners=steps.to(preconditioner)[:, None, None] * preconditioner)


def gd(step_sizes: Tensor | list[float], d: int) -> PGD:
    """Plain GD is PGD with scalar preconditioners Γ_ℓ = η_ℓ I (Ahn et al. 2023, Lemma 1, eq. 9)."""
    steps = as_vector("gd", "step_sizes", step_sizes)
    return pgd(torch.eye(d, dtype=steps.dtype), steps)


@dataclass(frozen=True)
class GDPlusPlus:
    """Preconditioned GD with a covariate transform per step (Ahn et al. 2023, Sec. 5, Thm 4; GD++).

    At step ℓ, with the current features X_ℓ (context and query) and Σ̂_ℓ = X_ℓᵀX_ℓ/n:

        r_j ← r_j − (η_ℓ/n) Σ_i r_i x_iᵀ Γ x_j     (context residuals, r_0 = y)
        ŷ   ← ŷ   + (η_ℓ/n) Σ_i r_i x_iᵀ Γ x_q     (ŷ_0 = 0)
        x   ← (I − γ_ℓ Σ̂_ℓ Γ) x                    (every token, query included)

    It is the forward pass of the eq.-(11) transformer with A_ℓ = −η_ℓ Γ and B_ℓ = (γ_ℓ/η_ℓ) I
    (Ahn et al. 2023, §5); with γ ≡ 0 it is PGD with preconditioners η_ℓ Γᵀ; Γ = I gives the GD++ of von
    Oswald et al. 2023 up to step sizes. ``preconditioner`` defaults to I.
    """

    step_sizes: Tensor  # (L,) η_ℓ
    transforms: Tensor  # (L,) γ_ℓ
    preconditioner: Tensor | None = None  # (d, d) Γ

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_sizes", as_vector("GDPlusPlus", "step_sizes", self.step_sizes))
        object.__setattr__(self, "transforms", as_vector("GDPlusPlus", "transforms", self.transforms))
        require(
            self,
            "transforms",
            self.transforms.shape == self.step_sizes.shape,
            f"shape {tuple(self.step_sizes.shape)} like step_sizes",
            tuple(self.transforms.shape),
        )

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the GD++ steps."""
        x, r = _regression("GDPlusPlus", episode)
        n, d = episode.n, episode.d
        gamma = (
            torch.eye(d, dtype=x.dtype, device=x.device) if self.preconditioner is None else self.preconditioner.to(x)
        )
        feats = torch.cat([x, episode.x_query.unsqueeze(1)], dim=1)  # (B, n+1, d)
        y_hat = torch.zeros_like(r[:, 0])
        for eta, g in zip(self.step_sizes.to(x), self.transforms.to(x), strict=True):
            ctx = feats[:, :n]  # (B, n, d)
            k = ctx @ gamma @ feats.transpose(1, 2) / n  # (B, n, n+1): x_iᵀ Γ x_j / n
            upd = eta * torch.einsum("bi,bij->bj", r, k)  # (B, n+1)
            r, y_hat = r - upd[:, :n], y_hat + upd[:, n]
            gram = ctx.transpose(1, 2) @ ctx / n  # (B, d, d) Σ̂_ℓ
            feats = feats - g * feats @ (gram @ gamma).transpose(1, 2)
        return y_hat
