"""``iclab train --config file.yaml``: one typed config for a single training run.

task:  {name: linear_regression, d: 5, n: 20, spectrum: [1, 1, 0.25, 0.0625, 1], weight_prior: inverse_covariance}
model: {name: linear_transformer, n_layers: 3, pattern: sparse}
train: {steps: 2000, lr: 0.02, clip: 0.01}
seed: 0
out: runs/train
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from iclab.core.config import config_hash, from_dict
from iclab.core.errors import ConfigError, did_you_mean
from iclab.core.seeding import derive_seed, generator
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.tasks.linear_regression import LinearRegression
from iclab.training.config import TrainConfig
from iclab.training.run import ModelSpec, TrainingRun
from iclab.training.trainer import TrainResult


@dataclass(frozen=True, kw_only=True)
class LinearRegressionTaskConfig:
    name: Literal["linear_regression"] = "linear_regression"
    d: int = 5
    n: int = 20
    spectrum: tuple[float, ...] | None = None  # None: Σ = I
    rotation: Literal["haar", "svd-uniform", "none"] = "haar"
    weight_prior: Literal["identity", "inverse_covariance"] = "identity"
    noise_std: float = 0.0

    def __post_init__(self) -> None:
        if self.spectrum is not None and len(self.spectrum) != self.d:
            raise ConfigError(f"task.spectrum must have d = {self.d} entries; got {len(self.spectrum)}")
        if self.n < 1:
            raise ConfigError(f"task.n must be an int >= 1; got {self.n}")

    def build(self, seed: int) -> LinearRegression:
        spectrum = self.spectrum or (1.0,) * self.d
        return LinearRegression.random_rotation(
            spectrum,
            generator=generator(derive_seed(seed, "task")),
            rotation=self.rotation,
            weight_prior=self.weight_prior,
            noise_std=self.noise_std,
        )


TASKS: dict[str, type] = {"linear_regression": LinearRegressionTaskConfig}
MODELS: dict[str, type] = {"linear_transformer": LinearTransformerConfig}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    task: Any = field(default_factory=LinearRegressionTaskConfig)
    model: Any = field(default_factory=LinearTransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    device: str = "cpu"
    out: str = "runs/train"

    def __post_init__(self) -> None:
        if not self.out.strip():  # '' would write into the current folder
            raise ConfigError(f"out must name a folder (the run goes in <out>/<config hash>/); got {self.out!r}")


def parse_run_config(data: dict[str, Any]) -> RunConfig:
    """Validate a YAML dict into a :class:`RunConfig` (unknown keys and names fail here)."""
    if not isinstance(data, dict):
        raise ConfigError(f"a run config must be a mapping of task, model, train, ...; got {type(data).__name__}")
    data = dict(data)
    known = {"task", "model", "train", "seed", "device", "out"}
    for k in data:
        if k not in known:
            raise ConfigError(f"unknown key {k!r}{did_you_mean(str(k), known)}")
    for section in ("task", "model"):
        if not isinstance(data.get(section) or {}, dict):
            raise ConfigError(f"{section} must be a mapping (e.g. name: ...); got {data[section]!r}")
    task = dict(data.pop("task", {}) or {})
    tname = task.pop("name", "linear_regression")
    if not isinstance(tname, str) or tname not in TASKS:
        raise ConfigError(
            f"task.name must be one of {sorted(TASKS)}; got {tname!r}{did_you_mean(str(tname), list(TASKS))}"
        )
    task_cfg: Any = from_dict(TASKS[tname], task, owner="task")
    model = dict(data.pop("model", {}) or {})
    mname = model.pop("name", "linear_transformer")
    if not isinstance(mname, str) or mname not in MODELS:
        raise ConfigError(
            f"model.name must be one of {sorted(MODELS)}; got {mname!r}{did_you_mean(str(mname), list(MODELS))}"
        )
    model.setdefault("d", task_cfg.d)
    if model["d"] != task_cfg.d:
        raise ConfigError(f"model.d must equal task.d = {task_cfg.d}; got {model['d']}")
    model_cfg: Any = from_dict(MODELS[mname], model, owner="model")
    train_cfg = from_dict(TrainConfig, data.pop("train", {}) or {}, owner="train")
    rest = from_dict(RunConfig, {k: data[k] for k in ("seed", "device", "out") if k in data})
    return RunConfig(task=task_cfg, model=model_cfg, train=train_cfg, seed=rest.seed, device=rest.device, out=rest.out)


def to_training_run(cfg: RunConfig) -> TrainingRun:
    """The :class:`TrainingRun` a YAML run config describes, in ``<out>/<config hash>/``."""
    task = cfg.task.build(cfg.seed)
    return TrainingRun(
        name="train",
        model=ModelSpec(LinearTransformer, cfg.model),
        task=functools.partial(task.sample, n=cfg.task.n),
        train=cfg.train,
        seed=cfg.seed,
        out_dir=Path(cfg.out) / config_hash(cfg),
    )


def run_training(cfg: RunConfig) -> tuple[TrainResult, Path]:
    """Train the configured model on the configured task in ``<out>/<config hash>/``."""
    from iclab.core.devices import resolve_device

    run = to_training_run(cfg)
    assert run.out_dir is not None
    return run.execute(device=resolve_device(cfg.device)), run.out_dir
