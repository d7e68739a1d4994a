"""Steps of :func:`~iclab.training.population.population_flow` and of the moment route of
:func:`~iclab.training.population.full_batch_gd` for a separate-head reduced model
(:class:`~iclab.models.SeparateAttention`, eq. S of Zhang et al. 2025) in one C call (``_reduced_flow.c``).

The torch loop spends ≈ 15 tensor operations of dispatch on each Euler step of a few (d, d) products; this runs the
steps between two recorded ones at once. The same iterates up to the order of the sums (float64: 1e-12 over
thousands of steps, tests/test_reduced_flow.py). Used on a CPU for float32/float64 contiguous parameters without
``all_blocks``; otherwise, or with ``ICLAB_NATIVE=0`` (``NATIVE`` False), the callers run their torch loop.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.models.reduced_attention import SeparateAttention, _ReducedAttention

#: the steps by ``_reduced_flow.c`` where it can be built; ``ICLAB_NATIVE=0`` or False here: the torch loop
NATIVE = native_kernels.ENABLED
#: what runs slower without the kernel (benchmarks/bench_reduced_flow.py: a step of Zhang et al.'s Fig. 3 quick)
COST = "a population-flow or moment GD step of the separate-head model about 50× slower"
_SOURCE = Path(__file__).with_name("_reduced_flow.c")
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "rf_population_steps": ([_L, _I, _I, _I, _L, R, _P, _P, _P, _P, _P, _P], _I),
        "rf_moment_steps": ([_L, _I, _I, _I, _L, R, _P, _P, _P, _P, _L, _P, _L], _I),
    }
)


def native() -> ctypes.CDLL | None:
    """``_reduced_flow.c`` compiled (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, cost=COST)


def _operands(m: _ReducedAttention, params: dict[str, Tensor]) -> tuple[ctypes.CDLL, str, int] | None:
    """(library, instance suffix, seeds) when the C steps take ``m`` and ``params``, else None."""
    if not NATIVE or not isinstance(m, SeparateAttention) or m.all_blocks:
        return None
    v, k, q = params["v"], params["k"], params["q"]
    if v.device.type != "cpu" or v.dtype not in (torch.float32, torch.float64):
        return None
    if not all(t.dtype == v.dtype and t.device == v.device and t.is_contiguous() for t in (k, q)):
        return None
    lib = native()
    if lib is None:
        return None
    return lib, "f32" if v.dtype == torch.float32 else "f64", v.numel() // m.n_heads


def _real(dtype: torch.dtype, x: float) -> ctypes.c_float | ctypes.c_double:
    return ctypes.c_float(x) if dtype == torch.float32 else ctypes.c_double(x)


def population_steps(
    m: _ReducedAttention, params: dict[str, Tensor], steps: int, alpha: float, L2: Tensor, A: Tensor, Lam: Tensor
) -> bool:
    """``steps`` Euler steps θ += alpha · flow(Λ² − A W Λ) of ``params`` in place; False (nothing done) where the C
    kernel does not take them."""
    found = _operands(m, params)
    if found is None:
        return False
    lib, tag, S = found
    v = params["v"]
    L2c, Ac, Lc = (t.to(v.dtype).contiguous() for t in (L2, A, Lam))
    fn = getattr(lib, f"rf_population_steps_{tag}")
    ptrs = (v.data_ptr(), params["k"].data_ptr(), params["q"].data_ptr(), L2c.data_ptr(), Ac.data_ptr(), Lc.data_ptr())
    rank = params["k"].shape[-2]
    if fn(S, m.n_heads, rank, m.d, steps, _real(v.dtype, alpha), *ptrs):
        raise MemoryError("rf_population_steps could not allocate its scratch")
    return True


def moment_steps(
    m: _ReducedAttention, params: dict[str, Tensor], steps: int, alpha: float, M: Tensor, c: Tensor
) -> bool:
    """``steps`` GD steps on the moments ([S,] d², d²) ``M`` and ([S,] d²) ``c`` of z = vec(β x_qᵀ), in place; False
    (nothing done) where the C kernel does not take them."""
    found = _operands(m, params)
    if found is None:
        return False
    lib, tag, S = found
    v = params["v"]
    Mc, cc = M.to(v.dtype).contiguous(), c.to(v.dtype).contiguous()
    d2 = m.d * m.d
    if Mc.shape[-2:] != (d2, d2) or cc.shape[-1] != d2:
        return False
    sM, sc = (d2 * d2 if Mc.dim() == 3 else 0), (d2 if cc.dim() == 2 else 0)
    fn = getattr(lib, f"rf_moment_steps_{tag}")
    rank = params["k"].shape[-2]
    ptrs = (v.data_ptr(), params["k"].data_ptr(), params["q"].data_ptr())
    if fn(S, m.n_heads, rank, m.d, steps, _real(v.dtype, alpha), *ptrs, Mc.data_ptr(), sM, cc.data_ptr(), sc):
        raise MemoryError("rf_moment_steps could not allocate its scratch")
    return True
