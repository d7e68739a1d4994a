"""Every experiment is a reproduction card: one module per experiment name inside its paper's package,
under 500 lines, opening with a docstring that gives its command and claims; its config nests the trainer's
settings (``train: TrainConfig``) and its tolerances (``tol``) instead of copying fields; its smoke preset never
loosens a tolerance; and a bad value is refused before any work under the card's own field name."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from pathlib import Path

import pytest

import iclab.experiments as pkg
from iclab import ConfigError
from iclab.core.config import route_shorthand
from iclab.experiments import all_experiments, get
from iclab.experiments.runner import resolve_config
from iclab.training import TrainConfig

EXPERIMENTS = all_experiments()
NAMES = list(EXPERIMENTS)
ROOT = Path(pkg.__file__).parent

#: Trainer settings a card must not copy flat (they live in its nested ``train: TrainConfig``).
TRAINER_FIELDS = {
    "optimizer",
    "betas",
    "batch_size",
    "schedule",
    "step_every",
    "clip",
    "resample_every",
    "eval_batch",
    "snapshot_every",
    "warmup_steps",
    "weight_decay",
    "lbfgs_history",
    "lbfgs_max_iter",
}


def _module(name: str):
    return importlib.import_module(EXPERIMENTS[name].module)


@pytest.mark.parametrize("name", NAMES)
def test_each_experiment_is_its_own_card_module(name: str) -> None:
    mod = _module(name)
    assert mod.__name__ in (f"iclab.experiments.{name}", name), "one module per experiment name, named after it"
    doc = inspect.getdoc(mod) or ""
    assert f"iclab run {name}" in doc, "the card's docstring gives its command"
    for claim in _claim_names(name):
        assert claim in doc, f"the card's docstring lists its claim {claim!r}"


def _claim_names(name: str) -> list[str]:
    import json

    frozen = json.loads((Path(__file__).parent / "data" / "smoke_claims.json").read_text())
    return list(frozen.get(name, {}))


def test_no_experiment_module_is_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


@pytest.mark.parametrize("name", NAMES)
def test_cards_nest_the_trainer_and_the_tolerances(name: str) -> None:
    cfg = EXPERIMENTS[name].config
    own = {f.name for f in dataclasses.fields(cfg)}
    assert not own & TRAINER_FIELDS, f"{name} copies trainer fields flat: {sorted(own & TRAINER_FIELDS)}"
    hints = typing.get_type_hints(cfg)
    trainers = [f for f in own if hints[f] is TrainConfig]
    assert trainers or not own & {"lr", "steps"} or "tol" in own, f"{name}: lr/steps outside a TrainConfig"


@pytest.mark.parametrize("name", NAMES)
def test_smoke_never_loosens_a_tolerance(name: str) -> None:
    exp = EXPERIMENTS[name]
    smoke = route_shorthand(exp.config, dict(exp.presets["smoke"]), owner=name)
    assert "tol" not in smoke, f"{name}'s smoke preset sets tolerances {smoke.get('tol')}: use check(..., smoke=why)"


def test_a_bad_value_is_refused_before_any_work_under_the_cards_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^ahn2023.fig1.train.lr must be a float > 0; got -1.0$"):
        resolve_config(get("ahn2023.fig1"), "quick", ["lr=-1"])
    from iclab.experiments.runner import run_experiment

    with pytest.raises(ConfigError, match="ahn2023.fig1.train.lr"):
        run_experiment("ahn2023.fig1", "quick", out=tmp_path, overrides=["lr=-1"])
    assert list(tmp_path.iterdir()) == []  # no run directory was made
