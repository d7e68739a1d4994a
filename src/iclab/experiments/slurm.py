"""SLURM: an experiment's independent training runs (or a sweep's points) as one SLURM job array, through submitit.

    backend = SlurmBackend(partition="gpu", time_min=240, cpus_per_task=8, gpus_per_task=1, folder="/shared/submitit")
    outcomes = backend.map(fn, items, labels=[...])     # one array task per item; the driver waits for them

From the command line: ``iclab run EXP --preset paper --backend slurm --cpus-per-task 8 --gpus-per-task 1
--slurm partition=gpu --slurm time=240 --slurm account=myproject --out /shared/runs`` (``partition``, ``time`` in
minutes, ``folder``, ``max-requeues``, ``parallel`` and ``cluster`` are the backend's; any other ``KEY=VALUE`` is an
sbatch option, ``--KEY=VALUE``).

Each batch of independent runs is one job array (``executor.batch()``): one array task per run, ``cpus_per_task``
torch threads, ``gpus_per_task`` GPUs (the run trains on ``cuda``). A task is :class:`submitit.helpers.Checkpointable`:
when SLURM preempts it or its time limit comes, submitit requeues it with the same arguments, and the requeued task
resumes the training run from the run's own last checkpoint in its run directory (``--out`` on storage every node
mounts). The tasks carry the driver's settings and ``--time-limit`` deadline as the local pool's do
(:class:`iclab.experiments.backends.WorkerSettings`); a task's error comes back as its traceback.

``cluster="local"`` runs the array as local processes (submitit's ``LocalExecutor``; the tests do), ``"debug"`` in
this process; None: SLURM when ``sbatch`` is on the PATH, else local processes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iclab.core.errors import ConfigError
from iclab.experiments.backends import OnDone, Outcome, WorkerSettings, _finish, _not_started, run_task
from iclab.training import stop

#: the ``--slurm KEY=VALUE`` keys that are the backend's own (any other is an sbatch option)
OWN_KEYS = {"partition", "time", "folder", "max-requeues", "parallel", "cluster"}


def _checkpointable() -> type:
    """:class:`submitit.helpers.Checkpointable` subclass that runs one task (imported when a backend is made)."""
    import submitit

    class RunTask(submitit.helpers.Checkpointable):
        """One array task: :func:`~iclab.experiments.backends.run_task`. On preemption or at the time limit submitit
        calls :meth:`checkpoint` (inherited: resubmit with the same arguments); the training run then resumes from
        its own last checkpoint."""

        def __call__(self, fn: Callable[[Any], Any], item: Any, settings: WorkerSettings) -> Any:
            return run_task(fn, item, settings)

    return RunTask


@dataclass
class SlurmBackend:
    """Tasks as a SLURM job array (submitit). ``time_min``: each task's time limit; ``max_requeues``: how often a
    preempted or timed-out task is requeued; ``parallel``: array tasks running at once (``%`` of ``--array``);
    ``sbatch``: further sbatch options (``{"account": "x", "qos": "high"}``)."""

    partition: str | None = None
    time_min: int = 60
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    folder: str | Path = "submitit"
    max_requeues: int = 3
    parallel: int = 256
    sbatch: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None  # None: slurm if sbatch is on the PATH; "local": local processes; "debug": here
    poll_s: float = 1.0
    name: str = "slurm"

    def __post_init__(self) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ConfigError("--backend slurm needs submitit: pip install 'iclab[slurm]'") from None
        for key, ok in (
            ("--cpus-per-task", isinstance(self.cpus_per_task, int) and self.cpus_per_task >= 1),
            ("--gpus-per-task", isinstance(self.gpus_per_task, int) and self.gpus_per_task >= 0),
            ("--slurm time", isinstance(self.time_min, int) and self.time_min >= 1),
        ):
            if not ok:
                raise ConfigError(f"{key} must be a whole number (slurm); got {self.__dict__}")
        self.folder = Path(self.folder).absolute()  # the array's tasks read their pickles from here

    @property
    def parallelism(self) -> int:
        return self.parallel

    @property
    def task_device(self) -> str | None:
        return "cuda" if self.gpus_per_task > 0 else None

    def executor(self) -> Any:
        """The submitit executor with this backend's resources."""
        import submitit

        ex = submitit.AutoExecutor(folder=Path(self.folder) / "%j", cluster=self.cluster)
        ex.update_parameters(
            name="iclab",
            timeout_min=self.time_min,
            cpus_per_task=self.cpus_per_task,
            gpus_per_node=self.gpus_per_task,
            tasks_per_node=1,
            nodes=1,
        )
        if ex.cluster == "slurm":
            ex.update_parameters(
                slurm_partition=self.partition,
                slurm_array_parallelism=self.parallel,
                slurm_max_num_timeout=self.max_requeues,
                slurm_additional_parameters=dict(self.sbatch),
            )
        return ex

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        if len(labels) != len(items):
            raise ValueError(f"{len(items)} items but {len(labels)} labels")
        ex = self.executor()
        task = _checkpointable()()
        settings = WorkerSettings.from_driver(self.cpus_per_task)
        with ex.batch():  # one job array
            jobs = [ex.submit(task, fn, item, settings) for item in items]
        outcomes: dict[int, Outcome] = {}
        while len(outcomes) < len(jobs):
            for i, job in enumerate(jobs):
                if i not in outcomes and job.done():
                    outcomes[i] = _finish(i, labels[i], _result(job), 1, on_done)
            if stop.should_stop():  # the running tasks checkpoint only by SLURM's own signal: cancel what is left
                for i, job in enumerate(jobs):
                    if i not in outcomes:
                        job.cancel(check=False)
                        outcomes[i] = _finish(i, labels[i], _not_started(labels[i]), 1, on_done)
            if len(outcomes) < len(jobs):
                time.sleep(self.poll_s)
        return [outcomes[i] for i in range(len(items))]


def _result(job: Any) -> tuple[Any, str | None, str, float]:
    """A finished job's ``run_task`` result, or its failure (the job's own error and the end of its log)."""
    try:
        return tuple(job.result())
    except Exception as e:  # the job died, was cancelled, or timed out more often than it may be requeued
        tail = ""
        with contextlib.suppress(Exception):  # no log to show
            tail = "\n".join((job.stderr() or "").splitlines()[-30:])
        return None, f"{type(e).__name__}: {e}\n{tail}".strip(), "", 0.0


def slurm_backend(options: Sequence[str], *, cpus_per_task: float = 1, gpus_per_task: float = 0) -> SlurmBackend:
    """The backend ``--backend slurm --slurm KEY=VALUE ...`` names (see the module docstring)."""
    own: dict[str, str] = {}
    sbatch: dict[str, str] = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            raise ConfigError(f"--slurm takes KEY=VALUE (partition=gpu, time=240, account=x); got {opt!r}")
        key = key.strip().lstrip("-")
        (own if key in OWN_KEYS else sbatch)[key] = value.strip()
    try:
        return SlurmBackend(
            partition=own.get("partition"),
            time_min=int(own.get("time", 60)),
            cpus_per_task=int(cpus_per_task),
            gpus_per_task=int(gpus_per_task),
            folder=own.get("folder", "submitit"),
            max_requeues=int(own.get("max-requeues", 3)),
            parallel=int(own.get("parallel", 256)),
            cluster=own.get("cluster"),
            sbatch=sbatch,
        )
    except ValueError as e:
        raise ConfigError(f"--slurm: {e}") from None
