"""Which run directory is an experiment's reproduction, and what every other one changed.

    card_run_name("ahn2023.fig1", "smoke")          # 'smoke-874c25ad43': the card's own config at that preset
    overrides_of("ahn2023.fig1", "smoke", config)   # ['train.lr=0.005']: the run's config against the card's
    select_runs(out)                                 # {experiment: RunChoice(card=..., others=[...])}

The runner names a run directory ``<preset>-<config hash>`` (:func:`iclab.experiments.runner.run_experiment`), so
the run of the card's own config at a preset is the one whose name carries the hash of
:func:`~iclab.experiments.runner.resolve_config` with no overrides. A run with overrides (``iclab run ... train.lr=
0.005``, a sweep's points) sits beside it under another hash: the report lists it under the card's run, labelled with
its overrides, and never shows it as the reproduction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from iclab.core.config import config_hash, to_dict
from iclab.core.errors import IclabError
from iclab.core.safe_parse import load_yaml_file

SKIP = ("sweeps", "report")  # directories of <out> that hold no experiment's runs


@functools.lru_cache(maxsize=256)
def _card_config(name: str, preset: str) -> tuple[str, str] | None:
    """(run directory name, config as JSON) of the card ``name`` at ``preset`` with no overrides; None when the
    experiment or preset is unknown here."""
    from iclab.experiments.registry import all_experiments
    from iclab.experiments.runner import resolve_config

    exp = all_experiments().get(name)
    if exp is None:
        return None
    try:
        cfg = resolve_config(exp, preset)
    except (IclabError, KeyError, TypeError, ValueError):
        return None
    return f"{preset}-{config_hash(cfg)}", json.dumps(_as_loaded(to_dict(cfg)), sort_keys=True, default=str)


def _as_loaded(value: Any) -> Any:
    """``value`` as its config.yaml reads back: tuples as lists (what a YAML dump and load would give, without them)."""
    if isinstance(value, dict):
        return {k: _as_loaded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_loaded(v) for v in value]
    return value


def card_run_name(name: str, preset: str) -> str | None:
    """The directory name of ``name``'s run at ``preset`` with the card's own config: ``<preset>-<hash>``."""
    found = _card_config(name, preset)
    return found[0] if found else None


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 0.1}} -> {'train.lr': 0.1}."""
    if isinstance(cfg, Mapping) and cfg:
        out: dict[str, Any] = {}
        for k, v in cfg.items():
            out |= flatten(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): cfg}


def config_diff(a: Any, b: Any) -> list[str]:
    """``b`` against ``a`` as ``key=value`` overrides (dotted keys; ``key removed`` for a key only ``a`` has)."""
    fa, fb = flatten(a), flatten(b)
    said = [f"{k}={_text(fb[k])}" for k in fb if k not in fa or fa[k] != fb[k]]
    return said + [f"{k} removed" for k in fa if k not in fb]


def _text(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    return json.dumps(v) if isinstance(v, list | dict) else str(v)


def overrides_of(name: str, preset: str, config: Any) -> list[str] | None:
    """The overrides that turn the card's config at ``preset`` into ``config`` ([] for the card's own config);
    None when the card is not known here."""
    found = _card_config(name, preset)
    if found is None or not isinstance(config, Mapping):
        return None
    return config_diff(json.loads(found[1]), config)


@dataclass(frozen=True)
class RunChoice:
    """One experiment's run directories under ``out``: ``card`` the newest run of the card's own config (None when
    there is none), ``others`` every other one, newest first."""

    card: Path | None
    others: tuple[Path, ...] = field(default=())


def _read_head(run_dir: Path) -> tuple[str, str]:
    """(experiment, preset) a run directory says it is, from config.yaml, else from its path."""
    name, preset = run_dir.parent.name, run_dir.name.split("-", 1)[0]
    try:
        data = load_yaml_file(run_dir / "config.yaml", what="config.yaml")  # bounded: no alias bomb, UTF-8 checked
    except (OSError, yaml.YAMLError):
        return name, preset
    if isinstance(data, dict):
        name, preset = str(data.get("experiment") or name), str(data.get("preset") or preset)
    return name, preset


def is_card_run(run_dir: Path) -> bool:
    """``run_dir`` holds the card's own config at its preset (its name carries that config's hash)."""
    name, preset = _read_head(run_dir)
    return card_run_name(name, preset) == run_dir.name


def select_runs(out: str | Path) -> dict[str, RunChoice]:
    """Every experiment directory under ``out`` -> its :class:`RunChoice` (a run directory is one with a
    ``summary.json``; the newest is the one whose ``summary.json`` was written last)."""
    found: dict[str, list[tuple[float, Path]]] = {}
    for summary in Path(out).glob("*/*/summary.json"):
        if summary.parent.parent.name in SKIP:
            continue
        found.setdefault(summary.parent.parent.name, []).append((summary.stat().st_mtime, summary.parent))
    choices = {}
    for exp_dir, runs in found.items():
        ordered = [p for _, p in sorted(runs, key=lambda t: (-t[0], t[1].name))]
        card = next((p for p in ordered if is_card_run(p)), None)
        choices[exp_dir] = RunChoice(card=card, others=tuple(p for p in ordered if p != card))
    return choices
