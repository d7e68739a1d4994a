"""Wang et al. 2025, Fig. 2 with RBF attention: as ``wang2025.fig2`` (one block, GD vs the Trained TF vs the number
L of training contexts) with the RBF kernel κ = exp(−‖W_K e_i − W_Q e_j‖²/2) ÷ N in head 1, for GD
(W_Q = W_K = a[I_d 0], eq. 26-44) and for the Trained TF.

What the paper shows (§6.1, whose Fig. 2 we read as showing RBF and softmax attention): the two agree once L is
large and GD needs fewer training contexts.

Run: ``iclab run wang2025.fig2_rbf --preset quick`` (``--preset paper``: the authors' 1-layer rbf lr 1e-3 for both
models, L = 2048 … 32768, 5 seeds).

Claims (fig2's tolerances):
- tf_matches_gd_acc_at_largest_L: |acc_TF − acc_GD| <= 0.02 at the largest L (quick 0.05).
- tf_matches_gd_nll_at_largest_L: |NLL_TF − NLL_GD| <= 0.05 there (quick 0.2).
- tf_approaches_gd_with_L: the GD − TF accuracy gap and the TF − GD NLL gap are both smaller at the largest L.
- gd_below_bayes_rate: the best GD accuracy <= Bayes E[max p] on the test queries + 3 s.e.
- gd_is_data_efficient: GD accuracy at the smallest and largest L within 0.01 (quick 0.03).
- tf_improves_with_L: the TF's accuracy at the largest L >= at the smallest.
- tf_nll_decreases_with_L: the TF's NLL rises by <= 0.02 between successive L.
- gd_beats_tf_at_smallest_L: acc_GD − acc_TF >= 0 at the smallest L.

Time on 2 CPU cores: quick ≈ 5 s; paper 14.4 core-hours projected, the longest run 1.1 h (≈ 7.2 h with
``--workers 2``); 1 seed at 800 updates a run gives 8/8 in 5.4 min.

What did not match: nothing at quick (docs/papers/wang2025.md "Fig. 2 with RBF attention"). The paper's text has no
RBF numbers, so only the qualitative statements are compared; RBF is ≈ 0.06 below softmax at quick and its GD model
is not converged after 150 updates.
"""

from __future__ import annotations

from iclab.experiments.registry import card
from iclab.experiments.wang2025._setup import QUICK, SMOKE
from iclab.experiments.wang2025._sweep_L import SweepLConfig, plot_sweep_L, run_sweep_L, sweep_claims

QUICK_PRESET = dict(
    **QUICK, kernel="rbf", L_grid=(512, 4096), match_acc_tol=0.05, match_nll_tol=0.2, data_efficiency_tol=0.03
)
# the authors' 1-layer rbf lr 1e-3 for both GD and TF (paper_optimiser)
PAPER_PRESET = dict(n_blocks=1, kernel="rbf", L_grid=(2048, 4096, 8192, 16384, 32768))
run, plot = run_sweep_L, plot_sweep_L
claims = sweep_claims(gd_is_data_efficient="4 updates: GD's accuracy at two L differs by test-set noise")
CARD = card(
    SweepLConfig,
    "Fig. 2 with RBF attention: one block, GD vs Trained TF vs L",
    smoke=dict(**SMOKE, kernel="rbf", L_grid=(32, 64)),
    quick=QUICK_PRESET,
    paper=PAPER_PRESET,
)
