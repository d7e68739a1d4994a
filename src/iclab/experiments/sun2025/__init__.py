"""Sun, Jadbabaie, Azizan 2025, "On the Role of Transformer Feed-Forward Layers in Nonlinear In-Context Learning"
(arXiv 2501.18187; ALT 2026 as v3): bilinear (GLU without activation) feed-forward layers let transformers with
linear self-attention learn polynomial tasks in context, which no linear transformer can (Prop. 1); one block does a
GD step on a quadratic kernel (Thm 2), deep ones block-coordinate descent (Thm 6/9).

Cards (one module each): ``fig1`` (Fig. 1, 5-9: linear vs bilinear TFs, sub-network curves), ``fig2`` (Fig. 2, 10:
dense vs sparse bilinear layers on a sparse cubic), ``fig3`` (the untrained Thm-2 construction's loss vs n), ``fig4``
(training prompt length), ``theorem5`` (trained attention finds Γ*), ``constructions`` (Thm 6/9 BCD table, Prop. 4
counterexample), ``linear_depth`` (Prop. 1 at every depth), ``order_ablation`` (FFN → LSA vs LSA → FFN blocks).
The shared task, models and training (App. I) are in ``_setup``.

    iclab reproduce sun2025 --preset quick

Notes, reference numbers and what did not match: docs/papers/sun2025.md; paper errors: docs/errata.md (Sun et al. 2025).
"""
