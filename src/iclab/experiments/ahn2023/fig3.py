"""Ahn et al. 2023, Fig. 3-5 (Thm 4): an L = 3 linear transformer with pattern (11), P_i = [[B_i, 0], [0, 1]] and
Q_i = [[A_i, 0], [0, 0]], trained by L-BFGS on one fixed batch (Fig. 3c), learns GD++ with Σ⁻¹ preconditioning:
B_i → b_i I, A_i → a_i Σ⁻¹ (Thm 4's set S), ‖A_0‖ < ‖A_1‖ < ‖A_2‖ (App. D), and a loss far below pattern (8)'s.
Fig. 4: B_0, B_1; Fig. 5: Σ^½A_iΣ^½ at the end of run 0.

Run: ``iclab run ahn2023.fig3 --preset quick``

Claims:
- loss_far_below_sparse_optimum: mean final test loss ≤ tol.loss_hi (the (11) S-optimum ≈ 7e-4; pattern (8): 0.133)
- B_is_scaled_identity: max Dist(B_i, I), i < L − 1, ≤ tol.dist_tol
- rotated_A_is_scaled_identity: max Dist(Σ^½A_iΣ^½, I) ≤ tol.dist_tol
- step_norms_increase_with_depth: fraction of runs with ‖A_0‖ < ‖A_1‖ < ‖A_2‖ ≥ tol.increasing_lo
- projection_onto_S_does_not_hurt: replacing A_i by a_iΣ⁻¹ and B_i by b_iI raises the fresh-prompt loss by at
  most tol.projection_rtol

Time on 2 CPU cores: quick 9 s at 1 thread; paper 460-497 s (4/5 claims).

What did not match: at paper Dist(Σ^½A_0Σ^½, I) stops at 0.12-0.13 (> 0.1), and the projection onto S lowers the
fresh-prompt loss by 23-59%: what the model has outside S is fitted to its one fixed batch. The authors' code uses
n = 20 where the text says 10 (docs/papers/ahn2023.md, docs/errata.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from iclab.core.numerics import dist_to_identity, sym_sqrt
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.ahn2023._setup import (
    LBFGS,
    SMOKE,
    LinearSetup,
    SeedRun,
    layer_dist_panel,
    log_loss_panel,
    paper_train,
    rotated_heatmaps,
    seed_runs,
    sigma_conj,
)
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.plotting import band, heatmap, save, subplots
from iclab.tasks import LinearRegression
from iclab.theory import preconditioned_gd as th
from iclab.training import TrainConfig


@dataclass(frozen=True, kw_only=True)
class Fig3Tolerances:
    loss_hi: float = 2e-3  # "converging to 0": the S-optimum is ≈ 7e-4
    dist_tol: float = 0.1
    increasing_lo: float = 0.5  # fraction of runs whose step norms increase with depth
    projection_rtol: float = 0.02  # projecting onto S may not raise the fresh-prompt loss by more than this


def _lbfgs_notebook() -> TrainConfig:
    """The Fig. 3c text and the authors' L-BFGS notebook: 2000 iterations on one fixed batch, never resampled."""
    return paper_train(**LBFGS, steps=2000, train_size=20_000, snapshot_every=10, eval_every=10)


@dataclass(frozen=True, kw_only=True)
class Fig3Config(LinearSetup):
    seeds: int = 3
    train: TrainConfig = field(default_factory=_lbfgs_notebook)
    projection_samples: int = 200_000  # fresh prompts for the trained-vs-projected-onto-S comparison
    tol: Fig3Tolerances = field(default_factory=Fig3Tolerances)


@dataclass
class Fig3Results:
    runs: list[SeedRun]


def run(cfg: Fig3Config, ctx: RunContext) -> Fig3Results:
    return Fig3Results(runs=seed_runs(cfg, ctx, pattern="pattern11", weight_prior="inverse_covariance"))


def _B(r: SeedRun) -> Tensor:
    assert r.B is not None, "a pattern-(11) run snapshots B"
    return r.B


def plot(results: Fig3Results, cfg: Fig3Config, out: Path) -> list[Path]:
    runs, L = results.runs, cfg.n_layers
    x = runs[0].snap_steps.numpy()
    fig, axes = subplots(2, L)
    for i in range(L - 1):
        dist = torch.stack([dist_to_identity(_B(r)[:, i]) for r in runs])
        band(axes[0, i], x, dist, label=f"B_{i}", color="tab:blue")
        axes[0, i].set_ylim(0, 1.02)
        axes[0, i].set_title(f"({'ab'[i] if i < 2 else i}) Dist(B_{i}, I)")
        axes[0, i].set_xlabel("iteration")
    log_loss_panel(axes[0, L - 1], runs, "(c) log in-context loss")
    for i in range(L):
        layer_dist_panel(axes[1, i], runs, i, f"({'def'[i] if i < 3 else i}) layer {i}")
    f3 = save(fig, out / "fig3.png")
    fig, axes = subplots(1, L - 1, size=(2.6, 2.6))
    for i in range(L - 1):
        heatmap(axes[0, i], _B(runs[0])[-1, i], title=f"B_{i}")
    return [f3, save(fig, out / "fig4.png"), rotated_heatmaps(runs[0], out / "fig5.png")]


def _projected_onto_S(Sigma: Tensor, A: Tensor, B: Tensor, cfg: Fig3Config) -> tuple[float, float]:
    """Fresh-prompt losses of a trained (11) model (final blocks ``A``, ``B``, each (L, d, d)) and of its
    projection onto Thm 4's set S.

    S: A_i = a_i Σ⁻¹, B_i = b_i I. The projection keeps each matrix's best scalar, a_i = tr(Σ^½A_iΣ^½)/d
    and b_i = tr(B_i)/d (the α of Dist(·, I)). Both models see the same ``projection_samples`` prompts
    (common random numbers), in float64.
    """
    Sigma = Sigma.to(torch.float64)
    A, B = A.to(torch.float64), B.to(torch.float64)
    d, L = Sigma.shape[0], A.shape[0]
    inv, half = torch.linalg.inv(Sigma), sym_sqrt(Sigma)
    a = torch.stack([torch.trace(half @ Ai @ half) / d for Ai in A])
    b = torch.stack([torch.trace(Bi) / d for Bi in B])
    eye = torch.eye(d, dtype=torch.float64)
    task = LinearRegression(d=d, covariance=Sigma, weight_prior="inverse_covariance")
    losses = []
    for blocks in ({"A": A, "B": B}, {"A": a[:, None, None] * inv, "B": b[:, None, None] * eye}):
        model = LinearTransformer(LinearTransformerConfig(d=d, n_layers=L, pattern="pattern11", init_std=0.0))
        model = model.double().load_matrices(**blocks)
        chunks = max(1, cfg.projection_samples // 20_000)
        gen = generator(derive_seed(0, "fig3-projection"))
        losses.append(th.mc_loss(model, task, cfg.n, cfg.projection_samples, generator=gen, chunks=chunks)[0])
    return losses[0], losses[1]


def claims(results: Fig3Results, cfg: Fig3Config) -> list[ClaimResult]:
    runs, L = results.runs, cfg.n_layers
    final_loss = torch.tensor([r.test_loss[-1] for r in runs]).mean().item()
    distB = torch.stack([dist_to_identity(_B(r)[-1, : L - 1]) for r in runs])
    distA = torch.stack([dist_to_identity(sigma_conj(r.A[-1], r.Sigma)) for r in runs])
    norms = torch.stack([torch.linalg.matrix_norm(sigma_conj(r.A[-1], r.Sigma)) for r in runs])  # (R, L)
    increasing = float((norms[:, 1:] > norms[:, :-1]).all(dim=1).double().mean())
    projected = [_projected_onto_S(r.Sigma, r.A[-1], _B(r)[-1], cfg) for r in runs]
    return [
        check(
            "loss_far_below_sparse_optimum",
            final_loss,
            hi=cfg.tol.loss_hi,
            detail="mean final test loss; sparse (8) S-optimum is 0.133, the (11) S-optimum ≈ 7e-4",
            smoke="5 L-BFGS iterations: the loss (≈ 1.5) has not left its plateau",
        ),
        check(
            "B_is_scaled_identity",
            distB.max().item(),
            hi=cfg.tol.dist_tol,
            detail="max Dist(B_i, I), i < L-1 (B_{L-1} does not affect the loss)",
            smoke="5 L-BFGS iterations: Dist(B_i, I) ≈ 0.7, the structure has not formed",
        ),
        check(
            "rotated_A_is_scaled_identity",
            distA.max().item(),
            hi=cfg.tol.dist_tol,
            detail="max Dist(Σ^½A_iΣ^½, I) (Thm 4)",
            smoke="5 L-BFGS iterations: Dist(Σ^½A_iΣ^½, I) ≈ 0.7, the structure has not formed",
        ),
        check(
            "step_norms_increase_with_depth",
            increasing,
            lo=cfg.tol.increasing_lo,
            detail="fraction of runs with ‖A_0‖ < ‖A_1‖ < ‖A_2‖ (App. D)",
            smoke="5 L-BFGS iterations: the step sizes have not separated by depth",
        ),
        check(
            "projection_onto_S_does_not_hurt",
            max(p / t - 1 for t, p in projected),
            hi=cfg.tol.projection_rtol,
            detail="max over runs of loss(A_i → a_iΣ⁻¹, B_i → b_iI) / loss(trained) − 1 on "
            f"{cfg.projection_samples} fresh prompts: trained {[f'{t:.2e}' for t, _ in projected]}, "
            f"projected {[f'{p:.2e}' for _, p in projected]}. What the trained model has outside Thm 4's S "
            "is fitted to its fixed training batch, not to the task",
        ),
    ]


SMOKE_FIG3 = dict(SMOKE, steps=5, eval_every=1, train_size=256, snapshot_every=1, projection_samples=2000)
# 400 L-BFGS iterations on 8000 prompts: test loss ≈ 1.3e-3, Dist(B_i, I) ≈ 0.32, not yet the paper's 7e-4 (that needs
# the 20 000-prompt batch and ~700 iterations); at 250 iterations Dist(B_i, I) sat on the tolerance, at 0.48-0.51.
QUICK = dict(seeds=1, steps=400, train_size=8000, batch_size=8000, eval_batch=20_000, loss_hi=1e-2, dist_tol=0.5)
CARD = card(
    Fig3Config,
    "Fig. 3-5: L=3 linear transformer with pattern (11) learns GD++ with Σ⁻¹ preconditioning (Thm 4)",
    smoke=SMOKE_FIG3,
    quick=QUICK,
)
