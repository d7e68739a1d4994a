"""Device selection."""

from __future__ import annotations

import torch

from iclab.core.errors import ConfigError


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU; anything else is checked to exist."""
    if isinstance(name, torch.device):
        return name
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:<i>'; got {name!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r} was asked for but CUDA is not available on this machine; use 'cpu' or 'auto'"
        )
    return dev


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_allocator_tuned = False


def tune_cpu_allocator() -> bool:
    """Keep freed CPU tensor memory in the process instead of returning it to the OS after every op (glibc only).

    glibc serves each large allocation (a (512, 125, 125) float32 attention matrix is 32 MB) with a fresh
    ``mmap`` and gives it back on free, so every training step page-faults its activations in again. This
    sets the mmap threshold to 1 GiB and the trim threshold and top pad high, the effect that PyTorch's CPU
    tuning guide gets from preloading jemalloc/tcmalloc. Measured on the 2-core CI machine: the 2-block
    categorical training step (benchmarks/bench_categorical.py) 117-138 -> 81-100 ms. The price is a
    process that keeps its peak heap. Called by the ``iclab`` CLI; a no-op returning False where glibc's
    ``mallopt`` is unavailable (macOS, Windows, musl). Idempotent.
    """
    global _allocator_tuned
    if _allocator_tuned:
        return True
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 1 << 28))
    )
    _allocator_tuned = ok
    return ok
