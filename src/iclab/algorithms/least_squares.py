"""Closed-form regression learners: least squares, ridge, Bayes posterior mean."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require


def _xy(owner: str, episode: Episode) -> tuple[Tensor, Tensor]:
    if episode.y is None:
        raise ValueError(f"{owner} needs a regression episode (float labels y); got a classification episode")
    return episode.x, episode.y


@dataclass(frozen=True)
class LeastSquares:
    """Minimum-norm least squares w = X⁺y (the OLS baseline of Ahn et al. 2023, Fig. 6)."""

    def predict(self, episode: Episode) -> Tensor:
        """The least-squares prediction (B,) at the query."""
        x, y = _xy("LeastSquares", episode)
        w = torch.linalg.pinv(x) @ y.unsqueeze(-1)  # (B, d, 1)
        return (episode.x_query.unsqueeze(1) @ w).reshape(-1)


@dataclass(frozen=True)
class Ridge:
    """Ridge regression w = (XᵀX/n + λ I)⁻¹ Xᵀy/n (λ is per-example, as in the 1/n-scaled loss)."""

    lam: float

    def __post_init__(self) -> None:
        require(self, "lam", self.lam > 0, "a float > 0 (use LeastSquares for λ = 0)")

    def predict(self, episode: Episode) -> Tensor:
        """The ridge regression prediction (B,) at the query."""
        x, y = _xy("Ridge", episode)
        n, d = episode.n, episode.d
        gram = x.transpose(1, 2) @ x / n + self.lam * torch.eye(d, dtype=x.dtype, device=x.device)
        w = torch.linalg.solve(gram, torch.einsum("bnd,bn->bd", x, y) / n)
        return torch.einsum("bd,bd->b", w, episode.x_query)


@dataclass(frozen=True)
class BayesPosteriorMean:
    """E[⟨w, x_q⟩ | context] for w ~ N(0, Σ_w) and y = ⟨w, x⟩ + N(0, σ²): the Bayes-optimal predictor.

        w̄ = Σ_w Xᵀ (X Σ_w Xᵀ + σ² I_n)⁻¹ y          (kernel form, used when n ≤ d)
          = (XᵀX + σ² Σ_w⁻¹)⁻¹ Xᵀ y                  (primal form, used when n > d)

    With σ² = 0 and n ≥ d it equals least squares; with n < d it is the minimum Σ_w⁻¹-norm
    interpolant. ``prior_cov``/``noise_var`` default to the episode's oracle entries ``w_cov`` and
    ``noise_var`` (an oracle learner).
    """

    prior_cov: Tensor | None = None
    noise_var: float | None = None

    def predict(self, episode: Episode) -> Tensor:
        """The posterior-mean prediction (B,) at the query."""
        x, y = _xy("BayesPosteriorMean", episode)
        n, d = episode.n, episode.d
        sw = self.prior_cov if self.prior_cov is not None else episode.task.get("w_cov")
        if sw is None:
            raise ValueError("BayesPosteriorMean needs prior_cov, or an episode whose task has 'w_cov'")
        sw = sw.to(x)
        s2 = self.noise_var if self.noise_var is not None else float(episode.task.get("noise_var", torch.tensor(0.0)))
        if n <= d:
            k = x @ sw @ x.transpose(1, 2) + s2 * torch.eye(n, dtype=x.dtype, device=x.device)  # (B, n, n)
            alpha = torch.linalg.solve(k, y.unsqueeze(-1))  # (B, n, 1)
            w = sw @ x.transpose(1, 2) @ alpha  # (B, d, 1)
        else:
            a = x.transpose(1, 2) @ x + s2 * torch.linalg.inv(sw)  # (B, d, d)
            w = torch.linalg.solve(a, x.transpose(1, 2) @ y.unsqueeze(-1))
        return (episode.x_query.unsqueeze(1) @ w).reshape(-1)
