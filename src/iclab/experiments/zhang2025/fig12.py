"""Zhang et al. 2025, Fig. 12 (App. D.8): as Fig. 4 for ranks R = 3, 5, 6, 7: ATTN_S (D = 8, N = 31, λ_d ∝ 1/d with
trace 1, H = 9) has conspicuous plateaus only at L(M_m) with m a multiple of R; dashed: eq. (19).

    iclab run zhang2025.fig12 --preset quick

Claims:

- plateau_levels_eq19: max |L − L(M_m)| over the detected plateaus at m ≡ 0 (mod R) <= 5e-3 (quick; 0.01 paper).
- final_loss_is_L_MD: max over ranks and seeds of |L(end) − L(M_D)| <= 1e-6 (quick; 0.01 paper).
- all_D_drops: every rank and seed completes the D = 8 drops.
- conspicuous_plateaus_at_multiples_of_R: no m = 1..D−1 misclassified (median Δ_m λ_{m+1}² / (Δ_0 λ_1²) >= 0.12).
- new_value_weight_per_conspicuous_plateau: share of (rank, seed, m) with exactly ⌈m/R⌉ grown value weights >= 0.8.

Time on 2 CPU cores: quick 8-11 s; paper (120 001 steps, t/τ = 48 000) 168 s, 5/5. At 20 001 steps (8000 τ) the last
drops have not happened (1/5).

What did not match: plateau levels within 4.4e-3 only at quick (R = 7 passes M_7 while its 7th pair is still
growing); see Fig. 4 and docs/papers/zhang2025.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from iclab.experiments.registry import card
from iclab.experiments.zhang2025._staircase import (
    QUICK_D8,
    SMOKE_STAIRS,
    StaircaseD8Config,
    claims_staircase,
    plot_staircase,
    run_staircase,
)


@dataclass(frozen=True, kw_only=True)
class Fig12Config(StaircaseD8Config):
    ranks: tuple[int, ...] = (3, 5, 6, 7)


run, plot, claims = run_staircase, functools.partial(plot_staircase, name="fig12"), claims_staircase
CARD = card(Fig12Config, "Fig. 12: as Fig. 4 for R = 3, 5, 6, 7", smoke=dict(SMOKE_STAIRS, ranks=(3,)), quick=QUICK_D8)
