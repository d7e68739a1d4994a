"""The trainer's configuration: one frozen dataclass, validated before any work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from iclab.core.errors import require, require_int

OPTIMIZERS = ("adam", "adamw", "sgd", "lbfgs")
SCHEDULES = ("constant", "step", "cosine")
CLIP_MODES = ("per_matrix", "global")
DType = Literal["float32", "float64"]
DTYPES = ("float32", "float64")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train one model on one task.

    Data: a fresh batch every ``resample_every`` steps (the paper's 100; 1 = online), or with
    ``train_size`` set, one fixed training set of that many episodes from which minibatches of
    ``batch_size`` are drawn (``batch_size == train_size``: full-batch GD).
    """

    steps: int = 1000
    batch_size: int = 1024
    optimizer: Literal["adam", "adamw", "sgd", "lbfgs"] = "adam"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0  # sgd only
    schedule: Literal["constant", "step", "cosine"] = "constant"
    step_every: int = 1000  # 'step' schedule: lr × step_gamma every step_every steps
    step_gamma: float = 0.5
    warmup_steps: int = 0  # linear warm-up before any schedule
    clip: float | None = None  # gradient-norm clip; None = off
    clip_mode: Literal["per_matrix", "global"] = "per_matrix"  # per (·,·) block of every parameter (the paper's)
    skip_nonfinite: bool = False  # skip (and count) steps whose gradient has an inf/NaN, as AMP's GradScaler does
    resample_every: int = 1
    train_size: int | None = None
    lbfgs_history: int = 100
    lbfgs_max_iter: int = 4
    lbfgs_line_search: Literal["strong_wolfe"] | None = None  # None: fixed step lr (the authors' notebooks)
    eval_every: int = 100  # test loss on a fixed held-out batch
    eval_batch: int = 4096
    snapshot_every: int = 0  # 0 = no parameter snapshots
    checkpoint_every: int = 1000  # 0 = only at the end
    log_every: int = 10
    seed: int = 0
    dtype: DType = "float32"
    tensorboard: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        pos = "an int >= 1"
        require_int(self, "steps", self.steps, 1)
        require_int(self, "batch_size", self.batch_size, 1)
        require(self, "optimizer", self.optimizer in OPTIMIZERS, f"one of {OPTIMIZERS}")
        require(self, "lr", self.lr > 0, "a float > 0")
        require(self, "betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "two floats in [0, 1)")
        require(self, "eps", self.eps > 0, "a float > 0")
        require(self, "weight_decay", self.weight_decay >= 0, "a float >= 0")
        require(self, "momentum", 0 <= self.momentum < 1, "a float in [0, 1)")
        require(self, "schedule", self.schedule in SCHEDULES, f"one of {SCHEDULES}")
        require(self, "step_every", self.step_every >= 1, pos)
        require(self, "step_gamma", 0 < self.step_gamma <= 1, "a float in (0, 1]")
        require(self, "warmup_steps", self.warmup_steps >= 0, "an int >= 0")
        require(self, "clip", self.clip is None or self.clip > 0, "null or a float > 0")
        require(self, "clip_mode", self.clip_mode in CLIP_MODES, f"one of {CLIP_MODES}")
        require(self, "resample_every", self.resample_every >= 0, "an int >= 0 (0: never resample)")
        require(
            self,
            "train_size",
            self.train_size is None or self.train_size >= self.batch_size,
            f"null or an int >= batch_size ({self.batch_size})",
        )
        require(self, "eval_every", self.eval_every >= 0, "an int >= 0 (0: only at the end)")
        require(self, "eval_batch", self.eval_batch >= 1, pos)
        require(self, "snapshot_every", self.snapshot_every >= 0, "an int >= 0")
        require(self, "checkpoint_every", self.checkpoint_every >= 0, "an int >= 0")
        require(self, "log_every", self.log_every >= 1, pos)
        require(self, "dtype", self.dtype in DTYPES, f"one of {DTYPES}")
        require(self, "lbfgs_history", self.lbfgs_history >= 1, pos)
        require(self, "lbfgs_max_iter", self.lbfgs_max_iter >= 1, pos)
        require(self, "lbfgs_line_search", self.lbfgs_line_search in (None, "strong_wolfe"), "None or 'strong_wolfe'")
