"""A sweep page's charts: every point's training curves overlaid, and each metric against each swept key.

    charts = sweep_charts(df, keys=("train.lr",), metrics=("final_loss",), out=Path("runs"))
    charts["overlay"]    # per finished point: its swept values and its runs' mean curves
    charts["scatter"]    # per (key, metric): mean over seeds at each value, the standard error where seeds repeat

The table is ``sweep.parquet`` (:mod:`iclab.experiments.sweep`): one row per point and seed, the swept keys, a
``seed`` column, the metrics, ``status`` and ``run_dir``. A point's run directory is read only when it lies inside
``out`` (the directory the report is written for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iclab.reporting.curves import CAP, downsample_all, mean_series, read_curves


def resolve_run_dir(value: Any, out: Path) -> Path | None:
    """A table's ``run_dir`` (as the sweep wrote it: relative to where it ran, or absolute) as a run directory
    inside ``out``; None when it names none there."""
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    base = out.resolve()
    for candidate in (path, out / Path(*path.parts[-2:]), out / path):
        if candidate.is_dir() and candidate.resolve().is_relative_to(base):
            return candidate.resolve()
    return None


def _num(v: Any) -> float | None:
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _scatter(rows: list[dict[str, Any]], keys: Sequence[str], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Per (key, metric): one trace per combination of the other keys; per value, the mean over its rows (seeds)
    and the standard error of that mean (None with one seed)."""
    charts = []
    for key in keys:
        others = [k for k in keys if k != key]
        for metric in metrics:
            groups: dict[str, dict[Any, list[float]]] = {}
            for r in rows:
                y = _num(r.get(metric))
                if y is None or r.get(key) is None:
                    continue
                trace = _label({k: r.get(k) for k in others}) or metric
                groups.setdefault(trace, {}).setdefault(r[key], []).append(y)
            traces = []
            for name, by_x in groups.items():
                xs = sorted(by_x, key=lambda v: (_num(v) is None, _num(v) or 0.0, str(v)))
                ys = [sum(by_x[x]) / len(by_x[x]) for x in xs]
                se = [_stderr(by_x[x]) for x in xs]
                traces.append(
                    {"name": name, "x": [_json(x) for x in xs], "y": ys, "se": se, "n": [len(by_x[x]) for x in xs]}
                )
            repeated = any(n > 1 for t in traces for n in t["n"])
            charts.append({"key": key, "metric": metric, "traces": traces, "repeated": repeated})
    return charts


def _stderr(ys: list[float]) -> float | None:
    if len(ys) < 2:
        return None
    m = sum(ys) / len(ys)
    return math.sqrt(sum((y - m) ** 2 for y in ys) / (len(ys) - 1) / len(ys))


def _json(v: Any) -> Any:
    n = _num(v)
    return n if n is not None else str(v)


def _overlay(rows: list[dict[str, Any]], keys: Sequence[str], out: Path, budget: int) -> dict[str, Any]:
    """Per finished point with a run directory inside ``out``: its swept values and the mean curve of its runs."""
    points: list[dict[str, Any]] = []
    for r in rows:
        if r.get("status", "ok") != "ok" or (run_dir := resolve_run_dir(r.get("run_dir"), out)) is None:
            continue
        curves = read_curves(run_dir)
        if not curves.runs:
            continue
        series = {m: mean_series([x.series[m] for x in curves.runs if m in x.series]) for m in curves.metrics}
        values = {k: _json(r.get(k)) for k in keys}
        if r.get("seed") is not None and _num(r.get("seed")) is not None:
            values["seed"] = int(_num(r.get("seed")) or 0)
        points.append({"name": _label(values), "values": values, "series": series})
    n_series = sum(len(p["series"]) for p in points) or 1
    per = max(50, min(CAP, budget // n_series))
    for p in points:
        p["series"] = downsample_all(p["series"], per)
    metrics = []
    for p in points:
        metrics += [m for m in p["series"] if m not in metrics]
    first = [m for m in ("test_loss", "train_loss") if m in metrics]
    return {"keys": list(keys), "metrics": first + [m for m in metrics if m not in first], "points": points}


def sweep_charts(
    df: Any, *, keys: Sequence[str], metrics: Sequence[str], out: Path, budget: int = 60_000
) -> dict[str, Any]:
    """The overlay and scatter data of a sweep table ``df`` (a pandas DataFrame); JSON-ready."""
    rows = df.to_dict("records")
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    return {"overlay": _overlay(rows, keys, out, budget), "scatter": _scatter(ok, keys, metrics)}
