"""The fast path of :class:`~iclab.models.BilinearTransformer`: the whole stack as one autograd node.

On a CPU with a C compiler the node is :class:`_NativeStack`, the C kernel ``_bilinear.c`` (prompts in vector lanes,
the backward run inside the forward for a unit output gradient; docs/performance.md, Sun et al. 2025); elsewhere,
or with ``ICLAB_NATIVE=0``, the torch code below, which computes the same numbers.

A step of the bilinear transformer (Sun, Jadbabaie, Azizan 2025, eq. (2)-(3)) is products with one 13-wide side
over B·T tokens, so it runs at the rate the BLAS reaches on those shapes (docs/performance.md, Sun et al. 2025). Layer
by layer, every (B, T, D) activation also goes to memory and back; here chunks of ``CHUNK`` prompts go through all
sub-layers while they are in cache, and the backward is written by hand:

* **Tokens batch-last.** A chunk is kept as z (D, c, T): the token entries are contiguous planes, so the FFN is one
  (2d̄, k)·(k, c·T) GEMM, the label row and the FFN's halves a, b are row slices (no strided elementwise work, no
  concatenation), and a prompt's tokens are the (D, T) view z.permute(1, 0, 2)[b] that ``torch.bmm`` takes as is.
* **Attention in the transposed moment form.** With G = Σ_{i≤n} z_i z_iᵀ (the context's Gram matrix), eq. (2) is
  z_j ← R z_j for every token, R = I + Σ_h P_h G Q_h / n (the transpose of :func:`~iclab.models.attention_core.
  moment_layer`'s T; G is symmetric). Backward, with g the output gradient: dR = Σ_j g_j z_jᵀ, dG = Σ_h P_hᵀ dR Q_hᵀ / n,
  dz_j = Rᵀ g_j + (dG + dGᵀ) z_j for the context (Rᵀ g_j for the query).
* **FFN** u = z + [a ⊙ b; 0], [b; a] = [W_1; W_0] z[:d̄] (eq. 3; the label row passes): the forward keeps [b; a], the
  backward forms [g⊙b; g⊙a] = [∂a; ∂b], dz[:d̄] = g[:d̄] + [W_0ᵀ W_1ᵀ][∂a; ∂b], d[W_0; W_1] = [∂a; ∂b] z[:d̄]ᵀ.
* **What is kept.** The input of every FFN and its [b; a]; the input of an attention layer that follows an FFN is
  rebuilt from them (one ``addcmul``). Per attention layer, G, R and dR for every prompt ((B, D, D), small): the P, Q
  gradients, Σ_b dR_b (Q_hᵀ G_b) / n and Σ_b (G_b P_hᵀ) dR_b / n, are two products over the whole batch at the end.
* **What is skipped.** The read-out is the query's label entry, so the last attention layer updates the query row
  alone (dR has one non-zero row), an FFN after it changes nothing that is read (zero gradient), and the prompt is data
  (no input gradient). ``live`` entries: the prompt's scratch rows are zero, so the first FFN reads (1, x) only.

Chunks run on torch's threads (:func:`~iclab.core.threads.map_on_threads`); the chunk sums are added in chunk order,
so the result does not depend on the thread count. The backward is not itself differentiable (a backward with
``create_graph`` raises, :func:`iclab.core.native.first_order`): :meth:`BilinearTransformer.forward_tokens` is the path for higher derivatives and ``torch.func`` transforms.
Exactness: tests/test_bilinear_fast.py checks values and every parameter gradient against the token-level layers in
float64 to 1e-10, for both orders, dense, sparse and no FFN, several heads, label scaling and ragged chunks.
"""

from __future__ import annotations

import ctypes
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.threads import map_on_threads, split_evenly

CHUNK = 64  # prompts per chunk: a (13, 64, 201) float32 chunk is 669 KB, its [b; a] 1.2 MB (32-96 within 10%)
#: run float32 and float64 CPU passes by the C kernel ``_bilinear.c`` (:class:`_NativeStack`) where it can be built
#: (:mod:`iclab.core.native`); environment ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
NATIVE_PART = 128  # prompts per C call at most (a multiple of 4 calls per batch: the same split on 1, 2, 4 threads)
#: the most memory the C kernel's forward may keep for the backward: every prompt's d out / d(weights) (4 bytes x 3756
#: per prompt for the 12-layer Fig.-7 model); a bigger batch replays the forward in the backward instead
JACOBIAN_BYTES = 1 << 28
MAX_DIM = 24  # token widths the C kernel is built for (one build per width, unrolled: 3 s at 13, 12 s at 24)
#: build with AVX-512 where the CPU has it (16 float32 lanes); False: AVX2 (8), as on a CPU without it
WIDE = True
_SOURCE = Path(__file__).with_name("_bilinear.c")
#: what runs slower by the torch code (docs/performance.md: 439 against 97.5 ms a 12-layer step at batch 4000)
COST = "a BilinearTransformer training step about 4.5× slower"
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "bl_lanes": ([], _I),
        "bl_forward": ([_L, _I, _I, _P, _I, _P, _P, _P, _P], _I),
        "bl_backward": ([_L, _I, _I, _P, _I, _P, _P, _P, _P, _P], _I),
        "bl_jacobian": ([_L, _I, _I, _P, _I, _P, _P, _P, _P, _P], _I),
        "bl_vjp": ([_L, _L, _P, _P, _P], _I),
        "bl_embed": ([_L, _I, _P, _L, _P, _L, _P, _L, R, _P], _I),
    }
)


def native(dim: int, live: int) -> ctypes.CDLL | None:
    """``_bilinear.c`` compiled for tokens ``dim`` wide whose first ``live`` entries are live in the prompt
    (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, defines={"DIM": dim, "LIVE": live}, wide=WIDE, cost=COST)


def native_embed(x: Tensor, xq: Tensor, y: Tensor, d_bar: int, inv: float) -> Tensor | None:
    """The prompt of eq. (1), (B, n+1, d̄+1), by ``_bilinear.c``'s ``bl_embed`` (the build the model's forward uses):
    [1, x_t, 0, y_t · inv] per context token, [1, x_q, 0, 0] for the query, the label one product rounded in the
    prompt's dtype, as :func:`iclab.models.bilinear.embed_scratch`'s torch code computes it. None where the kernel
    does not take these operands (not a CPU float32/float64 episode with contiguous token rows, a width past
    :data:`MAX_DIM`, no compiler): the caller's torch code runs."""
    B, n, d = x.shape
    ok = NATIVE and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and 2 <= d_bar + 1 <= MAX_DIM
    ok = ok and xq.dtype == y.dtype == x.dtype and xq.device == y.device == x.device and B > 0 and d + 1 < d_bar + 1
    ok = (
        ok
        and x.stride(-1) == 1
        and (n < 2 or x.stride(-2) == d)
        and xq.stride(-1) == 1
        and (n < 2 or y.stride(-1) == 1)
    )
    lib = native(d_bar + 1, d + 1) if ok else None
    if lib is None:
        return None
    z = x.new_empty(B, n + 1, d_bar + 1)
    fn = getattr(lib, "bl_embed_f32" if x.dtype == torch.float32 else "bl_embed_f64")
    step = split_evenly(B, NATIVE_PART)

    def run(s: int) -> int:
        e = min(s + step, B)
        ptrs = (x[s:e].data_ptr(), x.stride(0), xq[s:e].data_ptr(), xq.stride(0), y[s:e].data_ptr(), y.stride(0))
        return int(fn(e - s, n, *ptrs, inv, z[s:e].data_ptr()))

    map_on_threads(run, range(0, B, step))
    return z


def _transfer(G: Tensor, P: Tensor, Q: Tensor, n: int) -> Tensor:
    """R = I + Σ_h P_h G Q_h / n for every prompt: G (c, D, D), P, Q (H, D, D) -> (c, D, D)."""
    R = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device).expand_as(G).clone()
    for h in range(P.shape[0]):
        R.add_(torch.matmul(P[h], G).matmul(Q[h]), alpha=1.0 / n)  # (P_h G) Q_h: one bmm, one GEMM
    return R


class _Plan:
    """The sub-layers, their weights in the forms the passes use, and the tensors a step keeps (batch-last)."""

    def __init__(self, z0: Tensor, kinds: tuple[str, ...], flat: tuple[Tensor, ...], n: int, live: int, save: bool):
        B, T, D = z0.shape
        self.n, self.T = n, T
        self.kinds = kinds[: max(i for i, k in enumerate(kinds) if k == "attn") + 1] if "attn" in kinds else ()
        self.weights = [flat[2 * i : 2 * i + 2] for i in range(len(kinds))]  # (W_0, W_1) or (P, Q)
        # d̄: the FFN acts on z[:d̄], the label entry z[d̄] passes
        self.db = db = self.weights[kinds.index("ffn")][0].shape[0] if "ffn" in kinds else D - 1
        # the FFN's live inputs: the prompt's scratch rows are zero (k = d + 1 for a first FFN), else all d̄
        self.k = [live if i == 0 else db for i in range(len(kinds))]
        self.Wc: list[Tensor | None] = []  # [W_1; W_0] on the live inputs: the forward's GEMM
        self.Wd: list[Tensor | None] = []  # [W_0ᵀ W_1ᵀ]: the backward's
        for i, (kind, (a, b)) in enumerate(zip(kinds, self.weights, strict=True)):
            self.Wc.append(torch.cat([b, a])[:, : self.k[i]] if kind == "ffn" else None)
            self.Wd.append(torch.cat([a, b]).T.contiguous() if kind == "ffn" else None)
        L = len(self.kinds)
        new = z0.new_empty
        self.z = [new(D, B, T) if save and 0 < i < L and self._keeps_input(i) else None for i in range(L)]
        self.ba = [new(2 * db, B, T) if save and kind == "ffn" else None for kind in self.kinds]
        self.G = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]
        self.R = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]
        self.dR = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]

    def _keeps_input(self, i: int) -> bool:
        """Whether sub-layer i's input is kept (an attention layer after an FFN rebuilds it from the FFN's)."""
        return not (self.kinds[i] == "attn" and self.kinds[i - 1] == "ffn")


def _kept(t: Tensor | None) -> Tensor:
    """A buffer of a :class:`_Plan` that exists where it is read (``save`` on, a sub-layer of the right kind)."""
    assert t is not None
    return t


def _ffn_out(z: Tensor, ba: Tensor, db: int) -> Tensor:
    """u = z + [a ⊙ b; 0] for z (D, c, T) and [b; a] (2d̄, c, T)."""
    u = torch.empty_like(z)
    torch.addcmul(z[:db], ba[db:], ba[:db], out=u[:db])
    u[db:] = z[db:]
    return u


def _forward_chunk(plan: _Plan, z0: Tensor, s: int, save: bool) -> Tensor:
    """The query's label entry after the last attention layer, (c,), for prompts s … s + c − 1 (z0 (c, T, D))."""
    n, db, L = plan.n, plan.db, len(plan.kinds)
    z = z0.permute(2, 0, 1).contiguous()  # (D, c, T)
    c = z.shape[1]
    for i, kind in enumerate(plan.kinds):
        if kind == "ffn":
            k, out = plan.k[i], plan.ba[i]
            ba = _kept(out)[:, s : s + c] if save else z.new_empty(2 * db, c, plan.T)
            torch.mm(_kept(plan.Wc[i]), z[:k].reshape(k, -1), out=ba.reshape(2 * db, -1))  # [b; a]
            z = _ffn_out(z, ba, db)
            continue
        P, Q = plan.weights[i]
        zp = z.permute(1, 0, 2)  # (c, D, T): prompt b's tokens as columns
        G = torch.bmm(zp[:, :, :n], zp[:, :, :n].transpose(1, 2))  # (c, D, D)
        R = _transfer(G, P, Q, n)
        if save:
            _kept(plan.G[i])[s : s + c] = G
            _kept(plan.R[i])[s : s + c] = R
        if i == L - 1:
            return (R[:, -1] * zp[:, :, -1]).sum(-1)  # (R z_query)[label]
        zn = torch.bmm(R, zp).permute(1, 0, 2)  # (D, c, T)
        if save and plan.z[i + 1] is not None:
            z = _kept(plan.z[i + 1])[:, s : s + c]
            z.copy_(zn)
        else:
            z = zn.contiguous()
    raise AssertionError("a plan ends with an attention layer")


def _input(plan: _Plan, i: int, z0: Tensor, s: int, c: int) -> Tensor:
    """Sub-layer i's input (D, c, T) for the chunk: kept, or rebuilt (the prompt; an FFN's output from its input)."""
    if i == 0:
        return z0.permute(2, 0, 1).contiguous()
    kept = plan.z[i]
    if kept is not None:
        return kept[:, s : s + c]
    return _ffn_out(_input(plan, i - 1, z0, s, c), _kept(plan.ba[i - 1])[:, s : s + c], plan.db)


def _backward_chunk(plan: _Plan, z0: Tensor, grad: Tensor, s: int) -> list[Tensor | None]:
    """Writes the chunk's dR into ``plan.dR``; returns its d[W_0; W_1] (2d̄, k) per FFN (None for attention)."""
    n, db, L = plan.n, plan.db, len(plan.kinds)
    c = grad.shape[0]
    out: list[Tensor | None] = [None] * len(plan.weights)
    g: Tensor | None = None  # (D, c, T) gradient of the current sub-layer's output
    for i in reversed(range(L)):
        P, Q = plan.weights[i]
        if plan.kinds[i] == "ffn":
            z = _input(plan, i, z0, s, c)
            ba, k = _kept(plan.ba[i])[:, s : s + c], plan.k[i]
            assert g is not None
            d_ab = torch.empty_like(ba)  # [g⊙b; g⊙a] = [∂a; ∂b]
            torch.mul(g[:db], ba[:db], out=d_ab[:db])
            torch.mul(g[:db], ba[db:], out=d_ab[db:])
            flat = d_ab.reshape(2 * db, -1)
            out[i] = (z[:k].reshape(k, -1) @ flat.T).T  # (2d̄, k): [∂W_0; ∂W_1] on the live inputs (faster than NT)
            if i > 0:  # dz[:d̄] += [W_0ᵀ W_1ᵀ][∂a; ∂b]; the label passes
                g[:db].reshape(db, -1).addmm_(_kept(plan.Wd[i]), flat)
            continue
        u = _input(plan, i, z0, s, c)
        up = u.permute(1, 0, 2)  # (c, D, T)
        R, dR = _kept(plan.R[i])[s : s + c], _kept(plan.dR[i])[s : s + c]
        if i == L - 1:  # only (R z_query)[label] is read
            dR.zero_()
            torch.mul(grad.unsqueeze(-1), up[:, :, -1], out=dR[:, -1])
        else:
            assert g is not None
            torch.bmm(g.permute(1, 0, 2), up.transpose(1, 2), out=dR)  # Σ_j g_j u_jᵀ
        if i == 0:
            break
        dG = torch.zeros_like(dR)
        for h in range(P.shape[0]):
            dG.add_(torch.matmul(P[h].T, dR).matmul(Q[h].T), alpha=1.0 / n)
        S = dG + dG.transpose(1, 2)
        du = torch.bmm(S, up)  # (c, D, T): the context tokens' Gram term
        if i == L - 1:
            du[:, :, -1] = grad.unsqueeze(-1) * R[:, -1]  # Rᵀ g_query, g_query = grad · e_label
        else:
            du[:, :, -1] = 0.0  # the query is not a source
            assert g is not None
            du.baddbmm_(R.transpose(1, 2), g.permute(1, 0, 2))  # + Rᵀ g_j
        g = du.permute(1, 0, 2).contiguous()
    return out


class _Stack(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z0: Tensor, meta: tuple[Any, ...], *flat: Tensor) -> Tensor:
        kinds, n, live, chunk, save = meta
        with torch.no_grad():
            plan = _Plan(z0, kinds, flat, n, live, save)
            starts = range(0, z0.shape[0], chunk)
            slots = map_on_threads(lambda s: _forward_chunk(plan, z0[s : s + chunk], s, save), starts, z0.is_cuda)
        ctx.plan, ctx.chunk = plan, chunk
        ctx.save_for_backward(z0)
        return torch.cat(slots)

    @staticmethod
    @native_kernels.first_order("use model.forward_tokens(episode), the token pass")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        plan, chunk = ctx.plan, ctx.chunk
        (z0,) = ctx.saved_tensors
        starts = range(0, z0.shape[0], chunk)

        def run(s: int) -> list[Tensor | None]:
            return _backward_chunk(plan, z0[s : s + chunk], grad[s : s + chunk], s)

        parts = map_on_threads(run, starts, z0.is_cuda)
        grads: list[Tensor | None] = []
        db, n = plan.db, plan.n
        for i, (P, Q) in enumerate(plan.weights):
            if i >= len(plan.kinds):  # an FFN after the last attention layer: nothing it writes is read
                grads += [torch.zeros_like(P), torch.zeros_like(Q)]
            elif plan.kinds[i] == "ffn":
                dW = torch.zeros(2 * db, db, dtype=z0.dtype, device=z0.device)
                dW[:, : plan.k[i]] = torch.stack([_kept(p[i]) for p in parts]).sum(0)
                grads += [dW[:db], dW[db:]]
            else:  # R = I + Σ_h P_h G Q_h / n, G symmetric: dP_h = Σ_b dR_b (G_b Q_h)ᵀ / n, dQ_h = Σ_b (G_b P_hᵀ) dR_b / n
                G, dR = plan.G[i], plan.dR[i]
                grads.append(torch.stack([torch.einsum("bik,bjk->ij", dR, G @ q) for q in Q]) / n)
                grads.append(torch.stack([torch.einsum("bli,bik->lk", G @ p.T, dR) for p in P]) / n)
        ctx.plan = None
        return (None, None, *grads)


class _NativeStack(torch.autograd.Function):
    """:class:`_Stack` by the C kernel ``_bilinear.c``: prompts in vector lanes, every per-prompt matrix (G, R, their
    adjoints) a DIM x DIM array of vectors. With gradients on, the forward also runs the backward for a unit output
    gradient and keeps every prompt's d out / d(weights) (:data:`JACOBIAN_BYTES` at most), so the backward is one
    product with the output gradient; past that budget it keeps nothing and the backward replays the forward. The
    batch is split into parts of at most :data:`NATIVE_PART` prompts, a multiple of 4 of them, one C call per part with
    its own gradient sums, added in order: the same numbers on any thread count."""

    @staticmethod
    def forward(ctx: Any, z0: Tensor, meta: tuple[Any, ...], *flat: Tensor) -> Tensor:
        kinds, n, live, _chunk, save = meta
        L = max(i for i, k in enumerate(kinds) if k == "attn") + 1
        used = flat[: 2 * L]
        H = next(w.shape[0] for k, w in zip(kinds, used[::2], strict=False) if k == "attn")
        z0 = z0.contiguous()
        wts = torch.cat([w.detach().reshape(-1) for w in used]).to(z0.dtype).contiguous()
        off = torch.tensor([0, *itertools.accumulate(2 * w.numel() for w in used[::2])][:L], dtype=torch.int64)
        codes = torch.tensor([0 if k == "ffn" else 1 for k in kinds[:L]], dtype=torch.int32)
        lib, tag = native(z0.shape[-1], live), "f32" if z0.dtype == torch.float32 else "f64"
        lanes = getattr(lib, f"bl_lanes_{tag}")()
        B = z0.shape[0]
        step = split_evenly(B, NATIVE_PART)
        bounds = [(s, min(s + step, B)) for s in range(0, B, step)]
        common = (n, L, codes.data_ptr(), H)
        groups = [math.ceil((e - s) / lanes) * lanes for s, e in bounds]
        jacobian = save and sum(groups) * wts.numel() * z0.element_size() <= JACOBIAN_BYTES
        J = [z0.new_empty(g * wts.numel()) for g in groups] if jacobian else None
        out = z0.new_empty(B)
        fwd: Callable[..., int] = getattr(lib, f"bl_jacobian_{tag}" if jacobian else f"bl_forward_{tag}")

        def run(p: int) -> int:
            s, e = bounds[p]
            args = (z0[s:e].data_ptr(), wts.data_ptr(), off.data_ptr(), out[s:e].data_ptr())
            return fwd(e - s, *common, *args, *([J[p].data_ptr()] if J is not None else []))

        _check(map_on_threads(run, range(len(bounds))))
        ctx.common, ctx.bounds, ctx.tag, ctx.L, ctx.live = common, bounds, tag, L, live
        ctx.keep = (codes, off, J)
        ctx.save_for_backward(z0, wts, *flat)
        return out

    @staticmethod
    @native_kernels.first_order("use model.forward_tokens(episode), the token pass")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        z0, wts, *flat = ctx.saved_tensors
        _codes, off, J = ctx.keep
        lib = native(z0.shape[-1], ctx.live)
        grad = grad.contiguous().to(z0.dtype)
        bounds = ctx.bounds

        def run(p: int) -> Tensor:
            s, e = bounds[p]
            gw = torch.zeros_like(wts)
            if J is not None:
                code = getattr(lib, f"bl_vjp_{ctx.tag}")(e - s, wts.numel(), J[p].data_ptr(), grad[s:e].data_ptr(),
                                                         gw.data_ptr())  # fmt: skip
            else:
                code = getattr(lib, f"bl_backward_{ctx.tag}")(e - s, *ctx.common, z0[s:e].data_ptr(), wts.data_ptr(),
                                                              off.data_ptr(), grad[s:e].data_ptr(), gw.data_ptr())  # fmt: skip
            _check([code])
            return gw

        gw = torch.stack(map_on_threads(run, range(len(bounds)))).sum(0)
        grads: list[Tensor | None] = []
        at = 0
        for i, w in enumerate(flat):
            if i >= 2 * ctx.L:  # an FFN after the last attention layer: nothing it writes is read
                grads.append(torch.zeros_like(w))
                continue
            grads.append(gw[at : at + w.numel()].view_as(w).to(w.dtype))
            at += w.numel()
        ctx.keep = None
        return (None, None, *grads)


def _check(codes: list[int]) -> None:
    if any(codes):
        raise MemoryError("_bilinear.c could not allocate its scratch buffers")


def _uses_native(z0: Tensor, live: int) -> bool:
    ok = z0.dtype in (torch.float32, torch.float64) and z0.device.type == "cpu" and 2 <= z0.shape[-1] <= MAX_DIM
    ok = ok and z0.shape[0] > 0 and 1 <= live < z0.shape[-1]
    return NATIVE and ok and native(z0.shape[-1], live) is not None


def bilinear_stack(
    z0: Tensor, sublayers: list[tuple[str, Tensor, Tensor]], *, n: int, live: int, chunk: int | None = None
) -> Tensor:
    """The query's label entry after the sub-layers, (B,), from the prompt z0 (B, n+1, D); differentiable in the weights.

    ``sublayers``: ``("ffn", W_0, W_1)`` with (d̄, d̄) maps on z[:d̄] (eq. 3; the label entry D − 1 = d̄ passes) or
    ``("attn", P, Q)`` with (H, D, D) heads (eq. 2, the n context tokens are the sources). ``live``: z0's entries
    live … d̄ − 1 are zero (the scratch rows of eq. 1), so a first FFN reads z0[:live] alone. ``chunk``: prompts per
    chunk, :data:`CHUNK` when None.
    """
    kinds = tuple(kind for kind, _, _ in sublayers)
    flat = [w for _, a, b in sublayers for w in (a, b)]
    save = torch.is_grad_enabled() and any(w.requires_grad for w in flat)  # no grad: nothing is kept
    meta = (kinds, n, live, CHUNK if chunk is None else chunk, save)
    node: type[torch.autograd.Function] = _NativeStack if "attn" in kinds and _uses_native(z0, live) else _Stack
    return cast(Tensor, node.apply(z0, meta, *flat))  # Function.apply is unannotated
