"""One writer per run directory: the lock that :func:`iclab.experiments.runner.run_experiment` and the sweeps hold
while they write a run directory."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import filelock

from iclab.core.errors import CorruptFileError, IclabError
from iclab.core.io import atomic_write_json, read_json


class RunLockedError(IclabError):
    """Another process holds the run directory's lock (``wait=False``)."""


@contextlib.contextmanager
def run_lock(run_dir: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold ``run_dir/.lock`` (one writer per run directory); ``run_dir/lock.json`` says who holds it."""
    lock = filelock.FileLock(run_dir / ".lock")
    owner = run_dir / "lock.json"
    try:
        lock.acquire(timeout=-1 if wait else 0, poll_interval=0.2)
    except filelock.Timeout:
        holder = "another process"
        with contextlib.suppress(CorruptFileError):
            info = read_json(owner)
            holder = f"process {info.get('pid')} on {info.get('host')} (since {info.get('since')})"
        raise RunLockedError(f"{run_dir} is being written by {holder}; wait for it, or drop --no-wait") from None
    try:
        atomic_write_json(
            owner, {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        )
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
