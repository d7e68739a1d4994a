"""What a training run hands back: :class:`TrainResult` (the shared trainer), :class:`Trajectory` (the reduced
regimes of Zhang et al. 2025) and the trainer's in-loop :class:`StepTiming`.

Plain data with no training code in it, below both :mod:`iclab.training.trainer` and
:mod:`iclab.training.population`: the population regimes run the trainer (online SGD, autograd full-batch GD) and
the trainer imports nothing back. Both modules re-export these names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from iclab.core.io import atomic_torch_save, atomic_write_text, safe_torch_load
from iclab.core.safe_parse import load_json_file

__all__ = ["StepTiming", "TrainResult", "Trajectory"]


@dataclass(frozen=True)
class StepTiming:
    """Host-side wall time of a run's steps, measured inside the loop (CPU runs): the median optimiser step (data,
    forward, backward, clip, update), robust to a busy machine's stray slow steps, and the mean evaluation. What
    :func:`iclab.experiments.estimate.estimate_experiment` projects a run's cost from."""

    step_seconds: float  # median over the timed steps, the drawing of a new batch left out
    steps: int  # steps timed
    eval_seconds: float  # mean over the evaluations (0 when none ran)
    evals: int
    eval_every: int  # the config's; 0: only the last step evaluates
    draw_seconds: float = 0.0  # mean over the batches drawn (0 when none was)
    draws: int = 0
    draw_every: int = 0  # steps per new batch (resample_every); 0: drawn once (a fixed set, or resample_every 0)

    def per_step(self) -> float:
        """Seconds per step with the periodic evaluation amortised over ``eval_every`` steps and the drawing of a new
        batch over ``draw_every`` (Cheng et al.'s ReLU-GP batch of 30 000 prompts, drawn every 10 steps, cost as much
        as the step: a median step alone missed it)."""
        return (
            self.step_seconds
            + (self.eval_seconds / self.eval_every if self.eval_every else 0.0)
            + (self.draw_seconds / self.draw_every if self.draw_every else 0.0)
        )

    def accounted_seconds(self) -> float:
        """The part of the run's wall time that :meth:`per_step` stands for: the timed steps, the evaluations and the
        periodic draws (a set drawn once is the run's fixed cost, as its first evaluation is not)."""
        draws = self.draws * self.draw_seconds if self.draw_every else 0.0
        return self.steps * self.step_seconds + self.evals * self.eval_seconds + draws


@dataclass
class TrainResult:
    """What one training run returns: the trained model (its final parameters), the metric history and the
    parameter snapshots; ``name``/``seed`` say which :class:`~iclab.training.TrainingRun` it was, and the
    reduced regimes (full-batch GD, population flow) put their :class:`~iclab.training.Trajectory` here."""

    model: nn.Module
    history: list[dict[str, float]]  # one row per logged step: step, train_loss, lr[, test_loss]
    snapshots: dict[str, Tensor] = field(default_factory=dict)  # name -> (S, ...) on CPU
    snapshot_steps: list[int] = field(default_factory=list)
    resumed_from: int | None = None
    seconds: float = 0.0
    name: str = ""
    seed: int = 0
    trajectory: Trajectory | None = None
    timing: StepTiming | None = None  # the steps this call ran (None on a GPU, or a finished run reloaded)
    #: a run that diverged and trained again at a lower lr (``TrainingRun.retry_lr``): {"lr", "step", "retry_lr"}
    retry: dict[str, Any] | None = None

    @property
    def final_test_loss(self) -> float:
        """The last logged test loss (NaN when none was logged)."""
        rows = [r for r in self.history if "test_loss" in r]
        return rows[-1]["test_loss"] if rows else float("nan")

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite loss or gradient (``TrainConfig.skip_nonfinite``), as of the last logged row."""
        return int(self.history[-1].get("skipped_steps", 0)) if self.history else 0

    def curve(self, key: str) -> tuple[list[int], list[float]]:
        """The logged curve of ``key``: (steps, values) as lists."""
        rows = [r for r in self.history if key in r]
        return [int(r["step"]) for r in rows], [r[key] for r in rows]

    def curve_tensor(self, key: str = "test_loss") -> tuple[Tensor, Tensor]:
        """The logged curve of ``key`` as (steps (T,) int64, values (T,) float64) tensors."""
        steps, values = self.curve(key)
        return torch.tensor(steps, dtype=torch.int64), torch.tensor(values, dtype=torch.float64)


@dataclass
class Trajectory:
    """What every training mode returns; with ``n_seeds = S`` every per-run quantity leads with S.

    ``loss`` is the exact population loss L(W) at the recorded steps when Λ is known (always for
    :func:`population_flow`), otherwise the training loss; ``train_loss`` is the loss on the fixed
    training set (finite P), None otherwise. ``params`` holds name -> (T, ...) or (S, T, ...).
    """

    steps: Tensor  # (T,) step indices recorded
    time: Tensor  # (T,) t/τ = 2·lr·step (eq. 5)
    loss: Tensor  # (T,) or (S, T)
    params: dict[str, Tensor]
    train_loss: Tensor | None = None  # (T,) or (S, T)
    meta: dict[str, Any] = field(default_factory=dict)  # mode, lr, inv_n, ...
    #: the trainer's in-loop step timer where the trajectory came from it (full-batch GD of a token-level module by
    #: autograd): what ``iclab estimate`` projects the run from; not saved, not compared
    timing: StepTiming | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (JSON-able); :meth:`from_dict` inverts it."""

        def lst(t: Tensor) -> Any:
            return t.detach().cpu().tolist()

        return {
            "steps": lst(self.steps),
            "time": lst(self.time),
            "loss": lst(self.loss),
            "params": {k: lst(v) for k, v in self.params.items()},
            "train_loss": None if self.train_loss is None else lst(self.train_loss),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """The trajectory stored by :meth:`to_dict`."""
        f64 = torch.float64
        return cls(
            steps=torch.tensor(data["steps"], dtype=torch.long),
            time=torch.tensor(data["time"], dtype=f64),
            loss=torch.tensor(data["loss"], dtype=f64),
            params={k: torch.tensor(v, dtype=f64) for k, v in data["params"].items()},
            train_loss=None if data["train_loss"] is None else torch.tensor(data["train_loss"], dtype=f64),
            meta=dict(data.get("meta", {})),
        )

    def save(self, path: str | Path) -> Path:
        """``.json``: :meth:`to_dict` as JSON (float64 round trip); anything else: a torch file."""
        path = Path(path)
        if path.suffix == ".json":
            atomic_write_text(path, json.dumps(self.to_dict()))
        else:
            atomic_torch_save(path, {k: v for k, v in self.__dict__.items() if k != "timing"})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        """The trajectory saved at ``path``."""
        path = Path(path)
        if path.suffix == ".json":
            return cls.from_dict(load_json_file(path))  # bounded: size, nesting, repeated keys
        return cls(**safe_torch_load(path))
