"""Many experiments at once: ``iclab reproduce`` spreads whole experiments over a pool of processes, longest first.

    done = run_experiments(["ahn2023.fig1", "zhang2025.fig3"], "quick", out="runs", workers=2)
    [d.result.claims for d in done if d.ok]          # one Done per experiment, in the order given

Each worker process runs one experiment at a time, in full, with ``threads`` torch threads (1 by default: a process
per core), exactly as :func:`~iclab.experiments.runner.run_experiment` runs it in the driver: same run directory, same
seeds, same batched training runs, hence the same ``claims.json``. Its figures are drawn in the worker; the driver
only gathers the results, prints each experiment's claims as it finishes and writes the report. The pool is
:class:`~iclab.experiments.backends.LocalBackend`: a worker imports torch and the cards once, a worker that dies is
replaced and its experiment resumed from the checkpoints, and an experiment that raises is reported while the others
go on.

Order. A pool of ``k`` workers finishes soonest when the longest experiments start first (the longest-processing-time
rule: the last to start are short, so the workers end close together). :func:`expected_seconds` takes each
experiment's time from the ``summary.json`` an earlier run at the same preset wrote under ``out``; experiments never
run there come first, in the order of :data:`LONGEST_AT_QUICK`, then in the order given.
"""

from __future__ import annotations

import dataclasses
import math
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from iclab.core.errors import CorruptFileError, IclabError, OutputError
from iclab.core.io import read_json
from iclab.experiments.backends import LocalBackend, Outcome
from iclab.experiments.runner import ExperimentResult, run_experiment
from iclab.training.stop import Stopped

#: experiments whose quick preset takes longest on a CPU, longest first: the order of a first run, before any
#: ``summary.json`` records the times (the rest follow in the order given)
LONGEST_AT_QUICK = (
    "wang2025.language",
    "sun2025.fig2",
    "sun2025.linear_depth",
    "cheng2024.fig1",
    "wang2025.appf",
    "ahn2023.fig7",
    "ahn2023.fig1",
    "ahn2023.fig3",
    "sun2025.fig1",
    "wang2025.fig4_right",
    "sun2025.order_ablation",
    "wang2025.fig2_rbf",
    "cheng2024.fig5",
    "ahn2023.isotropic",
    "wang2025.fig4_left",
    "cheng2024.fig6",
)


def cores() -> int:
    """The cores this process may run on (its CPU affinity; a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on macOS and Windows
        return os.cpu_count() or 1


def default_workers(experiments: int, backend: str = "local", device: str = "cpu") -> int:
    """``iclab reproduce``'s ``--workers`` when not given: the cores for several experiments on this machine's CPU,
    else 1 (one experiment runs in the driver, as before; a GPU or Ray is shared otherwise)."""
    if experiments < 2 or backend != "local":
        return 1
    if device != "cpu" and not (device == "auto" and not torch.cuda.is_available()):
        return 1
    return cores()


@dataclass(frozen=True)
class Job:
    """One experiment to run in a worker: the arguments of :func:`~iclab.experiments.runner.run_experiment`."""

    name: str
    preset: str
    out: Path
    device: str = "cpu"
    force: bool = False
    wait: bool = True


@dataclass(frozen=True)
class Done:
    """One experiment's end: its result (without the in-memory ``results``, which stay in ``results.pt``), or its
    error: ``error`` for the report (``Type: message``), ``detail`` to print (the message of iclab's own errors, the
    traceback of any other), ``output_error`` when the run directory could not be written (nothing can: stop)."""

    name: str
    result: ExperimentResult | None = None
    error: str | None = None
    detail: str = ""
    output_error: bool = False

    @property
    def ok(self) -> bool:
        return self.result is not None


def run_one(job: Job) -> Done:
    """Run ``job`` in this process and return what the driver needs (the task of a pool worker)."""
    try:
        res = run_experiment(job.name, job.preset, out=job.out, device=job.device, force=job.force, wait=job.wait)
    except Stopped:  # --time-limit or a signal: checkpointed; the pool hands it back as stopped, not failed
        raise
    except Exception as e:  # one broken experiment must not lose the others
        detail = str(e) if isinstance(e, IclabError) else traceback.format_exc()
        return Done(job.name, None, f"{type(e).__name__}: {e}", detail, isinstance(e, OutputError))
    return Done(job.name, dataclasses.replace(res, results={}))


def expected_seconds(out: str | Path, name: str, preset: str) -> float | None:
    """The seconds of ``name``'s newest run at ``preset`` under ``out`` (its ``summary.json``), or None."""
    summaries = sorted(Path(out, name).glob(f"{preset}-*/summary.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(summaries):
        try:
            seconds = read_json(path).get("seconds")
        except (CorruptFileError, OSError, AttributeError):
            continue
        if isinstance(seconds, int | float) and math.isfinite(seconds):
            return float(seconds)
    return None


def schedule(names: Sequence[str], seconds: Mapping[str, float | None]) -> list[str]:
    """``names`` longest first: those without a time (``seconds`` None or absent) first, in the order of
    :data:`LONGEST_AT_QUICK` and then as given, then the timed ones by decreasing time (ties as given)."""
    rank = {n: i for i, n in enumerate(LONGEST_AT_QUICK)}
    position = {n: i for i, n in enumerate(names)}

    def key(n: str) -> tuple[int, float, int, int]:
        s = seconds.get(n)
        if s is None:
            return (0, 0.0, rank.get(n, len(rank)), position[n])
        return (1, -s, 0, position[n])

    return sorted(names, key=key)


def run_experiments(
    names: Sequence[str],
    preset: str,
    *,
    out: str | Path,
    device: str = "cpu",
    force: bool = False,
    wait: bool = True,
    workers: int | None = None,
    threads: int = 1,
    on_done: Callable[[Done], None] | None = None,
    task: Callable[[Job], Done] | None = None,
) -> list[Done]:
    """Run the experiments ``names`` on ``workers`` processes (default: :func:`cores`) of ``threads`` torch threads,
    longest first (:func:`schedule`); ``on_done`` is called in this process as each ends. One :class:`Done` per name,
    in the order of ``names``; :class:`~iclab.training.stop.Stopped` once the pool ends if ``--time-limit`` or a
    signal stopped any (the others kept their results). ``task`` (default :func:`run_one`; a module-level function: it
    travels to the workers by name) runs a job."""
    workers = workers or cores()
    order = schedule(names, {n: expected_seconds(out, n, preset) for n in names})
    jobs = [Job(n, preset, Path(out), device, force, wait) for n in order]

    def finished(o: Outcome) -> None:
        if on_done is not None and not o.stopped:
            on_done(_done(o))

    pool = LocalBackend(workers=min(workers, max(1, len(jobs))), threads=threads)
    try:
        outcomes = pool.map(task or run_one, jobs, labels=order, on_done=finished)
    finally:
        pool.close()
    stopped = [o.value for o in outcomes if o.stopped]
    if stopped:  # the finished experiments kept their results; the same command continues the others
        ok = sum(1 for o in outcomes if not o.stopped)
        raise Stopped(f"{ok}/{len(names)} experiments finished; {stopped[0].progress}", stopped[0].reason)
    by_name = {o.label: _done(o) for o in outcomes}
    return [by_name[n] for n in names]


def _done(o: Outcome) -> Done:
    """The task's own :class:`Done`, or one for a worker that failed outside it (died past its retries)."""
    if o.ok and isinstance(o.value, Done):
        return o.value
    error = o.error or f"the worker returned {type(o.value).__name__}, not Done"
    return Done(o.label, None, f"WorkerError: {error.strip().splitlines()[-1]}", error)
