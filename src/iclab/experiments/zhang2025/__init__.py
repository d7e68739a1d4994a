"""Zhang, Singh, Latham, Saxe 2025, "Training dynamics of in-context learning in linear attention" (ICML 2025).

Reproduces the paper's Figs 1, 3-9 and 11-14: multi-head linear attention with merged key-query (ATTN_M, eq. M) has
one abrupt drop, as a two-layer linear MLP on the cubic feature (eq. 6-7); with separate rank-R key and query
(ATTN_S, eq. S) it learns the principal components of Λ one (or R) at a time, through plateaus at the losses
L(M_m) of eq. (19) (eq. 26 for the next-token loss), which makes it in-context principal component regression
(eq. 22). Closed forms come from :mod:`iclab.theory.attention_dynamics`; docs/papers/zhang2025.md holds the
equations, the hyper-parameter mapping and what does not match.

    iclab reproduce zhang2025 --preset quick

One card per figure: ``fig1`` (ATTN_M ≡ MLP), ``fig9`` (its weights), ``fig3`` (ATTN_S rank one), ``fig4`` /
``fig12`` / ``fig11`` (rank R), ``fig13`` (repeated eigenvalues), ``fig6`` (init scale), ``fig7`` (N = 127),
``fig8`` (next-token loss), ``fig5`` (softmax), ``fig14`` (in-context vs in-weight). ``regime="population"`` runs the
exact population gradient flow, ``regime="full_batch"`` the paper's GD on P fixed sequences (_setup.py).
"""
