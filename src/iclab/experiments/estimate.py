"""What a preset costs before you run it: a probe trains every run for a few steps and projects the rest.

    est = estimate_experiment("zhang2025.fig4", "paper", probe_steps=50)
    est.projected_seconds, est.runs          # the whole experiment's projected wall time, one RunProbe per run

The probe runs the experiment's own ``run`` with the preset's config (same data sizes, models, seeds, evaluation),
then its plots and claims, but :class:`~iclab.experiments.registry.RunContext` trains every run for ``probe_steps``
steps and for half as many: the difference of the two times is the run's cost per step, the rest its fixed cost
(model build, data, first and last evaluation). Past ``probe_runs`` runs, a run trains one step and borrows the mean
step cost of those probed. The projection replaces each run's probe time by its fixed cost plus steps × step cost:

    projected = wall(probe) − Σ_runs probe seconds + Σ_runs (fixed + steps · step cost)

so the work outside training (data generation, evaluation, Monte Carlo, closed forms, plots) is measured, not
guessed. Periodic evaluations and checkpoints inside a long run are counted only as far as the probe reaches them.
An experiment whose analysis needs trained models may fail on the probe's untrained ones; the projection then covers
the runs before the failure, is a lower bound, and says so (``error``). Nothing is written outside a temporary
directory.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from iclab.core.devices import resolve_device
from iclab.core.errors import ConfigError, require_int
from iclab.experiments.registry import RunContext, RunProbe, get
from iclab.experiments.runner import resolve_config


@dataclass(frozen=True)
class Estimate:
    experiment: str
    preset: str
    probe_steps: int
    wall_seconds: float  # the probe's own wall time
    runs: tuple[RunProbe, ...]
    error: str | None = None  # the experiment's analysis failed on the probe's models after these runs

    @property
    def train_steps(self) -> int:
        return sum(r.steps for r in self.runs)

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
            "train_runs": len(self.runs),
            "train_steps": self.train_steps,
            "complete": self.complete,
            "error": self.error,
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
    return Estimate(exp.name, preset, probe_steps, wall, tuple(ctx.probes), error)


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 d``: a wall time at the precision a projection deserves."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"
