"""The report's interactive curves: the ``metrics.jsonl`` of a run directory's training runs, as chart data.

    curves = read_curves(Path("runs/ahn2023.fig6/smoke-cbc8f0e3f6"))   # Curves: runs, problems
    payload = curves.payload()                                           # JSON-ready, downsampled
    script_json(payload)                                                 # safe inside <script type=application/json>

A training run writes one JSON row per logged step (``{"step": 0, "train_loss": 5.7, "test_loss": 5.3, "lr": 0.001}``)
into ``<run_dir>/<run>/metrics.jsonl``; runs named ``<group>-seed<k>`` (``n2-seed0``, ``seed1``) are the seeds of one
group, overlaid with their mean. Every series keeps at most ``cap`` points (first, last and the minimum among them),
and a page at most ``budget`` in all, so that a paper-preset run of thousands of steps still makes a small page. The
browser draws them with the plotly.min.js shipped in the ``plotly`` package (:mod:`iclab.reporting.site`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iclab.core.safe_parse import load_json_text

METRICS = "metrics.jsonl"
CAP = 2000  # points per series at most
BUDGET = 60_000  # points per chart at most: long runs with many seeds share it
MAX_BYTES = 256 << 20  # a metrics.jsonl larger than this is not read
_SEED = re.compile(r"(?:^|[-_/])seed[-_]?(\d+)$")


@dataclass(frozen=True)
class Run:
    """One training run's logged series: metric -> (steps, values); a value that is not finite is None (a gap)."""

    name: str  # its directory relative to the run directory: "n2-seed0"
    series: dict[str, tuple[list[float], list[float | None]]]

    @property
    def group(self) -> str:
        """'n2-seed0' -> 'n2'; 'seed3' -> 'run'; a name with no seed is its own group."""
        return _SEED.sub("", self.name).rstrip("/") or "run"

    @property
    def seed(self) -> str:
        m = _SEED.search(self.name)
        return m.group(1) if m else ""


@dataclass(frozen=True)
class Curves:
    """Every training run under one run directory, and the ``metrics.jsonl`` lines that could not be read."""

    runs: tuple[Run, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @property
    def metrics(self) -> list[str]:
        """The logged series, losses first: train_loss, test_loss, then the others by name."""
        names = {m for r in self.runs for m in r.series}
        first = [m for m in ("train_loss", "test_loss") if m in names]
        return first + sorted(names - set(first))

    def payload(self, *, cap: int = CAP, budget: int = BUDGET) -> dict[str, Any]:
        """The chart data: per run and per group mean (groups of two seeds or more), every series downsampled."""
        groups: dict[str, list[Run]] = {}
        for r in self.runs:
            groups.setdefault(r.group, []).append(r)
        means = [
            (g, rs, {m: mean_series([r.series[m] for r in rs if m in r.series]) for m in self.metrics})
            for g, rs in groups.items()
            if len(rs) > 1
        ]
        n_series = sum(len(r.series) for r in self.runs) + sum(len(s) for _, _, s in means)
        per = max(50, min(cap, budget // max(n_series, 1)))
        return {
            "metrics": self.metrics,
            "runs": [
                {"name": r.name, "group": r.group, "seed": r.seed, "series": downsample_all(r.series, per)}
                for r in self.runs
            ],
            "means": [{"group": g, "n": len(rs), "series": downsample_all(s, per)} for g, rs, s in means],
        }


def downsample_all(series: dict[str, tuple[list[float], list[float | None]]], cap: int) -> dict[str, list[list[Any]]]:
    """metric -> [steps, values], each series cut to ``cap`` points by :func:`downsample`; empty series dropped."""
    return {m: [list(xy) for xy in downsample(xs, ys, cap)] for m, (xs, ys) in series.items() if xs}


def downsample(
    xs: Sequence[float], ys: Sequence[float | None], cap: int = CAP
) -> tuple[list[float], list[float | None]]:
    """At most ``cap`` (>= 3) points of the series: evenly spaced indices, always the first, the last and the
    minimum of ``ys`` (a loss curve's best point survives); unchanged when it is short enough."""
    n = len(xs)
    if n <= cap:
        return list(xs), list(ys)
    keep = {round(i * (n - 1) / (cap - 2)) for i in range(cap - 1)}
    finite = [i for i, y in enumerate(ys) if y is not None]
    if finite:
        keep.add(min(finite, key=lambda i: ys[i]))  # type: ignore[arg-type, return-value]
    idx = sorted(keep)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def mean_series(
    series: Iterable[tuple[list[float], list[float | None]]],
) -> tuple[list[float], list[float | None]]:
    """The mean over seeds at every step all of them logged (None where one of them is not finite)."""
    by_step: list[dict[float, float | None]] = [dict(zip(xs, ys)) for xs, ys in series]
    if not by_step:
        return [], []
    steps = sorted(set.intersection(*(set(d) for d in by_step)))
    ys: list[float | None] = []
    for s in steps:
        vals = [d[s] for d in by_step]
        ys.append(None if any(v is None for v in vals) else sum(v for v in vals if v is not None) / len(vals))
    return steps, ys


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def read_metrics(path: Path) -> tuple[dict[str, tuple[list[float], list[float | None]]], int]:
    """(metric -> (steps, values), lines not readable) of one ``metrics.jsonl``; rows without a numeric step skip."""
    series: dict[str, tuple[list[float], list[float | None]]] = {}
    bad = 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = load_json_text(line, what="a metrics line")  # bounded: a line nested 200 000 deep is refused
        except ValueError:  # json's decode error or safe_parse's DocumentError
            bad += 1
            continue
        step = _number(row.get("step")) if isinstance(row, dict) else None
        if step is None:
            bad += 1
            continue
        for k, v in row.items():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                xs, ys = series.setdefault(str(k), ([], []))
                xs.append(step)
                ys.append(_number(v))
    return series, bad


def read_curves(run_dir: Path, *, max_runs: int = 400) -> Curves:
    """Every ``metrics.jsonl`` below ``run_dir`` (at most ``max_runs``, by name); a damaged line is a problem."""
    root = run_dir.resolve()
    paths = sorted(p for p in run_dir.rglob(METRICS) if p.is_file() and p.resolve().is_relative_to(root))
    runs, problems = [], []
    for path in paths[:max_runs]:
        name = path.parent.relative_to(run_dir).as_posix()
        if path.stat().st_size > MAX_BYTES:
            problems.append(f"{name}/{METRICS} is over {MAX_BYTES >> 20} MB: not drawn")
            continue
        try:
            series, bad = read_metrics(path)
        except OSError as e:
            problems.append(f"{name}/{METRICS} is not readable: {e.strerror or e}")
            continue
        if bad:
            problems.append(f"{name}/{METRICS}: {bad} line{'s' if bad != 1 else ''} not readable, skipped")
        if series:
            runs.append(Run(name=name if name != "." else "run", series=series))
    if len(paths) > max_runs:
        problems.append(f"{len(paths)} training runs; the curves show the first {max_runs}")
    return Curves(runs=tuple(sorted(runs, key=lambda r: _natural(r.name))), problems=tuple(problems))


def _natural(s: str) -> list[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", s)]


_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` is left, so no
    string in it (a metric named ``</script><script>...``) can close the element; the page reads it with
    ``JSON.parse(element.textContent)``, never as code."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: _UNSAFE[m.group(0)], text)
