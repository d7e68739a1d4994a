"""Weights that make the bilinear transformer implement kernel GD and block-coordinate descent.

Sun, Jadbabaie, Azizan 2025, Thm 2 (App. C), Thm 6 / Thm 9 (App. G) and a counterexample to the bound of
Prop. 4 (§3.3, App. E; docs/errata.md). Each function returns a :class:`~iclab.models.BilinearTransformer`
in the dtype of its Γ; the tests check it against :mod:`iclab.algorithms.polynomial` in float64 to 1e-10.

Convention: the paper's LSA with P = e_D e_Dᵀ, Q = [[Γ, 0], [0, 0]] adds (1/n) Σ_j y_j φ_jᵀ Γ φ_i to the
label entry of token i (eq. 2, column i of P Z M Zᵀ Q Z). The query entry is therefore
φ_qᵀ Γᵀ h with h = (1/n) Σ_j φ_j y_j, and +ŷ = −φ_qᵀ Γᵀ h: one GD step with preconditioner A = −Γᵀ
(:class:`~iclab.algorithms.KernelGD`). Writing the step as x̄_qᵀ Γ x̄_i is the same only for a symmetric Γ
(Γ = −Λ⁻¹ is).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from iclab.core.errors import is_int, require, require_int
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig


def n_quadratic_features(d: int) -> int:
    """C(d+2, 2) = 1 + d + d(d+1)/2: the length of x̄ in eq. (7), the minimum d̄ of Thm 2."""
    return math.comb(d + 2, 2)


def quadratic_ffn_weights(
    d: int, d_bar: int | None = None, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    """App. C: (W_0, W_1), each (d̄, d̄), with scratch row (j, k) = x_j² − 1 (j = k) or x_j x_k (j < k), eq. (7) order.

    W_0 = [[0, 0], [W̃_0, 0]]: (x_j − 1)(x_j + 1) on squares, x_j · x_k on products; rows beyond C(d+2, 2) stay 0.
    """
    require_int("quadratic_ffn_weights", "d", d, 1)
    low = n_quadratic_features(d)
    d_bar = low if d_bar is None else d_bar
    require("quadratic_ffn_weights", "d_bar", is_int(d_bar, low), f"an int >= C(d+2, 2) = {low} for d = {d} (one scratch row per quadratic monomial)", d_bar)  # fmt: skip
    W0 = torch.zeros(d_bar, d_bar, dtype=dtype)
    W1 = torch.zeros(d_bar, d_bar, dtype=dtype)
    for m, (j, k) in enumerate(itertools.combinations_with_replacement(range(d), 2)):
        r = d + 1 + m
        W0[r, j + 1] = 1.0
        W1[r, k + 1] = 1.0
        if j == k:
            W0[r, 0], W1[r, 0] = -1.0, 1.0
    return W0, W1


def quadratic_lambda(d: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Λ = E[x̄x̄ᵀ] = diag(1, 1_d, 2 on each x_j² − 1, 1 on each x_j x_k) (Lemma 3), (C(d+2,2), C(d+2,2))."""
    lam = torch.ones(n_quadratic_features(d), dtype=dtype)
    for m, (j, k) in enumerate(itertools.combinations_with_replacement(range(d), 2)):
        lam[d + 1 + m] = 2.0 if j == k else 1.0
    return torch.diag(lam)


def _label_attention(gammas: Tensor, d_bar: int) -> tuple[Tensor, Tensor]:
    """(L, q, q) Γ's -> P = e_D e_Dᵀ, Q = [[Γ, 0], [0, 0]] (zero-padded to d̄), each (L, D, D)."""
    L, q = gammas.shape[0], gammas.shape[-1]
    P = torch.zeros(L, d_bar + 1, d_bar + 1, dtype=gammas.dtype)
    P[:, -1, -1] = 1.0
    Q = torch.zeros_like(P)
    Q[:, :q, :q] = gammas
    return P, Q


def _gamma(owner: str, gamma: Tensor, size: int, what: str) -> Tensor:
    g = torch.as_tensor(gamma)
    require(owner, "gamma", g.dim() >= 2 and tuple(g.shape[-2:]) == (size, size), f"{what} ({size}, {size})", tuple(g.shape))  # fmt: skip
    return g


def kernel_gd_block(d: int, gamma: Tensor | None = None, *, d_bar: int | None = None) -> BilinearTransformer:
    """Thm 2 (App. C): one block [FFN writing x̄ of eq. (7), LSA with Q = [[Γ, 0], [0, 0]]] = one kernel-GD step.

    ``gamma`` (C(d+2,2), C(d+2,2)), default −Λ⁻¹ = −diag(1, 1_d, ½ on squares, 1 on products) (Lemma 3).
    Equals ``algorithms.KernelGD(−Γᵀ)``. Needs d̄ ≥ C(d+2, 2) (the default).
    """
    require_int("kernel_gd_block", "d", d, 1)
    q = n_quadratic_features(d)
    if gamma is None:
        gamma = -torch.linalg.inv(quadratic_lambda(d))
    g = _gamma("kernel_gd_block", gamma, q, "a matrix over the C(d+2, 2) features of eq. (7),")
    d_bar = q if d_bar is None else d_bar
    W0, W1 = quadratic_ffn_weights(d, d_bar, dtype=g.dtype)
    cfg = BilinearTransformerConfig(d=d, d_bar=d_bar, n_blocks=1, ffn="dense", init_std=0.0)
    P, Q = _label_attention(g.unsqueeze(0), d_bar)
    return BilinearTransformer(cfg).to(g.dtype).load_weights(P=P, Q=Q, W0=W0[None], W1=W1[None])


def bcd_ffn_weights(d: int, n_blocks: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Thm 9: (W_0, W_1), each (L, 2d+1, 2d+1). W̃_0 = I_d; W̃_1 = E_1 (ℓ = 1), −E_{(ℓ−1)%d} + E_{ℓ%d} (ℓ > 1).

    Block ℓ's FFN turns the scratch entries x_j · x[(ℓ−1)%d] of the previous block into x_j · x[ℓ%d].
    """
    d_bar = 2 * d + 1
    W0 = torch.zeros(n_blocks, d_bar, d_bar, dtype=dtype)
    W1 = torch.zeros_like(W0)
    for ell in range(1, n_blocks + 1):
        W0[ell - 1, d + 1 :, 1 : d + 1] = torch.eye(d, dtype=dtype)
        W1[ell - 1, d + 1 :, 1 + (ell - 1) % d] += 1.0  # E_{ℓ%d}: column ℓ%d of ones (x's column ℓ%d is u's 1 + …)
        if ell > 1:
            W1[ell - 1, d + 1 :, 1 + (ell - 2) % d] -= 1.0
    return W0, W1


def bcd(d: int, gammas: Tensor) -> BilinearTransformer:
    """Thm 6 / Thm 9: d̄ = 2d+1, L = len(Γ) blocks doing L steps of block-coordinate descent (eq. 9, 10).

    ``gammas`` (L, 2d+1, 2d+1). ``block_predictions`` equals ``algorithms.BlockCoordinateDescent(−Γ_ℓᵀ).iterates``.
    """
    require_int("constructions.bcd", "d", d, 1)
    g = _gamma("constructions.bcd", gammas, 2 * d + 1, "an (L, 2d+1, 2d+1) stack, per-block")
    require("constructions.bcd", "gammas", g.dim() == 3 and g.shape[0] >= 1, "an (L, 2d+1, 2d+1) stack with L >= 1", tuple(g.shape))  # fmt: skip
    L = g.shape[0]
    W0, W1 = bcd_ffn_weights(d, L, dtype=g.dtype)
    cfg = BilinearTransformerConfig(d=d, d_bar=2 * d + 1, n_blocks=L, ffn="dense", init_std=0.0)
    P, Q = _label_attention(g, 2 * d + 1)
    return BilinearTransformer(cfg).to(g.dtype).load_weights(P=P, Q=Q, W0=W0, W1=W1)


def bcd_block_gram(d: int, ell: int = 1, dtype: torch.dtype = torch.float64) -> Tensor:
    """E[φ_ℓ φ_ℓᵀ] for φ_ℓ = (1, x, x[ℓ%d]·x): the identity except E[1 · x_ℓ²] = 1 and E[x_ℓ⁴] = 3."""
    j = 1 + d + (ell - 1) % d
    G = torch.eye(2 * d + 1, dtype=dtype)
    G[0, j] = G[j, 0] = 1.0
    G[j, j] = 3.0
    return G


def bcd_reference_gammas(d: int, n_blocks: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """(L, 2d+1, 2d+1): Γ^{(ℓ)} = −(population Gram of block ℓ)⁻¹: block-coordinate descent, Thm 6 (§4.1)."""
    return torch.stack([-torch.linalg.inv(bcd_block_gram(d, ell, dtype)) for ell in range(1, n_blocks + 1)])


def prop4_counterexample(dtype: torch.dtype = torch.float64) -> BilinearTransformer:
    """A counterexample to the bound of Prop. 4 (Sun et al. 2025, §3.3): d = 1, d̄ = 2 (no scratch row). The FFN
    overwrites the constant with 1 + (x² − 1)/√2, the LSA uses Γ = −diag(½, 1) = −Λ⁻¹ for the features
    (1 + (x²−1)/√2, x). Its loss tends to 2 − √2 ≈ 0.586 as n → ∞, below the bound C(3, 2) − d̃ = 1 that Prop. 4
    prints for d̃ = 2."""
    W0 = torch.tensor([[-1.0, 1.0], [0.0, 0.0]], dtype=dtype)  # row 0: x − 1
    W1 = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=dtype) / math.sqrt(2)  # row 0: (x + 1)/√2
    cfg = BilinearTransformerConfig(d=1, d_bar=2, n_blocks=1, ffn="dense", init_std=0.0)
    P, Q = _label_attention(-torch.diag(torch.tensor([0.5, 1.0], dtype=dtype))[None], 2)
    return BilinearTransformer(cfg).to(dtype).load_weights(P=P, Q=Q, W0=W0[None], W1=W1[None])
