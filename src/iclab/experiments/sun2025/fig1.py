"""Sun et al. 2025, Fig. 1 (a-c) and Figs. 5-9: quadratic in-context regression, a 6-layer linear transformer against
bilinear transformers with L ∈ {2, 4, 6} blocks [bilinear FFN (eq. 3) → LSA (eq. 2)], d ∈ {3, 4}, d̄ = 12, n = 200;
Figs. 5-9 are the test losses of the ℓ-block sub-networks during training (App. H), from snapshots of the same runs.
Prop. 1: no linear TF beats the affine floor d(d+3)/2 (9 / 14); the bilinear models go far below it, deeper is better.

Run: ``iclab run sun2025.fig1 --preset quick``

Claims, one set per d in ``ds``, named here for smoke's d = 2 (``_d3``, ``_d4`` at paper):
- linear_tf_above_affine_floor_d2: min over seeds of (loss + 3σ) of the linear TF at n_train >= d(d+3)/2 (Prop. 1).
- bilinear_below_linear_floor_d2: every bilinear model with L >= 2 below ``tol.margin`` × the floor (Fig. 1a, b).
- depth_helps_d2: no inversion of the mean loss over increasing L (Fig. 1a, b).
- deep_models_beat_single_block_bound_d4: at d = 4, d̄ < 15, every L >= 2 below the corrected Prop-4 bound 2.298
  (the paper prints 3) (Fig. 1b).
- single_block_above_bound_d4: the L = 1 model stays above that bound (Prop. 4).
- converged_L4_d3: d = 3, L = 4 reaches a mean loss <= ``tol.converged_loss`` = 1e-3 (a soft check; Fig. 9).
- subnetwork_loss_decreases_with_l_d2: the ℓ-block sub-network losses decrease in ℓ (2 % slack) for at least
  ``tol.subnet_fraction`` of the models (Figs. 5-9).
- short_prompts_are_worse_d2: every bilinear model is worse at the shortest test length than at n_train (Fig. 1c).

Time on 2 CPU cores: quick 35 s (d = 3, L ∈ {1, 2}, a 3-layer linear TF, 700 steps); paper 19 core-hours (5 seeds ×
20 000 steps × 4000 prompts; the longest run 49 min), ≈ 50 min on 40 Ray workers.

What did not match: at a quarter of the paper's budget (1 seed) d = 3, L = 4 reached 2.3e-3, not <= 1e-3 (d = 4
passes 6/6 there); the loss at test lengths below n_train explodes far beyond "rises for shorter prompts"; L = 4 diverges at the
quick preset's lr, so quick keeps L ∈ {1, 2} and the margin 1 × floor. See docs/papers/sun2025.md ("A CPU run at
paper scale", "Stability") and docs/errata.md (Sun et al. 2025).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from iclab import algorithms
from iclab.core.errors import require, require_int
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.experiments.sun2025._setup import (
    QUICK,
    SMOKE,
    BilinearSetup,
    ModelRow,
    at,
    decorate,
    length_panel,
    make_task,
    mean_at,
    model_base,
    require_ints,
    run_model_groups,
    upper,
)
from iclab.models.bilinear import BilinearTransformerConfig
from iclab.plotting import band, save, subplots
from iclab.theory import mc_loss
from iclab.theory import polynomial_features as pf


@dataclass(frozen=True, kw_only=True)
class Fig1Tolerances:
    margin: float = 0.5  # bilinear loss must be below margin × the linear floor
    converged_loss: float = 1e-3  # Fig. 9: d = 3, L = 4 (std over 5 seeds ~1e-5)
    subnet_fraction: float = 0.8  # of the models whose ℓ-block losses decrease in ℓ (Figs. 5-9)
    short_fraction: float = 1.0  # of the bilinear models worse at the shortest test length (Fig. 1c)
    max_inversions: int = 0  # of the mean loss over increasing L

    def __post_init__(self) -> None:
        require(self, "margin", isinstance(self.margin, int | float) and self.margin > 0, "a float > 0")


@dataclass(frozen=True, kw_only=True)
class Fig1Config(BilinearSetup):
    ds: tuple[int, ...] = (3, 4)
    blocks: tuple[int, ...] = (2, 4, 6)
    linear_layers: int = 6
    tol: Fig1Tolerances = field(default_factory=Fig1Tolerances)

    def __post_init__(self) -> None:
        require_ints(self, "ds", self.ds, 1)
        require_ints(self, "blocks", self.blocks, 1)
        require_int(self, "linear_layers", self.linear_layers, 1)
        super().__post_init__()

    def _model_ds(self) -> tuple[int, ...]:
        return tuple(self.ds)


@dataclass
class Fig1Results:
    rows: list[ModelRow]  # every (d, model, seed)
    least_squares: dict[int, list[float]]  # d -> least squares on the monomials at every test length


def _models(cfg: Fig1Config, d: int) -> dict[str, BilinearTransformerConfig]:
    base = model_base(cfg, d)
    out = {"linear": BilinearTransformerConfig(**base, n_blocks=cfg.linear_layers, ffn="none")}
    out.update({f"L{L}": BilinearTransformerConfig(**base, n_blocks=L) for L in cfg.blocks})
    return out


def least_squares_baseline(cfg: BilinearSetup, d: int) -> list[float]:
    """Least squares on the task's monomials (the Bayes posterior mean for w ~ N(0, I)) at every test length."""
    task, ls = make_task(cfg, d), algorithms.FeatureLeastSquares(cfg.monomials)
    batch = max(2, cfg.test_batch // 10)
    return [mc_loss(ls, task, n, batch, generator=generator(derive_seed(0, "ls", d, n)), chunks=max(1, batch * n // 1_000_000))[0] for n in cfg.test_ns]  # fmt: skip


def run(cfg: Fig1Config, ctx: RunContext) -> Fig1Results:
    rows = run_model_groups(cfg, ctx, [(_models(cfg, d), d, None) for d in cfg.ds])
    return Fig1Results(rows=rows, least_squares={d: least_squares_baseline(cfg, d) for d in cfg.ds})


def _curves_panel(ax: Any, rows: list[ModelRow], title: str) -> None:
    """Test-loss curve of the full model and of its ℓ-block sub-networks (Fig. 5-9)."""
    x = rows[0].snap_steps.numpy()
    L = rows[0].block_loss.shape[-1] - 1
    for ell in range(1, L + 1):
        band(ax, x, torch.stack([r.block_loss[:, ell] for r in rows]), label=f"ℓ = {ell}" + (" (full)" if ell == L else ""))  # fmt: skip
    decorate(ax, "iteration", "test loss", title)


def _short_prompt_panel(ax: Any, cfg: Fig1Config, rows: list[ModelRow]) -> None:
    """Fig. 1(c): the models of the last d on log-log axes with a c/n line through the deepest model's loss
    at the longest test length. The paper says only that (c) shows the loss rising for shorter prompts "aligned with
    Thm. 2"; the 1/n line is Thm. 2's rate, so the panel shows how far each model follows it."""
    length_panel(ax, cfg, rows, f"(c) d = {cfg.ds[-1]}: short prompts, log-log", None)  # (a)'s colours
    bil = [r for r in rows if r.model != "linear"]
    deepest = max(bil, key=lambda r: int(r.model[1:]), default=None)
    if deepest is not None:
        ns = torch.tensor(cfg.test_ns, dtype=torch.float64)
        c = float(deepest.length_loss[-1]) * cfg.test_ns[-1]
        ax.plot(ns.numpy(), (c / ns).numpy(), ls="--", color="gray", lw=0.8, label=f"∝ 1/n (Thm. 2 rate, through {deepest.model})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(list(cfg.test_ns), [str(n) for n in cfg.test_ns], minor=False)
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=7)


def plot(results: Fig1Results, cfg: Fig1Config, out: Path) -> list[Path]:
    rows = results.rows
    fig, axes = subplots(1, len(cfg.ds) + 1)
    for i, d in enumerate(cfg.ds):
        ax = axes[0, i]
        ls = results.least_squares[d]
        if max(ls) > 1e-8:
            ax.plot(cfg.test_ns, ls, "k:", lw=0.8, label="least squares on monomials")
        else:  # n >= #monomials: noise-free least squares interpolates, a line at 1e-28 would squash the panel
            ax.plot([], [], "k:", lw=0.8, label="least squares on monomials: 0 (exact)")
        panel = {3: "a", 4: "b"}.get(d, str(i))  # the paper's panels: (a) d = 3, (b) d = 4
        length_panel(ax, cfg, [r for r in rows if r.d == d], f"({panel}) d = {d}, d̄ = {cfg.d_bar}", pf.affine_floor(d))  # fmt: skip
    _short_prompt_panel(axes[0, -1], cfg, [r for r in rows if r.d == cfg.ds[-1]])
    paths = [save(fig, out / "fig1.png")]
    fig, axes = subplots(len(cfg.ds), len(cfg.blocks))
    for i, d in enumerate(cfg.ds):
        for j, L in enumerate(cfg.blocks):
            _curves_panel(axes[i, j], [r for r in rows if r.d == d and r.model == f"L{L}"], f"d = {d}, L = {L} (Fig. 5-9)")  # fmt: skip
    paths.append(save(fig, out / "fig5_9.png"))
    return paths


def claims(results: Fig1Results, cfg: Fig1Config) -> list[ClaimResult]:
    rows, tol, out = results.rows, cfg.tol, []
    for d in cfg.ds:
        floor = pf.affine_floor(d)
        lin = [r for r in rows if r.d == d and r.model == "linear"]
        worst = min(upper(cfg, r, cfg.n) for r in lin)
        out.append(check(f"linear_tf_above_affine_floor_d{d}", worst, lo=floor, detail=f"min over seeds of (loss + 3σ) of the {cfg.linear_layers}-layer linear TF at n = {cfg.n}; Prop. 1 floor d(d+3)/2"))  # fmt: skip
        bil = {L: [r for r in rows if r.d == d and r.model == f"L{L}"] for L in cfg.blocks}
        if any(L >= 2 for L in cfg.blocks):
            best_bad = max(
                at(cfg, r, cfg.n)[0] for L, rs in bil.items() if L >= 2 for r in rs
            )  # the paper's L ∈ {2, 4, 6}
            out.append(check(f"bilinear_below_linear_floor_d{d}", best_bad, hi=tol.margin * floor, detail=f"max over L >= 2, seeds of the bilinear loss at n = {cfg.n} vs {tol.margin} × floor", smoke="6 training steps: the bilinear models are still at their initial loss"))  # fmt: skip
        means = [mean_at(bil[L], cfg, cfg.n) for L in cfg.blocks]
        inversions = sum(b > a for a, b in itertools.pairwise(means))
        out.append(check(f"depth_helps_d{d}", inversions, hi=tol.max_inversions, detail=f"inversions of the mean loss over L = {cfg.blocks}: {[round(m, 4) for m in means]}"))  # fmt: skip
        if d == 4 and cfg.d_bar < math.comb(d + 2, 2):
            out += _single_block_bound_claims(cfg, bil, dict(zip(cfg.blocks, means, strict=True)))
        if d == 3 and 4 in cfg.blocks:
            out.append(_converged_claim(cfg, bil[4]))
        finals = [r.block_loss[-1] for rs in bil.values() for r in rs]
        mono = sum(bool((f[1:] <= f[:-1] * 1.02).all()) for f in finals) / len(finals)
        out.append(check(f"subnetwork_loss_decreases_with_l_d{d}", mono, lo=tol.subnet_fraction, detail="fraction of trained models whose ℓ-block sub-network losses decrease in ℓ ≥ 1 (2 % slack)"))  # fmt: skip
        short = min(cfg.test_ns)
        worse = sum(at(cfg, r, short)[0] > at(cfg, r, cfg.n)[0] for rs in bil.values() for r in rs) / sum(len(rs) for rs in bil.values())  # fmt: skip
        out.append(check(f"short_prompts_are_worse_d{d}", worse, lo=tol.short_fraction, detail=f"fraction of bilinear models with a higher loss at n_test = {short} than at n_train = {cfg.n}", smoke="6 training steps: no model has learnt to use long prompts yet"))  # fmt: skip
    return out


def _single_block_bound_claims(cfg: Fig1Config, bil: dict[int, list[ModelRow]], means: dict[int, float]) -> list[ClaimResult]:  # fmt: skip
    """Fig. 1b with the corrected Prop. 4: at d = 4 and d̄ < C(d+2, 2) EVERY trained depth L >= 2 has a mean
    loss below the one-block bound (2.298 at d̄ = 12; the paper prints 3), and a single block (L = 1) stays above it
    (a finite-n loss of one block is above its n → ∞ value, which Prop. 4 bounds)."""
    d = 4
    bound, printed = pf.prop4_bound(d, cfg.d_bar), pf.paper_prop4_bound(d, cfg.d_bar)
    out = []
    deep = {L: m for L, m in means.items() if L >= 2}
    if deep:
        worst = max(deep, key=lambda L: deep[L])
        per = {L: round(m, 4) for L, m in deep.items()}
        out.append(check("deep_models_beat_single_block_bound_d4", deep[worst], hi=bound, detail=f"max over L >= 2 of the mean loss at n = {cfg.n} (L = {worst}; per L {per}) vs the corrected Prop-4 bound {bound:.3f} for one block at d̄ = {cfg.d_bar} (paper's: {printed:.0f})"))  # fmt: skip
    if 1 in bil:
        single = min(upper(cfg, r, cfg.n) for r in bil[1])
        out.append(check("single_block_above_bound_d4", single, lo=bound, detail=f"min over seeds of (loss + 3σ) of the L = 1 model at n = {cfg.n} vs the corrected Prop-4 bound {bound:.3f} at d̄ = {cfg.d_bar}: one block cannot go below it"))  # fmt: skip
    return out


def _converged_claim(cfg: Fig1Config, rows: list[ModelRow]) -> ClaimResult:
    """Fig. 9 (a soft check): d = 3, L = 4 converges, mean final loss <= 1e-3 (seed std ~1e-5)."""
    losses = [at(cfg, r, cfg.n)[0] for r in rows]
    mean = sum(losses) / len(losses)
    std = math.sqrt(sum((v - mean) ** 2 for v in losses) / (len(losses) - 1)) if len(losses) > 1 else float("nan")
    return check("converged_L4_d3", mean, hi=cfg.tol.converged_loss, detail=f"mean over {len(losses)} seed(s) of the L = 4 loss at n = {cfg.n}, d = 3; std over seeds {std:.3g} (paper: ~1e-5; a soft check)")  # fmt: skip


# quick: d = 3 only, L ∈ {1, 2}: L = 4 reaches NaN at batch 256, n = 50 even with label_scale and the identity init
# (step 150 at lr 1e-2, 360 at 3e-3; docs/papers/sun2025.md "Stability"). The margin is the floor itself (the paper
# preset asks for half of it).
CARD = card(
    Fig1Config,
    "Fig. 1, 5-9: quadratic ICL, 6-layer linear TF vs bilinear TFs with L blocks; ℓ-block sub-network curves",
    smoke=dict(**SMOKE, ds=(2,), d_bar=7, blocks=(1, 2), linear_layers=2, test_ns=(10, 20)),
    quick=dict(**QUICK, ds=(3,), blocks=(1, 2), linear_layers=3, test_ns=(25, 50, 100), margin=1.0),
)
