"""Typed configs from dicts/YAML with dotted overrides; errors name the field."""

from __future__ import annotations

import pytest

from iclab import ConfigError
from iclab.core.config import apply_overrides, config_hash, from_dict, parse_override, to_dict
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
