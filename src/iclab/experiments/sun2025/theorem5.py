"""Sun et al. 2025, Thm 5 (Sec. 3.3, App. F): with the kernel fixed to the quadratic features x̄ of eq. (7), the
optimal attention has the (5)-sparse form and its Γ* = −(S + Φ̄/n)⁻¹SΛ⁻¹ (a closed form derived here) → −Λ⁻¹ as
n → ∞. Here one block with d̄ = C(d+2, 2), its bilinear FFN frozen at App. C's weights and its LSA (full P, Q) trained
with Adam: the learned Γ_eff = P_DD·Q[:q, :q] is scored by the exact Lemma-8 loss L(Γ, n) (no Monte Carlo).

Run: ``iclab run sun2025.theorem5 --preset quick``

Claims (Thm 5):
- learned_loss_reaches_L_gamma_star: worst seed's exact loss of the learned Γ over L(Γ*), minus 1, in
  [−1e-9, ``tol.loss_rtol``] (L(Γ*) = 1.877 / 3.407 at d = 3 / 4, n = 200).
- attention_is_5_sparse: the largest read-out-relevant off-pattern product of P, Q over |Γ_eff| <= ``tol.pattern_tol``.
- learned_gamma_is_gamma_star: max over seeds ‖Γ − Γ*‖_F/‖Γ*‖_F <= ``tol.gamma_rtol``.

Time on 2 CPU cores: quick 15 s (d = 2, n = 50, 1 seed × 1500 steps); paper 53 min on one contended core (d = 3,
n = 200, 3 seeds × 5000 steps of 4000 prompts): 3/3, loss +0.016 % over L(Γ*), ‖Γ − Γ*‖/‖Γ*‖ <= 0.005.

What did not match: the paper's bound ‖Γ* + Λ⁻¹‖_F = O(d^{3/2}/√n) is violated at moderate n (it inherits Thm 2's
error); the paper gives no training recipe for this check (lr 3e-3 with cosine decay, 5000 steps, 3 seeds is ours);
quick needs looser pattern and Γ tolerances (0.1, 0.2). See docs/papers/sun2025.md ("Theorem 5 at the paper preset")
and docs/errata.md (Sun et al. 2025, #2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from iclab import constructions, tasks
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.experiments.sun2025._setup import SMOKE, BilinearSetup, paper_train
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig
from iclab.plotting import band, heatmap, save, subplots
from iclab.theory import polynomial_features as pf
from iclab.training import TrainConfig, TrainingRun


@dataclass(frozen=True, kw_only=True)
class Theorem5Tolerances:
    loss_rtol: float = 0.02  # exact loss of the learned Γ at most this fraction above L(Γ*)
    pattern_tol: float = 1e-2  # off-pattern products of P, Q relative to |Γ_eff|
    gamma_rtol: float = 0.1  # ‖Γ − Γ*‖_F/‖Γ*‖_F


@dataclass(frozen=True, kw_only=True)
class Theorem5Config(BilinearSetup):
    seeds: int = 3
    # a one-block problem convex in Γ: lr 3e-3 with cosine decay, 5000 steps (ours; App. I's 1e-3 × 20 000 is 4× longer)
    train: TrainConfig = field(
        default_factory=lambda: paper_train(snapshot_every=0, steps=5000, lr=3e-3, schedule="cosine")
    )
    tol: Theorem5Tolerances = field(default_factory=Theorem5Tolerances)

    def _model_ds(self) -> tuple[int, ...]:
        return ()  # the model is built with d̄ = C(d+2, 2) (the construction's FFN), not ``d_bar``


@dataclass
class Theorem5Row:
    seed: int
    gamma: Tensor  # (q, q) learned Γ_eff = P_DD·Q[:q, :q], float64
    off_pattern: float  # largest off-pattern product over |Γ_eff|
    exact_loss: float  # Lemma-8 loss of gamma at n
    steps: Tensor  # (T,) steps of the training test-loss curve
    test_loss: Tensor  # (T,)


@dataclass
class Theorem5Results:
    rows: list[Theorem5Row]
    gamma_star: Tensor  # (q, q) Γ* = −(S + Φ̄/n)⁻¹SΛ⁻¹
    optimal_loss: float  # L(Γ*, n)
    construction_loss: float  # L(−Λ⁻¹, n) = K(d)/n


def _effective_gamma(model: BilinearTransformer, q: int) -> tuple[Tensor, float]:
    """Γ_eff = P_DD · Q[:q, :q] and the largest read-out-relevant off-pattern entry relative to it (Thm 5)."""
    P, Q = model.P[0, 0].detach().double().cpu(), model.Q[0, 0].detach().double().cpu()
    gamma = P[-1, -1] * Q[:q, :q]
    off = max(float(P[-1, :q].abs().max() * Q.abs().max()), float(Q[-1, :q].abs().max() * P[-1, -1].abs()))
    return gamma, off / float(gamma.abs().max())


def _frozen_ffn_model(cfg: Theorem5Config, seed: int, q: int) -> BilinearTransformer:
    """One block, d̄ = q, its FFN loaded with App. C's weights and frozen; P, Q drawn from
    ``derive_seed(seed, "init")``."""
    W0, W1 = constructions.quadratic_ffn_weights(cfg.d, q)
    mcfg = BilinearTransformerConfig(d=cfg.d, d_bar=q, n_blocks=1, init_std=cfg.init_std)
    model = BilinearTransformer(mcfg, generator=generator(derive_seed(seed, "init")))
    model.load_weights(W0=W0[None].float(), W1=W1[None].float())
    for p in model.ffn.parameters():
        p.requires_grad_(False)
    return model


def run(cfg: Theorem5Config, ctx: RunContext) -> Theorem5Results:
    q = math.comb(cfg.d + 2, 2)
    task = tasks.quadratic(cfg.d)
    stats = pf.quadratic_stats(cfg.d)
    train = dataclasses.replace(cfg.train, checkpoint_every=max(1, cfg.train.steps // 10))
    runs = [
        TrainingRun(
            name=f"seed{s}",
            model=_frozen_ffn_model(cfg, s, q),
            task=functools.partial(task.sample, n=cfg.n),
            train=train,
            seed=s,
        )
        for s in range(cfg.seeds)
    ]
    rows = []
    for s, res in enumerate(ctx.execute(runs)):
        gamma, off = _effective_gamma(cast(BilinearTransformer, res.model), q)
        steps, loss = res.curve("test_loss")
        rows.append(Theorem5Row(seed=s, gamma=gamma, off_pattern=off, exact_loss=pf.one_block_loss(gamma, cfg.n, stats), steps=torch.tensor(steps), test_loss=torch.tensor(loss)))  # fmt: skip
    g_star = pf.optimal_gamma(cfg.n, stats)
    return Theorem5Results(rows=rows, gamma_star=g_star, optimal_loss=pf.one_block_loss(g_star, cfg.n, stats), construction_loss=pf.construction_constant(cfg.d) / cfg.n)  # fmt: skip


def plot(results: Theorem5Results, cfg: Theorem5Config, out: Path) -> list[Path]:
    rows = results.rows
    fig, axes = subplots(1, 3)
    ax = axes[0, 0]
    band(ax, rows[0].steps.numpy(), torch.stack([r.test_loss for r in rows]), label="test loss")
    ax.axhline(results.optimal_loss, ls="--", color="tab:green", label="L(Γ*)")
    ax.axhline(results.construction_loss, ls=":", color="tab:red", label="L(−Λ⁻¹) = K/n")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.legend(fontsize=7)
    heatmap(axes[0, 1], rows[0].gamma, title="learned Γ", annotate=False)
    heatmap(axes[0, 2], results.gamma_star, title="Γ* (exact)", annotate=False)
    return [save(fig, out / "theorem5.png")]


#: why the smoke preset's few steps cannot judge a claim
NEAR_INIT = "6 training steps: the attention is still near its random init"


def claims(results: Theorem5Results, cfg: Theorem5Config) -> list[ClaimResult]:
    rows, opt, g_star, tol = results.rows, results.optimal_loss, results.gamma_star, cfg.tol
    gerr = max(float(torch.linalg.matrix_norm(r.gamma - g_star) / torch.linalg.matrix_norm(g_star)) for r in rows)
    return [
        check(
            "learned_loss_reaches_L_gamma_star",
            max(r.exact_loss for r in rows) / opt - 1,
            lo=-1e-9,
            hi=tol.loss_rtol,
            detail=f"exact loss of the learned Γ over L(Γ*) = {opt:.4f}, minus 1 (L(Γ*) = 1.877 / 3.407 at d = 3 / 4, n = 200)",
            smoke=NEAR_INIT,
        ),
        check(
            "attention_is_5_sparse",
            max(r.off_pattern for r in rows),
            hi=tol.pattern_tol,
            detail="largest read-out-relevant off-pattern product (P_{D,x̄}·|Q|, Q_{D,x̄}·P_DD) over |Γ_eff|",
            smoke=NEAR_INIT,
        ),
        check(
            "learned_gamma_is_gamma_star",
            gerr,
            hi=tol.gamma_rtol,
            detail="max over seeds ‖Γ − Γ*‖_F/‖Γ*‖_F, Γ = P_DD Q[:q, :q]",
            smoke=NEAR_INIT,
        ),
    ]


# quick: the learned Γ is itself only within ~10 % of Γ*, and the off-pattern products shrink with it (0.069
# measured); the paper preset keeps 1e-2.
QUICK = dict(seeds=1, d=2, n=50, steps=1500, batch_size=1000, lr=1e-2, eval_batch=4096, eval_every=100,
             loss_rtol=0.03, pattern_tol=0.1, gamma_rtol=0.2)  # fmt: skip
CARD = card(
    Theorem5Config,
    "Thm 5: with the FFN frozen at the construction, trained attention finds Γ* = −(S + Φ̄/n)⁻¹SΛ⁻¹",
    smoke=dict(SMOKE, snapshot_every=0, d=2),
    quick=QUICK,
)
