"""Typed configs from dicts/YAML with dotted overrides; errors name the field."""

from __future__ import annotations

import dataclasses
import re

import pytest

from iclab import ConfigError
from iclab.core.config import (
    apply_overrides,
    config_hash,
    from_dict,
    load_yaml,
    parse_override,
    route_shorthand,
    to_dict,
)
from iclab.core.safe_parse import DocumentError, load_json_text, load_yaml_text
from iclab.experiments.registry import all_experiments
from iclab.experiments.runner import resolve_config
from iclab.models import LinearTransformerConfig
from iclab.training import TrainConfig
from iclab.training.run_config import parse_run_config


def test_from_dict_roundtrip() -> None:
    cfg = from_dict(TrainConfig, {"lr": 1, "betas": [0.5, 0.6], "clip": None})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.betas == (0.5, 0.6)
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


def test_unknown_key_suggests() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'model.n_layer'; did you mean 'n_layers'\?"):
        from_dict(LinearTransformerConfig, {"n_layer": 3}, owner="model")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"steps": "ten"}, "train.steps must be an int; got 'ten'"),
        ({"steps": 1.5}, "train.steps must be an int; got 1.5"),
        ({"optimizer": "rmsprop"}, "train.optimizer must be one of"),
        ({"betas": [0.9]}, "train.betas must be"),
        ({"tensorboard": "yes"}, "train.tensorboard must be true or false"),
    ],
)
def test_bad_types(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(TrainConfig, data, owner="train")
    assert fragment in str(e.value)


def test_overrides() -> None:
    data = apply_overrides(
        {"train": {"lr": 0.1}}, ["train.lr=0.02", "model.n_layers=4", "model.pattern=sparse", "train.clip=null"]
    )
    assert data == {"train": {"lr": 0.02, "clip": None}, "model": {"n_layers": 4, "pattern": "sparse"}}
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="override must look like key.sub=value"):
        parse_override("train.lr")
    with pytest.raises(ConfigError, match="dotted names"):
        parse_override("a..b=1")


def test_config_hash_is_stable_and_sensitive() -> None:
    a, b = TrainConfig(lr=0.1), TrainConfig(lr=0.1)
    assert config_hash(a) == config_hash(b) != config_hash(TrainConfig(lr=0.2))


def test_run_config_validation() -> None:
    cfg = parse_run_config(
        {"task": {"d": 3, "n": 10}, "model": {"n_layers": 2, "pattern": "sparse"}, "train": {"steps": 5}}
    )
    assert cfg.model.d == 3 and cfg.task.n == 10 and cfg.train.steps == 5
    with pytest.raises(ConfigError, match="model.d must equal task.d = 3; got 4"):
        parse_run_config({"task": {"d": 3}, "model": {"d": 4}})
    with pytest.raises(ConfigError, match="task.name must be one of"):
        parse_run_config({"task": {"name": "sines"}})
    with pytest.raises(ConfigError, match="task.spectrum must have d = 3 entries; got 2"):
        parse_run_config({"task": {"d": 3, "spectrum": [1, 2]}})
    with pytest.raises(ConfigError, match="unknown key 'trian'; did you mean 'train'"):
        parse_run_config({"trian": {}})
    with pytest.raises(ConfigError, match="model.pattern must be one of"):
        parse_run_config({"model": {"pattern": "dense"}})


# ---- nested configs: a card nests `train: TrainConfig` instead of copying its fields -------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Tol:
    dist_tol: float = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Card:
    seeds: int = 3
    train: TrainConfig = dataclasses.field(default_factory=lambda: TrainConfig(lr=0.02, steps=300, clip=0.01))
    tol: _Tol = dataclasses.field(default_factory=_Tol)
    model: LinearTransformerConfig = dataclasses.field(default_factory=LinearTransformerConfig)


def test_a_nested_mapping_merges_onto_the_fields_default() -> None:
    cfg = from_dict(_Card, {"train": {"steps": 20}}, owner="x.fig1")
    assert (cfg.train.steps, cfg.train.lr, cfg.train.clip) == (20, 0.02, 0.01)  # the card's defaults survive
    assert from_dict(_Card, to_dict(cfg)) == cfg
    assert config_hash(cfg) != config_hash(from_dict(_Card, {}))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train": {"lr": -1}}, "x.fig1.train.lr must be a float > 0; got -1.0"),
        ({"train": {"lr": "a"}}, "x.fig1.train.lr must be a float; got 'a'"),
        ({"model": {"n_layers": 0}}, "x.fig1.model.n_layers must be an int >= 1; got 0"),
        ({"train": {"stepz": 3}}, "unknown key 'x.fig1.train.stepz'; did you mean 'steps'?"),
    ],
)
def test_errors_in_a_nested_config_name_the_full_path(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(_Card, data, owner="x.fig1")
    assert str(e.value) == message


def test_shorthand_keys_route_to_the_one_nested_field() -> None:
    assert route_shorthand(_Card, {"steps": 20, "dist_tol": 0.5, "seeds": 1}) == {
        "train": {"steps": 20},
        "tol": {"dist_tol": 0.5},
        "seeds": 1,
    }
    # an explicit nested value and a shorthand merge; the later one wins
    assert route_shorthand(_Card, {"train": {"steps": 20, "lr": 0.1}, "steps": 5}) == {"train": {"steps": 5, "lr": 0.1}}
    data = apply_overrides(route_shorthand(_Card, {"steps": 20}), ["lr=-1", "train.clip=null"], cls=_Card)
    assert data == {"train": {"steps": 20, "lr": -1, "clip": None}}
    with pytest.raises(ConfigError, match=r"^x.fig1.train.lr must be a float > 0; got -1.0$"):
        from_dict(_Card, data, owner="x.fig1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _TwoTrainers(_Card):
    probe: TrainConfig = dataclasses.field(default_factory=TrainConfig)


def test_an_ambiguous_or_unknown_shorthand_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^'x.lr' is ambiguous: it could be any of train.lr, probe.lr; write the"):
        route_shorthand(_TwoTrainers, {"lr": 3}, owner="x")
    with pytest.raises(ConfigError, match="'x.steps' is ambiguous"):
        apply_overrides({}, ["steps=3"], cls=_TwoTrainers, owner="x")
    assert apply_overrides({}, ["probe.steps=3"], cls=_TwoTrainers) == {"probe": {"steps": 3}}
    with pytest.raises(ConfigError, match=r"unknown key 'x.lrr'; did you mean 'lr'\?"):
        from_dict(_Card, apply_overrides({}, ["lrr=3"], cls=_Card), owner="x")


@pytest.mark.parametrize(("raw", "value"), [("1e-3", 1e-3), ("2E5", 2e5), ("-1.5e+2", -150.0), (".5", 0.5), ("3", 3)])
def test_overrides_read_exponent_floats_as_numbers(raw: str, value: float) -> None:
    """YAML 1.1 reads ``1e-3`` as a string; an override ``train.lr=1e-3`` means the number (YAML 1.2)."""
    from iclab.core.config import parse_override

    key, parsed = parse_override(f"train.lr={raw}")
    assert key == ["train", "lr"] and parsed == value and type(parsed) is type(value)


def test_an_added_setting_at_its_default_keeps_the_run_identity() -> None:
    """A setting added to a config later (``added_setting``) leaves the hash and a checkpoint's match of every
    config that does not use it as they were, and changes them when it is used."""
    import dataclasses

    from iclab.core.config import added_setting, config_hash, identity, to_dict

    @dataclasses.dataclass(frozen=True)
    class Before:
        lr: float = 0.1

    @dataclasses.dataclass(frozen=True)
    class After:
        lr: float = 0.1
        projection: str = added_setting("none")

    assert identity(After()) == to_dict(Before()) and config_hash(After()) == config_hash(Before())
    assert config_hash(After(projection="after_step")) != config_hash(Before())
    assert "projection" in to_dict(After())  # the resolved config still shows every setting


# --- bounded parsing (iclab.core.safe_parse) -----------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False)
)


def test_yaml_alias_bomb_is_refused_as_config_override_and_file(tmp_path) -> None:
    """A 0.5 kB alias bomb (9^9 strings once expanded): refused at once wherever YAML is read."""
    assert len(BOMB) < 600
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_yaml(path)
    flow = "{" + BOMB.strip().replace("\n", ", ") + "}"
    with pytest.raises(ConfigError, match="anchors and aliases"):
        parse_override(f"train.lr={flow}")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("train: {lr: 1}\ntrain: {lr: 2}\n", "duplicate key 'train'"),
        ("model: {n_layers: 1, n_layers: 2}\n", "duplicate key 'n_layers'"),
        ("[" * 200_000, "nested deeper than 64"),
        ("x: " + "y" * (2 << 20), "at most 1048576"),
    ],
)
def test_hostile_yaml_files_are_one_config_error(tmp_path, text: str, fragment: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_yaml(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[" * 200_000 + "]" * 200_000, "nested deeper than 64"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("[" * 65 + "]" * 65, "nested deeper than 64"),
        ('{"seconds": 1', "not valid JSON"),
    ],
)
def test_hostile_json_is_one_document_error(text: str, fragment: str) -> None:
    with pytest.raises(DocumentError, match=re.escape(fragment)):
        load_json_text(text)


def test_bounded_readers_read_what_iclab_writes() -> None:
    assert load_json_text('{"x": [1.5, NaN, Infinity], "y": {"z": null}}')["y"] == {"z": None}
    assert load_yaml_text("train: {lr: 1e-3, betas: [0.9, 0.99]}") == {"train": {"lr": 0.001, "betas": [0.9, 0.99]}}
    assert load_json_text("[" * 64 + "]" * 64) is not None  # the bound itself is accepted


# --- fields that must agree, overrides a card ignores ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["ahn2023.isotropic", "ahn2023.fig1", "zhang2025.fig1", "cheng2024.fig1"])
def test_d_and_spectrum_must_agree(name: str) -> None:
    """d = 100000 beside a 5-entry spectrum once trained at d = 5 and exited 0: now refused, naming both fields."""
    exp = all_experiments()[name]
    with pytest.raises(ConfigError, match=rf"{re.escape(name)}\.spectrum must be 100000 .*d"):
        resolve_config(exp, "smoke", ["d=100000"])
    d = len(resolve_config(exp, "smoke").spectrum) + 1
    spectrum = "[" + ", ".join(["1.0"] * d) + "]"
    assert resolve_config(exp, "smoke", [f"d={d}", f"spectrum={spectrum}"]).d == d  # both changed: accepted


@pytest.mark.parametrize("name", ["ahn2023.isotropic", "sun2025.fig1", "cheng2024.fig1"])
def test_checkpoint_every_a_card_sets_itself_is_refused(name: str) -> None:
    """These cards checkpoint every steps / 10 (or / 5): a train.checkpoint_every would be hashed and ignored."""
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every must be left at 1000"):
        resolve_config(all_experiments()[name], "smoke", ["train.checkpoint_every=7"])


def test_train_config_out_must_name_a_folder() -> None:
    with pytest.raises(ConfigError, match="out must name a folder"):
        parse_run_config({"out": ""})
