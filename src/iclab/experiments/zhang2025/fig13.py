"""Zhang et al. 2025, Fig. 13 (App. D.8): with repeated eigenvalues λ = (.35, .35, .15, .15) ATTN_S of rank R = 1..4
(D = 4, N = 31, H = 5, six seeds per rank) still plateaus at the levels of eq. (19) (dashed); a plateau between equal
eigenvalues (L(M_1) for R = 1) may be skipped, depending on the random init.

    iclab run zhang2025.fig13 --preset quick

Claims:

- plateau_levels_eq19: max |L − L(M_m)| over the detected plateaus at m ≡ 0 (mod R) <= 2e-4 (quick; 0.01 paper).
- final_loss_is_L_MD: max over ranks and seeds of |L(end) − L(M_D)| <= 1e-6 (quick; 0.01 paper).
- R1_can_plateau_between_equal_eigenvalues: some R = 1 seed plateaus at L(M_1) although λ_1 = λ_2 (share > 0).

Time on 2 CPU cores: quick 6-10 s; paper under 90 s (all claims pass).

What did not match: nothing at quick (R = 1 plateaus at L(M_1) in 5 of 6 seeds; levels within 1.1e-4;
docs/papers/zhang2025.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from iclab.experiments.registry import ClaimResult, card, check
from iclab.experiments.zhang2025._staircase import (
    QUICK_D4,
    SMOKE_STAIRS,
    StaircaseConfig,
    StaircaseResults,
    claims_staircase,
    plot_staircase,
    run_staircase,
    staircase_stats,
)


@dataclass(frozen=True, kw_only=True)
class Fig13Config(StaircaseConfig):
    spectrum: tuple[float, ...] = (0.35, 0.35, 0.15, 0.15)
    ranks: tuple[int, ...] = (1, 2, 3, 4)
    claim_rank_rule: bool = False
    claim_heads: bool = False
    claim_all_drops: bool = False


def claims(results: StaircaseResults, cfg: Fig13Config) -> list[ClaimResult]:
    out = claims_staircase(results, cfg)
    r1 = next((r for r in results.runs if r.R == 1), None)
    if r1 is not None:
        st = staircase_stats(r1, results.Lambda, cfg)
        share = float((st.slopes[:, 1] <= cfg.tol.slope_tol).double().mean())
        out.append(
            check(
                "R1_can_plateau_between_equal_eigenvalues",
                share,
                lo=1e-9,
                detail="share of R = 1 seeds with a plateau at L(M_1) although λ_1 = λ_2 (set by the random init; may be skipped)",
                smoke="200 steps: the R = 1 seed has not reached L(M_1) yet",
            )
        )
    return out


run, plot = run_staircase, functools.partial(plot_staircase, name="fig13")
CARD = card(
    Fig13Config,
    "Fig. 13: repeated eigenvalues (.35,.35,.15,.15): plateaus still at eq. (19) levels, some skipped",
    smoke=dict(SMOKE_STAIRS, ranks=(1,)),
    quick=QUICK_D4,
)
