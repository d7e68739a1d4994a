"""Run an experiment at a preset: resolve its config, reuse or resume its run directory, write
results, figures and ``claims.json``.

Layout: ``<out>/<experiment>/<preset>-<config hash>/`` holding ``config.yaml``, ``results.pt``,
``claims.json``, ``summary.json``, figures (``*.png``) and one sub-directory per training run
(checkpoints and ``metrics.jsonl``). Same config, same directory: a finished experiment is
reused, an interrupted one resumes its training runs from their checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.progress import Progress

from iclab.core.config import apply_overrides, config_hash, from_dict, route_shorthand, to_dict
from iclab.core.devices import resolve_device
from iclab.core.errors import ConfigError, did_you_mean
from iclab.core.io import atomic_torch_save, atomic_write_json, atomic_write_text, read_json
from iclab.experiments.registry import PRESETS, ClaimResult, Experiment, RunContext, get


@dataclass
class ExperimentResult:
    experiment: Experiment
    preset: str
    config: Any
    out_dir: Path
    results: dict[str, Any]
    claims: list[ClaimResult]
    figures: list[Path]
    seconds: float
    reused: bool

    @property
    def passed(self) -> bool:
        """Every checked claim passed (claims not checked at this preset do not count)."""
        return all(c.passed for c in self.claims if c.checked)

    def claims_json(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.claims]


def resolve_config(
    exp: Experiment, preset: str, overrides: list[str] | tuple[str, ...] = (), seeds: int | None = None
) -> Any:
    """The experiment's config at ``preset`` with ``key=value`` overrides, validated."""
    if preset not in PRESETS:
        raise ConfigError(f"preset must be one of {list(PRESETS)}; got {preset!r}{did_you_mean(preset, list(PRESETS))}")
    data = route_shorthand(exp.config, dict(exp.presets[preset]), owner=exp.name)
    data = apply_overrides(data, list(overrides), cls=exp.config, owner=exp.name)
    if seeds is not None:
        names = {f.name for f in dataclasses.fields(exp.config)}
        if "seeds" not in names:
            raise ConfigError(f"experiment {exp.name!r} has no seeds to set (it is deterministic)")
        if seeds < 1:
            raise ConfigError(f"--seeds must be an int >= 1; got {seeds}")
        data["seeds"] = seeds
    return from_dict(exp.config, data, owner=exp.name)


def judge(exp: Experiment, preset: str, claims: list[ClaimResult]) -> list[ClaimResult]:
    """At ``smoke``, report the claims the card lists in ``smoke_unchecked`` as not checked, with its reason."""
    if preset != "smoke":
        return claims
    names = {c.name for c in claims}
    unknown = sorted(set(exp.smoke_unchecked) - names)
    if unknown:
        raise ConfigError(f"{exp.name}.smoke_unchecked names claims it does not make: {unknown}")
    return [c.not_checked(exp.smoke_unchecked[c.name]) if c.name in exp.smoke_unchecked else c for c in claims]


def run_experiment(
    name: str,
    preset: str = "quick",
    *,
    out: str | Path = "runs",
    device: str = "cpu",
    seeds: int | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    force: bool = False,
    progress: Progress | None = None,
) -> ExperimentResult:
    exp = get(name)
    cfg = resolve_config(exp, preset, overrides, seeds)
    dev = resolve_device(device)
    run_dir = Path(out) / exp.name / f"{preset}-{config_hash(cfg)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        run_dir / "config.yaml",
        yaml.safe_dump({"experiment": exp.name, "preset": preset, "config": to_dict(cfg)}, sort_keys=False),
    )
    t0 = time.perf_counter()
    results_path = run_dir / "results.pt"
    reused = results_path.is_file() and not force
    if reused:
        results = torch.load(results_path, weights_only=False)
    else:
        ctx = RunContext(out_dir=run_dir, device=dev, preset=preset, progress=progress)
        results = exp.run(cfg, ctx)
        atomic_torch_save(results_path, results)
    figures = exp.plot(results, cfg, run_dir)
    claims = judge(exp, preset, exp.claims(results, cfg))
    seconds = time.perf_counter() - t0
    if reused and (run_dir / "summary.json").is_file():
        seconds = float(read_json(run_dir / "summary.json").get("seconds", seconds))
    atomic_write_json(run_dir / "claims.json", [c.to_dict() for c in claims])
    atomic_write_json(
        run_dir / "summary.json",
        {
            "experiment": exp.name,
            "preset": preset,
            "seconds": seconds,
            "passed": all(c.passed for c in claims if c.checked),
            "figures": [f.name for f in figures],
        },
    )
    return ExperimentResult(exp, preset, cfg, run_dir, results, claims, figures, seconds, reused)
