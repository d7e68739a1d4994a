"""Where independent work runs: in this process, on a local process pool, or on a Ray cluster.

    backend = make_backend("local", workers=4)          # or make_backend("ray", address="auto", cpus_per_task=2)
    outcomes = backend.map(fn, items, labels=[...])     # one Outcome per item, in order; fn and items must pickle
    values = [o.unwrap() for o in outcomes]             # re-raises a task's error in the driver

A backend only decides *where* a unit of work runs (DESIGN: "the unit of distributed work is one training run"); what
runs, its seeds and its run directory are the caller's. Every task gets ``threads`` torch threads (1 by default:
a process per core), the driver's determinism and allocator settings, and its own process. The same seeds then give
the same numbers whichever backend ran them: a test compares the three bit for bit.

Faults. A task that raises is an :class:`Outcome` with ``error`` (its traceback) and the others go on; the caller
decides (an experiment re-raises the first, a sweep records it). A worker process that dies (killed, out of memory)
is retried: Ray retries the task (``max_retries``) and the local pool is rebuilt and the task resubmitted (``retries``);
a training run then resumes from its last checkpoint in its own run directory.

Ray is an optional extra (``pip install iclab[ray]``): the same code runs on a laptop (a local Ray started on demand,
``address=None``) and on a cluster (``address="auto"`` or ``"HOST:PORT"`` of a running head). On a cluster the output
directory must be shared storage (NFS, a mounted bucket): :func:`check_shared_storage` verifies it on every node
before any work, and :func:`check_same_code` that every node imports the driver's iclab sources (:func:`source_hash`).
Every path a task gets is absolute (the drivers resolve ``--out`` first): a worker's working directory may be
elsewhere. A local pool's workers exit once their driver is gone (killed with SIGKILL, it cannot close them). SLURM
job arrays: :mod:`iclab.experiments.slurm`.

This module holds the local pool and :func:`make_backend`; the task side (:class:`Outcome`, :class:`WorkerSettings`,
:func:`run_task`) lives in ``iclab.experiments._tasks`` and Ray in :mod:`iclab.experiments.ray_backend`, and every
name of both is importable from here.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from iclab.core.errors import ConfigError
from iclab.experiments._tasks import Backend as Backend
from iclab.experiments._tasks import OnDone as OnDone
from iclab.experiments._tasks import Outcome as Outcome
from iclab.experiments._tasks import TaskError as TaskError
from iclab.experiments._tasks import WorkerSettings as WorkerSettings
from iclab.experiments._tasks import _check_labels as _check_labels
from iclab.experiments._tasks import _count_not_started as _count_not_started
from iclab.experiments._tasks import _finish as _finish
from iclab.experiments._tasks import _not_started as _not_started
from iclab.experiments._tasks import run_task as run_task
from iclab.experiments.ray_backend import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from iclab.experiments.ray_backend import RayBackend as RayBackend
from iclab.experiments.ray_backend import check_same_code as check_same_code
from iclab.experiments.ray_backend import check_shared_storage as check_shared_storage
from iclab.experiments.ray_backend import local_ray as local_ray
from iclab.experiments.ray_backend import source_hash as source_hash
from iclab.training import stop

BACKENDS = ("local", "ray", "slurm")


# --------------------------------------------------------------------------------------------------- local


def _worker_init(parent: int) -> None:
    """A pool worker's start: the stop handlers (:func:`iclab.training.stop.install_worker_handlers`) and a watchdog
    that ends the worker once its driver is gone (a driver killed with SIGKILL cannot stop its pool: its orphaned
    workers would train on for nobody)."""
    stop.install_worker_handlers()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="iclab-orphan-watchdog").start()


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    """Poll the parent process id; once it changes (the driver died and the worker was re-parented), exit at once.
    Training runs checkpoint with atomic writes, so the next command resumes from the last checkpoint."""
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(70)


@dataclass
class LocalBackend:
    """``workers`` processes on this machine (spawned, ``threads`` torch threads each, kept until :meth:`close`);
    ``workers=1`` runs the tasks in this process one after another (today's behaviour: nothing is pickled).

    Stopping (:mod:`iclab.training.stop`): each task carries the driver's deadline; the workers' SIGTERM, SIGUSR1 and
    SIGINT raise their stop flag, and the driver forwards the signals it receives to them. Once stopping, the driver
    cancels the tasks not started, waits for the running ones to checkpoint, and closes the pool.

    Spawned workers import the driver's ``__main__`` module: a script that uses a pool must keep its work under
    ``if __name__ == "__main__":``, as everywhere with Python's multiprocessing (the ``iclab`` command does)."""

    workers: int = 1
    threads: int = 1
    retries: int = 2  # times a task is resubmitted after its worker process died
    name: str = "local"
    _pool: cf.ProcessPoolExecutor | None = field(default=None, init=False, repr=False)
    _unforward: Callable[[], None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"--workers must be an int >= 1; got {self.workers!r}")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ConfigError(f"threads per worker must be an int >= 1; got {self.threads!r}")

    @property
    def parallelism(self) -> int:
        return self.workers

    def _executor(self) -> cf.ProcessPoolExecutor:
        """The worker processes, started on first use and kept for later maps (a worker imports torch once)."""
        if self._pool is None:
            ctx = mp.get_context("spawn")  # fork after torch's thread pools started is unsafe
            pool = cf.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
            )
            self._pool = pool
            self._unforward = stop.forward_to(lambda: list(getattr(pool, "_processes", None) or {}))
            atexit.register(self.close)
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (a later map starts new ones)."""
        if self._unforward is not None:
            self._unforward()
            self._unforward = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        _check_labels(items, labels)
        if self.workers == 1:
            return _count_not_started(
                [
                    _finish(
                        i, labels[i], _not_started(labels[i]) if stop.should_stop() else run_task(fn, item), 1, on_done
                    )
                    for i, item in enumerate(items)
                ]
            )
        settings = WorkerSettings.from_driver(self.threads)
        outcomes: dict[int, Outcome] = {}
        attempts = dict.fromkeys(range(len(items)), 0)
        pending = list(range(len(items)))
        while pending:
            pool = self._executor()
            futures = {}
            for i in pending:
                attempts[i] += 1
                futures[pool.submit(run_task, fn, items[i], settings)] = i
            broken = self._gather(futures, labels, attempts, outcomes, on_done)
            if broken or stop.should_stop():  # a worker died, every task still in the pool with it; or stopping
                self.close()
            pending = []
            for i in sorted(broken):
                if stop.should_stop():
                    outcomes[i] = _finish(i, labels[i], _not_started(labels[i]), attempts[i], on_done)
                elif attempts[i] > self.retries:
                    err = f"its worker process died {attempts[i]} times (killed, or out of memory)"
                    outcomes[i] = _finish(i, labels[i], (None, err, socket.gethostname(), 0.0), attempts[i], on_done)
                else:
                    pending.append(i)
        return _count_not_started([outcomes[i] for i in range(len(items))])

    def _gather(
        self,
        futures: dict[cf.Future[Any], int],
        labels: Sequence[str],
        attempts: dict[int, int],
        outcomes: dict[int, Outcome],
        on_done: OnDone | None,
    ) -> list[int]:
        """Wait for ``futures`` and record their outcomes; return the tasks lost with a dead worker. Once stopping
        (:func:`iclab.training.stop.should_stop`, checked every fraction of a second) the tasks not started are
        cancelled and the running ones waited for: they checkpoint and stop."""
        broken: list[int] = []
        waiting, cancelled = set(futures), False
        while waiting:
            done, waiting = cf.wait(waiting, timeout=0.2, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i = futures[fut]
                if fut.cancelled():
                    outcomes[i] = _finish(i, labels[i], _not_started(labels[i]), attempts[i], on_done)
                    continue
                try:
                    result = fut.result()
                except cf.process.BrokenProcessPool:
                    broken.append(i)
                    continue
                outcomes[i] = _finish(i, labels[i], result, attempts[i], on_done)
            if not cancelled and stop.should_stop():
                cancelled = True
                for fut in waiting:
                    fut.cancel()
        return broken


# --------------------------------------------------------------------------------------------------- helpers


def make_backend(
    backend: str = "local",
    *,
    workers: int = 1,
    address: str | None = None,
    cpus_per_task: float = 1,
    gpus_per_task: float = 0,
) -> LocalBackend | RayBackend:
    """The backend the CLI's ``--backend/--workers/--address/--cpus-per-task/--gpus-per-task`` name."""
    if backend == "local":
        if address is not None or gpus_per_task:
            raise ConfigError("--address and --gpus-per-task are Ray options; add --backend ray")
        return LocalBackend(workers=workers, threads=max(1, int(cpus_per_task)))
    if backend == "ray":
        return RayBackend(address=address, cpus_per_task=cpus_per_task, gpus_per_task=gpus_per_task)
    if backend == "slurm":
        raise ConfigError("--backend slurm: iclab.experiments.slurm.slurm_backend makes it (its options: --slurm)")
    raise ConfigError(f"--backend must be one of {list(BACKENDS)}; got {backend!r}")
