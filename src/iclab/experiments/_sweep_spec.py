"""A sweep's spec (:mod:`iclab.experiments.sweep`): :class:`SweepSpec` read and validated from a YAML file or a dict
(:func:`load_sweep_spec`), its points (:class:`Point`: grid × zip × list × seeds) and each point's config and run
directory (:func:`resolve_point`), what ``iclab run`` / ``iclab train`` would use. Running the points and writing the
table is :mod:`iclab.experiments.sweep`, which re-exports every public name here.
"""

from __future__ import annotations

import builtins
import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from iclab.core.config import apply_overrides, config_hash, load_yaml, to_dict
from iclab.core.errors import ConfigError, did_you_mean
from iclab.experiments._sweep_limits import brief, check_seeds, check_size, sweep_size

KEYS = {"name", "experiment", "train", "preset", "overrides", "grid", "zip", "list", "seeds", "metrics"}
SWEEP_COLUMNS = ("status", "claims_passed", "claims_total", "seconds", "host", "reused", "run_dir", "error")
#: a row's bookkeeping besides SWEEP_COLUMNS (never plotted as a metric)
ROW_COLUMNS = ("experiment", "preset", "config_hash", "git_revision", "start", "end", "attempts")


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

    @property
    def size(self) -> int:
        """How many points :meth:`points` gives, counted without expanding them."""
        return sweep_size(self.grid, self.zip, len(self.list), None if self.seeds is None else len(self.seeds))

    def iter_points(self) -> Iterator[Point]:
        """Every point, one at a time (grid × zip × list × seeds, the grid's last key fastest): nothing expanded."""
        zipped = [dict(zip(self.zip, vals, strict=True)) for vals in zip(*self.zip.values(), strict=True)] or [{}]
        listed = [dict(e) for e in self.list] or [{}]
        seeds: list[int | None] = list(self.seeds) if self.seeds is not None else [None]
        for vals in itertools.product(*self.grid.values()):
            g = dict(zip(self.grid, vals, strict=True))
            for z, li, s in itertools.product(zipped, listed, seeds):
                yield Point(self, {**g, **z, **li}, s)

    def points(self) -> builtins.list[Point]:
        """Every point: grid × zip × list × seeds."""
        return builtins.list(self.iter_points())

    def to_dict(self) -> dict[str, Any]:
        """The spec as a dict in the YAML file's form."""
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


def load_sweep_spec(
    path: str | Path | dict[str, Any],
    *,
    name: str | None = None,
    allow_large: bool | None = None,
    validate: bool = True,
) -> SweepSpec:
    """Read and validate a sweep spec (a YAML file or a dict); every point's config is checked before any work
    (``validate=False`` leaves that to the caller, point by point: ``iclab sweep --dry-run`` streams its plan). A
    sweep of more than ``_sweep_limits.MAX_POINTS`` points is refused before any is expanded, unless ``allow_large``."""
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
        raise ConfigError(f"sweep spec: list must be a list of non-empty mappings key: value; got {brief(listed)}")
    for e in listed:
        _check_keys(e, "list")
    seeds = check_seeds(data.get("seeds"), sweep_size(grid, zipped, len(listed), None), allow_large)
    check_size(sweep_size(grid, zipped, len(listed), None if seeds is None else len(seeds)), allow_large)
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
        train = (train if train.is_absolute() else base / train).absolute()  # a worker elsewhere reads it too
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
    if validate:
        check_points(spec)
    return spec


def check_points(spec: SweepSpec) -> None:
    """Validate every point's config before any work (the error names the point)."""
    for p in spec.iter_points():
        resolve_point(p)


def _axis(data: dict[str, Any], key: str) -> dict[str, list[Any]]:
    axis = data.get(key) or {}
    if not isinstance(axis, dict) or not all(isinstance(v, list) and v for v in axis.values()):
        raise ConfigError(f"sweep spec: {key} must map dotted keys to non-empty lists of values; got {brief(axis)}")
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


# --------------------------------------------------------------------------------------------------- helpers


def _cell(v: Any) -> Any:
    """A table cell: numbers, strings and bools as they are; lists and mappings as YAML flow text."""
    return v if v is None or isinstance(v, int | float | str | bool) else _yaml_value(v)


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(_cell(v))


def _yaml_value(v: Any) -> str:
    return yaml.safe_dump(to_dict(v), default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
