"""Attention pieces of :mod:`iclab.models.categorical_attention` shared by its models (Wang et al. 2025): kernel heads
over the context keys, the erasure head's weights, softmax cross-attention to W_e's columns."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from iclab.core.kernels import KernelName, gram


def kernel_head(
    kernel: KernelName,
    keys: Tensor,
    queries: Tensor,
    values: Tensor,
    *,
    divide_by_n: bool = True,
    weights: Tensor | None = None,
) -> Tensor:
    """Σ_{i≤n} κ(k_i, q_j) v_i for every target j: keys (B, n, ·), queries (B, T, ·), values (B, n, k) -> (B, T, k).

    The n keys are the context tokens only (queries masked as keys); softmax is normalised over them.
    ``divide_by_n``: ÷ n for the unnormalised kernels. ``weights`` (B, T, n): precomputed κ(k_i, q_j) in
    target-major layout (the GD model's scores are the same in every block); see :func:`head_weights`.
    """
    w = head_weights(kernel, keys, queries) if weights is None else weights  # (B, T, n)
    out = weigh(w, values)  # (B, T, k)
    return out / keys.shape[1] if divide_by_n and kernel != "softmax" else out


#: value widths up to which :func:`weigh` takes the transposed orientation (measured: 2× faster at k = 5, slower
#: at k = 25, where the transposing copies cost more than the GEMM saves)
THIN_VALUES = 8


class _Weigh(torch.autograd.Function):
    """weights (B, T, n) @ values (B, n, k) with every product in the orientation MKL's batched GEMM is fast in.

    With few value columns (k ≪ n) a plain ``weights @ values`` runs at ~2 GB/s on CPU; the thin operand on
    the left, (valuesᵀ weightsᵀ)ᵀ, is ~2× faster, and the weight gradient is produced row-major, as the
    softmax backward reads it (autograd through the transposed form would hand it a transposed gradient and
    a (B, T, n) copy). Measured in benchmarks/bench_categorical.py.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(weights: Tensor, values: Tensor) -> Tensor:
        return (values.mT.contiguous() @ weights.mT).mT

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        weights, values = ctx.saved_tensors
        g_w = grad @ values.mT if ctx.needs_input_grad[0] else None  # (B, T, n) row-major
        g_v = (grad.mT.contiguous() @ weights).mT if ctx.needs_input_grad[1] else None  # (B, n, k)
        return g_w, g_v


def weigh(weights: Tensor, values: Tensor) -> Tensor:
    """weights (B, T, n) @ values (B, n, k) -> (B, T, k) (a transposed view), the same product as ``@``,
    computed in the orientation that is fast on CPU for thin values (see :class:`_Weigh`); differentiable
    once (not twice)."""
    if values.shape[-1] > THIN_VALUES:
        return weights @ values
    return cast(Tensor, _Weigh.apply(weights, values))  # Function.apply is unannotated


def head_weights(kernel: KernelName, keys: Tensor, queries: Tensor) -> Tensor:
    """κ(k_i, q_j) as (B, T, n), target-major: ``gram``'s (B, n, T) transposed (for softmax a free view, since
    ``gram`` normalises along contiguous memory), so that w @ values and its backward read rows."""
    return gram(kernel, keys, queries).transpose(1, 2)


def scaled_head_weights(kernel: KernelName, scale: Tensor, keys: Tensor, queries: Tensor) -> Tensor:
    """:func:`head_weights` of ``scale`` · keys and ``scale`` · queries for a scalar ``scale`` (the GD model's a, eq.
    26-30 with W_Q = W_K = a[I_d 0]), (B, T, n): the data's inner products (linear, exp) or distances (rbf: squared,
    laplacian: L1) are formed without autograd and the scale enters after them, so the backward is elementwise on the
    weights alone (no gradient for the data, whose (B, n, d) products with a were most of a step). Keys or queries
    that need a gradient, and softmax, take :func:`head_weights` on the scaled inputs."""
    if kernel == "softmax" or keys.requires_grad or queries.requires_grad:
        return head_weights(kernel, scale * keys, scale * queries)
    with torch.no_grad():
        if kernel == "laplacian":
            base = (queries.unsqueeze(-2) - keys.unsqueeze(-3)).abs().sum(-1)
        else:
            base = queries @ keys.mT  # (B, T, n)
            if kernel == "rbf":  # ‖t − k‖² = ‖t‖² + ‖k‖² − 2 tᵀk, as gram expands it
                sq = queries.square().sum(-1, keepdim=True) + keys.square().sum(-1).unsqueeze(-2)
                base = (sq - 2 * base).clamp_min(0)
    if kernel == "linear":
        return scale * scale * base
    if kernel == "exp":
        return torch.exp(scale * scale * base)
    if kernel == "rbf":
        return torch.exp(-0.5 * scale * scale * base)
    return torch.exp(-scale.abs() * base)


def erasure_weights(kind: str | None, keys: Tensor, queries: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Weights of the erasure head: (context weights (B, n, T), self weights (B, T)).

    ``keys``/``queries`` (B, T, ·) are W_K e and W_Q e of every token. Target j attends to the n context
    tokens and, if it is a query (j ≥ n), to itself. ``rbf``: exp(−‖k_i − q_j‖²/2), the i = j scores from
    the direct difference; ``softmax``: normalised over those keys; ``identity``: δ_ij.
    """
    B, T = queries.shape[:2]
    is_query = torch.arange(T, device=queries.device) >= n  # (T,)
    eye = torch.eye(n, T, dtype=torch.bool, device=queries.device)  # (n, T): i == j
    if kind == "identity":
        ctx = eye.to(queries.dtype).expand(B, n, T)
        return ctx, is_query.to(queries.dtype).expand(B, T)
    if kind == "rbf":
        self_score = torch.exp(-0.5 * (keys - queries).square().sum(-1))  # (B, T) κ(k_j, q_j), exact
        ctx = gram("rbf", keys[:, :n], queries)  # (B, n, T)
        ctx = torch.where(eye, _diagonal(self_score, n, T), ctx)
        return ctx, self_score * is_query
    if kind == "softmax":
        logits = keys[:, :n] @ queries.transpose(1, 2)  # (B, n, T)
        self_logit = (keys * queries).sum(-1).masked_fill(~is_query, float("-inf"))  # (B, T)
        top = torch.maximum(logits.amax(1), self_logit)  # (B, T)
        w_ctx, w_self = torch.exp(logits - top.unsqueeze(1)), torch.exp(self_logit - top)
        z = w_ctx.sum(1) + w_self
        return w_ctx / z.unsqueeze(1), w_self / z
    raise ValueError(f"erasure_weights: kind must be 'rbf', 'softmax' or 'identity'; got {kind!r}")


def _diagonal(self_score: Tensor, n: int, T: int) -> Tensor:
    """(B, T) self scores placed on the diagonal i = j of a (B, n, T) tensor (zeros elsewhere)."""
    diag = torch.diag_embed(self_score[:, :n], dim1=1, dim2=2)  # (B, n, n)
    return diag if n == T else torch.nn.functional.pad(diag, (0, T - n))


def erasure_failure_rate(x: Tensor) -> float:
    """Fraction of context rows j with argmax_i x_jᵀx_i ≠ j (i over the context): where the dot-product softmax
    erasure of the paper concentrates on the wrong token as λ → ∞ (≈ 12% on U[−1,1]^10, N = 125, docs/errata.md;
    0 when ‖x_i‖ is constant). ``x`` (B, n, d)."""
    inner = x @ x.transpose(1, 2)  # (B, n, n)
    arg = inner.argmax(1)  # (B, n) for each target j
    return float((arg != torch.arange(x.shape[1], device=x.device)).to(torch.float64).mean())


def softmax_cross_attention(queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """Σ_c softmax_c(k_cᵀ q_j) v_c: queries (B, T, k), keys (C, k), values (C, m) -> (B, T, m) (eq. 38-43).

    Plain softmax attention over the C keys (no temperature, no 1/√k; the stable max-subtracted softmax).
    """
    return torch.softmax(queries @ keys.T, dim=-1) @ values
