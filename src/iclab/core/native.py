"""Optional C kernels: built once with the system C compiler on first use, loaded by ctypes, else None.

A kernel is one C source file shipped in the package (``package-data``: ``*.c``, ``*.h``), which may include the
headers beside it. :func:`load` compiles it with ``cc -O3 -mavx2 -mfma`` (plus ``-DNAME=value`` for a kernel
specialised to a shape, and AVX-512 where asked for and the CPU has it) into ``$ICLAB_KERNEL_DIR`` (default
``~/.cache/iclab/kernels``), under a name that carries a hash of the source, those headers and the flags, so an
edited source or header is rebuilt and concurrent builds never see a half-written file (each builds aside, then
renames atomically). It returns None, and the caller runs its torch code, where there
is no compiler, the CPU lacks AVX2 + FMA, the build fails, or the environment sets ``ICLAB_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

#: False where the environment sets ``ICLAB_NATIVE=0``: every kernel then runs its torch code
ENABLED = os.environ.get("ICLAB_NATIVE", "1") != "0"
FLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")

_loaded: dict[tuple[Path, tuple[str, ...]], ctypes.CDLL | None] = {}


Signature = tuple[list[type], type]  # (argtypes, restype) of one C function


def per_real(signatures: Callable[[type], dict[str, Signature]]) -> dict[str, Signature]:
    """The signatures of a kernel compiled as one instance per real type (``name_f32``, ``name_f64``):
    ``signatures(R)`` with R the instance's ctypes real (``ctypes.c_float``, ``ctypes.c_double``)."""
    return {
        f"{name}_{tag}": sig
        for tag, R in (("f32", ctypes.c_float), ("f64", ctypes.c_double))
        for name, sig in signatures(R).items()
    }


def load(
    source: Path,
    signatures: dict[str, Signature],
    *,
    defines: dict[str, int] | None = None,
    wide: bool = False,
) -> ctypes.CDLL | None:
    """The compiled ``source`` with each function's ``(argtypes, restype)`` set, or None where it cannot be built.
    Built at most once per process, source and options: ``defines`` become ``-DNAME=value`` (a kernel specialised to
    a shape), ``wide`` adds AVX-512 (:func:`wide_flags`) where the CPU has it."""
    extra = tuple(f"-D{k}={int(v)}" for k, v in sorted((defines or {}).items())) + (wide_flags() if wide else ())
    key = (source, extra)
    if key not in _loaded:
        lib = _build(source, extra)
        if lib is not None:
            for name, (args, res) in signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
        _loaded[key] = lib
    return _loaded[key]


def wide_flags() -> tuple[str, ...]:
    """``-mavx512f -mavx512vl`` where torch reports an AVX-512 CPU (512-bit vectors: twice the lanes), else ()."""
    return ("-mavx512f", "-mavx512vl") if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else ()


def compiler() -> str | None:
    """The C compiler a build would use (``$CC``, else ``cc`` or ``gcc`` on PATH), or None where there is none or the
    CPU lacks AVX2 + FMA: then every kernel runs its torch code."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512")):
        return None
    return cc


def _build(source: Path, extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    cc = compiler()
    if cc is None:
        return None
    try:
        headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what it may include
        flags = (*FLAGS, *extra)
        tag = hashlib.sha256(source.read_bytes() + headers + " ".join(flags).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "iclab" / "kernels"
        folder = Path(os.environ.get("ICLAB_KERNEL_DIR", cache))
        target = folder / f"{source.stem.lstrip('_')}-{tag}.so"
        if not target.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:  # build aside, then one atomic rename
                built = Path(tmp) / target.name
                subprocess.run([cc, *flags, "-o", str(built), str(source)], check=True, capture_output=True,
                               timeout=120)  # fmt: skip
                os.replace(built, target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
