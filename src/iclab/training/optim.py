"""Optimisers, learning-rate schedules and gradient clipping for the trainer."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import torch
from torch import Tensor, nn

from iclab.training.config import TrainConfig
from iclab.training.lbfgs import LBFGS


def make_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    params = list(params)
    # foreach: the same element-wise operations in the same order as the per-tensor loop torch runs on a CPU by
    # default (the same bits, tests/test_trainer.py), dispatched once per step instead of once per tensor
    if cfg.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=True
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=True
        )
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return LBFGS(
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
def clip_gradients(
    params: Iterable[nn.Parameter],
    max_norm: float,
    mode: str,
    *,
    eps: float | None = None,
    masks: Mapping[nn.Parameter, Tensor] | None = None,
) -> None:
    """Clip gradients to norm ``max_norm``: each block's gradient g is scaled by min(1, max_norm / ‖g‖).

    ``per_matrix``: every (·, ·) block over a parameter's last two axes is clipped on its own
    (the authors' ``clip_and_step``: each [layer, head, P/Q] d×d block); vectors and scalars are
    clipped as one block. ``global``: one norm over all gradients (``clip_grad_norm_``, whose rule is
    max_norm / (‖g‖ + 1e-6)). ``eps``: the rule max_norm / (‖g‖ + eps) in either mode; None keeps the mode's
    own. ``masks`` ({parameter: bool mask}): the masked entries are left out of the norms (they are scaled
    with their block all the same).
    Parameters flagged ``ensemble_axis`` (an :class:`~iclab.training.ensemble.Ensemble`'s stacked
    weights) keep axis 0 as the member: the blocks are those of each member alone.
    """
    with_grad = [p for p in params if p.grad is not None]
    if eps is not None or masks:
        _clip_with_rule(with_grad, max_norm, mode, 0.0 if eps is None and mode != "global" else eps, masks or {})
        return
    if mode == "global":
        torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        return
    for p in with_grad:
        g = p.grad
        assert g is not None  # with_grad
        g.mul_((max_norm / _block_norms(p, g).clamp_min(1e-30)).clamp(max=1.0))


def _block_norms(p: nn.Parameter, g: Tensor) -> Tensor:
    """The per-matrix norms of ``p``'s gradient ``g``, broadcastable to it: one per (·, ·) block over the last two
    axes, or one for a vector or scalar (per member of an ensemble's ``ensemble_axis``)."""
    lead = 1 if getattr(p, "ensemble_axis", False) else 0
    if g.dim() - lead >= 2:
        norms: Tensor = torch.linalg.matrix_norm(g, keepdim=True)  # (..., 1, 1)
        return norms
    return g.norm(dim=tuple(range(lead, g.dim())), keepdim=True) if g.dim() > lead else g.abs()


def _coefficient(max_norm: float, norm: Tensor, eps: float) -> Tensor:
    """min(1, max_norm / (norm + eps)) elementwise, one IEEE division (``max_norm / t`` would be ``t⁻¹ · max_norm``);
    a zero norm gives 1."""
    return torch.full_like(norm, max_norm).div_(norm + eps).nan_to_num_(nan=1.0).clamp_(max=1.0)


def _clip_with_rule(
    with_grad: list[nn.Parameter], max_norm: float, mode: str, eps: float | None, masks: Mapping[nn.Parameter, Tensor]
) -> None:
    """:func:`clip_gradients` with a stated coefficient rule and/or masked entries left out of the norms."""

    def counted(p: nn.Parameter) -> Tensor:
        g = p.grad
        assert g is not None  # with_grad
        m = masks.get(p)
        return g if m is None else g.masked_fill(m, 0)

    if mode == "global":
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(counted(p)) for p in with_grad]))
        coef = _coefficient(max_norm, total, 1e-6 if eps is None else eps)
        for p in with_grad:
            cast(Tensor, p.grad).mul_(coef)
        return
    assert eps is not None  # clip_gradients passes 0 for the per-matrix rule
    for p in with_grad:
        cast(Tensor, p.grad).mul_(_coefficient(max_norm, _block_norms(p, counted(p)), eps))


@torch.no_grad()
def clip_groups_(
    groups: Sequence[Sequence[nn.Parameter]],
    thresholds: Sequence[float],
    *,
    eps: float = 0.0,
    masks: Mapping[nn.Parameter, Tensor] | None = None,
) -> None:
    """Clip each group's gradients as one vector: group i's are scaled by min(1, thresholds[i] / (‖g_i‖ + eps)).

    ‖g_i‖ is the norm of the group's gradients laid end to end (one parameter: its own norm, as
    ``grad[i].norm()`` in Cheng et al. 2024's ``clip_and_step``, which clips layer i of their stacked
    parameter to 10⁻⁸/(9 − i)²); ``masks`` ({parameter: bool mask}) leave the masked entries out of it.
    """
    masks = masks or {}
    for group, c in zip(groups, thresholds, strict=False):
        grads = [(p, p.grad) for p in group if p.grad is not None]
        if not grads:
            continue
        parts = [g if p not in masks else g.masked_fill(masks[p], 0) for p, g in grads]
        flat = parts[0] if len(parts) == 1 else torch.cat([g.reshape(-1) for g in parts])
        coef = _coefficient(c, torch.linalg.vector_norm(flat), eps)
        for _, g in grads:
            g.mul_(coef)
