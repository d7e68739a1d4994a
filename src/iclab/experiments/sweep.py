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
"""

from __future__ import annotations

import builtins
import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from iclab.core.config import apply_overrides, config_hash, load_yaml, to_dict
from iclab.core.errors import ConfigError, OutputError, did_you_mean
from iclab.core.io import atomic_write_json, atomic_write_text
from iclab.experiments.backends import Backend, LocalBackend, Outcome, RayBackend

KEYS = {"name", "experiment", "train", "preset", "overrides", "grid", "zip", "list", "seeds", "metrics"}
SWEEP_COLUMNS = ("status", "claims_passed", "claims_total", "seconds", "host", "reused", "run_dir", "error")


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: what to run (``experiment`` at ``preset``, or the ``train`` config file), the fixed
    ``overrides`` and the axes."""

    name: str
    experiment: str | None = None
    train: Path | None = None
    preset: str = "quick"
    overrides: tuple[str, ...] = ()
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: dict[str, list[Any]] = field(default_factory=dict)
    list: tuple[dict[str, Any], ...] = ()
    seeds: tuple[int, ...] | None = None
    metrics: tuple[str, ...] | None = None  # the metrics the figures show (default: every numeric one)

    @property
    def keys(self) -> builtins.list[str]:
        """The swept keys, in the order of the spec (seed last)."""
        keys = [*self.grid, *self.zip]
        for entry in self.list:
            keys += [k for k in entry if k not in keys]
        return keys

    def points(self) -> builtins.list[Point]:
        """Every point: grid × zip × list × seeds."""
        grid = [dict(zip(self.grid, vals, strict=True)) for vals in itertools.product(*self.grid.values())]
        zipped = [dict(zip(self.zip, vals, strict=True)) for vals in zip(*self.zip.values(), strict=True)] or [{}]
        listed = [dict(e) for e in self.list] or [{}]
        seeds: list[int | None] = list(self.seeds) if self.seeds is not None else [None]
        out = []
        for g, z, li, s in itertools.product(grid, zipped, listed, seeds):
            values = {**g, **z, **li}
            out.append(Point(self, values, s))
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        d.update({"experiment": self.experiment} if self.experiment else {"train": str(self.train)})
        if self.experiment:
            d["preset"] = self.preset
        d.update(overrides=list(self.overrides), grid=self.grid, zip=self.zip, list=[dict(e) for e in self.list])
        if self.seeds is not None:
            d["seeds"] = list(self.seeds)
        if self.metrics is not None:
            d["metrics"] = list(self.metrics)
        return d


@dataclass(frozen=True)
class Point:
    """One run of a sweep: the spec's fixed overrides plus this point's ``values`` (and ``seed``)."""

    spec: SweepSpec
    values: dict[str, Any]
    seed: int | None = None

    @property
    def label(self) -> str:
        parts = [f"{k}={_text(v)}" for k, v in self.values.items()]
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return ",".join(parts) or "default"

    @property
    def overrides(self) -> list[str]:
        """``key=value`` overrides, as ``iclab run`` / ``iclab train`` take them (values in YAML flow style)."""
        extra = {**self.values, **({"seed": self.seed} if self.seed is not None else {})}
        return [*self.spec.overrides, *(f"{k}={_yaml_value(v)}" for k, v in extra.items())]


# --------------------------------------------------------------------------------------------------- the spec


def load_sweep_spec(path: str | Path | dict[str, Any], *, name: str | None = None) -> SweepSpec:
    """Read and validate a sweep spec (a YAML file or a dict); every point's config is checked before any work."""
    base = Path(".")
    if isinstance(path, dict):
        data, default_name = dict(path), "sweep"
    else:
        path = Path(path)
        data, default_name, base = load_yaml(path), path.stem, path.parent
    if not isinstance(data, dict):
        raise ConfigError(f"a sweep spec must be a mapping of experiment/train, grid, ...; got {type(data).__name__}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"sweep spec: unknown key {unknown[0]!r}{did_you_mean(str(unknown[0]), KEYS)}")
    if ("experiment" in data) == ("train" in data):
        raise ConfigError("sweep spec: give exactly one of `experiment: NAME` or `train: CONFIG.yaml`")
    overrides = data.get("overrides") or []
    if isinstance(overrides, dict):
        overrides = [f"{k}={_yaml_value(v)}" for k, v in overrides.items()]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"sweep spec: overrides must be a list of key=value strings or a mapping; got {overrides!r}")
    grid = _axis(data, "grid")
    zipped = _axis(data, "zip")
    lengths = {k: len(v) for k, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"sweep spec: zip axes must have equal lengths; got {lengths}")
    listed = data.get("list") or []
    if not isinstance(listed, list) or not all(isinstance(e, dict) and e for e in listed):
        raise ConfigError(f"sweep spec: list must be a list of non-empty mappings key: value; got {listed!r}")
    for e in listed:
        _check_keys(e, "list")
    seeds = data.get("seeds")
    if seeds is not None:
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            seeds = list(range(seeds))
        if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds):
            raise ConfigError(f"sweep spec: seeds must be an int count or a non-empty list of ints; got {seeds!r}")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"sweep spec: seeds repeat: {seeds}")
    swept = [*grid, *zipped, *(k for e in listed for k in e)]
    dup = sorted({k for k in [*grid, *zipped] if list(grid).count(k) + list(zipped).count(k) > 1})
    if dup:
        raise ConfigError(f"sweep spec: key(s) {dup} appear in more than one axis")
    if seeds is not None and "seed" in swept:
        raise ConfigError("sweep spec: sweep `seed` with `seeds:`, not as an axis key")
    metrics = data.get("metrics")
    if metrics is not None and (not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics)):
        raise ConfigError(f"sweep spec: metrics must be a list of column names; got {metrics!r}")
    name = str(name or data.get("name") or default_name)
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"sweep spec: name must be letters, digits, '-', '_' or '.'; got {name!r}")
    train = None
    if "train" in data:
        train = Path(str(data["train"]))
        train = train if train.is_absolute() else base / train
        if not train.is_file():
            raise ConfigError(f"sweep spec: train config {train} does not exist")
        if "preset" in data:
            raise ConfigError("sweep spec: `preset` is for experiments; a train config is its own preset")
    spec = SweepSpec(
        name=name,
        experiment=str(data["experiment"]) if "experiment" in data else None,
        train=train,
        preset=str(data.get("preset", "quick")),
        overrides=tuple(overrides),
        grid=grid,
        zip=zipped,
        list=tuple(listed),
        seeds=tuple(int(s) for s in seeds) if seeds is not None else None,
        metrics=tuple(metrics) if metrics is not None else None,
    )
    for p in spec.points():
        resolve_point(p)  # every point's config validated before any work: the error names the point
    return spec


def _axis(data: dict[str, Any], key: str) -> dict[str, list[Any]]:
    axis = data.get(key) or {}
    if not isinstance(axis, dict) or not all(isinstance(v, list) and v for v in axis.values()):
        raise ConfigError(f"sweep spec: {key} must map dotted keys to non-empty lists of values; got {axis!r}")
    _check_keys(axis, key)
    return {str(k): list(v) for k, v in axis.items()}


def _check_keys(d: dict[str, Any], where: str) -> None:
    for k in d:
        if not isinstance(k, str) or not k or k in SWEEP_COLUMNS:
            raise ConfigError(f"sweep spec: {where} key {k!r} is not a config key")


def resolve_point(point: Point) -> tuple[Any, Path]:
    """The point's validated config and run directory (what ``iclab run`` / ``iclab train`` would use)."""
    spec = point.spec
    try:
        if spec.experiment is not None:
            from iclab.experiments.registry import get
            from iclab.experiments.runner import resolve_config

            exp = get(spec.experiment)
            if point.seed is not None and "seed" not in {f.name for f in dataclasses.fields(exp.config)}:
                raise ConfigError(
                    f"{exp.name} has no `seed` key (it runs `seeds` seeds itself): sweep `seeds: [...]` needs a seed "
                    "key; sweep the number of seeds with `grid: {seeds: [...]}` instead"
                )
            cfg = resolve_config(exp, spec.preset, point.overrides)
            return cfg, Path(exp.name) / f"{spec.preset}-{config_hash(cfg)}"
        from iclab.training.run_config import parse_run_config

        assert spec.train is not None
        cfg = parse_run_config(apply_overrides(load_yaml(spec.train), point.overrides))
        return cfg, Path(cfg.out) / config_hash(cfg)
    except ConfigError as e:
        raise ConfigError(f"sweep point {point.label}: {e}") from None


# --------------------------------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class PointTask:
    """What a worker gets: the point and where to write (picklable)."""

    point: Point
    out: str
    device: str = "cpu"


def run_point(task: PointTask) -> dict[str, Any]:
    """Run one point (reusing or resuming its run directory) and return its table row's results."""
    point = task.point
    spec = point.spec
    t0 = time.perf_counter()
    if spec.experiment is not None:
        from iclab.experiments.runner import run_experiment

        res = run_experiment(spec.experiment, spec.preset, out=task.out, device=task.device, overrides=point.overrides)
        checked = [c for c in res.claims if c.checked]
        metrics = {c.name: float(c.measured) for c in res.claims if _is_number(c.measured)}
        return {
            "metrics": metrics,
            "claims_passed": sum(c.passed for c in checked),
            "claims_total": len(checked),
            "seconds": res.seconds,
            "reused": res.reused,
            "run_dir": str(res.out_dir),
        }
    from iclab.core.devices import resolve_device
    from iclab.training.run_config import to_training_run

    cfg, _ = resolve_point(point)
    run = to_training_run(cfg)
    result = run.execute(device=resolve_device(cfg.device))
    train_rows = [r for r in result.history if "train_loss" in r]
    return {
        "metrics": {
            "final_train_loss": float(train_rows[-1]["train_loss"]) if train_rows else math.nan,
            "final_test_loss": float(result.final_test_loss),
        },
        "claims_passed": None,
        "claims_total": None,
        "seconds": time.perf_counter() - t0,
        "reused": result.resumed_from is not None and result.resumed_from >= cfg.train.steps,
        "run_dir": str(run.out_dir),
    }


# --------------------------------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    spec: SweepSpec
    out_dir: Path
    table: Any  # pandas.DataFrame
    figures: list[Path]
    failures: list[Outcome]
    seconds: float

    @property
    def ok(self) -> bool:
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
    others go on. The sweep directory is locked: a second driver of the same sweep waits.
    """
    from iclab.experiments.runner import run_lock

    spec = spec if isinstance(spec, SweepSpec) else load_sweep_spec(spec)
    backend = backend or LocalBackend()
    out = Path(out)
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


def _table(spec: SweepSpec, points: list[Point], outcomes: list[Outcome]) -> Any:
    import pandas as pd

    rows = []
    for p, o in zip(points, outcomes, strict=True):
        row: dict[str, Any] = {k: _cell(p.values.get(k)) for k in spec.keys}
        row["seed"] = p.seed
        value = o.value or {}
        row.update(
            status="ok" if o.ok else "failed",
            claims_passed=value.get("claims_passed"),
            claims_total=value.get("claims_total"),
            seconds=float(value.get("seconds", o.seconds)),
            host=o.host,
            reused=bool(value.get("reused", False)),
            run_dir=value.get("run_dir", ""),
            error=o.error or "",
        )
        row.update(value.get("metrics", {}))
        rows.append(row)
    return pd.DataFrame(rows)


def _write_parquet(table: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        table.to_parquet(tmp, index=False)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def metric_columns(spec: SweepSpec, table: Any) -> list[str]:
    """The table's metric columns (numeric, not a swept key or bookkeeping), or those the spec names."""
    fixed = {*spec.keys, "seed", *SWEEP_COLUMNS}
    cols = [c for c in table.columns if c not in fixed and _numeric_column(table[c])]
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


def _cell(v: Any) -> Any:
    """A table cell: numbers, strings and bools as they are; lists and mappings as YAML flow text."""
    return v if v is None or isinstance(v, int | float | str | bool) else _yaml_value(v)


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(_cell(v))


def _slug(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)


def _yaml_value(v: Any) -> str:
    return yaml.safe_dump(to_dict(v), default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
