"""Zhang et al. 2025, Fig. 7 (App. D.9): with high-dimensional data (D = 8, N = 127, λ_d ∝ 1/d with trace 1) the
contrast of Fig. 2 holds: ATTN_M drops once to L(M_D), ATTN_S of rank one steps down a staircase whose plateaus sit
at eq. (19). Full-batch GD on P sequences; the training loss is plotted, dashed: eq. (19) at N = 127.

    iclab run zhang2025.fig7 --preset quick

Claims:

- merged_one_drop: every ATTN_M seed's loss drops exactly once.
- merged_final_loss: mean final ATTN_M loss = L(M_D) within 5 %.
- separate_plateau_levels: max |L − L(M_m)| over the ATTN_S plateaus <= 0.01 (finite P).
- separate_several_drops: every ATTN_S seed completes at least 2 drops.

Time on 2 CPU cores: quick 6 s; paper under 90 s (all claims pass).

What did not match: the paper's D, H and R for this figure are not in the text (D = 8, H = 8, R = 1 here); quick runs
40 000 τ, 6-7 of the 8 drops (docs/papers/zhang2025.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from iclab.experiments.registry import ClaimResult, card
from iclab.experiments.zhang2025._setup import INV_D8, sgd
from iclab.experiments.zhang2025._two_models import (
    TwoModelConfig,
    TwoModelResults,
    plot_two_models,
    run_two_models,
    two_model_claims,
)
from iclab.training import TrainConfig


@dataclass(frozen=True, kw_only=True)
class Fig7Config(TwoModelConfig):
    seeds: int = 2
    d: int = 8
    n: int = 127
    spectrum: tuple[float, ...] = INV_D8
    n_heads: int = 8
    w_init: float = 0.05
    train: TrainConfig = field(default_factory=lambda: sgd(lr=0.5, steps=60_000))
    merged_lr: float = 0.1
    merged_steps: int = 3000


def claims(results: TwoModelResults, cfg: Fig7Config) -> list[ClaimResult]:
    return two_model_claims(results, cfg)[0]


run, plot = run_two_models, functools.partial(plot_two_models, name="fig7")
CARD = card(
    Fig7Config,
    "Fig. 7: high-dimensional data (N=127): the same contrast, one drop vs a staircase at eq. (19)",
    smoke=dict(steps=100, merged_steps=50, train_size=500, eval_every=5),
    quick=dict(train_size=20_000, w_init=0.1, lr=1.0, steps=20_000, eval_every=20),
)
