"""Zhang et al. 2025, Fig. 11 (App. D.8): for ATTN_S with rank R = 2, 3, 4 (D = 4, N = 31, λ = (.4, .3, .2, .1),
H = 5, as Fig. 3b) a new value weight grows exactly at the drops L(M_m) → L(M_{m+1}) with m a multiple of R, and the
conspicuous plateaus sit at those m. Top: loss of six seeds with eq. (19); bottom: |v_i| of seed 0.

    iclab run zhang2025.fig11 --preset quick

Claims:

- plateau_levels_eq19: max |L − L(M_m)| over the detected plateaus at m ≡ 0 (mod R) <= 2e-4 (quick; 0.01 paper).
- final_loss_is_L_MD: max over ranks and seeds of |L(end) − L(M_D)| <= 1e-6 (quick; 0.01 paper).
- all_D_drops: every rank and seed completes the D drops.
- conspicuous_plateaus_at_multiples_of_R: no m = 1..D−1 misclassified (median Δ_m λ_{m+1}² / (Δ_0 λ_1²) >= 0.12).
- new_value_weight_per_conspicuous_plateau: share of (rank, seed, m) with exactly ⌈m/R⌉ grown value weights >= 0.8.

Time on 2 CPU cores: quick 5 s; paper under 90 s (all claims pass).

What did not match: per seed the rank rule has exceptions (a third head growing early makes the m = 4 plateau of R = 2
brief in one of six seeds); the claim takes the median over seeds (docs/papers/zhang2025.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from iclab.experiments.registry import card
from iclab.experiments.zhang2025._staircase import (
    QUICK_D4,
    SMOKE_STAIRS,
    StaircaseConfig,
    claims_staircase,
    plot_staircase,
    run_staircase,
)


@dataclass(frozen=True, kw_only=True)
class Fig11Config(StaircaseConfig):
    ranks: tuple[int, ...] = (2, 3, 4)


run, plot, claims = run_staircase, functools.partial(plot_staircase, name="fig11"), claims_staircase
CARD = card(
    Fig11Config,
    "Fig. 11: a new value weight grows exactly at the drops M_m → M_{m+1} with m a multiple of R",
    smoke=dict(SMOKE_STAIRS, ranks=(2,)),
    quick=QUICK_D4,
)
