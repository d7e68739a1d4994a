"""Wang et al. 2025, Fig. 2 (softmax panel): one attention block, GD vs the Trained TF vs the number L of training
contexts, on the §6.1 data (d = 10, C = 25, d' = 5, N = 125, λ = 10); test accuracy and NLL at the best validation
NLL, the dashed line the Bayes E[max p] / NLL on the same test queries.

What the paper shows (§6.1): the one-block transformer with the GD construction (W_Q = W_K = a[I_d 0], eq. 26-44;
"GD") and the same skeleton trained freely ("Trained TF") reach the same test accuracy and NLL once L is large; GD
needs far fewer training contexts. Both stay below the Bayes rate E[max_c p] of the generator.

Run: ``iclab run wang2025.fig2 --preset quick`` (``--preset paper``: 5 seeds, L = 2048 … 32768, the authors' lr
table, 5000 epochs).

Claims:
- tf_matches_gd_acc_at_largest_L: |acc_TF − acc_GD| <= 0.02 at the largest L (quick 0.05).
- tf_matches_gd_nll_at_largest_L: |NLL_TF − NLL_GD| <= 0.05 there (quick 0.2).
- tf_approaches_gd_with_L: the GD − TF accuracy gap and the TF − GD NLL gap are both smaller at the largest L.
- gd_below_bayes_rate: the best GD accuracy <= Bayes E[max p] on the test queries + 3 s.e.
- gd_is_data_efficient: GD accuracy at the smallest and largest L within 0.01 (quick 0.03).
- tf_improves_with_L: the TF's accuracy at the largest L >= at the smallest.
- tf_nll_decreases_with_L: the TF's NLL rises by <= 0.02 between successive L.
- gd_beats_tf_at_smallest_L: acc_GD − acc_TF >= 0 at the smallest L.

Time on 2 CPU cores: quick ≈ 11 s (one seed, L ∈ {512, 4096}, 150 updates of 128, lr 0.03); paper 11.5 core-hours
projected, the longest run 41 min (≈ 5.8 h with ``--workers 2``); 1 seed at 2000 updates a run passes 8/8 in 3 min.

What did not match: nothing at quick (docs/papers/wang2025.md "Quick presets"); the paper's figure values are not in
its text, so only the qualitative statements are compared, and quick uses one constant lr 0.03 for both models.
"""

from __future__ import annotations

from iclab.experiments.registry import card
from iclab.experiments.wang2025._setup import QUICK, SMOKE
from iclab.experiments.wang2025._sweep_L import SweepLConfig, plot_sweep_L, run_sweep_L, sweep_claims

QUICK_PRESET = dict(**QUICK, L_grid=(512, 4096), match_acc_tol=0.05, match_nll_tol=0.2, data_efficiency_tol=0.03)
run, plot = run_sweep_L, plot_sweep_L
claims = sweep_claims(tf_approaches_gd_with_L="4 updates: the gaps between two untrained models are noise")
CARD = card(
    SweepLConfig,
    "Fig. 2: one attention block, GD vs Trained TF vs number of training contexts L",
    smoke=dict(**SMOKE, L_grid=(32, 64)),
    quick=QUICK_PRESET,
    paper=dict(n_blocks=1, L_grid=(2048, 4096, 8192, 16384, 32768)),
)
