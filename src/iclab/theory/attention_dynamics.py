"""Population statistics and losses of multi-head linear attention on in-context linear regression.

Zhang, Singh, Latham, Saxe 2025 ("Training dynamics of in-context learning in linear attention").
Data: x ~ N(0, Λ) in R^D, w ~ N(0, I_D), y = wᵀx, N context pairs, no label noise. After the
zero-block reduction every model of the paper predicts ŷ_q = βᵀ W x_q with β = (1/N) Σ_n y_n x_n
(eq. 4) and an effective D×D matrix W (W = Σ_i v_i U_i for ATTN_M, Σ_i Σ_r v_i k_ir q_irᵀ for ATTN_S).

``inv_n`` is the statistic 1/N that enters the theory: 1/N for a fixed context length, E(1/N) when the
length varies (next-token loss, eq. 23, 26; see :func:`expected_inv_n`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from iclab.core.errors import require


def _check_lambda(Lambda: Tensor) -> None:
    require(
        "attention_dynamics",
        "Lambda",
        Lambda.ndim == 2 and Lambda.shape[0] == Lambda.shape[1] and bool(torch.allclose(Lambda, Lambda.mT)),
        "a symmetric (D, D) covariance",
        tuple(Lambda.shape),
    )


def _check_inv_n(inv_n: float) -> None:
    require("attention_dynamics", "inv_n", 0.0 <= float(inv_n) <= 1.0, "1/N or E(1/N), in [0, 1]", inv_n)


def expected_inv_n(n_max: int) -> float:
    """E(1/N) for N ~ Uniform{1..n_max}: H_{n_max}/n_max (the next-token loss, eq. 23, 26).

    n_max = 31 gives 0.129911.
    """
    require("expected_inv_n", "n_max", isinstance(n_max, int) and n_max >= 1, "an int >= 1", n_max)
    return sum(1.0 / k for k in range(1, n_max + 1)) / n_max


def second_moment_hat(Lambda: Tensor, inv_n: float) -> Tensor:
    """E(Λ̂²) = Λ² + E(1/N)(Λ + tr(Λ) I)Λ, eq. (30); with a fixed N, eq. (31) = (15).

    Λ̂ = (1/N) Σ_n x_n x_nᵀ is the in-context covariance (eq. 27); uses E[x xᵀ x xᵀ] = 2Λ² + tr(Λ)Λ.
    """
    _check_lambda(Lambda)
    _check_inv_n(inv_n)
    eye = torch.eye(Lambda.shape[0], dtype=Lambda.dtype, device=Lambda.device)
    return Lambda @ Lambda + inv_n * (Lambda + torch.trace(Lambda) * eye) @ Lambda


def population_loss(W: Tensor, Lambda: Tensor, inv_n: float) -> Tensor:
    """L(W) = E(y_q − βᵀ W x_q)² = tr Λ − 2 tr(Λ² W) + tr(Wᵀ E(Λ̂²) W Λ); (..., D, D) -> (...).

    Exact for Gaussian x, w ~ N(0, I) and no label noise (the loss of eq. 5, no ½; consistent with
    the fixed-point losses of eq. 19 and 63).
    """
    A = second_moment_hat(Lambda, inv_n)
    L2 = Lambda @ Lambda
    lin = torch.einsum("ij,...ji->...", L2, W)
    quad = torch.einsum("...ji,jk,...kl,li->...", W, A, W, Lambda)
    return torch.trace(Lambda) - 2 * lin + quad


def population_gradient(W: Tensor, Lambda: Tensor, inv_n: float) -> Tensor:
    """G(W) = −½ ∂L/∂W = Λ² − E(Λ̂²) W Λ, the "common term" of the gradient flow (eq. 57); (..., D, D)."""
    A = second_moment_hat(Lambda, inv_n)
    return Lambda @ Lambda - A @ W @ Lambda
