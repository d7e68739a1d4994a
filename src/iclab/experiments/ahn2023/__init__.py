"""Ahn, Cheng, Daneshmand, Sra 2023, "Transformers learn to implement preconditioned gradient descent for
in-context learning" (NeurIPS 2023, arXiv 2306.00297).

Reproduces Fig. 1-2 (pattern (8) learns Σ⁻¹-preconditioned GD, Thm 3), Fig. 3-5 (pattern (11) learns GD++ with Σ⁻¹
preconditioning, Thm 4), Fig. 6 and 7 (App. D: the trained transformer against GD and Σ⁻¹-PGD, across N and L),
and, without a figure in the paper, Thm 1 (one layer learns Γ⋆), Thm 2 (two symmetric layers learn diagonal, in fact
scalar, preconditioners) and Thm 5 (the optimal scale of ReLU attention). One card (module) per experiment.

Run: ``iclab reproduce ahn2023 --preset quick`` (a few minutes on 2 CPU cores) or ``--preset paper``
(the paper's settings: hours on a CPU, minutes on a GPU). Notes: docs/papers/ahn2023.md.
"""
