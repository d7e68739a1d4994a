"""The query row of a softmax or ReLU attention layer by the C kernel ``_query_attn.c`` (CPU, float32 and float64).

:meth:`iclab.models.LinearAttention.forward` with ``query_only`` (a model's last layer) sends the query token

    Δt = scale · Σ_h P_h Σ_i h̃(s_iᵀ Q_h t) s_i      (Zhang et al. 2025, eq. M; softmax over the m sources, Sec. 7)

with the keys the sources themselves (W_K = I). :func:`attention_update` forms that as batched per-prompt products
and writes the (B, H, m) scores, weights and their gradients to memory: at Zhang et al.'s Fig. 5 (P = 80 000 prompts
of 32 tokens, 8 heads, float64) four 160 MB tensors per step. The kernel keeps a group of 4 (float64) or 8 (float32)
prompts in the lanes of an AVX2 vector (8 or 16 with AVX-512, :data:`WIDE`) and never writes them. It gives dL/dQ and
dL/dP only: it runs where the prompt is data (no gradient wanted for it, as in a one-layer model); otherwise, under
``torch.func`` transforms, on a GPU, or where no C compiler is, the torch code. A model reads one column of the
result (the label): for it the forward pass also keeps each prompt's gradient factors (u and dq per head, for a unit
gradient on that column), and the backward sums them (:func:`query_update`). For any other output gradient the
backward reads the prompts again and recomputes a group's forward (cheaper than storing the weights).

Exactness: tests/test_query_fast.py checks values and the gradients of every parameter against the torch pass in
float64 to 1e-10 (softmax and ReLU, merged and separate key-query, context or all sources); docs/performance.md has
the timings.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.private_torch import is_transformed
from iclab.core.threads import map_on_threads, split_evenly

#: run the query row of softmax/ReLU layers by ``_query_attn.c`` where it can be built; ``ICLAB_NATIVE=0`` or False:
#: the torch code
NATIVE = native_kernels.ENABLED
#: build with AVX-512 where the CPU has it (8 float64 lanes); False: AVX2 (4), as on a CPU without it
WIDE = True
#: keep the forward pass's gradient factors for the column a model reads (:func:`query_update`); False: every
#: backward reads the prompts and runs the forward again (the path before the factors, kept for comparison)
FACTORS = True
#: prompts per thread's part at most (parts are a multiple of 4, so sums do not depend on the thread count)
PART = 8192
MIN_SPLIT = 256  # batches under 4 × this many prompts are one part
ACT_CODES = {"relu": 1, "softmax": 3}
MAX_DIM, MMAX = 16, 1024  # token widths a library is built for (one per width), the most sources

_SOURCE = Path(__file__).with_name("_query_attn.c")
#: what runs slower by the torch code (docs/performance.md: 104-153 against 33-46 ms a Zhang et al. Fig. 5 step)
COST = "a softmax/ReLU query-row layer step about 3-4× slower"
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "qa_lanes": ([], _I),
        "qa_forward": ([_I] * 6 + [R] + [_P] * 4, _I),
        "qa_backward": ([_I] * 6 + [R] + [_P] * 6, _I),
        "qa_forward_factors": ([_I] * 6 + [R] + [_P] * 3 + [_I] + [_P] * 2, _I),
        "qa_factor_grads": ([_I] * 5 + [R] + [_P] * 5, _I),
    }
)


def native(width: int) -> ctypes.CDLL | None:
    """``_query_attn.c`` compiled for tokens ``width`` wide (:func:`iclab.core.native.load`, ``-DDIM=width``, built
    once per width); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, defines={"DIM": width}, wide=WIDE, cost=COST)


def applies(z: Tensor, m: int, activation: str, *params: Tensor) -> bool:
    """Whether :func:`query_update` runs the C kernel for these inputs (else the caller runs the torch code)."""
    ok = (
        NATIVE
        and activation in ACT_CODES
        and z.device.type == "cpu"
        and z.dtype in (torch.float32, torch.float64)
        and not z.requires_grad
        and z.shape[-1] <= MAX_DIM
        and 1 <= m <= MMAX
        and not is_transformed(z, *params)
    )
    return bool(ok) and native(z.shape[-1]) is not None


def query_update(
    z: Tensor, m: int, Q: Tensor, P: Tensor, activation: str, scale: float, readout: int | None = None
) -> Tensor:
    """scale · Σ_h P_h Σ_i h̃(s_iᵀ Q_h t) s_i, (B, 1, D), for the target t = z[:, -1] over the sources s_i = z[:, i],
    i < m; ``Q``, ``P`` (H, D, D); differentiable in Q and P (call only where :func:`applies`).

    ``readout``: the one column of the result that the caller's loss reads (a model's label coordinate), or None.
    Given it and a gradient to compute, the forward pass also keeps each prompt's factors of the parameter gradients
    for that column (``qa_forward_factors``, 2·H·D numbers a prompt), and a backward whose output gradient is zero in
    every other column sums them (``qa_factor_grads``) instead of reading the prompts and running the forward
    again: a Zhang et al. Fig. 5 step 1.4-1.6× faster. Any other output gradient takes the full backward."""
    grad = torch.is_grad_enabled() and (Q.requires_grad or P.requires_grad)
    col = readout if FACTORS and grad and readout is not None else -1
    out: Tensor = _QueryRow.apply(z, Q, P, (m, ACT_CODES[activation], float(scale), col))  # Function.apply: unannotated
    return out.unsqueeze(1)


def _bounds(B: int) -> list[tuple[int, int]]:
    part = split_evenly(B, PART) if B >= 4 * MIN_SPLIT else B
    return [(s, min(s + part, B)) for s in range(0, B, part)]


def _check(codes: list[int]) -> None:
    if 1 in codes:
        raise MemoryError("_query_attn.c could not allocate its scratch buffer")
    if any(codes):
        raise ValueError(f"_query_attn.c takes the token width it was built for, 1 to {MMAX} sources, relu or softmax")


class _QueryRow(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, Q: Tensor, P: Tensor, meta: tuple[int, int, float, int]) -> Tensor:
        m, act, scale, col = meta
        z, Q, P = z.contiguous(), Q.detach().contiguous(), P.detach().contiguous()
        B, T, D = z.shape
        lib = native(D)
        assert lib is not None
        H = Q.shape[0]
        tag = "f32" if z.dtype == torch.float32 else "f64"
        out = z.new_empty(B, D)
        bounds = _bounds(B)
        F, offset = None, None
        if col < 0:
            forward: Callable[..., int] = getattr(lib, f"qa_forward_{tag}")

            def run(part: tuple[int, int]) -> int:
                s, e = part
                return forward(e - s, T, m, D, H, act, scale, z[s:e].data_ptr(), Q.data_ptr(), P.data_ptr(),
                               out[s:e].data_ptr())  # fmt: skip

        else:
            with_factors: Callable[..., int] = getattr(lib, f"qa_forward_factors_{tag}")
            offset, size = _factor_offsets(bounds, getattr(lib, f"qa_lanes_{tag}")(), 2 * H * D)
            F = z.new_empty(size)

            def run(part: tuple[int, int]) -> int:
                s, e = part
                return with_factors(e - s, T, m, D, H, act, scale, z[s:e].data_ptr(), Q.data_ptr(), P.data_ptr(),
                                    col, out[s:e].data_ptr(), F[offset[part]:].data_ptr())  # fmt: skip

        _check(map_on_threads(run, bounds))
        ctx.meta, ctx.tag, ctx.bounds, ctx.offset = meta, tag, bounds, offset
        ctx.save_for_backward(z, Q, P, *([] if F is None else [F]))
        return out

    @staticmethod
    @native_kernels.first_order("run with ICLAB_NATIVE=0 (the torch code of the same layer)")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        z, Q, P, *factors = ctx.saved_tensors
        m, act, scale, col = ctx.meta
        _, T, D = z.shape
        H, lib, grad = Q.shape[0], native(D), grad.contiguous()
        if factors and not _other_columns(grad, col).any():
            (F,), offset = factors, ctx.offset
            from_factors: Callable[..., int] = getattr(lib, f"qa_factor_grads_{ctx.tag}")

            def call(s: int, e: int, gQ: Tensor, gP: Tensor) -> int:
                return from_factors(e - s, T, D, H, col, scale, z[s:e].data_ptr(), F[offset[s, e]:].data_ptr(),
                                    grad[s:e].data_ptr(), gQ.data_ptr(), gP.data_ptr())  # fmt: skip

        else:
            backward: Callable[..., int] = getattr(lib, f"qa_backward_{ctx.tag}")

            def call(s: int, e: int, gQ: Tensor, gP: Tensor) -> int:
                return backward(e - s, T, m, D, H, act, scale, z[s:e].data_ptr(), Q.data_ptr(), P.data_ptr(),
                                grad[s:e].data_ptr(), gQ.data_ptr(), gP.data_ptr())  # fmt: skip

        def run(part: tuple[int, int]) -> tuple[Tensor, Tensor]:
            gQ, gP = torch.zeros_like(Q), torch.zeros_like(P)
            _check([call(*part, gQ, gP)])
            return gQ, gP

        parts = map_on_threads(run, ctx.bounds)
        gQ, gP = (torch.stack(g).sum(0) for g in zip(*parts, strict=True))
        return None, gQ, gP, None


def _factor_offsets(bounds: list[tuple[int, int]], lanes: int, per_lane: int) -> tuple[dict[tuple[int, int], int], int]:
    """Where each part's factors start in one buffer (its groups of ``lanes`` prompts, the last one padded, each
    ``per_lane`` vectors), and the buffer's size in reals."""
    offset, at = {}, 0
    for s, e in bounds:
        offset[s, e], at = at, at + -(-(e - s) // lanes) * per_lane * lanes
    return offset, at


def _other_columns(grad: Tensor, col: int) -> Tensor:
    """``grad`` (B, D) without its column ``col``: where it is all zero, the gradient is the factors' sum."""
    return torch.cat([grad[:, :col], grad[:, col + 1 :]], dim=1)
