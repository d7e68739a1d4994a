"""The trainer's configuration: one frozen dataclass, validated before any work."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from iclab.core.config import added_setting
from iclab.core.errors import require, require_int

OPTIMIZERS = ("adam", "adamw", "sgd", "lbfgs")
SCHEDULES = ("constant", "step", "cosine")
CLIP_MODES = ("per_matrix", "global", "per_group")
PROJECTIONS = ("none", "after_step", "start_and_after_step")
DType = Literal["float32", "float64"]
DTYPES = ("float32", "float64")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train one model on one task.

    Data: a fresh batch every ``resample_every`` steps (the paper's 100; 1 = online), or with
    ``train_size`` set, one fixed training set of that many episodes from which minibatches of
    ``batch_size`` are drawn (``batch_size == train_size``: full-batch GD).

    Clipping (``clip`` or ``clip_thresholds`` set): each gradient block b of norm ‖g_b‖ is scaled by
    min(1, c_b / (‖g_b‖ + clip_eps)). The blocks (``clip_mode``): ``per_matrix``, every (·, ·) matrix of every
    parameter, c_b = ``clip``; ``global``, all gradients together; ``per_group``, each of the model's clip groups
    (its ``clip_groups()``, else one group per layer of ``model.layers`` and one per other parameter:
    :func:`iclab.training.trainer.clip_groups`) with c_b = ``clip_thresholds[b]``, or ``clip`` for every group.
    ``clip_eps`` None keeps each mode's own rule: c/‖g‖ for ``per_matrix`` and ``per_group``, torch's
    ``clip_grad_norm_`` c/(‖g‖ + 1e-6) for ``global``. ``clip_masked`` False leaves the gradients of the entries
    the model holds at zero (its ``projection_masks()``) out of the norms.

    Projection: a model with ``projection_masks()`` ({parameter name: bool mask of the entries held at zero}) is
    re-masked after every optimiser step (``after_step``: the first step sees the initial weights as drawn, as
    the authors' ``zero_row_col`` (Cheng et al. 2024) and ``zero_p`` (Ahn et al. 2023) do), and with
    ``start_and_after_step`` also once before the first step of a fresh run.
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
    clip_mode: Literal["per_matrix", "global", "per_group"] = "per_matrix"  # per (·,·) block of every parameter
    clip_thresholds: tuple[float, ...] | None = added_setting(None)  # per_group: group i clipped to clip_thresholds[i]
    clip_eps: float | None = added_setting(
        None
    )  # coefficient c/(norm + clip_eps); None: the mode's own rule (class docstring)
    clip_masked: bool = added_setting(True)  # the gradients of masked entries count in the clip norms
    projection: Literal["none", "after_step", "start_and_after_step"] = added_setting(
        "none"
    )  # re-mask (class docstring)
    skip_nonfinite: bool = False  # skip (and count) steps whose loss or gradient has an inf/NaN (as AMP's GradScaler)
    #: with ``skip_nonfinite``: this many steps skipped in a row end the run (DivergenceError), since then every batch
    #: overflows: the weights, not a rare batch (a batch is kept ``resample_every`` steps, each of them skipped)
    skip_limit: int = added_setting(100)
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
        self._check_finite()
        require_int(self, "steps", self.steps, 1)
        require_int(self, "skip_limit", self.skip_limit, 1)
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
        self._check_clip_rules()
        require(self, "projection", self.projection in PROJECTIONS, f"one of {PROJECTIONS}")
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

    def _check_finite(self) -> None:
        """Refuse an infinity or NaN where a finite number is meant (``lr=1e400`` reads as inf), before the range
        checks: one ConfigError naming the field."""
        for name in ("lr", "eps", "weight_decay", "momentum", "step_gamma", "clip", "clip_eps"):
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                require(self, name, False, "finite" if name not in ("clip", "clip_eps") else "null or finite")
        betas = self.betas
        if isinstance(betas, tuple | list) and any(isinstance(b, float) and not math.isfinite(b) for b in betas):
            require(self, "betas", False, "two finite floats in [0, 1)")

    def _check_clip_rules(self) -> None:
        th = self.clip_thresholds
        if th is not None:
            ok = isinstance(th, tuple | list) and bool(th) and all(_positive(t) for t in th)
            require(self, "clip_thresholds", ok, "null or a non-empty tuple of floats > 0, one per clip group")
            object.__setattr__(self, "clip_thresholds", tuple(float(t) for t in th))
            require(self, "clip_mode", self.clip_mode == "per_group", "'per_group' when clip_thresholds is set")
            require(self, "clip", self.clip is None, "null when clip_thresholds is set (the thresholds are the clip)")
        eps = self.clip_eps
        require(self, "clip_eps", eps is None or (_real(eps) and eps >= 0), "null or a float >= 0")
        require(self, "clip_masked", isinstance(self.clip_masked, bool), "a bool")
        clipping = self.clip is not None or th is not None
        require(self, "clip_masked", self.clip_masked or clipping, "true when no clip is set (nothing to clip)")

    @property
    def clipping(self) -> bool:
        """Whether gradients are clipped (``clip`` or ``clip_thresholds`` set)."""
        return self.clip is not None or self.clip_thresholds is not None


def _real(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: object) -> bool:
    return isinstance(v, int | float) and _real(v) and v > 0
