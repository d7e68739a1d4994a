"""The fast path of :class:`~iclab.models.LinearTransformer` with linear scores: the L-layer moment form as one C call.

Ahn, Cheng, Daneshmand, Sra 2023, eq. (3)-(4), in the moment form of :mod:`iclab.models.attention_core`: a prompt is
its sources' Gram matrix G_0 (D, D) and query row q_0 (D,); layer ℓ is z ← z T_ℓ with
T_ℓ = I + Σ_h Q_hᵀ G_ℓ P_hᵀ / n, so q_{ℓ+1} = q_ℓ T_ℓ and G_{ℓ+1} = T_ℓᵀ G_ℓ T_ℓ, and the read-out is q_L's label
entry. At D = 6 every product is a 6 × 6 one per prompt, which torch runs as many small batch-last operations
(:func:`~iclab.models.attention_core.batched_matmul`, GEMMs with a side of 6) at a few GFLOP/s. The C kernel
``_moment_attn.c`` keeps a group of prompts in the lanes of a vector (8 float32 with AVX2, 16 with AVX-512; half as
many float64) through all layers, forward and a hand-written backward that replays the forward per group; nothing per
prompt goes to memory but G_0, q_0 in and ŷ out. :func:`moments` builds G_0, q_0 from the data by the same kernel,
without the (B, n+1, D) prompt (:func:`~iclab.models.attention_core.context_moments`). Parts of the batch run on
torch's threads (:func:`~iclab.core.threads.map_on_threads`), each with its own gradient sums, added in part order:
the same numbers on any thread count.

Where the kernel cannot be built, with ``ICLAB_NATIVE=0`` or :data:`NATIVE` = False, under ``torch.func`` transforms,
or with a prompt that needs a gradient, :meth:`AttentionStack.forward <iclab.models.attention_core.AttentionStack.
forward>` runs the same moment form in torch (the same numbers up to rounding). The backward is not itself
differentiable (a backward with ``create_graph`` raises, :func:`iclab.core.native.first_order`): :meth:`~iclab.models.attention_core.AttentionStack.forward_tokens` and
that torch path serve higher derivatives. Exactness: tests/test_moment_fast.py checks values and every parameter
gradient against the token-level layers in float64 to 1e-10, for each pattern, L ∈ {1, 3, 4} and odd batches.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.private_torch import is_transformed
from iclab.core.threads import map_on_threads, split_evenly

#: run float32 and float64 CPU passes by the C kernel ``_moment_attn.c`` where it can be built
#: (:mod:`iclab.core.native`); environment ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
#: build with AVX-512 where the CPU has it (16 float32 lanes); False: AVX2 (8), as on a CPU without it
WIDE = True
PART = 4096  # prompts per C call at most (a multiple of 4 calls per batch: the same split on 1, 2, 4 threads)
MAX_DIM = 16  # token widths the kernel is built for (one build per width, unrolled)
MAX_LAYERS = 64  # the kernel's limits on layers and heads (_moment_attn.c: MAX_LAYERS, MAX_HEADS)
MAX_HEADS = 64
_SOURCE = Path(__file__).with_name("_moment_attn.c")
#: what runs slower by the torch code (``python benchmarks/bench_moment_fast.py``: the Ahn et al. Fig. 1 / 6 / 7 steps,
#: the kernel against the torch code of the moment form, alternating)
COST = "a LinearTransformer training step about 5× slower"
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "ma_lanes": ([], _I),
        "ma_forward": ([_L, _I, _I, _P, _P, R, _I, _P, _P, _L, _P], _I),
        "ma_backward": ([_L, _I, _I, _P, _P, R, _I, _P, _P, _L, _P, _P, _P], _I),
        "ma_moments": ([_L, _I, _P, _L, _P, _L, _P, _L, _I, _P, _P, _L], _I),
    }
)


def native(dim: int) -> ctypes.CDLL | None:
    """``_moment_attn.c`` compiled for tokens ``dim`` wide (:func:`iclab.core.native.load`); None where it cannot be
    built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, defines={"DIM": dim}, wide=WIDE, cost=COST)


def applies(gram: Tensor, q: Tensor, P: Tensor, Q: Tensor) -> bool:
    """True where :func:`moment_stack` runs the C kernel: a float32 or float64 CPU batch, D <= :data:`MAX_DIM`, no
    ``torch.func`` transform, prompts that need no gradient, and a kernel that builds."""
    D = gram.shape[0]
    ok = (
        NATIVE
        and gram.dtype in (torch.float32, torch.float64)
        and gram.device.type == "cpu"
        and D <= MAX_DIM
        and P.shape[0] <= MAX_LAYERS
        and P.shape[1] <= MAX_HEADS
        and not (gram.requires_grad or q.requires_grad)
        and not is_transformed(gram, q, P, Q)
    )
    return ok and native(D) is not None


def _parts(B: int, lanes: int) -> list[tuple[int, int]]:
    """[start, stop) of each C call: parts of at most :data:`PART` prompts in whole lane groups, about a multiple of 4
    of them (even work on 1, 2 or 4 threads); they depend on the batch alone, so do the sums."""
    size = math.ceil(split_evenly(B, PART) / lanes) * lanes if 4 * lanes <= B else B
    return [(s, min(s + size, B)) for s in range(0, B, size)]


def _check(codes: list[int]) -> None:
    if 1 in codes:
        raise MemoryError("_moment_attn.c could not allocate its scratch buffers")
    if any(codes):
        raise ValueError(f"_moment_attn.c takes at most {MAX_LAYERS} layers and {MAX_HEADS} heads")


def moments_apply(x: Tensor, y: Tensor, x_query: Tensor) -> bool:
    """True where :func:`moments` runs the C kernel: float32 or float64 CPU data that needs no gradient, rows of
    contiguous entries (the episode's views of one (B, n+1, d) draw are), d + 1 <= :data:`MAX_DIM`, outside
    ``torch.func`` transforms."""
    d = x.shape[-1]
    ok = (
        NATIVE
        and x.dtype in (torch.float32, torch.float64)
        and x.dtype == y.dtype == x_query.dtype
        and x.device.type == "cpu"
        and d + 1 <= MAX_DIM
        and x.stride(-1) == 1
        and (x.shape[1] < 2 or x.stride(1) == d)
        and (y.shape[1] < 2 or y.stride(1) == 1)
        and x_query.stride(-1) == 1
        and not (x.requires_grad or y.requires_grad or x_query.requires_grad)
        # inside a torch.func transform a tensor made there is wrapped (no data pointer) even when the data is not
        and not is_transformed(x, y, x_query, x.view_as(x))
    )
    return ok and native(d + 1) is not None


def moments(x: Tensor, y: Tensor, x_query: Tensor, *, include_query: bool = False) -> tuple[Tensor, Tensor]:
    """(G_0 (D, D, B), q_0 (D, B)) of the prompts z = [x_i, y_i] (context) and [x_q, 0] (eq. 1), batch-last:
    G_0 = Σ_i z_i z_iᵀ over the context, plus the query with ``include_query``; the C kernel's
    :func:`~iclab.models.attention_core.context_moments`, without the (B, n+1, D) prompt. Call it where
    :func:`moments_apply` is True."""
    B, n, d = x.shape
    D = d + 1
    lib = native(D)
    assert lib is not None
    tag = "f32" if x.dtype == torch.float32 else "f64"
    run_c: Callable[..., int] = getattr(lib, f"ma_moments_{tag}")
    gram, q = x.new_empty(D, D, B), x.new_empty(D, B)
    size = x.element_size()
    parts = _parts(B, getattr(lib, f"ma_lanes_{tag}")())
    strides = (x.stride(0), y.stride(0), x_query.stride(0))

    def run(p: int) -> int:
        s, e = parts[p]
        data = (x.data_ptr() + s * strides[0] * size, strides[0], y.data_ptr() + s * strides[1] * size, strides[1])
        query = (x_query.data_ptr() + s * strides[2] * size, strides[2], int(include_query))
        return run_c(e - s, n, *data, *query, gram.data_ptr() + s * size, q.data_ptr() + s * size, B)

    _check(map_on_threads(run, range(len(parts))))
    return gram, q


class _NativeMoments(torch.autograd.Function):
    """The whole L-layer moment-form pass by ``_moment_attn.c``: forward keeps nothing but its inputs; the backward
    replays the forward per group of prompts and adds dL/dP, dL/dQ, one C call per part, the parts' sums in order."""

    @staticmethod
    def forward(ctx: Any, gram: Tensor, q: Tensor, P: Tensor, Q: Tensor, meta: tuple[float, bool]) -> Tensor:
        scale, residual = meta
        D, B = q.shape
        lib = native(D)
        assert lib is not None
        tag = "f32" if q.dtype == torch.float32 else "f64"
        gram, q = gram.detach().contiguous(), q.detach().contiguous()
        P, Q = P.detach().contiguous(), Q.detach().contiguous()
        L, H = P.shape[:2]
        parts = _parts(B, getattr(lib, f"ma_lanes_{tag}")())
        out = q.new_empty(B)
        forward: Callable[..., int] = getattr(lib, f"ma_forward_{tag}")
        common = (L, H, P.data_ptr(), Q.data_ptr(), scale, int(residual))
        size = gram.element_size()

        def run(p: int) -> int:
            s, e = parts[p]
            return forward(e - s, *common, gram.data_ptr() + s * size, q.data_ptr() + s * size, B, out[s:].data_ptr())

        _check(map_on_threads(run, range(len(parts))))
        ctx.meta, ctx.parts, ctx.tag, ctx.common = meta, parts, tag, common
        ctx.save_for_backward(gram, q, P, Q)
        return out

    @staticmethod
    @native_kernels.first_order("use model.forward_tokens(episode), the token pass")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        gram, q, P, Q = ctx.saved_tensors
        D, B = q.shape
        backward: Callable[..., int] = getattr(native(D), f"ma_backward_{ctx.tag}")
        grad = grad.contiguous()
        size = gram.element_size()

        def run(p: int) -> tuple[Tensor, Tensor]:
            s, e = ctx.parts[p]
            gP, gQ = torch.zeros_like(P), torch.zeros_like(Q)
            data = (gram.data_ptr() + s * size, q.data_ptr() + s * size, B, grad[s:].data_ptr())
            _check([backward(e - s, *ctx.common, *data, gP.data_ptr(), gQ.data_ptr())])
            return gP, gQ

        sums = map_on_threads(run, range(len(ctx.parts)))
        gP = torch.stack([g[0] for g in sums]).sum(0) if ctx.needs_input_grad[2] else None
        gQ = torch.stack([g[1] for g in sums]).sum(0) if ctx.needs_input_grad[3] else None
        return None, None, gP, gQ, None


def moment_stack(gram: Tensor, q: Tensor, P: Tensor, Q: Tensor, *, scale: float, residual: bool = True) -> Tensor:
    """The query's label entry of z_L, (B,), from G_0 (D, D, B) and q_0 (D, B) batch-last
    (:func:`~iclab.models.attention_core.context_moments`), for P, Q (L, H, D, D) in the paper's orientation and
    ``scale`` the 1/n of eq. (3). Differentiable in P and Q. Call it where :func:`applies` is True."""
    return cast(Tensor, _NativeMoments.apply(gram, q, P, Q, (float(scale), bool(residual))))  # apply is unannotated
