"""Ahn et al. 2023, Fig. 7 (App. D): log test loss against depth L at N = 20, d = 5, w⋆ ~ N(0, Σ⁻¹): the L-layer
pattern-(11) transformer equals one Σ⁻¹-PGD step at L = 1 (Thm 1/3) and, for L ≥ 2, lies below L steps of
constant-step Σ⁻¹-PGD and GD and below the best pattern-(8) transformer (the Thm-3 S-optimum, dashed).

Run: ``iclab run ahn2023.fig7 --preset quick``

Claims:
- baselines_match_reference: GD / PGD log-losses within tol.log_atol of their Monte-Carlo references at every L
- one_layer_tf_equals_pgd: at L = 1, log TF − log PGD = 0 ± tol.log_atol
- tf_at_or_below_sparse_optimum: for L ≥ 2, log TF − log S-optimum(8) ≤ tol.log_atol
- tf_beats_pgd: TF < constant-step PGD at every L ≥ 2

Time on 2 CPU cores: quick 12 s at 1 thread; paper 1.9 h with ``--workers 2`` (4/4, log-loss −2.78 / −6.07 / −6.28 at L = 2-4).

What did not match: nothing. As the authors' notebook does, the paper preset evaluates the best of the last 20
snapshots on a validation batch and averages log-losses over seeds (docs/papers/ahn2023.md, docs/errata.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from iclab.core.errors import is_int, require
from iclab.experiments.ahn2023._setup import (
    LBFGS_QUICK,
    LOG_GD_BY_L,
    LOG_PGD_BY_L,
    SMOKE,
    BaselineConfig,
    ComparisonRow,
    compare,
    mean_by,
    method_plot,
    paper_train,
    sparse_reference,
)
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.plotting import save
from iclab.training import TrainConfig


@dataclass(frozen=True, kw_only=True)
class Fig7Tolerances:
    log_atol: float = 0.05


def _variable_l_notebook() -> TrainConfig:
    """The authors' variable_L notebook: AdamW, lr 0.01 halved every 4000 steps, 20 000 steps."""
    return paper_train(lr=0.01, steps=20_000, step_every=4000, snapshot_every=100, eval_every=500)


@dataclass(frozen=True, kw_only=True)
class Fig7Config(BaselineConfig):
    layers: tuple[int, ...] = (1, 2, 3, 4)
    train: TrainConfig = field(default_factory=_variable_l_notebook)
    reference_samples: int = 200_000
    select_last: int = 20  # the notebook: the best of the last 20 checkpoints (every 100 steps) on validation
    tol: Fig7Tolerances = field(default_factory=Fig7Tolerances)

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = len(self.layers) >= 1 and all(is_int(L, 1) for L in self.layers)
        require(self, "layers", ok, "a non-empty tuple of ints >= 1")


@dataclass
class Fig7Results:
    rows: list[ComparisonRow]
    sparse_optimum: dict[int, float]  # L -> the Thm-3 S-optimal loss of pattern (8)


def run(cfg: Fig7Config, ctx: RunContext) -> Fig7Results:
    rows = compare(cfg, ctx, [(cfg.n, L) for L in cfg.layers], by="L")
    sparse = {L: sparse_reference(cfg.d, cfg.n, L, cfg.reference_samples).loss for L in cfg.layers}
    return Fig7Results(rows=rows, sparse_optimum=sparse)


def plot(results: Fig7Results, cfg: Fig7Config, out: Path) -> list[Path]:
    lines = (("tf", "L-layer TF (11)", "o-"), ("pgd", "L-step Σ⁻¹-PGD", "s-"), ("gd", "L-step GD", "^-"))
    fig, ax = method_plot(results.rows, "L", lines, log=True)
    sp = results.sparse_optimum
    ax.plot(list(sp), [math.log(v) for v in sp.values()], "k--", lw=0.8, label="pattern (8) S-optimum (Thm 3)")
    ax.set_xlabel("number of layers / steps L")
    ax.set_ylabel("log(loss)")
    ax.legend(fontsize=7)
    return [save(fig, out / "fig7.png")]


EARLY = "5 training steps: the transformer is still near its initial loss"


def claims(results: Fig7Results, cfg: Fig7Config) -> list[ClaimResult]:
    rows, sp, atol = results.rows, results.sparse_optimum, cfg.tol.log_atol
    tf, pgd, gd = (mean_by(rows, k, "L", log=True) for k in ("tf", "pgd", "gd"))  # mean over seeds of log-losses
    out = []
    if cfg.d == 5 and cfg.n == 20:
        err = max(
            max(abs(gd[L] - LOG_GD_BY_L[L]), abs(pgd[L] - LOG_PGD_BY_L[L])) for L in cfg.layers if L in LOG_GD_BY_L
        )
        out.append(
            check(
                "baselines_match_reference",
                err,
                hi=atol,
                detail="max |log-loss gap| of GD / PGD to their Monte-Carlo references",
                smoke="512 test prompts: the Monte-Carlo error of the log-losses (≈ 0.18) exceeds 0.05",
            )
        )
    if 1 in cfg.layers:
        out.append(
            check(
                "one_layer_tf_equals_pgd",
                tf[1] - pgd[1],
                atol=atol,
                expected=0.0,
                detail="at L = 1 the optimum is one Σ⁻¹-PGD step (Thm 1/3)",
                smoke=EARLY,
            )
        )
    deep = [L for L in cfg.layers if L >= 2]
    if deep:
        gap = max(tf[L] - math.log(sp[L]) for L in deep)
        out.append(
            check(
                "tf_at_or_below_sparse_optimum",
                gap,
                hi=atol,
                detail=f"max over L ≥ 2 of log TF − log S-opt(8); TF log-loss {[round(tf[L], 2) for L in deep]}",
                smoke=EARLY,
            )
        )
        out.append(
            check(
                "tf_beats_pgd",
                sum(tf[L] < pgd[L] for L in deep) / len(deep),
                lo=1.0,
                detail="fraction of L ≥ 2 with TF < constant-step PGD",
                smoke=EARLY,
            )
        )
    return out


SMOKE_FIG7 = dict(SMOKE, layers=(1, 2), steps=5, eval_batch=512, eval_every=5, select_last=0, reference_samples=2000)
# 200 L-BFGS iterations: at 100 the L = 4 model was still on its plateau in some runs (log-loss −2.6 vs −2.9)
#: 8000 fixed prompts: on 3000 the L = 4 model fits its training set (loss 0.002) while its test loss swings between
#: 0.05 and 600 over the run, so the final value is decided by rounding (log test loss -6.9 with 2 threads, +3.5 with
#: 1 thread or in float64); on 8000 it is -1.75 to -1.83 (relative to the sparse optimum) in all three.
QUICK = dict(LBFGS_QUICK, seeds=1, steps=200, train_size=8000, batch_size=8000, log_atol=0.1)
CARD = card(
    Fig7Config,
    "Fig. 7: log test loss vs depth L, L-layer TF vs L steps of GD and Σ⁻¹-PGD (N = 20)",
    smoke=SMOKE_FIG7,
    quick=QUICK,
)
