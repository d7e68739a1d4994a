"""The training protocols of the Cheng et al. 2024 cards: the paper's (App. H.1, with our choices where it is
silent) and the authors' own loop (``run_exp`` of their run-exp.ipynb: its optimiser, per-layer clipping and
re-masking), with the masked full-matrix model that loop trains."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from torch import Tensor

from iclab.core.errors import require
from iclab.models.kernel_attention import KernelTransformer, KernelTransformerConfig
from iclab.training import TrainConfig


def paper_train(**changes: Any) -> TrainConfig:
    """App. H.1's trainer ("Adam with gradient clipping", batch 30 000 resampled every 10 steps); the paper
    leaves the rest open and the values are our choices (docs/papers/cheng2024.md). A deep all-linear model is a
    polynomial of degree 3^L in its prompt: a rare prompt can overflow the float32 loss (|ŷ| ≈ 3e23 on one of
    30 000 at L = 7, Fig. 4), and the steps on that batch are skipped and counted (``skip_nonfinite``, docs/errata.md)."""
    base = TrainConfig(
        steps=3000,  # "after convergence" (H.1); not measured at the paper batch here
        batch_size=30_000,
        resample_every=10,
        optimizer="adam",
        lr=0.01,
        betas=(0.9, 0.999),
        schedule="cosine",
        clip=1.0,
        clip_mode="per_matrix",
        eval_every=100,
        eval_batch=4096,
        snapshot_every=0,
        dtype="float32",
        skip_nonfinite=True,
    )
    return dataclasses.replace(base, **changes)


#: Cheng et al.'s per-layer clip thresholds, layer i clipped to 10⁻⁸/(9 − i)² (their ``clip_and_step`` with
#: ``clip_r = 1e-8``, as ``run_exp`` calls it for t <= 8000), for models of up to 8 layers.
AUTHORS_CLIP = tuple(1e-8 / (8 - i + 1) ** 2 for i in range(8))


def authors_train(base: TrainConfig | None = None, **changes: Any) -> TrainConfig:
    """``base`` (default: :func:`paper_train`) with the authors' optimiser, clipping and re-masking (``run_exp``):
    AdamW with betas (0.9, 0.9), lr 0.1, no weight decay, constant lr; layer i's whole gradient (the masked entries
    included) clipped to :data:`AUTHORS_CLIP` [i] by c/‖g‖ (no ε); the masked entries re-zeroed after every step
    (``zero_row_col``), so the first step sees the initial matrices as drawn; no step is skipped. Train :class:`MaskedKernelTransformer`
    with it. Not expressed: their clip_r rises to 1e-7 after step 8000."""
    authors = dict(
        optimizer="adamw",
        lr=0.1,
        betas=(0.9, 0.9),
        eps=1e-8,
        weight_decay=0.0,
        schedule="constant",
        warmup_steps=0,
        clip=None,
        clip_mode="per_group",
        clip_thresholds=AUTHORS_CLIP,
        clip_eps=0.0,
        clip_masked=True,
        projection="after_step",
        skip_nonfinite=False,  # their loop steps on whatever the gradient is: a non-finite one ends the run here
    )
    return dataclasses.replace(base or paper_train(), **{**authors, **changes})


class MaskedKernelTransformer(KernelTransformer):
    """The authors' parameterisation of the model (their ``Transformer_F``): V, Q, K free (D × D) per layer and
    head, every entry drawn N(0, init_std²), with the entries Asm. 2.1 and 4.4 hold at zero masked: V's blocks
    V_{D,1:d} and V_{1:d,D} (all of V but V_{D,D} for ``pattern='label'``, A ≡ 0), Q's and K's label row and column
    (their ``param_mask``). :meth:`projection_masks` gives the trainer these masks
    (``TrainConfig.projection='after_step'`` re-zeroes them after every step, as their ``zero_row_col``); their
    gradients are computed and count in the clip norms, as in the authors' loop. Between steps the model is
    :class:`~iclab.models.KernelTransformer` with V = [[A, 0], [0, r]] and B, C blocks. ``config.value`` and
    ``config.qk`` must be ``'full'``."""

    def __init__(
        self,
        config: KernelTransformerConfig | None = None,
        *,
        pattern: Literal["sparse", "label"] = "sparse",
        generator: torch.Generator | None = None,
    ) -> None:
        config = config or KernelTransformerConfig(value="full", qk="full")
        owner = "MaskedKernelTransformer"
        require(owner, "config.value", config.value == "full", "'full' (the masks hold the pattern)", config.value)
        require(owner, "config.qk", config.qk == "full", "'full' (the masks hold the pattern)", config.qk)
        require(owner, "pattern", pattern in ("sparse", "label"), "'sparse' or 'label'", pattern)
        super().__init__(config, generator=generator)
        self.pattern = pattern

    def projection_masks(self) -> dict[str, Tensor]:
        """{parameter name: bool mask (H, D, D), True where the entry is held at zero}."""
        d, D, H = self.config.d, self.config.d + 1, self.config.n_heads
        label = torch.zeros(D, D, dtype=torch.bool)
        label[-1, :] = label[:, -1] = True  # Q's, K's label row and column
        if self.pattern == "label":
            value = torch.ones(D, D, dtype=torch.bool)
            value[-1, -1] = False  # only r = V_{D,D} is free
        else:
            value = torch.zeros(D, D, dtype=torch.bool)
            value[-1, :d] = value[:d, -1] = True
        device = next(self.parameters()).device
        per = {"V_free": value, "Q_free": label, "K_free": label}
        return {
            f"layers.{i}.{name}": m.to(device).expand(H, D, D).clone()
            for i in range(len(self.layers))
            for name, m in per.items()
        }
