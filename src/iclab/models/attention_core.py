"""The multi-head "scores × values" update shared by every attention layer.

Head h sends target token t_j the sum Σ_i h̃_h(k_{h,i}, q_{h,j}) v_{h,i} over the m sources s_i, with
key k_{h,i} = W_{K,h} s_i, query q_{h,j} = W_{Q,h} t_j and value v_{h,i} = W_{V,h} s_i (Ahn et al. 2023,
eq. (3); Cheng, Chen, Sra 2024, eq. (2) and, per head, eq. (26); Zhang et al. 2025, eq. M).
:func:`attention_update` returns ``scale`` · Σ_h of it. The layers differ only in how they build the
maps (:class:`~iclab.models.LinearAttention`: W_K = I, W_Q = Q_h, W_V = P_h on the full token;
:class:`~iclab.models.KernelAttention`: [B, 0], [C, 0] or Q, K, and V = [[A, 0], [0, r]]) and are thin
wrappers around this function.

Linear heads are evaluated by associativity, Δ_j = t_jᵀ Σ_h W_{Q,h}ᵀ W_{K,h} (Σ_i s_i s_iᵀ) W_{V,h}ᵀ (in
rows): one (B, D, D) Gram matrix, mixed over heads at (D, D) size, then one product with the targets.
No m×T score matrix and no per-head (m, ·) key or value tensor is formed: O(m·D²) per prompt. The
other scores come from :func:`iclab.core.kernels.gram`, softmax normalised over the m sources.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from iclab.core.errors import require, require_shape
from iclab.core.kernels import INNER_PRODUCT_KERNELS, gram


def attention_update(
    sources: Tensor,
    targets: Tensor,
    query_maps: Tensor,
    value_maps: Tensor,
    activations: Sequence[str],
    *,
    key_maps: Tensor | None = None,
    sigma: float = 1.0,
    logit_cap: float | None = None,
    scale: float = 1.0,
) -> Tensor:
    """scale · Σ_h Σ_i h̃_h(W_{K,h} s_i, W_{Q,h} t_j) W_{V,h} s_i for every target t_j. (B, T, e).

    ``sources`` (B, m, D_s), ``targets`` (B, T, D_t); per-head maps ``query_maps`` (H, k, D_t),
    ``value_maps`` (H, e, D_s) and ``key_maps`` (H, k, D_s), where ``None`` means W_K = I (keys are the
    sources; then k = D_s). ``activations``: one name from ``("linear", "relu", "exp", "softmax")`` per
    head; softmax is normalised over the m sources of each target. ``sigma`` is the exp/softmax
    bandwidth, exp(kᵀq/σ²); ``logit_cap`` caps exp heads' logits (an overflow guard, exact below the
    cap; :func:`~iclab.core.kernels.gram`). Consecutive heads with the same activation are evaluated in
    one batched call (parameter slices only, so this also runs under ``torch.func.vmap``).
    """
    H = len(activations)
    owner = "attention_update"
    require(owner, "activations", H >= 1, "a non-empty sequence, one name per head", activations)
    for act in activations:
        require(owner, "activations", act in INNER_PRODUCT_KERNELS, f"names from {INNER_PRODUCT_KERNELS}", act)
    B, _, Ds = sources.shape
    k = Ds if key_maps is None else key_maps.shape[1]
    require_shape(owner, "targets", tuple(targets.shape), (B, None, None))
    require_shape(owner, "query_maps", tuple(query_maps.shape), (H, k, targets.shape[-1]))
    require_shape(owner, "value_maps", tuple(value_maps.shape), (H, None, Ds))
    if key_maps is not None:
        require_shape(owner, "key_maps", tuple(key_maps.shape), (H, None, Ds))

    def heads(t: Tensor, a: int, b: int) -> Tensor:
        return t if (a, b) == (0, H) else t[a:b]

    out: Tensor | None = None
    gram_matrix: Tensor | None = None  # Σ_i s_i s_iᵀ, shared by every linear head
    start = 0
    while start < H:  # one run [start, stop) of heads sharing an activation
        act, stop = activations[start], start + 1
        while stop < H and activations[stop] == act:
            stop += 1
        Wq, Wv = heads(query_maps, start, stop), heads(value_maps, start, stop)
        Wk = None if key_maps is None else heads(key_maps, start, stop)
        if act == "linear":
            if gram_matrix is None:
                gram_matrix = sources.transpose(1, 2) @ sources  # (B, D_s, D_s)
            KQ = Wq if Wk is None else Wk.transpose(-1, -2) @ Wq  # (h, D_s, D_t): W_Kᵀ W_Q
            mix = torch.einsum("hst,bsu,heu->bte", KQ, gram_matrix, Wv)  # (B, D_t, e): Σ_h W_Qᵀ W_K G W_Vᵀ
            part = targets @ mix
        else:
            keys = sources.unsqueeze(1) if Wk is None else torch.einsum("bis,hks->bhik", sources, Wk)
            queries = torch.einsum("bjt,hkt->bhjk", targets, Wq)  # (B, h, T, k)
            keys = keys.expand(-1, queries.shape[1], -1, -1)  # (B, h, m, k)
            cap = logit_cap if act == "exp" else None
            scores = gram(act, keys, queries, sigma=sigma, logit_cap=cap)  # (B, h, m, T)
            values = torch.einsum("bis,hes->bhie", sources, Wv)  # (B, h, m, e)
            part = torch.einsum("bhij,bhie->bje", scores, values)
        out = part if out is None else out + part
        start = stop
    assert out is not None
    return out if scale == 1.0 else out * scale
