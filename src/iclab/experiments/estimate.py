"""What a preset costs before you run it: a probe trains every run for a few steps and projects the rest.

    est = estimate_experiment("zhang2025.fig4", "paper", probe_steps=50)
    est.projected_seconds, est.runs          # the whole experiment's projected wall time, one RunProbe per run

The probe runs the experiment's own ``run`` with the preset's config (same data sizes, models, seeds, evaluation),
then its plots and claims, but :class:`~iclab.experiments.registry.RunContext` trains every run for ``probe_steps``
steps. A sampled run's cost per step is the trainer's in-loop timer (:class:`~iclab.training.StepTiming`: the median
step, robust to a busy machine, plus the evaluation amortised over ``eval_every`` and the drawing of a new batch over
``resample_every``), as is a full-batch run of a
token-level module (trained by the same trainer); a run of a reduced model's full-batch GD or of the population flow
is trained again for half as many steps and the difference of the two times is its cost per step. The rest of a run's
time is its fixed cost (model build, data, first and last evaluation). Past ``probe_runs`` runs, a run trains one step
and borrows the mean step cost of those probed. The projection replaces each run's probe time by its fixed cost plus
steps × step cost:

    projected = wall(probe) − Σ_runs probe seconds + Σ_runs (fixed + steps · step cost)

so the work outside training (data generation, evaluation, Monte Carlo, closed forms, plots) is measured, not
guessed (:attr:`Estimate.outside_seconds`): it runs at the probed config's sizes, so an override that shrinks an
evaluation (Sun et al.'s ``test_batch``: 100 000 float64 Monte-Carlo prompts per test length) shrinks its share, and
the projection counts the evaluation at the preset's size only when the probe runs it at that size. Periodic evaluations and checkpoints inside a long run are counted only as far as the probe reaches them.
An experiment whose analysis needs trained models may fail on the probe's untrained ones; the projection then covers
the runs before the failure, is a lower bound, and says so (``error``). Nothing is written outside a temporary
directory. The estimate carries the probe's :func:`~iclab.core.provenance.provenance` (date, commit, machine,
threads): a projection holds for the machine and the code that were probed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from iclab.core.devices import resolve_device
from iclab.core.errors import ConfigError, CorruptFileError, require_int
from iclab.core.io import safe_torch_load
from iclab.core.provenance import provenance
from iclab.experiments.registry import RunContext, RunProbe, get
from iclab.experiments.runner import resolve_config
from iclab.experiments.sweep import Point, SweepSpec, resolve_point


@dataclass(frozen=True)
class Estimate:
    experiment: str
    preset: str
    probe_steps: int
    wall_seconds: float  # the probe's own wall time
    runs: tuple[RunProbe, ...]
    error: str | None = None  # the experiment's analysis failed on the probe's models after these runs
    threads: int = 1  # torch threads the probe ran with: a core-hour is an hour of one of them
    probe_runs: int | None = None  # runs probed before the rest borrow their step cost (None: every run)
    overrides: tuple[str, ...] = ()  # config overrides of the probe (e.g. a smaller test batch)
    provenance: dict[str, Any] | None = None  # iclab.core.provenance.provenance() of the probe

    @property
    def core_hours(self) -> float:
        """Projected core-hours: what a backend spreads over its workers (``--workers``, Ray)."""
        return self.projected_seconds * self.threads / 3600

    @property
    def longest_run_seconds(self) -> float:
        """The longest training run's projection: the wall time no number of workers goes below."""
        return max((r.projected_seconds for r in self.runs), default=0.0)

    @property
    def train_steps(self) -> int:
        return sum(r.steps for r in self.runs)

    @property
    def outside_seconds(self) -> float:
        """The probe's time outside its training runs (evaluations after training, Monte Carlo, closed forms, plots),
        counted once in the projection as measured."""
        return max(0.0, self.wall_seconds - sum(r.seconds for r in self.runs))

    @property
    def projected_seconds(self) -> float:
        """The whole experiment's projected wall time on the probe's device (see the module docstring)."""
        return self.wall_seconds + sum(r.projected_seconds - r.seconds for r in self.runs)

    @property
    def complete(self) -> bool:
        """Whether the probe ran the experiment to the end (else the projection is a lower bound)."""
        return self.error is None

    def to_dict(self) -> dict[str, object]:
        return {
            "experiment": self.experiment,
            "preset": self.preset,
            "probe_steps": self.probe_steps,
            "wall_seconds": round(self.wall_seconds, 3),
            "projected_seconds": round(self.projected_seconds, 1),
            "outside_training_seconds": round(self.outside_seconds, 1),
            "train_runs": len(self.runs),
            "train_steps": self.train_steps,
            "complete": self.complete,
            "error": self.error,
            "threads": self.threads,
            "probe_runs": self.probe_runs,
            "overrides": list(self.overrides),
            "provenance": self.provenance,
            "core_hours": round(self.core_hours, 4),
            "longest_run_seconds": round(self.longest_run_seconds, 1),
            "runs": [
                {
                    "name": r.name,
                    "steps": r.steps,
                    "projected_seconds": round(r.projected_seconds, 2),
                    "core_hours": round(r.projected_seconds * self.threads / 3600, 5),
                    "borrowed": r.borrowed,
                }
                for r in self.runs
            ],
        }


def estimate_experiment(
    name: str,
    preset: str = "paper",
    *,
    probe_steps: int = 50,
    probe_runs: int = 1_000_000,
    device: str = "cpu",
    seeds: int | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Estimate:
    """Probe ``name`` at ``preset`` (every training run cut to ``probe_steps``; past ``probe_runs`` runs, to one
    step) and project its full wall time.

    Bad names, presets and overrides are refused before any work, as by :func:`~iclab.experiments.run_experiment`.
    """
    require_int("estimate_experiment", "probe_steps", probe_steps, 1)
    require_int("estimate_experiment", "probe_runs", probe_runs, 1)
    exp = get(name)
    cfg = resolve_config(exp, preset, overrides, seeds)
    dev = resolve_device(device)
    prov = provenance(dev)  # taken before the probe: its load average is the machine's as the probe starts
    error = None
    with tempfile.TemporaryDirectory(prefix="iclab-estimate-") as tmp:
        ctx = RunContext(
            out_dir=Path(tmp),
            device=dev,
            preset=preset,
            experiment=exp.name,
            probe_steps=probe_steps,
            probe_runs=probe_runs,
        )
        t0 = time.perf_counter()
        try:
            results = exp.run(cfg, ctx)
        except ConfigError:
            raise
        except Exception as e:  # the analysis of untrained models may fail; the runs before it are measured
            error = f"{type(e).__name__}: {e}"
        else:
            with contextlib.suppress(Exception):  # plots and claims of untrained models: timed when they work
                exp.plot(results, cfg, Path(tmp))
                exp.claims(results, cfg)
        wall = time.perf_counter() - t0
    return Estimate(
        exp.name,
        preset,
        probe_steps,
        wall,
        tuple(ctx.probes),
        error,
        torch.get_num_threads(),
        probe_runs if any(p.borrowed for p in ctx.probes) else None,
        tuple(overrides),
        prov,
    )


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 d``: a wall time at the precision a projection deserves."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def plan_sweep(spec: SweepSpec, *, out: str | Path = "runs", probe_steps: int = 50) -> list[dict[str, Any]]:
    """Each point with its run directory, whether it is ``done``, started (``partial``) or ``new``, and its projected
    seconds on one worker (a cost probe of ``probe_steps`` and half as many steps, :mod:`iclab.experiments.estimate`;
    0 when done). Points that differ only in their seed are probed once."""
    return list(iter_plan_sweep(spec, out=out, probe_steps=probe_steps))


def iter_plan_sweep(spec: SweepSpec, *, out: str | Path = "runs", probe_steps: int = 50) -> Iterator[dict[str, Any]]:
    """:func:`plan_sweep` one point at a time (each point's config validated as it comes): a plan that streams."""
    cache: dict[tuple[tuple[str, str], ...], float] = {}
    for p in spec.iter_points():
        _, rel = resolve_point(p)
        run_dir = Path(out) / rel if spec.experiment else rel
        done = (run_dir / "results.pt").is_file() if spec.experiment else _train_done(rel)
        state = "done" if done else "partial" if run_dir.exists() else "new"
        key = tuple(sorted((k, str(v)) for k, v in p.values.items()))
        if not done and key not in cache:
            cache[key] = _estimate(p, probe_steps)
        seconds = 0.0 if done else cache[key]
        yield {"point": p.label, "state": state, "projected_seconds": seconds, "run_dir": str(run_dir)}


def _estimate(point: Point, probe_steps: int) -> float:
    spec = point.spec
    if spec.experiment is not None:
        est = estimate_experiment(spec.experiment, spec.preset, probe_steps=probe_steps, overrides=point.overrides)
        return est.projected_seconds
    from iclab.training.run_config import to_training_run

    cfg, _ = resolve_point(point)
    with tempfile.TemporaryDirectory(prefix="iclab-estimate-") as tmp:
        run = dataclasses.replace(to_training_run(cfg), out_dir=Path(tmp) / "run")
        ctx = RunContext(out_dir=Path(tmp), device=torch.device(cfg.device), preset="train", probe_steps=probe_steps)
        ctx.execute([run])
        return ctx.probes[0].projected_seconds


def _train_done(run_dir: Path) -> bool:
    """Whether a train point's checkpoint says it finished (a damaged one counts as not done; the run redoes it)."""
    with contextlib.suppress(CorruptFileError, OSError):
        ck = safe_torch_load(run_dir / "checkpoint.pt")
        return isinstance(ck, dict) and bool(ck.get("finished"))
    return False
