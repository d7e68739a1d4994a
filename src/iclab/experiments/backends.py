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
before any work.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import multiprocessing as mp
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from iclab.core.errors import ConfigError, IclabError, OutputError

BACKENDS = ("local", "ray")


class TaskError(IclabError):
    """A task failed on a worker; the message carries its label and the worker's traceback."""


@dataclass(frozen=True)
class Outcome:
    """What one task gave back: its value or its error (the worker's traceback), where and how long it ran."""

    index: int
    label: str
    value: Any = None
    error: str | None = None
    host: str = ""
    seconds: float = 0.0
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value, or a :class:`TaskError` naming the task and carrying the worker's traceback."""
        if self.error is not None:
            raise TaskError(f"{self.label} failed on {self.host or 'a worker'}:\n{self.error}")
        return self.value


OnDone = Callable[[Outcome], None]


class Backend(Protocol):
    name: str

    @property
    def parallelism(self) -> int:
        """Processes that run tasks at once (1: the driver itself, tasks one after another)."""
        ...

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        """Run ``fn(item)`` for every item and return one :class:`Outcome` per item, in order."""
        ...


# --------------------------------------------------------------------------------------------------- the task side


@dataclass(frozen=True)
class WorkerSettings:
    """The driver's process-wide settings a worker copies before its first task."""

    threads: int = 1
    deterministic: bool = True
    tune_allocator: bool = True
    allow_large: bool = False

    @classmethod
    def from_driver(cls, threads: int = 1) -> WorkerSettings:
        from iclab.core import devices

        return cls(
            threads=threads,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            tune_allocator=bool(getattr(devices, "_allocator_tuned", False)),
            allow_large=os.environ.get("ICLAB_ALLOW_LARGE", "") not in ("", "0"),
        )

    def apply(self) -> None:
        torch.set_num_threads(self.threads)
        if self.allow_large:
            os.environ["ICLAB_ALLOW_LARGE"] = "1"
        if self.tune_allocator:
            from iclab.core.devices import tune_cpu_allocator

            tune_cpu_allocator()
        if self.deterministic:
            from iclab.core.seeding import use_deterministic_algorithms

            use_deterministic_algorithms()


def run_task(
    fn: Callable[[Any], Any], item: Any, settings: WorkerSettings | None = None
) -> tuple[Any, str | None, str, float]:
    """Run one task where it lands: (value, traceback or None, host, seconds). Errors are returned, not raised, so a
    task's own failure is reported once and never retried (a retry is for a worker that died)."""
    if settings is not None:
        settings.apply()
    t0 = time.perf_counter()
    try:
        value, error = fn(item), None
    except Exception:  # reported to the driver with the worker's traceback
        value, error = None, traceback.format_exc()
    return value, error, socket.gethostname(), time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------- local


@dataclass
class LocalBackend:
    """``workers`` processes on this machine (spawned, ``threads`` torch threads each, kept until :meth:`close`);
    ``workers=1`` runs the tasks in this process one after another (today's behaviour: nothing is pickled).

    Spawned workers import the driver's ``__main__`` module: a script that uses a pool must keep its work under
    ``if __name__ == "__main__":``, as everywhere with Python's multiprocessing (the ``iclab`` command does)."""

    workers: int = 1
    threads: int = 1
    retries: int = 2  # times a task is resubmitted after its worker process died
    name: str = "local"
    _pool: cf.ProcessPoolExecutor | None = field(default=None, init=False, repr=False)

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
            self._pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)
            atexit.register(self.close)
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (a later map starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        _check_labels(items, labels)
        if self.workers == 1:
            return [_finish(i, labels[i], run_task(fn, item), 1, on_done) for i, item in enumerate(items)]
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
            broken: list[int] = []
            for fut in cf.as_completed(futures):
                i = futures[fut]
                try:
                    result = fut.result()
                except cf.process.BrokenProcessPool:
                    broken.append(i)
                    continue
                outcomes[i] = _finish(i, labels[i], result, attempts[i], on_done)
            if broken:  # a worker died: every task still in the pool was lost with it; a new pool retries them
                self.close()
            pending = []
            for i in sorted(broken):
                if attempts[i] > self.retries:
                    err = f"its worker process died {attempts[i]} times (killed, or out of memory)"
                    outcomes[i] = _finish(i, labels[i], (None, err, socket.gethostname(), 0.0), attempts[i], on_done)
                else:
                    pending.append(i)
        return [outcomes[i] for i in range(len(items))]


# --------------------------------------------------------------------------------------------------- Ray


@dataclass
class RayBackend:
    """Ray core tasks: ``ray.init(address)`` (None: a local Ray started here with this machine's cores; "auto" or
    "HOST:PORT": a running cluster), one task per item with ``cpus_per_task`` CPUs (and torch threads) and
    ``gpus_per_task`` GPUs. Ray retries a task whose worker died up to ``max_retries`` times."""

    address: str | None = None
    cpus_per_task: float = 1
    gpus_per_task: float = 0
    max_retries: int = 3
    num_cpus: int | None = None  # a local Ray only: cores to give it (default: all)
    name: str = "ray"

    def __post_init__(self) -> None:
        if not (isinstance(self.cpus_per_task, int | float) and self.cpus_per_task > 0):
            raise ConfigError(f"--cpus-per-task must be > 0; got {self.cpus_per_task!r}")
        if not (isinstance(self.gpus_per_task, int | float) and self.gpus_per_task >= 0):
            raise ConfigError(f"--gpus-per-task must be >= 0; got {self.gpus_per_task!r}")
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--backend ray needs Ray: pip install 'iclab[ray]'") from None

    @property
    def parallelism(self) -> int:
        ray = self._ray()
        return max(1, int(ray.cluster_resources().get("CPU", 1) // self.cpus_per_task))

    def _ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
            if self.address is None:
                kwargs["num_cpus"] = self.num_cpus
            else:
                kwargs["address"] = self.address
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local Ray on loopback; a cluster sets its own
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"cannot connect to Ray at {self.address!r}: {e}") from None
        return ray

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        _check_labels(items, labels)
        ray = self._ray()
        threads = max(1, int(self.cpus_per_task))
        settings = WorkerSettings.from_driver(threads)
        remote = ray.remote(num_cpus=self.cpus_per_task, num_gpus=self.gpus_per_task, max_retries=self.max_retries)(
            run_task
        )
        refs = {remote.remote(fn, item, settings): i for i, item in enumerate(items)}
        outcomes: dict[int, Outcome] = {}
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    result = ray.get(ref)
                except Exception as e:  # the worker died more than max_retries times, or the task could not run
                    result = (None, f"{type(e).__name__}: {e}", "", 0.0)
                outcomes[i] = _finish(i, labels[i], result, 1, on_done)
        return [outcomes[i] for i in range(len(items))]

    def check_shared_storage(self, out: Path) -> None:
        """Refuse ``out`` unless every node of the cluster sees it (resume across machines needs shared storage)."""
        check_shared_storage(self._ray(), out)


def check_shared_storage(ray: Any, out: Path) -> None:
    """Write a marker under ``out`` and read it on every alive node; a node that does not see it is named."""
    out = Path(out).resolve()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return  # one machine: local storage is shared with itself
    marker = out / f".iclab-shared-{uuid.uuid4().hex}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text("iclab")
    except OSError as e:
        raise OutputError(f"cannot write {out} ({e.strerror or e})") from e
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0)(_sees)
        refs = {
            n["NodeManagerAddress"]: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote(str(marker))
            for n in nodes
        }
        blind = [addr for addr, ref in refs.items() if not ray.get(ref)]
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise OutputError(
            f"--out {out} is not shared storage: nodes {blind} do not see it. On a cluster put --out on storage every "
            "node mounts at the same path (NFS, a mounted bucket), so that a run resumed on another node finds its "
            "checkpoints"
        )


def _sees(path: str) -> bool:
    return Path(path).is_file()


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
    raise ConfigError(f"--backend must be one of {list(BACKENDS)}; got {backend!r}")


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """A local Ray for the span of a block (tests, examples); shut down after."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_cpus, log_to_driver=False, include_dashboard=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _check_labels(items: Sequence[Any], labels: Sequence[str]) -> None:
    if len(labels) != len(items):
        raise ValueError(f"{len(items)} items but {len(labels)} labels")


def _finish(
    i: int, label: str, result: tuple[Any, str | None, str, float], attempts: int, on_done: OnDone | None
) -> Outcome:
    value, error, host, seconds = result
    outcome = Outcome(i, label, value, error, host, seconds, attempts)
    if on_done is not None:
        on_done(outcome)
    return outcome
