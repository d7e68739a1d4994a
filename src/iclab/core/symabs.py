"""|K| and a Gaussian draw with covariance |K| for a batch of small symmetric matrices.

A kernel that is not positive semi-definite (Cheng et al.'s ReLU kernel: every Gram matrix of their set-up is
indefinite) has no Gaussian process; the paper's labels follow N(0, K₊) with K₊ = U|D|Uᵀ from K = UDUᵀ (Def. 3.3).
:func:`abs_sample` gives, per prompt,

    y = |K|^{1/2} g = U |D|^{1/2} Uᵀ g,        K₊ = |K| = U |D| Uᵀ,

the symmetric square root, so y does not depend on which eigenvectors a solver returns (signs, a basis of a
repeated eigenvalue): the C kernel and torch give the same draw to rounding.

On the CPU the C kernel ``_sym_abs.c`` diagonalises 16 float32 or 8 float64 matrices at once (half as many with
AVX2) by cyclic Jacobi rotations, one vector operation per step for all of them; ``torch.linalg.eigh`` calls LAPACK
once per matrix, which at 31 × 31 (n = 30) is mostly call and workspace overhead. For y alone (``with_abs=False``,
a training batch) the kernel tridiagonalises by Householder reflections and runs implicit QL with the lanes' sweeps
in step, its rotations applied to g and replayed backwards: no eigenvectors formed, ≈ 4× faster than Jacobi at
31 × 31 (its float32 rounding up to ≈ 6× torch's on near-singular K^relu grams, 1e-5 relative; tests/test_symabs.py). At Cheng et al.'s batch (30 000
prompts of n = 30, resampled every 10 steps) this draw cost as much per step as the model's training step on a
ReLU-label run;
docs/performance.md has the timings. Elsewhere (a GPU, no C compiler, ``ICLAB_NATIVE=0``, matrices over
64 × 64, a batch where the sweeps do not converge) torch's eigh runs. :func:`cholesky_sample` is the same for a
positive definite K (y = L g).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.threads import map_on_threads, split_evenly

#: use ``_sym_abs.c`` where it can be built; ``ICLAB_NATIVE=0`` or False: torch's eigh
NATIVE = native_kernels.ENABLED
#: build with AVX-512 where the CPU has it (16 float32 matrices side by side); False: AVX2 (8), as without it
WIDE = True
#: matrices per thread's part at most (the C kernel) or per eigh call (torch, which runs a batched eigh on one thread)
PART = 4096

Engine = Literal["auto", "native", "torch"]
ENGINES = ("auto", "native", "torch")

_SOURCE = Path(__file__).with_name("_sym_abs.c")
#: what runs slower by torch's eigh / cholesky_ex (docs/performance.md)
COST = "Gaussian-process label draws 2.6-4.8× (|K|) and 6-7× (Cholesky) slower"
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "sa_nmax": ([], _I),
    **native_kernels.per_real(
        lambda R: {"sa_sample": ([_I, _I] + [_P] * 4, _I), "sa_cholesky": ([_I, _I] + [_P] * 4, _I)}
    ),
}


def native() -> ctypes.CDLL | None:
    """``_sym_abs.c`` compiled (:func:`iclab.core.native.load`, AVX-512 where the CPU has it), or None."""
    return native_kernels.load(_SOURCE, _SIGNATURES, wide=WIDE, cost=COST)


def abs_sample(K: Tensor, g: Tensor, *, with_abs: bool = True, engine: Engine = "auto") -> tuple[Tensor, Tensor | None]:
    """y = |K|^{1/2} g (B, N) and, with ``with_abs``, |K| (B, N, N), for symmetric ``K`` (B, N, N) and ``g`` (B, N).

    K must be symmetric (neither path symmetrises it); float32 or float64, any device. ``engine``: "auto" and
    "native" run the C kernel on a CPU (2-5x torch's eigh in float32, 1.2-3x in float64, at n = 30 / 14; without
    ``with_abs`` its QL path, ≈ 4x the Jacobi one at n = 30), "torch" torch's eigh."""
    lib, K, g = _prepare("abs_sample", K, g, engine)
    if lib is not None:
        fn = lib.sa_sample_f32 if K.dtype == torch.float32 else lib.sa_sample_f64
        y = torch.empty_like(g)
        kp = torch.empty_like(K) if with_abs else None
        if _on_parts(g.shape[0], lambda i, b: fn(b, g.shape[1], K[i:].data_ptr(), g[i:].data_ptr(), y[i:].data_ptr(),
                                                   kp[i:].data_ptr() if kp is not None else None)):  # fmt: skip
            return y, kp
    return _torch(K, g, with_abs)


def cholesky_sample(K: Tensor, g: Tensor, *, engine: Engine = "auto") -> tuple[Tensor, Tensor]:
    """y = L g (B, N) with L Lᵀ = K (Cholesky), and ``bad`` (B,) bool: the prompts whose K is not numerically positive
    definite (their y is not a draw: redraw them by :func:`abs_sample`). ``engine``: "auto" and "native" run the C
    kernel on a CPU (L matrices side by side, no LAPACK call per matrix: 6-7x), "torch" ``torch.linalg.cholesky_ex``."""
    lib, K, g = _prepare("cholesky_sample", K, g, engine)
    if lib is not None:
        fn = lib.sa_cholesky_f32 if K.dtype == torch.float32 else lib.sa_cholesky_f64
        y = torch.empty_like(g)
        bad = torch.empty(g.shape[0], dtype=torch.int32)
        if _on_parts(g.shape[0], lambda i, b: fn(b, g.shape[1], K[i:].data_ptr(), g[i:].data_ptr(), y[i:].data_ptr(),
                                                   bad[i:].data_ptr())):  # fmt: skip
            return y, bad.bool()
    chol, info = torch.linalg.cholesky_ex(K)
    return (chol @ g.unsqueeze(-1)).squeeze(-1), info != 0


def _prepare(owner: str, K: Tensor, g: Tensor, engine: str) -> tuple[ctypes.CDLL | None, Tensor, Tensor]:
    """Check the shapes and the engine; the library where the C kernel runs (else None), K and g (in K's dtype) as
    it reads them."""
    if K.ndim != 3 or K.shape[-1] != K.shape[-2] or g.shape != K.shape[:-1]:
        raise ValueError(f"{owner}: K must be (B, N, N) and g (B, N); got {tuple(K.shape)} and {tuple(g.shape)}")
    if engine not in ENGINES:
        raise ValueError(f"{owner}: engine must be one of {ENGINES}; got {engine!r}")
    g = g.to(K.dtype)
    ok = NATIVE and engine != "torch" and K.device.type == "cpu" and K.dtype in (torch.float32, torch.float64)
    lib = native() if ok and K.shape[0] > 0 else None
    if lib is None or K.shape[-1] > lib.sa_nmax():
        return None, K, g
    return lib, K.contiguous(), g.contiguous()


def _on_parts(B: int, call: Callable[[int, int], int]) -> bool:
    """``call(start, count)`` for each part of the batch, on torch's threads; True if every part returned 0 (a part
    whose Jacobi sweeps did not converge returns its count of such groups, and the caller runs torch instead)."""
    part = split_evenly(B, PART)
    return all(int(r) == 0 for r in map_on_threads(lambda i: call(i, min(part, B - i)), range(0, B, part)))


def _torch(K: Tensor, g: Tensor, with_abs: bool) -> tuple[Tensor, Tensor | None]:
    def part(i: int) -> tuple[Tensor, Tensor | None]:
        evals, U = torch.linalg.eigh(K[i : i + PART])  # K = U D Uᵀ
        mag = evals.abs()
        proj = (U.transpose(-1, -2) @ g[i : i + PART].unsqueeze(-1)).squeeze(-1)  # Uᵀ g
        y = (U @ (mag.sqrt() * proj).unsqueeze(-1)).squeeze(-1)
        return y, ((U * mag.unsqueeze(-2)) @ U.transpose(-1, -2) if with_abs else None)

    parts = map_on_threads(part, range(0, K.shape[0], PART), K.is_cuda)
    y = torch.cat([p[0] for p in parts])
    if not with_abs:
        return y, None
    return y, torch.cat([p[1] for p in parts])  # type: ignore[misc]  # p[1] is a Tensor when with_abs
