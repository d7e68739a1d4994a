"""Ahn et al. 2023, Fig. 7 (App. D): log test loss against depth L at N = 20, d = 5, w⋆ ~ N(0, Σ⁻¹): the L-layer
pattern-(11) transformer equals one Σ⁻¹-PGD step at L = 1 (Thm 1/3) and, for L ≥ 2, lies below L steps of
constant-step Σ⁻¹-PGD and GD and below the best pattern-(8) transformer (the Thm-3 S-optimum, dashed).

Run: ``iclab run ahn2023.fig7 --preset quick``

Claims:
- baselines_match_reference: GD / PGD log-losses within tol.log_atol of spec 002 §5.0 at every L
- one_layer_tf_equals_pgd: at L = 1, log TF − log PGD = 0 ± tol.log_atol
- tf_at_or_below_sparse_optimum: for L ≥ 2, log TF − log S-optimum(8) ≤ tol.log_atol
- tf_beats_pgd: TF < constant-step PGD at every L ≥ 2

Time on 2 CPU cores: quick 48 s (L ∈ {1, 2, 3, 4}, one seed, 200 L-BFGS iterations on 3000 prompts); paper 1.9 h
with ``--workers 2`` (20 AdamW runs of 20 000 steps of 20 000 prompts), 4/4: mean log-loss −2.78 / −6.07 / −6.28 at
L = 2 / 3 / 4. The paper preset evaluates, as the authors' notebook does, the best of the last 20 snapshots on a
validation batch and averages log-losses over seeds (errata 002 #17).

What did not match: nothing at quick (log-loss −2.69 / −5.84 / −6.91 at L = 2 / 3 / 4 against the pattern-(8)
optimum's −1.02 / −2.01 / −2.90). With 100 L-BFGS iterations the L = 4 model sometimes stayed on a plateau, so quick
runs 200. See docs/papers/ahn2023.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from iclab.core.errors import is_int, require
from iclab.experiments.ahn2023._setup import (
    LOG_GD_BY_L,
    LOG_PGD_BY_L,
    BaselineConfig,
    ComparisonRow,
    compare,
    mean_by,
    paper_train,
    sparse_reference,
)
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.plotting import save, subplots
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
    rows = results.rows
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    ax = axes[0, 0]
    for key, label, style in (
        ("tf", "L-layer TF (11)", "o-"),
        ("pgd", "L-step Σ⁻¹-PGD", "s-"),
        ("gd", "L-step GD", "^-"),
    ):
        m = mean_by(rows, key, "L", log=True)
        ax.plot(list(m), list(m.values()), style, label=label, ms=4)
    sp = results.sparse_optimum
    ax.plot(list(sp), [math.log(v) for v in sp.values()], "k--", lw=0.8, label="pattern (8) S-optimum (Thm 3)")
    ax.set_xlabel("number of layers / steps L")
    ax.set_ylabel("log(loss)")
    ax.legend(fontsize=7)
    return [save(fig, out / "fig7.png")]


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
                detail="max |log-loss gap| of GD / PGD to spec 002 §5.0",
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
            )
        )
        out.append(
            check(
                "tf_beats_pgd",
                sum(tf[L] < pgd[L] for L in deep) / len(deep),
                lo=1.0,
                detail="fraction of L ≥ 2 with TF < constant-step PGD",
            )
        )
    return out


FIG7 = register(
    Experiment(
        name="ahn2023.fig7",
        title="Fig. 7: log test loss vs depth L, L-layer TF vs L steps of GD and Σ⁻¹-PGD (N = 20)",
        config=Fig7Config,
        presets={
            "smoke": dict(
                layers=(1, 2),
                seeds=1,
                steps=5,
                batch_size=256,
                eval_batch=512,
                eval_every=5,
                reference_samples=2000,
                select_last=0,
            ),
            # quick: 200 L-BFGS iterations (the paper: Adam, 20k steps). At 100 the L = 4 model was still on its
            # plateau in some runs (log-loss -2.6 vs the S-optimum's -2.9), depending on float32 rounding.
            "quick": dict(
                seeds=1,
                optimizer="lbfgs",
                lr=0.1,
                steps=200,
                train_size=3000,
                batch_size=3000,
                resample_every=0,
                schedule="constant",
                clip=None,
                eval_batch=20_000,
                eval_every=50,
                log_atol=0.1,
                select_last=0,  # L-BFGS on a fixed set: the final model
            ),
            "paper": dict(),
        },
        run=run,
        plot=plot,
        claims=claims,
        description="d=5, N=20, w⋆ ~ N(0, Σ⁻¹). The dashed line is the best pattern-(8) transformer (Thm 3 S-optimum); the trained pattern-(11) model goes below it.",
        smoke_unchecked={
            "baselines_match_reference": "512 test prompts: the Monte-Carlo error of the log-losses (≈ 0.18) exceeds 0.05",
            "one_layer_tf_equals_pgd": "5 training steps: the transformer is still near its initial loss",
            "tf_at_or_below_sparse_optimum": "5 training steps: the transformer is still near its initial loss",
            "tf_beats_pgd": "5 training steps: the transformer is still near its initial loss",
        },
    )
)
