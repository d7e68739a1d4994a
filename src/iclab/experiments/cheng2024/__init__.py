"""Cheng, Chen, Sra 2024, "Transformers implement functional gradient descent to learn non-linear
functions in context" (ICML 2024).

Reproduces Figs 1-6: the test loss of transformers with attention activation h̃ against n and L on K-GP data
beside the Bayes predictor (Figs 1, 2), convergence to the Thm 4.5/4.6 stationary points (Figs 3, 5, 6), and a
2-head (linear + exp) model on composite-kernel data (Fig. 4, App. D). Shared set-up in ``_setup.py``
(App. H.1) and ``_stationary.py`` (Figs 3, 5, 6); one card per figure.

Run: ``iclab reproduce cheng2024 --preset quick`` (minutes on 2 CPU cores; a reduced grid) or
``--preset paper`` (App. H.1's settings: batch 30 000 resampled every 10 steps, 3 seeds with their
own Σ = UᵀDU; weeks on a CPU, meant for a GPU). Notes and results: docs/papers/cheng2024.md.
"""
