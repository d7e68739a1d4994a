"""Stopping a long run in pieces: a deadline and a flag, checked by the trainer at every step boundary.

    with stop.handling(deadline=time.time() + stop.parse_duration("2h")):
        run_experiment(...)          # raises Stopped once a run has checkpointed at its next step boundary

The state is one per process: an absolute wall-clock deadline (``--time-limit``), and a flag set by the signal handlers
of :func:`handling` (SIGTERM and SIGUSR1, what SLURM sends before it kills a job, and SIGINT, Ctrl-C). The trainer
calls :func:`should_stop` after each step: the flag, or ``time.monotonic()`` against the deadline (no system call on
Linux, where the clock is read in user space). When it answers True the run checkpoints the state it would resume from
(model, optimiser, history, snapshots; the batches are a function of the seed and the step) and raises
:class:`Stopped`; the same call then continues it bit for bit (``tests/test_time_limit.py``). A second signal while
stopping kills at once (the pool's workers with it).

A process pool's workers (:class:`iclab.experiments.backends.LocalBackend`) get the deadline in each task's payload
(:func:`set_deadline`) and handlers that only set the flag (:func:`install_worker_handlers`); the driver forwards
the signals it receives to them (:func:`forward_to`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

from iclab.core.errors import ConfigError

EX_TEMPFAIL = 75  # sysexits.h: a temporary failure, run again (a stopped command)
EX_INTERRUPTED = 130  # 128 + SIGINT: a command stopped by Ctrl-C
SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Stopped(Exception):
    """A run, an experiment or a command stopped before its end with its state checkpointed; the same call continues
    it. ``progress`` says what is done ("ahn2023.fig1: 1 run finished, 1 partial (seed1 at step 12/20)"), ``reason``
    what stopped it ("time limit", "SIGTERM", "SIGUSR1", "SIGINT" or "requested"), ``not_started`` how many runs of the
    stopped batch never started. Not an ``IclabError``: nothing was wrong with the input."""

    def __init__(self, progress: str, reason: str = "requested", not_started: int = 0) -> None:
        super().__init__(progress)
        self.progress, self.reason, self.not_started = progress, reason, not_started

    def __reduce__(self) -> tuple[type[Stopped], tuple[str, str, int]]:  # crosses process boundaries (a pool's tasks)
        return type(self), (self.progress, self.reason, self.not_started)

    def __str__(self) -> str:
        return f"incomplete: {self.progress}; run the same command to continue"

    @property
    def exit_code(self) -> int:
        """75 (EX_TEMPFAIL: run again), or 130 after Ctrl-C."""
        return EX_INTERRUPTED if self.reason == "SIGINT" else EX_TEMPFAIL


class _State:
    deadline: float | None = None  # absolute, time.time()
    mono_deadline: float | None = None  # the same instant on time.monotonic(), immune to clock changes
    reason: str | None = None  # set by a signal or request()
    signals: int = 0
    worker: bool = False  # a pool worker: every signal only sets the flag; the driver kills


_state = _State()
_forward: list[Callable[[], Iterable[int]]] = []  # the processes the driver forwards its signals to


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90s``, ``45m``, ``2h``, ``1h30m``, ``1d``, or a bare number of seconds; > 0."""
    s = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", s)
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        seconds = float(s)
    elif parts and "".join(n + u for n, u in parts) == s:
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(
            f"--time-limit must be a duration > 0 such as 90s, 45m, 2h or 1h30m (units s, m, h, d); got {text!r}"
        )
    return seconds


def set_deadline(at: float | None) -> None:
    """Stop every run of this process at its first step boundary after ``at`` (``time.time()``); None: no deadline."""
    _state.deadline = at
    _state.mono_deadline = None if at is None else time.monotonic() + (at - time.time())


def deadline() -> float | None:
    """This process's deadline (``time.time()``), or None: what a pool's tasks carry."""
    return _state.deadline


def request(reason: str = "requested") -> None:
    """Raise the flag: every run of this process stops at its next step boundary."""
    if _state.reason is None:
        _state.reason = reason


def requested() -> str | None:
    """Why this process is stopping ("time limit", a signal's name, ...), or None while it is not."""
    if _state.reason is None and _state.mono_deadline is not None and time.monotonic() >= _state.mono_deadline:
        return "time limit"
    return _state.reason


def should_stop() -> bool:
    """True once the flag is raised or the deadline has passed: the trainer's check at each step boundary."""
    if _state.reason is not None:
        return True
    return _state.mono_deadline is not None and time.monotonic() >= _state.mono_deadline


def reset() -> None:
    """No deadline, no flag (a new command in the same process, a test)."""
    set_deadline(None)
    _state.reason, _state.signals = None, 0


def forward_to(pids: Callable[[], Iterable[int]]) -> Callable[[], None]:
    """Forward the signals the driver receives to the processes ``pids()`` names (a pool's workers); returns the
    function that stops forwarding."""
    _forward.append(pids)
    return lambda: _forward.remove(pids) if pids in _forward else None


def _children() -> list[int]:
    out: list[int] = []
    for pids in list(_forward):
        with contextlib.suppress(Exception):  # a pool shutting down: its table may be gone
            out.extend(pids())
    return out


def _handle(signum: int, frame: FrameType | None) -> None:
    _state.signals += 1
    if _state.worker:
        request(signal.Signals(signum).name)
        return
    if _state.signals > 1:  # a second signal while stopping: kill at once, the workers with it
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    request(signal.Signals(signum).name)
    for pid in _children():
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def install_worker_handlers() -> None:
    """A pool worker's handlers (its initializer): SIGTERM, SIGUSR1 and SIGINT raise the flag, however often."""
    _state.worker = True
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _handle)


@contextlib.contextmanager
def handling(deadline: float | None = None) -> Iterator[None]:
    """For the span of a command: the deadline set and SIGTERM, SIGUSR1 and SIGINT handled (the first stops at the
    next step boundary, a second kills); the previous handlers and a clear state after. Outside the main thread only
    the deadline applies."""
    reset()
    set_deadline(deadline)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        reset()
