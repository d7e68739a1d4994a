"""The summary figure of a sweep: metrics against one swept key, mean ± s.e. over seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from iclab.plotting.figures import save, subplots


def plot_metric_vs_key(
    table: Any, key: str, others: Sequence[str], metrics: Sequence[str], path: Path, *, title: str = ""
) -> Path:
    """One panel per metric: ``metric`` against ``key`` (a column of the pandas ``table``), mean ± s.e. over the rows
    that share a value of ``key`` and of every column in ``others`` (the seeds), one line per value of ``others``.
    Non-numeric values of ``key`` are placed at equal spacing in the order they first appear. Returns the PNG path."""
    fig, axes = subplots(1, len(metrics), size=(3.4, 2.7))
    others = list(others)
    for ax, metric in zip(axes.ravel(), metrics, strict=False):
        groups = table.groupby(others, dropna=False, sort=False) if others else [((), table)]
        for label, g in groups:
            stats = g.groupby(key, sort=False, dropna=False)[metric].agg(["mean", "std", "count"])
            xs = list(stats.index)
            numeric = all(_is_number(x) for x in xs)
            order = np.argsort(xs) if numeric else np.arange(len(xs))
            x = np.asarray(xs, dtype=float)[order] if numeric else np.arange(len(xs))
            mean = stats["mean"].to_numpy()[order]
            se = (stats["std"].fillna(0.0) / np.sqrt(stats["count"])).to_numpy()[order]
            labels = label if isinstance(label, tuple) else (label,)
            name = ", ".join(f"{k}={_text(v)}" for k, v in zip(others, labels, strict=False))
            ax.errorbar(x, mean, yerr=se, marker="o", ms=3, capsize=2, lw=1, label=name or None)
            if not numeric:
                ax.set_xticks(x, [_text(v) for v in np.asarray(xs, dtype=object)[order]], fontsize=7)
        ax.set_xlabel(key)
        ax.set_title(metric, fontsize=8)
        if others and len(ax.get_lines()) > 1:
            ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=8)
    return save(fig, path)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) and math.isfinite(float(v))


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
