"""Pieces shared by experiment modules: the linear-regression training set-up and seeded runs."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig, Pattern
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression, WeightPrior
from iclab.training import TrainConfig, TrainResult, train


@dataclass(frozen=True, kw_only=True)
class LinearSetup:
    """The training set-up of Ahn et al. 2023, Sec. 4.3, with the authors' code's hidden settings
    (AdamW β = (0.99, 0.9), lr halved every 2000 steps, init std 1e-4; spec 002 §3.1)."""

    seeds: int = 5
    d: int = 5
    n: int = 20
    n_layers: int = 3
    spectrum: tuple[float, ...] = AHN2023_SPECTRUM
    rotation: Literal["haar", "svd-uniform", "none"] = "haar"
    optimizer: Literal["adam", "adamw", "sgd", "lbfgs"] = "adamw"
    lr: float = 0.02
    betas: tuple[float, float] = (0.99, 0.9)
    steps: int = 30_000
    batch_size: int = 20_000
    resample_every: int = 100
    train_size: int | None = None  # a fixed training set (L-BFGS runs)
    schedule: Literal["constant", "step", "cosine"] = "step"
    step_every: int = 2000
    clip: float | None = 0.01
    init_std: float = 1e-4
    lbfgs_history: int = 600
    lbfgs_max_iter: int = 4
    lbfgs_line_search: Literal["strong_wolfe"] | None = None
    eval_every: int = 100
    eval_batch: int = 20_000
    snapshot_every: int = 100
    dtype: Literal["float32", "float64"] = "float32"

    def train_config(self, seed: int, **changes: object) -> TrainConfig:
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(self, f.name)}
        kw.update(seed=seed, checkpoint_every=max(1, self.steps // 10), progress=True)
        kw.update(changes)
        return TrainConfig(**kw)  # type: ignore[arg-type]


def make_task(setup: LinearSetup, seed: int, weight_prior: WeightPrior, d: int | None = None) -> LinearRegression:
    """Run ``seed``'s problem: Σ = UᵀDU with its own random U (the paper: 5 runs, 5 different U)."""
    spectrum = setup.spectrum if d is None else (1.0,) * d
    return LinearRegression.random_rotation(
        spectrum, generator=generator(derive_seed(seed, "task")), rotation=setup.rotation, weight_prior=weight_prior
    )


def train_model(
    setup: LinearSetup,
    ctx: RunContext,
    *,
    seed: int,
    task: LinearRegression,
    pattern: Pattern,
    n: int | None = None,
    n_layers: int | None = None,
    activation: Literal["linear", "relu"] = "linear",
    name: str,
    snapshot: bool = True,
    **train_changes: object,
) -> tuple[LinearTransformer, TrainResult]:
    """Train one linear transformer on ``task`` for one seed, in ``ctx.out_dir/name`` (resumable)."""
    n = n or setup.n
    mcfg = LinearTransformerConfig(
        d=task.d, n_layers=n_layers or setup.n_layers, pattern=pattern, activation=activation, init_std=setup.init_std
    )
    model = LinearTransformer(mcfg, generator=generator(derive_seed(seed, "init")))
    tcfg = setup.train_config(seed, **train_changes)
    snap = functools.partial(_snapshot, pattern=pattern) if snapshot and tcfg.snapshot_every else None
    result = train(
        model,
        functools.partial(task.sample, n=n),
        tcfg,
        out_dir=ctx.subdir(name),
        device=ctx.device,
        snapshot_fn=snap,
        progress=ctx.progress,
        description=name,
    )
    return model, result


def _snapshot(model: LinearTransformer, pattern: Pattern) -> dict[str, Tensor]:
    out = {"P": model.P[:, 0], "Q": model.Q[:, 0]} if pattern == "full" else {"A": model.A[:, 0]}
    if pattern == "pattern11":
        out["B"] = model.B[:, 0]
    return out


def curve(result: TrainResult, key: str = "test_loss") -> tuple[Tensor, Tensor]:
    steps, values = result.curve(key)
    return torch.tensor(steps), torch.tensor(values, dtype=torch.float64)


def seed_runs(
    setup: LinearSetup, ctx: RunContext, *, pattern: Pattern, weight_prior: WeightPrior
) -> list[dict[str, object]]:
    """Train one model per seed (each on its own Σ) and collect what the figures plot: the test-loss
    curve, the parameter snapshots (``A``, ``B``, ... stacked over snapshot steps) and Σ."""
    runs: list[dict[str, object]] = []
    for s in range(setup.seeds):
        task = make_task(setup, s, weight_prior)
        _, res = train_model(setup, ctx, seed=s, task=task, pattern=pattern, name=f"seed{s}")
        steps, loss = curve(res)
        runs.append(
            {
                "seed": s,
                "steps": steps,
                "test_loss": loss,
                "snap_steps": torch.tensor(res.snapshot_steps),
                **res.snapshots,
                "Sigma": task.Sigma,
            }
        )
    return runs
