"""Optimisers, learning-rate schedules and gradient clipping for the trainer."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from iclab.training.config import TrainConfig


def make_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.LBFGS(
        params,
        lr=cfg.lr,
        history_size=cfg.lbfgs_history,
        max_iter=cfg.lbfgs_max_iter,
        line_search_fn=cfg.lbfgs_line_search,
    )


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of ``cfg.lr`` at ``step`` (0-based): linear warm-up, then the schedule.

    'step' halves (× step_gamma) every ``step_every`` steps as the authors' notebooks do
    (Ahn et al. 2023 code: lr × 0.5 at t % 2000 == 0, t > 0).
    """
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    t = step - cfg.warmup_steps
    if cfg.schedule == "step":
        return cfg.step_gamma ** (t // cfg.step_every)
    if cfg.schedule == "cosine":
        total = max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(t, total) / total))
    return 1.0


@torch.no_grad()
def clip_gradients(params: Iterable[nn.Parameter], max_norm: float, mode: str) -> None:
    """Clip gradients to norm ``max_norm``.

    ``per_matrix``: every (·, ·) block over a parameter's last two axes is clipped on its own
    (the authors' ``clip_and_step``: each [layer, head, P/Q] d×d block); vectors and scalars are
    clipped as one block. ``global``: one norm over all gradients (``clip_grad_norm_``).
    Parameters flagged ``ensemble_axis`` (an :class:`~iclab.training.ensemble.Ensemble`'s stacked
    weights) keep axis 0 as the member: the blocks are those of each member alone.
    """
    with_grad = [p for p in params if p.grad is not None]
    if mode == "global":
        torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        return
    for p in with_grad:
        g = p.grad
        assert g is not None  # with_grad
        lead = 1 if getattr(p, "ensemble_axis", False) else 0
        if g.dim() - lead >= 2:
            norms = torch.linalg.matrix_norm(g, keepdim=True)  # (..., 1, 1)
        else:  # a vector or scalar (per member): one block
            norms = g.norm(dim=tuple(range(lead, g.dim())), keepdim=True) if g.dim() > lead else g.abs()
        g.mul_((max_norm / norms.clamp_min(1e-30)).clamp(max=1.0))
