"""The bounds of a sweep spec, checked before any point is expanded (:mod:`iclab.experiments.sweep`): the number of
points (:data:`MAX_POINTS` unless ``--allow-large``) and the ``seeds:`` entry, with error lines of bounded length."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from iclab.core.errors import ConfigError

#: The most points a sweep may have without ``--allow-large`` (each is a run directory, a row and a task).
MAX_POINTS = 10_000


def sweep_size(grid: dict[str, list[Any]], zipped: dict[str, list[Any]], listed: int, seeds: int | None) -> int:
    """The number of points of a sweep's axes: the product of the grid's lengths × the zip length × the list
    length × the seeds (an empty axis counts 1)."""
    n = math.prod(len(v) for v in grid.values())
    n *= len(next(iter(zipped.values()))) if zipped else 1
    return n * max(listed, 1) * (seeds or 1)


def check_size(n: int, allow_large: bool | None = None) -> None:
    """Refuse a sweep of more than :data:`MAX_POINTS` points before any is expanded, unless ``allow_large`` (default:
    the ``ICLAB_ALLOW_LARGE`` environment variable that ``iclab --allow-large`` sets)."""
    if allow_large is None:
        allow_large = os.environ.get("ICLAB_ALLOW_LARGE", "") not in ("", "0")
    if n > MAX_POINTS and not allow_large:
        raise ConfigError(
            f"sweep spec: {n} points is more than {MAX_POINTS}; check the axes (grid multiplies), or lift the limit "
            "with `iclab --allow-large sweep ...`"
        )


def check_seeds(seeds: Any, points: int, allow_large: bool | None) -> list[int] | None:
    """The spec's ``seeds:`` (a count or a list of distinct ints) checked; ``points``: the points without seeds."""
    if seeds is None:
        return None
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        check_size(points * max(seeds, 1), allow_large)  # before range(seeds) exists
        seeds = list(range(seeds))
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ConfigError(f"sweep spec: seeds must be an int count or a non-empty list of ints; got {brief(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"sweep spec: seeds repeat: {brief(seeds)}")
    return seeds


def brief(value: Any) -> str:
    """``repr`` cut to 200 characters: an error line, not a dump of a large value."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def check_inside(points: Iterable[tuple[str, str]], out: str | Path) -> None:
    """Refuse a train sweep a point of which (label, its config's ``out:``) would write outside ``out`` (absolute
    elsewhere, or climbing out with ``..``): a sweep writes under its ``--out`` only."""
    root = Path(out).resolve()
    for label, where in points:
        if not Path(where).resolve().is_relative_to(root):
            raise ConfigError(
                f"sweep point {label}: out = {where!r} is outside --out {str(out)!r}; a sweep writes under its "
                "--out only: set `out:` to a folder inside it"
            )
