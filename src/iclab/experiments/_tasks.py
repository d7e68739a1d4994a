"""The task side of every backend (:mod:`iclab.experiments.backends`): what a task gives back (:class:`Outcome`), the
driver's settings a worker copies (:class:`WorkerSettings`) and the wrapper a task runs in where it lands
(:func:`run_task`), shared by the local pool, Ray (:mod:`iclab.experiments.ray_backend`) and SLURM
(:mod:`iclab.experiments.slurm`).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from iclab.core.errors import IclabError
from iclab.training import stop


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
        return self.error is None and not self.stopped

    @property
    def stopped(self) -> bool:
        """The task stopped at a step boundary (:mod:`iclab.training.stop`) or never started: its value is the
        :class:`~iclab.training.stop.Stopped`."""
        return isinstance(self.value, stop.Stopped)

    def unwrap(self) -> Any:
        """The value, or a :class:`TaskError` naming the task and carrying the worker's traceback; a stopped task
        raises its :class:`~iclab.training.stop.Stopped`."""
        if self.error is not None:
            raise TaskError(f"{self.label} failed on {self.host or 'a worker'}:\n{self.error}")
        if isinstance(self.value, stop.Stopped):
            raise self.value
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
    """The driver's process-wide settings a worker copies before each task, and the driver's stop deadline
    (``--time-limit``: an absolute ``time.time()``, not part of any run's config or hash)."""

    threads: int = 1
    deterministic: bool = True
    tune_allocator: bool = True
    allow_large: bool = False
    deadline: float | None = None

    @classmethod
    def from_driver(cls, threads: int = 1) -> WorkerSettings:
        from iclab.core import devices

        return cls(
            threads=threads,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            tune_allocator=bool(getattr(devices, "_allocator_tuned", False)),
            allow_large=os.environ.get("ICLAB_ALLOW_LARGE", "") not in ("", "0"),
            deadline=stop.deadline(),
        )

    def apply(self) -> None:
        torch.set_num_threads(self.threads)
        stop.set_deadline(self.deadline)
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
    task's own failure is reported once and never retried (a retry is for a worker that died). A task that stopped
    (:class:`~iclab.training.stop.Stopped`, its state checkpointed) returns the Stopped as its value."""
    if settings is not None:
        settings.apply()
    t0 = time.perf_counter()
    out, err = _Tail(sys.stdout), _Tail(sys.stderr)
    try:
        if settings is None:  # in the driver itself: its output is the user's already
            value, error = fn(item), None
        else:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                value, error = fn(item), None
    except stop.Stopped as e:
        value, error = e, None
    except Exception:  # reported to the driver with the worker's traceback and the end of its output
        value, error = None, traceback.format_exc()
        logs = "\n".join(t for t in (out.text(), err.text()) if t)
        if logs:
            error += f"--- the task's output (last lines) ---\n{logs}\n"
    return value, error, socket.gethostname(), time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------- worker output


class _Tail(io.TextIOBase):
    """A stream that writes through to ``stream`` and keeps its last ``lines`` lines (a failed task's output)."""

    def __init__(self, stream: Any, lines: int = 40) -> None:
        self.stream, self.lines = stream, collections.deque[str](maxlen=lines)
        self._partial = ""

    def write(self, text: str) -> int:
        with contextlib.suppress(Exception):
            self.stream.write(text)
        *full, self._partial = (self._partial + text).split("\n")
        self.lines.extend(full)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.flush()

    def text(self) -> str:
        return "\n".join([*self.lines, self._partial]).strip()


# --------------------------------------------------------------------------------------------------- helpers


def _check_labels(items: Sequence[Any], labels: Sequence[str]) -> None:
    if len(labels) != len(items):
        raise ValueError(f"{len(items)} items but {len(labels)} labels")


def _not_started(label: str) -> tuple[Any, str | None, str, float]:
    """The result of a task that a stop kept from starting."""
    return stop.Stopped(f"{label} not started", stop.requested() or "requested", 1), None, socket.gethostname(), 0.0


def _count_not_started(outcomes: list[Outcome]) -> list[Outcome]:
    """Every stopped outcome's Stopped counts the tasks of the whole map that never started (the one an experiment
    raises then says so)."""
    stopped = [o.value for o in outcomes if isinstance(o.value, stop.Stopped)]
    total = sum(e.not_started for e in stopped)
    for e in stopped:
        e.not_started = total
    return outcomes


def _finish(
    i: int, label: str, result: tuple[Any, str | None, str, float], attempts: int, on_done: OnDone | None
) -> Outcome:
    value, error, host, seconds = result
    outcome = Outcome(i, label, value, error, host, seconds, attempts)
    if on_done is not None:
        on_done(outcome)
    return outcome
