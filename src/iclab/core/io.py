"""Atomic, verified file writes and safe reads.

A reader never sees a half-written file and a crash loses nothing already written (write to a temporary file, fsync,
rename). Tensor files carry a SHA-256 sidecar (``<name>.sha256``, written after the file): a torn, truncated or
bit-flipped file fails :func:`safe_torch_load` with a :class:`~iclab.core.errors.CorruptFileError` naming it, and so
does a pickle that asks for anything but tensors, containers and the allow-listed plain-data classes: nothing on disk
is ever executed (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from iclab.core.errors import CorruptFileError, OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file (mkstemp's own is 0600: a report others cannot read)


def _atomic(path: Path, write: Any, mode: str, before_replace: Callable[[], None] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def atomic_write_text(path: str | Path, text: str) -> None:
    _atomic(Path(path), lambda f: f.write(text), "w")


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    """``torch.save`` atomically, then its SHA-256 sidecar.

    The old sidecar is removed before the new bytes take the name, so at every instant the file has its own sidecar or
    none (format-checked only): a crash between any two steps leaves a file that verifies, never a mismatch."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    _atomic(path, lambda f: f.write(data), "wb", before_replace=lambda: _unlink(_sidecar(path)))
    atomic_write_text(_sidecar(path), hashlib.sha256(data).hexdigest() + "\n")


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def safe_torch_load(path: str | Path, *, allowed: Iterable[type] = (), map_location: Any = "cpu") -> Any:
    """Load a file written by :func:`atomic_torch_save` without executing anything in it.

    The bytes must match the SHA-256 sidecar when there is one; the unpickler accepts tensors, containers, numbers,
    strings and the plain-data classes in ``allowed`` only. Any failure raises ``CorruptFileError`` naming the file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptFileError(path, f"cannot be read ({e.strerror or e})") from e
    side = _sidecar(path)
    if side.is_file():
        want = side.read_text().strip()
        if hashlib.sha256(data).hexdigest() != want:
            raise CorruptFileError(path, f"checksum mismatch against {side.name} (torn or damaged file)")
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CorruptFileError(path, f"refused to unpickle it: {_first_line(e)[:300]}") from e
    except Exception as e:  # torch's zip reader raises RuntimeError on torn or foreign files
        raise CorruptFileError(path, f"not a readable torch file ({type(e).__name__}: {_first_line(e)[:200]})") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def rotate(path: str | Path, to: str | Path) -> None:
    """Rename ``path`` (and its sidecar) to ``to``, replacing what is there: keeps the previous version of a file.

    Three steps, each leaving files that verify after a crash: ``to``'s sidecar is removed, ``path`` takes the name
    ``to`` (now without a sidecar: format-checked only), then ``path``'s sidecar follows it."""
    path, to = Path(path), Path(to)
    _unlink(_sidecar(to))
    os.replace(path, to)
    if _sidecar(path).exists():
        os.replace(_sidecar(path), _sidecar(to))


def quarantine(path: str | Path) -> Path:
    """Move a damaged file (and its sidecar) aside so nothing is lost and it is not read again: to ``<name>.corrupt``,
    or ``<name>.corrupt.1``, ``.corrupt.2``, ... when that is taken (an earlier quarantine is never overwritten)."""
    path = Path(path)
    dest = path.with_name(path.name + ".corrupt")
    n = 0
    while dest.exists() or _sidecar(dest).exists():
        n += 1
        dest = path.with_name(f"{path.name}.corrupt.{n}")
    os.replace(path, dest)
    side = _sidecar(path)
    if side.exists():
        os.replace(side, _sidecar(dest))
    return dest


def _json_default(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a damaged one raises ``CorruptFileError`` naming it."""
    path = Path(path)
    from iclab.core.safe_parse import DocumentError, load_json_file  # bounded: size, nesting, repeated keys

    try:
        return load_json_file(path, what="the file")
    except (OSError, DocumentError) as e:
        raise CorruptFileError(path, f"not readable JSON ({e})") from e


def probe_writable(folder: str | Path, hint: str = "choose another --out") -> None:
    """Create ``folder`` and write (then remove) a small file in it, before any work: a directory that cannot be
    written (read-only, ``/proc``, a full disk) raises ``OutputError`` naming it and ``hint``, not a traceback after
    the run."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        atomic_write_text(probe, "iclab\n")
        _unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot write the run directory {folder} ({e.strerror or e}); {hint}") from e
