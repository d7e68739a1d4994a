"""Sweeps: an experiment (or an ``iclab train`` config) over grid / zip / list axes of dotted config keys and seeds.

    # examples/sweeps/smoke.yaml
    experiment: ahn2023.theorem2      # or  train: ../../configs/linear_sparse.yaml  (relative to this file)
    preset: smoke
    overrides: [train.steps=40]       # every point
    grid: {train.lr: [0.01, 0.02]}    # cartesian product
    zip:  {n: [10, 20], m: [5, 6]}    # one axis whose values go together
    list: [{n_layers: 1}, {n_layers: 2, n: 10}]   # one axis of explicit points
    seeds: [0, 1, 2]                  # the config's ``seed`` key, one row each

    result = run_sweep("examples/sweeps/smoke.yaml", out="runs", backend=make_backend("local", workers=2))
    result.table                      # a pandas DataFrame: one row per point and seed

The axes combine as a product; every point is what ``iclab run EXP --preset P key=value ...`` (``iclab train``) would
run, in the same run directory, so finished points are reused and interrupted ones resume. Points are tasks of a
backend (:mod:`iclab.experiments.backends`); a failing point is recorded and the others go on. Output in
``<out>/sweeps/<name>/``: ``sweep.parquet`` (one row per point and seed), ``sweep.yaml``, ``summary.json`` and
``sweep_<key>.png`` per swept key; the columns are in docs/scaling.md.

The spec (:class:`SweepSpec`, :class:`Point`, :func:`load_sweep_spec`, :func:`resolve_point`) lives in
``iclab.experiments._sweep_spec``; every public name of it is importable from here.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from iclab.core.config import config_hash
from iclab.core.errors import ConfigError, OutputError
from iclab.core.io import atomic_write_json, atomic_write_text
from iclab.experiments._sweep_limits import check_inside
from iclab.experiments._sweep_spec import KEYS as KEYS
from iclab.experiments._sweep_spec import ROW_COLUMNS as ROW_COLUMNS
from iclab.experiments._sweep_spec import SWEEP_COLUMNS as SWEEP_COLUMNS
from iclab.experiments._sweep_spec import Point as Point
from iclab.experiments._sweep_spec import SweepSpec as SweepSpec
from iclab.experiments._sweep_spec import _cell
from iclab.experiments._sweep_spec import check_points as check_points
from iclab.experiments._sweep_spec import load_sweep_spec as load_sweep_spec
from iclab.experiments._sweep_spec import resolve_point as resolve_point
from iclab.experiments.backends import Backend, LocalBackend, Outcome, RayBackend
from iclab.training.stop import Stopped

# --------------------------------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class PointTask:
    """What a worker gets: the point and where to write (picklable); ``cwd``, the driver's working directory,
    anchors a train config's relative ``out:`` (a worker's own working directory may be elsewhere)."""

    point: Point
    out: str
    device: str = "cpu"
    cwd: str = dataclasses.field(default_factory=os.getcwd)


DIVERGED_FACTOR = 1e6  # a train point whose final loss is this many times its first (or not finite) diverged


def run_point(task: PointTask) -> dict[str, Any]:
    """Run one point (reusing or resuming its run directory) and return its table row's results: the metrics, the
    claims (measured, expected, passed), the config hash, the start and end times and the compute seconds (a reused
    point's original ones)."""
    start = _now()
    row = _run_experiment_point(task) if task.point.spec.experiment is not None else _run_train_point(task)
    return {**row, "start": start, "end": _now()}


def _run_experiment_point(task: PointTask) -> dict[str, Any]:
    from iclab.experiments.runner import run_experiment

    spec, point = task.point.spec, task.point
    assert spec.experiment is not None
    res = run_experiment(spec.experiment, spec.preset, out=task.out, device=task.device, overrides=point.overrides)
    checked = [c for c in res.claims if c.checked]
    return {
        "metrics": {c.name: float(c.measured) for c in res.claims if _is_number(c.measured)},
        "claims": {c.name: {"expected": c.expected, "passed": c.passed if c.checked else None} for c in res.claims},
        "claims_passed": sum(c.passed for c in checked),
        "claims_total": len(checked),
        "seconds": res.seconds,  # a reused run's original compute time (its summary's)
        "reused": res.reused,
        "run_dir": str(res.out_dir),
        "config_hash": config_hash(res.config),
    }


def _run_train_point(task: PointTask) -> dict[str, Any]:
    from iclab.core.devices import resolve_device
    from iclab.training.run_config import to_training_run

    t0 = time.perf_counter()
    cfg, _ = resolve_point(task.point)
    run = to_training_run(cfg)
    if run.out_dir is not None and not run.out_dir.is_absolute():
        run = dataclasses.replace(run, out_dir=Path(task.cwd) / run.out_dir)
    result = run.execute(device=resolve_device(cfg.device))
    losses = [float(r["train_loss"]) for r in result.history if "train_loss" in r]
    final = losses[-1] if losses else math.nan
    return {
        "metrics": {"final_train_loss": final, "final_test_loss": float(result.final_test_loss)},
        "claims_passed": None,
        "claims_total": None,
        "seconds": float(result.seconds or time.perf_counter() - t0),
        "reused": result.resumed_from is not None and result.resumed_from >= cfg.train.steps,
        "run_dir": str(run.out_dir),
        "config_hash": config_hash(cfg),
        "diverged": bool(losses) and _diverged(losses[0], final, float(result.final_test_loss)),
    }


def _diverged(first: float, final: float, test: float) -> bool:
    """A final loss that is not finite, or :data:`DIVERGED_FACTOR` times the first recorded loss."""
    if not (math.isfinite(final) and math.isfinite(test)):
        return True
    return math.isfinite(first) and first > 0 and max(final, test) > DIVERGED_FACTOR * first


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns: one table row per point (a ``pandas.DataFrame``, also ``sweep.parquet``), the figures and the failed points."""

    spec: SweepSpec
    out_dir: Path
    table: Any  # pandas.DataFrame
    figures: list[Path]
    failures: list[Outcome]
    seconds: float

    @property
    def ok(self) -> bool:
        """No point failed."""
        return not self.failures


def sweep_dir(spec: SweepSpec, out: str | Path) -> Path:
    return Path(out) / "sweeps" / spec.name


def run_sweep(
    spec: SweepSpec | str | Path | dict[str, Any],
    *,
    out: str | Path = "runs",
    backend: Backend | None = None,
    device: str = "cpu",
    on_done: Callable[[Outcome], None] | None = None,
) -> SweepResult:
    """Run every point of ``spec`` on ``backend`` (default: this process), then write the table and the figures.

    A failing point is a row with ``status="failed"`` and its traceback in ``error`` (also in ``failures``); the
    others go on. The sweep directory is locked: a second driver of the same sweep waits. A sweep asked to stop
    (:mod:`iclab.training.stop`: ``--time-limit``, SIGTERM, SIGUSR1, SIGINT) raises
    :class:`~iclab.training.stop.Stopped` once its running points have checkpointed, and writes no table.
    """
    from iclab.experiments.locks import run_lock

    spec = spec if isinstance(spec, SweepSpec) else load_sweep_spec(spec)
    backend = backend or LocalBackend()
    out = Path(out).absolute()  # every path a task gets is absolute: a worker's working directory may be elsewhere
    if spec.train is not None:  # a train point writes to its config's `out:`, which must lie under --out
        check_inside(((p.label, resolve_point(p)[0].out) for p in spec.iter_points()), out)
    d = sweep_dir(spec, out)
    try:
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "sweep.yaml", yaml.safe_dump(spec.to_dict(), sort_keys=False))
    except OSError as e:
        raise OutputError(f"cannot write the sweep directory {d} ({e.strerror or e}); choose another --out") from e
    if isinstance(backend, RayBackend):
        backend.check_shared_storage(out)
    points = spec.points()
    t0 = time.perf_counter()
    with run_lock(d):
        tasks = [PointTask(p, str(out), device) for p in points]
        outcomes = backend.map(run_point, tasks, labels=[p.label for p in points], on_done=on_done)
        _raise_if_stopped(spec, outcomes)
        table = _table(spec, points, outcomes)
        _write_parquet(table, d / "sweep.parquet")
        figures = plot_sweep(spec, table, d)
        failures = [o for o in outcomes if not o.ok]
        seconds = time.perf_counter() - t0
        atomic_write_json(
            d / "summary.json",
            {
                "kind": "sweep",
                "name": spec.name,
                "experiment": spec.experiment or str(spec.train),
                "preset": spec.preset if spec.experiment else None,
                "keys": spec.keys,
                "metrics": metric_columns(spec, table),
                "points": len(points),
                "failed": len(failures),
                "seconds": seconds,
                "backend": backend.name,
                "figures": [f.name for f in figures],
            },
        )
    return SweepResult(spec, d, table, figures, failures, seconds)


def _raise_if_stopped(spec: SweepSpec, outcomes: list[Outcome]) -> None:
    """A sweep some of whose points stopped (:mod:`iclab.training.stop`) writes no table: it raises
    :class:`~iclab.training.stop.Stopped` saying which points are done and where the stopped ones are."""
    stopped = [o.value for o in outcomes if isinstance(o.value, Stopped)]
    if not stopped:
        return
    done = sum(o.ok for o in outcomes)
    started = [e.progress for e in stopped if not e.progress.endswith(" not started")]
    where = "; ".join(started[:4]) + ("; ..." if len(started) > 4 else "")
    text = f"sweep {spec.name}: {done}/{len(outcomes)} points finished" + (f"; {where}" if where else "")
    raise Stopped(text, stopped[0].reason, sum(e.progress.endswith(" not started") for e in stopped))


def _table(spec: SweepSpec, points: list[Point], outcomes: list[Outcome]) -> Any:
    """One row per point: its swept values and seed, what ran (experiment, preset, config hash, git revision), when
    and where (start, end, compute seconds, attempts, host), its status, metrics and claims (``<claim>`` measured,
    ``<claim>.expected``, ``<claim>.passed``)."""
    import pandas as pd

    revision = _git_revision()
    rows = []
    for p, o in zip(points, outcomes, strict=True):
        row: dict[str, Any] = {k: _cell(p.values.get(k)) for k in spec.keys}
        row["seed"] = p.seed
        value = o.value if isinstance(o.value, dict) else {}
        row.update(
            status=_status(o, value),
            experiment=spec.experiment or str(spec.train),
            preset=spec.preset if spec.experiment else None,
            config_hash=value.get("config_hash") or config_hash(resolve_point(p)[0]),
            git_revision=revision,
            start=value.get("start"),
            end=value.get("end"),
            claims_passed=value.get("claims_passed"),
            claims_total=value.get("claims_total"),
            seconds=float(value.get("seconds", o.seconds)),
            attempts=o.attempts,
            host=o.host,
            reused=bool(value.get("reused", False)),
            run_dir=value.get("run_dir", ""),
            error=o.error or "",
        )
        row.update(value.get("metrics", {}))
        for name, claim in value.get("claims", {}).items():
            row[f"{name}.expected"] = claim["expected"]
            row[f"{name}.passed"] = claim["passed"]
        rows.append(row)
    return pd.DataFrame(rows)


def _status(o: Outcome, value: dict[str, Any]) -> str:
    """``diverged``: the point's training raised :class:`~iclab.core.errors.DivergenceError` or ended with a loss
    that is not finite or blew up (:func:`_diverged`); ``failed``: any other error; ``ok``."""
    if o.error is not None:
        return "diverged" if "DivergenceError" in o.error else "failed"
    return "diverged" if value.get("diverged") else "ok" if o.ok else "failed"


def _git_revision() -> str | None:
    """HEAD of the iclab checkout (``-dirty`` when tracked files differ from it), or None outside one."""
    from iclab.core.provenance import git_commit

    commit = git_commit()
    if commit is None:
        return None
    return str(commit["sha"]) + ("-dirty" if commit.get("dirty") else "")


def _write_parquet(table: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        table.to_parquet(tmp, index=False)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def metric_columns(spec: SweepSpec, table: Any) -> list[str]:
    """The table's metric columns (numeric, not a swept key or bookkeeping), or those the spec names."""
    fixed = {*spec.keys, "seed", *SWEEP_COLUMNS, *ROW_COLUMNS}
    cols = [
        c
        for c in table.columns
        if c not in fixed and not c.endswith((".expected", ".passed")) and _numeric_column(table[c])
    ]
    if spec.metrics is not None:
        missing = [m for m in spec.metrics if m not in cols]
        if missing and len(table) and (table["status"] == "ok").any():
            raise ConfigError(f"sweep {spec.name}: metrics {missing} are not columns of the table; it has {cols}")
        cols = [m for m in spec.metrics if m in cols]
    return cols


def plot_sweep(spec: SweepSpec, table: Any, out_dir: Path, *, max_metrics: int = 4) -> list[Path]:
    """One figure per swept key (:func:`iclab.plotting.sweeps.plot_metric_vs_key`), ``sweep_<key>.png``."""
    from iclab.plotting.sweeps import plot_metric_vs_key

    ok = table[table["status"] == "ok"] if len(table) else table
    metrics = metric_columns(spec, table)[:max_metrics]
    if ok.empty or not metrics:
        return []
    return [
        plot_metric_vs_key(
            ok,
            key,
            [k for k in spec.keys if k != key],
            metrics,
            out_dir / f"sweep_{_slug(key)}.png",
            title=f"sweep {spec.name}: mean ± s.e. over seeds",
        )
        for key in spec.keys
    ]


def format_failure(o: Outcome, point: Point) -> str:
    """A failed point for the terminal: its label, its overrides and the worker's traceback."""
    return f"point {o.label} failed on {o.host}\n  overrides: {' '.join(point.overrides)}\n{o.error}"


# --------------------------------------------------------------------------------------------------- helpers


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


def _numeric_column(col: Any) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)


def _slug(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)
