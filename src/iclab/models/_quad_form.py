"""Quadratic forms s_iᵀ M_h s_i / 2 of many short rows, with their gradients: the per-key term of an rbf head.

The Trained TF's first block with the rbf kernel (:func:`~iclab.models._categorical_fast.first_block_kernel`, Wang et
al. 2025 Fig. 2 with RBF attention) needs ‖K_h s_i‖²/2 = s_iᵀ(K_hᵀK_h)s_i / 2 for every context token s_i (r = 15 wide
at §6.1) and both heads. In torch that is a product and three elementwise passes over (N, 2r), forward and back, about
half of that block's step. The C kernel ``_quad_form.c`` keeps W rows in the lanes of a vector and reads each row
once per pass; the backward sums ∂/∂M over a fixed split of the rows (:func:`~iclab.core.threads.split_evenly`), the
parts' sums added in part order: the same numbers on any thread count.

Where the kernel cannot be built, with ``ICLAB_NATIVE=0`` or :data:`NATIVE` = False, under ``torch.func`` transforms
or off the CPU, :func:`quad_forms` runs the torch code (the same numbers up to rounding). The backward is not itself
differentiable (a backward with ``create_graph`` raises, :func:`iclab.core.native.first_order`); the torch code
serves higher derivatives (``model.fast = False``). tests/test_categorical_fast.py checks both against each other and
against ``torch.autograd.gradcheck`` in float64.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.private_torch import is_transformed
from iclab.core.threads import map_on_threads, split_evenly

#: run float32 and float64 CPU rows by the C kernel ``_quad_form.c`` where it can be built (:mod:`iclab.core.native`);
#: environment ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
#: build with AVX-512 where the CPU has it (16 float32 lanes); False: AVX2 (8)
WIDE = True
PART = 16_384  # rows per C call at most (a multiple of 4 calls: the same split on 1, 2, 4 threads)
MAX_R = 64  # the widest rows (_quad_form.c: MAX_R)
_SOURCE = Path(__file__).with_name("_quad_form.c")
#: what runs slower by the torch code (benchmarks/bench_categorical.py --kernel rbf --blocks 1)
COST = "the rbf Trained TF's first block about 2× slower"
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "qf_lanes": ([], _I),
        "qf_forward": ([_L, _L, _I, _I, _P, _P, _P], _I),
        "qf_backward": ([_L, _L, _I, _I, _P, _P, _P, _P, _P], _I),
    }
)


def native() -> ctypes.CDLL | None:
    """``_quad_form.c`` compiled (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, wide=WIDE, cost=COST)


def applies(s: Tensor, M: Tensor) -> bool:
    """True where :func:`quad_forms` runs the C kernel: float32 or float64 CPU tensors of one dtype, r <= :data:`MAX_R`,
    no ``torch.func`` transform, and a kernel that builds."""
    ok = (
        NATIVE
        and s.dtype in (torch.float32, torch.float64)
        and s.dtype == M.dtype
        and s.device.type == "cpu"
        and s.shape[-1] <= MAX_R
        and not is_transformed(s, M)
    )
    return ok and native() is not None


def _parts(N: int) -> list[tuple[int, int]]:
    size = split_evenly(N, PART) if N else 1
    return [(a, min(a + size, N)) for a in range(0, N, size)]


def _check(codes: list[int]) -> None:
    if 1 in codes:
        raise MemoryError("_quad_form.c could not allocate its gradient sums")
    if any(codes):
        raise ValueError(f"_quad_form.c takes rows at most {MAX_R} wide")


class _QuadForms(torch.autograd.Function):
    """a = s_iᵀ M_h s_i / 2 for symmetric M by ``_quad_form.c``; the forward keeps its inputs, the backward one C
    call per part."""

    @staticmethod
    def forward(ctx: Any, s: Tensor, M: Tensor) -> Tensor:
        s, M = s.detach().contiguous(), M.detach().contiguous()
        (N, r), H = s.shape, M.shape[0]
        a = s.new_empty(N, H)
        tag = "f32" if s.dtype == torch.float32 else "f64"
        run_c = getattr(native(), f"qf_forward_{tag}")
        parts = _parts(N)
        _check(map_on_threads(lambda p: run_c(*parts[p], r, H, s.data_ptr(), M.data_ptr(), a.data_ptr()),
                              range(len(parts))))  # fmt: skip
        ctx.tag, ctx.parts = tag, parts
        ctx.save_for_backward(s, M)
        return a

    @staticmethod
    @native_kernels.first_order("set model.fast = False (the torch code of the block)")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        s, M = ctx.saved_tensors
        r, H = s.shape[1], M.shape[0]
        grad = grad.contiguous()
        gs = torch.empty_like(s)
        run_c = getattr(native(), f"qf_backward_{ctx.tag}")

        def run(p: int) -> Tensor:
            gM = torch.empty_like(M)
            args = (r, H, s.data_ptr(), M.data_ptr(), grad.data_ptr(), gs.data_ptr(), gM.data_ptr())
            _check([run_c(*ctx.parts[p], *args)])
            return gM

        sums = map_on_threads(run, range(len(ctx.parts)))
        gM = torch.stack(sums).sum(0) if ctx.needs_input_grad[1] else None
        return (gs if ctx.needs_input_grad[0] else None), gM


def quad_forms(s: Tensor, M: Tensor) -> Tensor:
    """s_iᵀ M_h s_i / 2, (N, H), for rows s (N, r) and M (H, r, r); differentiable in both. The C kernel reads one
    triangle of the symmetric part (M + Mᵀ)/2, which the form depends on alone."""
    if s.shape[0] and applies(s, M):
        return cast(Tensor, _QuadForms.apply(s, (M + M.mT) / 2))  # Function.apply is unannotated
    N, r = s.shape
    H = M.shape[0]
    y = s @ M.permute(1, 0, 2).reshape(r, H * r)  # (N, H r): M_h s_i, M symmetric
    return (y * s.repeat(1, H)).view(N, H, r).sum(-1) * 0.5
