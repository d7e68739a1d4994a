"""Wang, Convertino, Cheng, Henao, Carin 2025, "On Understanding Attention-Based In-Context Learning for
Categorical Data" (ICML 2025; docs/papers/wang2025.md).

Transformers with self-attention plus cross-attention to the class embeddings W_e perform functional gradient
descent on the categorical cross-entropy (eq. 2-3): K blocks of the GD construction (eq. 26-44) are K GD steps, and
a freely trained transformer ("Trained TF") of the same skeleton learns to match it. One reproduction card per
experiment:

- ``fig2`` / ``fig2_rbf``: one block (softmax / RBF attention), GD vs Trained TF vs the number L of training
  contexts (§6.1);
- ``fig3``: the GD model with 1-6 blocks over training;
- ``fig4_left``: two blocks, GD vs Trained TF vs L;
- ``fig4_right``: in-context classification of held-out classes (digits stand-in for ImageNet), GD vs linear
  probing (§6.2);
- ``appf``: single-step models on quadrant data, five kernels (App. F, Figs. 6-9);
- ``gd_init``: the Trained TF started at the GD model stays there (§5, App. I);
- ``language``: GD vs a transformer on next-token prediction of generated stories (§6.3).

Run them all: ``iclab reproduce wang2025 --preset quick`` (≈ 2-4 min on 2 CPU cores; one seed, minibatch 64-128,
100-400 updates, reduced L grids) or ``--preset paper`` (the authors' protocol: 5 seeds, minibatch 512, 5000 epochs
over L contexts; days on a CPU, hours on a GPU). The shared protocol (fixed L training contexts per seed, early
stopping on the validation NLL, the authors' learning-rate table) is in ``_setup.py``.
"""
