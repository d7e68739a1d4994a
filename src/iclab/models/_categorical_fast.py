"""The Trained TF's fast path: :class:`~iclab.models.categorical_attention.CategoricalTransformer` with less work.

Taken by ``mode='free'``, ``erasure='kernel'`` (the authors' Trained TF: free matrices, both self-attention heads
ordinary heads) with the softmax, linear, exp or rbf kernel, see ``CategoricalTransformer.uses_fast_path``. Paper
tokens are columns e = (x; u; E; f) ∈ R^{d+3d'} (eq. 4); here rows (B, T, D). A head's score is s_ij = (W_K e_i)ᵀ(W_Q e_j) = e_iᵀ A e_j
with A = W_Kᵀ W_Q, its output P Σ_i softmax_i(s_ij) W_V e_i = V Σ_i softmax_i(s_ij) e_i with V = P W_V (eq. 26-30
with free matrices; the softmax runs over the n context tokens, queries masked as keys).

* **First block** (eq. 36-44 on the tokens of eq. 4/23: E = w̄_e at every token, F = 0). Write s_i = (x_i; u_i) ∈ R^r,
  r = d + d'. Then e_iᵀ A e_j = s_iᵀ q̃_j + (terms without i), q̃_j = A[s,s] s_j + A[s,E] w̄_e; the softmax over the
  sources i drops the terms without i, and since the weights sum to one, Σ_i p_ij V e_i = V[:,s] Σ_i p_ij s_i +
  V[:,E] w̄_e. Both heads therefore attend with r-wide (15-wide at §6.1) queries to the same keys = values s_i,
  instead of D = 25-wide keys and values: one :class:`_SharedKVSoftmax` over 2T query rows (heads interleaved), with
  a hand-written backward (the x columns, data, get no gradient; only the d' columns of u do).
* **First block, unnormalised kernels** (:func:`first_block_kernel`: linear, exp, rbf). Nothing cancels, but every
  score is still s_iᵀb_j plus a per-query term (and for rbf a per-key one, ‖K_h s_i‖²/2): the heads read the r-wide
  s_i and their values are V_h,s s_i plus a constant, in torch but for rbf's per-key quadratic forms (the C kernel
  ``_quad_form.c``, :mod:`iclab.models._quad_form`); docs/performance.md times it against the general block.
* **Query-only block** (the last block: the readout needs the query tokens only): s_iq = e_iᵀ (A e_q), so a query
  needs A e_q (one D-vector per head) and Σ_i p_iq e_i; no key or value projection of the n context tokens.
* Cross-attention (eq. 38-44): the matrix chains are folded, logits ẽ (W_Q^cᵀ W_K^c W_e) and values
  W_eᵀ W_V^cᵀ P^cᵀ, one (D, C) and one (C, D) product per token.

* The GD model's cross-attention over every context token (:func:`cross_softmax`, eq. 38-43: 5-wide queries, the
  C = 25 columns of W_e as keys and values) runs, in float32 on the CPU, in the C kernel's ``cross_softmax_*``: eight
  rows along the vector lanes, the weights recomputed in the backward instead of stored.

The shared head runs, for float32 CPU rows 16 wide (§6.1: 15 padded), in the fused C kernel ``_kv_softmax.c`` (scores,
softmax and both products per block of 6 query rows in L1; built on first use by :func:`native`; :data:`NATIVE` or
``ICLAB_NATIVE=0`` turns it off), else in chunks of torch batched products. Middle blocks of K ≥ 3 run the general
code. Outputs and gradients equal the general path's to float rounding (tests/test_categorical_fast.py, float64 to
1e-10; the C kernel against the float64 head to float32 rounding). Measured in benchmarks/bench_categorical.py and
docs/performance.md.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from iclab.core import native as native_kernels
from iclab.core.threads import map_on_threads
from iclab.models._quad_form import quad_forms

#: contexts per thread in one chunk of :class:`_SharedKVSoftmax`: a chunk's (c, M, n) scores stay in L2 (measured:
#: 4-16 equally good, the whole batch at once 1.4× slower)
CHUNK = 8

#: source width rounded up to this many columns (zero-padded): MKL's batched GEMM with 16-wide operands is up to 2×
#: faster than with 15-wide ones (probabilities @ sources)
ALIGN = 8


#: run :class:`_SharedKVSoftmax` on float32 CPU tensors 16 wide by the fused C kernel ``_kv_softmax.c`` where it can
#: be built (:mod:`iclab.core.native`); environment ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
_SOURCE = Path(__file__).with_name("_kv_softmax.c")
#: what runs slower by the torch code (docs/performance.md: 1.1-1.55× the C kernel's head)
COST = "the Trained TF's first softmax head up to 1.5× slower"
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES: dict[str, native_kernels.Signature] = {
    "kv_softmax_forward": ([_I] * 4 + [_P] * 5, _I),
    "kv_softmax_backward": ([_I] * 6 + [_P] * 7, _I),
    "cross_softmax_forward": ([_I] * 5 + [_P] * 4, _I),
    "cross_softmax_backward": ([_I] * 5 + [_P] * 7, _I),
}


class BlockWeights(Protocol):
    """The weights of one free block (``categorical_attention._FreeBlock``), paper orientation: self-attention
    W_Q, W_K, W_V, P (2, D, D), cross-attention W_Q^c (d', D), W_K^c (d', d'), W_V^c (D, d'), P^c (D, D)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    P: Tensor
    W_Qc: Tensor
    W_Kc: Tensor
    W_Vc: Tensor
    Pc: Tensor


def native() -> ctypes.CDLL | None:
    """The compiled ``_kv_softmax.c`` (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, cost=COST)


def _lib() -> ctypes.CDLL:
    """:func:`native` where :func:`_uses_native` said it is built."""
    lib = native()
    assert lib is not None
    return lib


def _uses_native(q: Tensor) -> bool:
    ok = q.dtype == torch.float32 and q.device.type == "cpu" and q.shape[-1] == 16
    return NATIVE and ok and native() is not None


def _split(fn: Callable[..., int], B: int, *args: object, threads: int | None = None) -> None:
    """fn(b0, b1, *args) over [0, B) in ``threads`` (default: torch's) contiguous slices, one per thread of
    :func:`~iclab.core.threads.map_on_threads` (ctypes releases the GIL); tensors are passed as pointers."""
    k = max(1, min(torch.get_num_threads() if threads is None else threads, B))
    ptrs = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]
    bounds = [B * t // k for t in range(k + 1)]
    codes = map_on_threads(lambda t: fn(bounds[t], bounds[t + 1], *ptrs), range(k))
    if any(codes):
        raise MemoryError("_kv_softmax.c could not allocate its scratch buffers")


class _SharedKVSoftmax(torch.autograd.Function):
    """o_j = Σ_i softmax_i(q_jᵀ s_i) s_i per context, keys = values = s = [x | u | 0] (B, n, R); q (B, M, R).

    By the C kernel where :func:`_uses_native` (the batch split over torch's thread count), else in chunks of
    :data:`CHUNK` contexts per thread, so that each chunk's (c, M, n) scores, probabilities and score gradients stay in
    cache; only the probabilities are kept for the backward. Backward, with dP = g sᵀ: dS = P ⊙ (dP − Σ_i p_ij dP_ij)
    (as torch's softmax backward: exact cancellation where a row saturates), dq = dS s, ds = dSᵀ q + Pᵀ g, the last
    only for the columns that need it (u; x too if it requires a gradient). The pad columns of q must be 0.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, x: Tensor, u: Tensor) -> Tensor:
        q = q.contiguous()
        B, M, R = q.shape
        n, rx, ru = x.shape[1], x.shape[-1], u.shape[-1]
        s = torch.cat([x, u, x.new_zeros(B, n, R - rx - ru)], dim=-1)  # (B, n, R)
        keep = any(ctx.needs_input_grad)
        o = q.new_empty(B, M, R)
        ctx.widths, ctx.native = (rx, ru), _uses_native(q)
        if ctx.native:  # kept: the weights exp(score − max) in 16-aligned rows (B, M, np) and 1 / their sums (B, M)
            p, inv = (q.new_empty(B, M, -(-n // 16) * 16), q.new_empty(B, M)) if keep else (None, None)
            _split(_lib().kv_softmax_forward, B, M, n, q, s, p, inv, o)
        else:  # kept: the probabilities (B, M, n)
            p, inv = q.new_empty(B, M, n) if keep else None, None
            _torch_forward(q, s, p, o)
        if keep:
            ctx.save_for_backward(q, s, p, inv)
        return o

    @staticmethod
    @native_kernels.first_order("set model.fast = False (the plain torch pass)")
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        q, s, p, inv = ctx.saved_tensors
        rx, ru = ctx.widths
        need_q, need_x, need_u = ctx.needs_input_grad
        g = g.contiguous()
        B, M, n = q.shape[0], q.shape[1], s.shape[1]
        cols = slice(0 if need_x else rx, rx + ru)  # the source columns that need a gradient
        width = cols.stop - cols.start
        dq = torch.empty_like(q) if need_q else None
        ds_t = q.new_empty(B, width, n) if need_x or need_u else None  # (B, w, n): dsᵀ of those columns
        if ctx.native:
            w = width if ds_t is not None else 0
            _split(_lib().kv_softmax_backward, B, M, n, cols.start, w, q, s, p, inv, g, dq, ds_t)
        else:
            _torch_backward(q, s, p, g, dq, ds_t, cols)
        if ds_t is None:
            return dq, None, None
        ds = ds_t.mT  # (B, n, w): the columns cols.start .. rx + ru
        return dq, ds[..., :rx] if need_x else None, ds[..., rx - cols.start :] if need_u else None


def _torch_forward(q: Tensor, s: Tensor, p: Tensor | None, o: Tensor) -> None:
    """The forward of :class:`_SharedKVSoftmax` by chunks of batched products, into ``o`` and ``p`` (unless None)."""
    B, M, n = q.shape[0], q.shape[1], s.shape[1]
    c = B if q.is_cuda else CHUNK * torch.get_num_threads()  # a GPU takes the batch at once
    scratch = q.new_empty(min(c, B), M, n)
    for a in range(0, B, c):
        b = min(a + c, B)
        sc = torch.bmm(q[a:b], s[a:b].mT, out=scratch[: b - a])  # (c, M, n) scores
        pc = torch.softmax(sc, -1, out=p[a:b]) if p is not None else torch.softmax(sc, -1)
        torch.bmm(pc, s[a:b], out=o[a:b])  # (c, M, R)


def _torch_backward(q: Tensor, s: Tensor, p: Tensor, g: Tensor, dq: Tensor | None, ds_t: Tensor | None,
                    cols: slice) -> None:  # fmt: skip
    """The backward of :class:`_SharedKVSoftmax` by chunks of batched products, into ``dq`` and ``ds_t``."""
    B, M, n = p.shape
    q_t, g_t = q[..., cols].mT.contiguous(), g[..., cols].mT.contiguous()  # (B, w, M)
    c = B if q.is_cuda else CHUNK * torch.get_num_threads()  # a GPU takes the batch at once
    scratch = q.new_empty(min(c, B), M, n)
    for a in range(0, B, c):
        b = min(a + c, B)
        dsc = torch.bmm(g[a:b], s[a:b].mT, out=scratch[: b - a])  # (c, M, n) dP
        dsc.sub_(torch.linalg.vecdot(dsc, p[a:b]).unsqueeze(-1)).mul_(p[a:b])  # dS = P ⊙ (dP − Σ_i p_ij dP_ij)
        if dq is not None:
            torch.bmm(dsc, s[a:b], out=dq[a:b])
        if ds_t is not None:
            torch.bmm(q_t[a:b], dsc, out=ds_t[a:b]).baddbmm_(g_t[a:b], p[a:b])


def shared_kv_softmax(q: Tensor, x: Tensor, u: Tensor) -> Tensor:
    """Σ_i softmax_i(q_jᵀ s_i) s_i with s_i = [x_i; u_i; 0] (keys = values): q (B, M, R), x (B, n, rx), u (B, n, ru)
    -> (B, M, R), R ≥ rx + ru, q's last R − rx − ru columns 0 (their outputs are 0). See :class:`_SharedKVSoftmax`."""
    return cast(Tensor, _SharedKVSoftmax.apply(q, x, u))  # Function.apply is unannotated


class _CrossSoftmax(torch.autograd.Function):
    """o_j = Σ_c softmax_c(k_cᵀ q_j) v_c (eq. 38-43) by the C kernel ``_kv_softmax.c`` (rows split over torch's
    threads): q (N, dk), keys (C, dk), values (C, dm), float32 CPU. Nothing (N, C) is stored; the backward
    recomputes the probabilities from q (dk-wide products, cheap) and sums the threads' shares of the keys' and values'
    gradients."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        q, keys, values = q.contiguous(), keys.contiguous(), values.contiguous()
        (N, dk), (C, dm) = q.shape, values.shape
        o = q.new_empty(N, dm)
        _split(_lib().cross_softmax_forward, N, C, dk, dm, q, keys, values, o)
        ctx.save_for_backward(q, keys, values)
        return o

    @staticmethod
    @native_kernels.first_order("set model.fast = False (the plain torch pass)")
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, keys, values = ctx.saved_tensors
        g = g.contiguous()
        (N, dk), (C, dm) = q.shape, values.shape
        k = max(1, min(torch.get_num_threads(), N))
        cp = -(-C // 8) * 8
        dq = torch.empty_like(q)
        dkt, dvt = q.new_empty(k, dk, cp), q.new_empty(k, dm, cp)  # each thread's share, transposed and padded
        bounds = [N * t // k for t in range(k + 1)]
        fn, ptrs = _lib().cross_softmax_backward, [a.data_ptr() for a in (q, keys, values, g, dq)]

        def run(t: int) -> int:
            return int(fn(bounds[t], bounds[t + 1], C, dk, dm, *ptrs, dkt[t].data_ptr(), dvt[t].data_ptr()))

        if any(map_on_threads(run, range(k))):
            raise MemoryError("_kv_softmax.c could not allocate the cross-attention's gradient sums")
        return dq, dkt.sum(0)[:, :C].T, dvt.sum(0)[:, :C].T


def _uses_native_cross(q: Tensor, keys: Tensor, values: Tensor) -> bool:
    ok = q.dtype == torch.float32 and q.device.type == "cpu" and keys.dtype == values.dtype == torch.float32
    ok = ok and 1 <= q.shape[-1] <= 16 and values.shape[-1] <= 16 and keys.shape[0] <= 64
    return NATIVE and NATIVE_CROSS and ok and native() is not None


#: run :func:`cross_softmax` by the C kernel where it applies (and :data:`NATIVE`); False: always the torch code
NATIVE_CROSS = True


def cross_softmax(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """Σ_c softmax_c(k_cᵀ q_j) v_c: q (..., dk), keys (C, dk), values (C, dm) -> (..., dm) (eq. 38-43), as
    :func:`~iclab.models._categorical_heads.softmax_cross_attention`; by :class:`_CrossSoftmax` for float32 CPU
    tensors at most 16 wide with at most 64 keys where the C kernel is built, else by torch (the same numbers to float
    rounding). The fused kernel reads q and writes the output only: no (..., C) scores, probabilities or their
    gradients go through memory (the GD model's cross-attention over every context token, §6.1)."""
    if not _uses_native_cross(q, keys, values):
        return torch.softmax(q @ keys.T, dim=-1) @ values
    o = cast(Tensor, _CrossSoftmax.apply(q.reshape(-1, q.shape[-1]), keys, values))  # Function.apply is unannotated
    return o.view(*q.shape[:-1], values.shape[-1])


def _cross(blk: BlockWeights, W: Tensor, zt: Tensor) -> Tensor:
    """zt + P^c Σ_c softmax_c((W_K^c w_{e,c})ᵀ W_Q^c ẽ_j) W_V^c w_{e,c} (eq. 38-44); W (d', C), zt (B, T, D).

    Both matrix chains are folded into (D, C) and (C, D) matrices: two products per token, none with a d'-wide side
    (MKL runs those at a third of the speed)."""
    logits = blk.W_Qc.T @ (blk.W_Kc @ W)  # (D, C): zt ↦ (W_K^c w_{e,c})ᵀ W_Q^c ẽ
    values = W.T @ (blk.Pc @ blk.W_Vc).T  # (C, D): W_eᵀ W_V^cᵀ P^cᵀ
    flat = zt.reshape(-1, zt.shape[-1])
    return torch.addmm(flat, torch.softmax(flat @ logits, dim=-1), values).view(zt.shape)


def first_block(
    blk: BlockWeights, W: Tensor, x: Tensor, U: Tensor, n: int, *, last: bool, logit_scale: float = 1.0
) -> Tensor:
    """The first free block on the tokens (x; U; w̄_e; 0) of eq. (4)/(23): (B, T, D), or the m = T − n query tokens
    only (B, m, D) when ``last``. ``blk`` holds the block's weights (paper orientation), W = W_e (d', C), x (B, T, d),
    U (B, T, d') (any rows: the query's is 0). The keys and values are the r-wide s_i = (x_i; u_i), see the module
    docstring. ``logit_scale``: both heads' scores × this (``CategoricalTransformerConfig.attn_logit_scale``)."""
    B, T, d = x.shape
    dp = U.shape[-1]
    r = d + dp
    R = -(-r // ALIGN) * ALIGN  # r rounded up: zero pad columns
    wbar = W.mean(1)  # (d',) w̄_e, the E slot of every token
    A = blk.W_K.mT @ blk.W_Q  # (2, D, D) e_iᵀ A_h e_j: head h's score
    A = A * logit_scale if logit_scale != 1 else A
    V = blk.P @ blk.W_V  # (2, D, D) head h's value and output map
    src, E = slice(0, r), slice(r, r + dp)
    # q̃_hj = A_h[s,s] s_j + A_h[s,E] w̄_e, rows (target, head), padded to R: (B, T', 2R) viewed as (B, 2T', R)
    Wq = nn.functional.pad(A[:, src, src], (0, 0, 0, R - r)).reshape(2 * R, r)  # (2R, r)
    bq = nn.functional.pad(A[:, src, E] @ wbar, (0, R - r)).reshape(2 * R)  # (2R,)
    tgt = slice(n, T) if last else slice(0, T)
    s_tgt = torch.cat([x[:, tgt], U[:, tgt]], dim=-1)  # (B, T', r)
    Tt = s_tgt.shape[1]
    q = torch.addmm(bq, s_tgt.reshape(B * Tt, r), Wq.T).view(B, 2 * Tt, R)
    o = shared_kv_softmax(q, x[:, :n], U[:, :n]).view(B * Tt, 2 * R)  # [Σ_i p_0ij s_i | Σ_i p_1ij s_i], padded
    Wv = nn.functional.pad(V[:, :, src], (0, R - r)).permute(1, 0, 2).reshape(-1, 2 * R)  # (D, 2R)
    bv = (V[0] + V[1])[:, E] @ wbar  # (D,) the heads' values of the constant E slot
    # e_j + the heads' constant part, then + the rest: ẽ (eq. 37)
    z_tgt = torch.cat([s_tgt + bv[src], (wbar + bv[E]).expand(B, Tt, dp), bv[r + dp :].expand(B, Tt, dp)], dim=-1)
    zt = torch.addmm(z_tgt.view(B * Tt, -1), o, Wv.T)  # (B T', D)
    return _cross(blk, W, zt).view(B, Tt, -1)


#: the unnormalised kernels whose first free block runs on the r-wide s_i (:func:`first_block_kernel`)
STRUCTURED_KERNELS = ("linear", "exp", "rbf")


def first_block_kernel(
    blk: BlockWeights,
    W: Tensor,
    x: Tensor,
    U: Tensor,
    n: int,
    *,
    kernel: str,
    last: bool,
    divide_by_n: bool = True,
) -> Tensor:
    """:func:`first_block` for the unnormalised kernels of :data:`STRUCTURED_KERNELS` (linear kᵀt, exp exp(kᵀt), rbf
    exp(−‖k − t‖²/2), ÷ n with ``divide_by_n``), the same arguments and result (their logits are not scaled).

    On e_i = (s_i; w̄_e; 0) head h's key is k_i = K_h s_i + κ_h (K_h = W_K,h[:, s], κ_h = W_K,h[:, E] w̄_e) and its query
    t_j = W_Q,h e_j, so k_iᵀt_j = s_iᵀ(K_hᵀt_j) + κ_hᵀt_j and, with t'_j = t_j − κ_h,
    −‖k_i − t_j‖²/2 = s_iᵀ(K_hᵀt'_j) − s_iᵀ(K_hᵀK_h)s_i/2 − ‖t'_j‖²/2: every score is s_iᵀb_j + c_j − a_i with r-wide b_j
    (a = 0 but for rbf). The value P_h W_V,h e_i = V_h,s s_i + V_h,E w̄_e, so head h writes
    (V_h,s Σ_i κ_ij s_i + V_h,E w̄_e Σ_i κ_ij) / n: no D-wide key, query or value of a context token is formed (the
    general block projects every token to 4 D columns; benchmarks/bench_categorical.py counts both blocks' FLOPs)."""
    B, T, d = x.shape
    dp, D = U.shape[-1], blk.W_Q.shape[-1]
    r = d + dp
    wbar = W.mean(1)  # (d',) w̄_e, the E slot of every token
    src, E = slice(0, r), slice(r, r + dp)
    Ks, kc = blk.W_K[:, :, src], blk.W_K[:, :, E] @ wbar  # (2, D, r), (2, D)
    tgt = slice(n, T) if last else slice(0, T)
    s_tgt, s_ctx = torch.cat([x[:, tgt], U[:, tgt]], dim=-1), torch.cat([x[:, :n], U[:, :n]], dim=-1)
    Tt = s_tgt.shape[1]
    t = (s_tgt.reshape(B * Tt, r) @ blk.W_Q[:, :, src].reshape(2 * D, r).T).view(B * Tt, 2, D)
    t = t + blk.W_Q[:, :, E] @ wbar  # (B T', 2, D)
    if kernel == "rbf":
        t = t - kc
        c = -0.5 * t.square().sum(-1)  # (B T', 2)
        a = quad_forms(s_ctx.reshape(B * n, r), Ks.mT @ Ks).view(B, n, 2).mT.unsqueeze(1)  # (B, 1, 2, n) ‖K_h s_i‖²/2
    else:
        c = (t * kc).sum(-1)
    b = torch.einsum("jhD,hDr->jhr", t, Ks).reshape(B, Tt * 2, r)  # rows (target, head)
    scores = (s_ctx @ b.mT).mT.view(B, Tt, 2, n) + c.view(B, Tt, 2, 1)  # ctx on the left: its gradient row-major
    if kernel == "rbf":
        w = torch.exp((scores - a).clamp_max(0))  # −‖k − t‖²/2 <= 0, as gram's clamp of the expansion
    else:
        w = torch.exp(scores) if kernel == "exp" else scores
    w = w.view(B, Tt * 2, n)
    V = blk.P @ blk.W_V  # (2, D, D) head h's value and output map
    o = torch.cat([(w @ s_ctx).view(B * Tt, 2 * r), w.sum(-1).view(B * Tt, 2)], dim=-1)  # [Σκs_0 | Σκs_1 | Σκ_0 | Σκ_1]
    Wv = torch.cat([V[:, :, src].permute(1, 0, 2).reshape(D, 2 * r), (V[:, :, E] @ wbar).T], dim=-1)  # (D, 2r + 2)
    e_tgt = torch.cat([s_tgt, wbar.expand(B, Tt, dp), s_tgt.new_zeros(B, Tt, dp)], dim=-1).view(B * Tt, D)
    zt = torch.addmm(e_tgt, o, Wv.T, alpha=1 / n if divide_by_n else 1)  # ẽ (eq. 37)
    return _cross(blk, W, zt.view(B, Tt, D))


def query_block(blk: BlockWeights, W: Tensor, z: Tensor, n: int, *, logit_scale: float = 1.0) -> Tensor:
    """A free block evaluated at the m = T − n query tokens only: z (B, T, D) -> (B, m, D). Scores e_iᵀ(A_h e_q)
    (× ``logit_scale``), outputs V_h Σ_i p_iq e_i: the context tokens are never projected (see the module
    docstring)."""
    B, T, D = z.shape
    ctx, zq = z.split([n, T - n], dim=1)  # (B, n, D), (B, m, D); one gradient concatenation, no zero-filled scatter
    A = blk.W_K.mT @ blk.W_Q  # (2, D, D)
    A = A * logit_scale if logit_scale != 1 else A
    V = blk.P @ blk.W_V  # (2, D, D)
    m = T - n
    aq = (zq @ A.reshape(2 * D, D).T).view(B, 2 * m, D)  # rows (query, head): A_h e_q
    p = torch.softmax((ctx @ aq.mT).mT, dim=-1)  # (B, 2m, n); ctx on the left: its gradient comes out row-major
    o = (p @ ctx).view(B, m, 2 * D)  # [Σ_i p_0iq e_i | Σ_i p_1iq e_i]
    zt = zq + o @ V.permute(1, 0, 2).reshape(D, 2 * D).T  # ẽ (eq. 37)
    return _cross(blk, W, zt)
