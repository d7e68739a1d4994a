"""Optional C kernels: built once with the system C compiler on first use, loaded by ctypes, else None.

A kernel is one C source file shipped in the package (``package-data``: ``*.c``, ``*.h``), which may include the
headers beside it. :func:`load` compiles it with ``cc -O3 -mavx2 -mfma`` (plus ``-DNAME=value`` for a kernel
specialised to a shape, and AVX-512 where asked for and the CPU has it) into :func:`kernel_dir`
(``$ICLAB_KERNEL_DIR``, default ``~/.cache/iclab/kernels``), under a name that carries a hash of the source, those
headers and the flags, so an edited source or header is rebuilt and concurrent builds never see a half-written file
(each builds aside, then renames atomically). Where the compiler rejects the AVX-512 flags, the AVX2 build of the same
source runs. It returns None, and the caller runs its torch code (which computes the same), where the environment sets
``ICLAB_NATIVE=0``, there is no compiler, the CPU lacks AVX2 + FMA, the build fails or the cache directory cannot be
written.

Every outcome is recorded (:func:`records`: one :class:`Record` per source and flags, built / loaded / fallback and
why), which ``iclab doctor`` prints; the first fallback of each kernel in a process, other than the one
``ICLAB_NATIVE=0`` asks for, warns once (:class:`NativeKernelWarning`) with the slowdown to expect. After a build,
:func:`prune` keeps the cache bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

#: False where the environment sets ``ICLAB_NATIVE=0``: every kernel then runs its torch code
ENABLED = os.environ.get("ICLAB_NATIVE", "1") != "0"
FLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
WIDE_FLAGS = ("-mavx512f", "-mavx512vl")  # 512-bit vectors: twice the lanes
BUILD_SECONDS = 120  # a build that takes longer is given up (the torch code runs)
#: :func:`prune` removes built libraries not used for this many days, then the oldest past :data:`PRUNE_KEEP` files
PRUNE_DAYS = 30.0
PRUNE_KEEP = 64  # the kernel tests build about 20 (each kernel, its widths, AVX2 and AVX-512 builds)

#: headers of this folder that kernels elsewhere include by a relative path ("../core/_per_real.h")
SHARED_HEADERS = (Path(__file__).with_name("_per_real.h"),)
Signature = tuple[list[type], type]  # (argtypes, restype) of one C function
Status = Literal["built", "loaded", "fallback"]
_Key = tuple[Path, tuple[str, ...]]


class NativeKernelWarning(UserWarning):
    """A C kernel cannot be used in this process: its torch code runs instead (the same numbers, more slowly)."""


@dataclass(frozen=True)
class Record:
    """What :func:`load` did for one source and flags.

    ``status``: "built" (compiled in this process), "loaded" (from the cache) or "fallback" (the torch code runs);
    ``reason``: why it fell back, or a note on a library that runs (the AVX-512 build rejected: the AVX2 one);
    ``path``: the library loaded; ``flags``: the flags asked for beyond :data:`FLAGS` (``-D`` values, AVX-512);
    ``used``: those the loaded library was built with."""

    source: Path
    flags: tuple[str, ...]
    status: Status
    reason: str = ""
    path: Path | None = None
    used: tuple[str, ...] = ()

    @property
    def isa(self) -> str:
        """The vector width the library runs: "AVX-512", "AVX2", or "" for a fallback."""
        if self.status == "fallback":
            return ""
        return "AVX-512" if any(f in WIDE_FLAGS for f in self.used) else "AVX2"

    @property
    def name(self) -> str:
        """The source's file name and its ``-D`` values, e.g. ``_bilinear.c DIM=13 LIVE=5``."""
        return " ".join([self.source.name, *(f[2:] for f in self.flags if f.startswith("-D"))])


_loaded: dict[_Key, ctypes.CDLL | None] = {}
_records: dict[_Key, Record] = {}
_warned: set[Path] = set()  # sources whose fallback has warned in this process
_pruned: list[Path] = []  # what prune removed in this process


def first_order(remedy: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """For the backward of an autograd Function whose gradients carry no graph (a C kernel's, or a hand-written one
    on tensors it made in the forward): a backward run with ``create_graph`` (grad mode on inside it) raises and
    says ``remedy`` (where the second derivatives are), instead of returning gradients whose own derivatives would
    silently be zero. Put it under ``@staticmethod``."""

    def wrap(backward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(backward)
        def checked(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled():
                raise RuntimeError(
                    "this fused pass has a hand-written backward and is differentiable once; for second derivatives "
                    f"(create_graph=True) {remedy}"
                )
            return backward(ctx, *grads)

        return checked

    return wrap


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
    cost: str = "",
) -> ctypes.CDLL | None:
    """The compiled ``source`` with each function's ``(argtypes, restype)`` set, or None where it cannot be built.
    Built at most once per process, source and options: ``defines`` become ``-DNAME=value`` (a kernel specialised to
    a shape), ``wide`` adds AVX-512 (:func:`wide_flags`) where the CPU has it, and where the compiler rejects those
    flags the AVX2 build runs. ``cost``: what runs slower without the kernel, for the one
    :class:`NativeKernelWarning` of its first fallback (e.g. "a KernelTransformer step about 4× slower")."""
    defs = tuple(f"-D{k}={int(v)}" for k, v in sorted((defines or {}).items()))
    wflags = wide_flags() if wide else ()
    key = (source, defs + wflags)
    if key not in _loaded:
        lib, record = _open(source, defs, wflags)
        if lib is not None:
            try:
                for name, (args, res) in signatures.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, res
            except AttributeError:  # a library that lacks a declared function is not used
                lib, record = None, Record(source, key[1], "fallback", f"no function {name} in {record.path}")
        _loaded[key], _records[key] = lib, record
        if lib is None and ENABLED and source not in _warned:
            _warned.add(source)
            slower = f"expect {cost}" if cost else "expect its steps to be several times slower"
            warnings.warn(
                f"C kernel {record.name} not used ({record.reason}): the torch code runs instead (same results to "
                f"rounding); {slower}. `iclab doctor` reports every kernel.",
                NativeKernelWarning,
                stacklevel=3,
            )
    return _loaded[key]


def records() -> list[Record]:
    """What :func:`load` did in this process, one :class:`Record` per source and flags, in the order of first use."""
    return list(_records.values())


def wide_flags() -> tuple[str, ...]:
    """``-mavx512f -mavx512vl`` (:data:`WIDE_FLAGS`) where torch reports an AVX-512 CPU, else ()."""
    return WIDE_FLAGS if cpu_capability().startswith("AVX512") else ()


def cpu_capability() -> str:
    """The vector ISA torch dispatches to on this CPU: "AVX512", "AVX2", or e.g. "DEFAULT" (none of them; ARM)."""
    return str(torch.backends.cpu.get_cpu_capability())


def find_compiler() -> str | None:
    """The C compiler a build would run: ``$CC`` where set (None if it names no program), else ``cc`` or ``gcc`` on
    PATH, else None."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def unavailable() -> str | None:
    """Why no kernel can be built in this process (``ICLAB_NATIVE=0``, no compiler, no AVX2 + FMA), else None."""
    if not ENABLED:
        return "disabled by ICLAB_NATIVE=0"
    if find_compiler() is None:
        cc = os.environ.get("CC")
        return f"no C compiler: CC={cc} is not a program" if cc else "no C compiler: no cc or gcc on PATH"
    if not cpu_capability().startswith(("AVX2", "AVX512")):
        return f"no AVX2 + FMA on this CPU (torch reports {cpu_capability()})"
    return None


def compiler() -> str | None:
    """The C compiler a build would use, or None where no kernel can be built here (:func:`unavailable`:
    ``ICLAB_NATIVE=0``, no compiler, a CPU without AVX2 + FMA): then every kernel runs its torch code."""
    return None if unavailable() else find_compiler()


def kernel_dir() -> Path:
    """Where built libraries are kept: ``$ICLAB_KERNEL_DIR``, else ``$XDG_CACHE_HOME/iclab/kernels``, else
    ``~/.cache/iclab/kernels``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iclab" / "kernels"
    return Path(os.environ.get("ICLAB_KERNEL_DIR") or cache)


def prune(
    folder: Path | None = None, *, max_age_days: float = PRUNE_DAYS, keep: int = PRUNE_KEEP, now: float | None = None
) -> list[Path]:
    """Remove from ``folder`` (default :func:`kernel_dir`) the built libraries (``*.so``) not used for
    ``max_age_days``, then the least recently used past ``keep`` files, and build folders left by a build that died
    over a day ago; never a library this process loaded. A library's modification time is its last use (:func:`load`
    touches it). Returns what was removed; a file that cannot be removed is left as it is."""
    folder = kernel_dir() if folder is None else folder
    now = time.time() if now is None else now
    in_use = {r.path.resolve() for r in _records.values() if r.path is not None}
    removed: list[Path] = []

    def remove(path: Path) -> None:
        try:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            removed.append(path)
        except OSError:
            pass

    stamped = []
    try:
        for path in folder.iterdir():
            with contextlib.suppress(OSError):  # removed meanwhile by another process
                stamped.append((path.stat().st_mtime, path))
    except OSError:
        return removed
    for mtime, path in stamped:
        if path.is_dir() and path.name.startswith("tmp") and now - mtime > 86400:
            remove(path)
    libraries = sorted((m, p) for m, p in stamped if p.suffix == ".so")
    held = sum(p.resolve() in in_use for _, p in libraries)
    libraries = [(m, p) for m, p in libraries if p.resolve() not in in_use]
    for mtime, path in libraries:
        if now - mtime > max_age_days * 86400:
            remove(path)
    left = [p for _, p in libraries if p not in removed]
    for path in left[: max(0, held + len(left) - keep)]:  # the least recently used first
        remove(path)
    _pruned.extend(removed)
    return removed


def pruned() -> list[Path]:
    """What :func:`prune` removed in this process (after builds, or asked for)."""
    return list(_pruned)


def cache_usage(folder: Path | None = None) -> tuple[int, int]:
    """The number of built libraries in ``folder`` (default :func:`kernel_dir`) and their bytes."""
    try:
        sizes = [p.stat().st_size for p in (kernel_dir() if folder is None else folder).glob("*.so")]
    except OSError:
        return 0, 0
    return len(sizes), sum(sizes)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    for line in _cpuinfo().splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags(names: tuple[str, ...] = ("avx2", "fma", "avx512f")) -> dict[str, bool | None]:
    """Whether the CPU reports each ISA extension of ``names`` (``/proc/cpuinfo``); None where it cannot be read."""
    for line in _cpuinfo().splitlines():
        if line.lower().startswith(("flags", "features")):
            have = set(line.split(":", 1)[1].split())
            return {n: n in have for n in names}
    return dict.fromkeys(names)


def compiler_version(cc: str | None = None) -> str:
    """The first line of ``cc --version`` (default :func:`find_compiler`), or "" where none runs."""
    cc = cc or find_compiler()
    if cc is None:
        return ""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return next((line.strip() for line in out.splitlines() if line.strip()), "")


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


class _BuildError(Exception):
    def __init__(self, reason: str, rejected: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.rejected = reason, rejected  # rejected: the compiler ran and refused the source or flags


def _open(
    source: Path, defs: tuple[str, ...], wflags: tuple[str, ...], retry: bool = True
) -> tuple[ctypes.CDLL | None, Record]:
    """The library of ``source`` built with ``defs`` and ``wflags`` (the AVX2 build where the compiler rejects
    ``wflags``), and its record."""
    flags = defs + wflags
    problem = unavailable()
    if problem is not None:
        return None, Record(source, flags, "fallback", problem)
    cc, note, used = find_compiler(), "", flags
    assert cc is not None
    try:
        try:
            path, built = _compile(cc, source, flags)
        except _BuildError as e:
            if not (wflags and e.rejected):
                raise
            note, used = f"AVX-512 build rejected, the AVX2 build runs ({e.reason})", defs
            path, built = _compile(cc, source, defs)
    except _BuildError as e:
        return None, Record(source, flags, "fallback", e.reason)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        if retry and not path.exists():  # pruned by another process since it was found: build it again
            return _open(source, defs, wflags, retry=False)
        return None, Record(source, flags, "fallback", f"cannot load {path}: {e}")
    record = Record(source, flags, "built" if built else "loaded", note, path, used)
    _records[(source, flags)] = record  # in use from now: prune keeps it
    if built:
        prune(path.parent)
    else:
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use, for prune
    return lib, record


def _compile(cc: str, source: Path, extra: tuple[str, ...]) -> tuple[Path, bool]:
    """The cached library of ``source`` built with ``extra`` flags, and whether it was built now."""
    try:
        # what it may include: the headers beside it and the shared ones
        headers = b"".join(h.read_bytes() for h in sorted({*source.parent.glob("*.h"), *SHARED_HEADERS}))
        text = source.read_bytes()
    except OSError as e:
        raise _BuildError(f"cannot read the source: {e}") from e
    flags = (*FLAGS, *extra)
    tag = hashlib.sha256(text + headers + " ".join(flags).encode()).hexdigest()[:16]
    folder = kernel_dir()
    target = folder / f"{source.stem.lstrip('_')}-{tag}.so"
    if target.exists():
        return target, False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:  # build aside, then one atomic rename
            built = Path(tmp) / target.name
            try:
                subprocess.run([cc, *flags, "-o", str(built), str(source)], check=True, capture_output=True,
                               timeout=BUILD_SECONDS)  # fmt: skip
            except subprocess.CalledProcessError as e:
                raise _BuildError(f"build failed: {_first_error(e.stderr, source)}", rejected=True) from e
            except subprocess.TimeoutExpired as e:
                raise _BuildError(f"build took over {BUILD_SECONDS} s") from e
            os.replace(built, target)
    except _BuildError:
        raise
    except OSError as e:
        if e.filename is not None and Path(str(e.filename)) == Path(cc):
            raise _BuildError(f"cannot run the compiler {cc}: {e.strerror}") from e
        raise _BuildError(f"cache dir {folder} not writable: {e.strerror or e}") from e
    return target, True


def _first_error(stderr: bytes | str | None, source: Path) -> str:
    """The compiler's first line that says "error" (else its first line), the source by its file name, shortened to
    200 characters."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    text = text.replace(str(source), source.name)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((line for line in lines if "error" in line), lines[0] if lines else "no message")
    return line if len(line) <= 200 else line[:197] + "..."
