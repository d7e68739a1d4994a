"""The run shared by Figs 1 and 9: ATTN_M (eq. M) and the two-layer linear MLP on the cubic feature z = vec(βx_qᵀ)
(eq. 6-7), trained by full-batch GD on the same P sequences from the same (mapped) init. With
``dynamics='all_blocks'`` ATTN_M trains every block (u_i and the vector v_i start at zero and move, App. G) while
the MLP stays the reduced model on z."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.experiments.zhang2025._setup import F64, Setup, covariance, finite, full_batch, odd_moment_ratio, sgd
from iclab.models.reduced_attention import MergedAttention
from iclab.tasks.linear_regression import LinearRegression
from iclab.theory import attention_dynamics as ad
from iclab.training import ModelSpec, TrainConfig, TrainingRun

#: Figs 1 and 9 share these presets (and so one run per preset).
SMOKE: dict[str, object] = dict(steps=40, train_size=200, lr=0.1, w_init=1e-2, eval_every=2)
QUICK: dict[str, object] = dict(steps=1500, train_size=5000, lr=0.1, w_init=1e-3, eval_every=5)
INIT_KEY = ("init", "merged")


@dataclass(frozen=True, kw_only=True)
class MergedSetup(Setup):
    seeds: int = 1
    n_heads: int = 8
    w_init: float = 1.6e-5  # the code's --init 1e-6 per entry, ×√N, ×√H (eq. 34)
    train_size: int = 5000
    train: TrainConfig = field(default_factory=lambda: sgd(lr=0.031, steps=6001))  # the code's lr 1e-3, ×N


@dataclass
class MergedResults:
    Lambda: Tensor
    time: Tensor  # (T,)
    loss: Tensor  # (T,) population loss of the ATTN_M iterates
    train_loss: Tensor  # (T,)
    mlp_train_loss: Tensor  # (T,)
    v: Tensor  # (T, H)
    U: Tensor  # (T, H, d, d)
    mlp_W1: Tensor  # (T, H, d²)
    blocks: dict[str, Tensor] = field(default_factory=dict)  # dynamics='all_blocks': u (T, H, d), v_vec (T, H, d)
    odd_ratio: float = 0.0  # ε of the training set (:func:`odd_moment_ratio`), 0 for the reduced route


def run_merged(cfg: MergedSetup, ctx: RunContext) -> MergedResults:
    """ATTN_M and the MLP on z = vec(βx_qᵀ), full-batch GD on the same data from the same (mapped) init."""
    Lam = covariance(cfg)
    kw = dict(d=cfg.d, n_heads=cfg.n_heads, w_init=cfg.w_init)
    init_model = cast(
        MergedAttention,
        ModelSpec(MergedAttention, kwargs=kw, dtype="float64").build(generator(derive_seed(0, *INIT_KEY))),
    )
    mlp = init_model.mlp()  # w_2 = v, W_1[i] = vec(U_i)ᵀ (eq. 6-7)
    # all blocks: the same draws of v, U (the blocks come after them, at zero)
    spec = ModelSpec(MergedAttention, kwargs=kw | (dict(all_blocks=True) if cfg.all_blocks else {}), dtype="float64")
    task = LinearRegression(d=cfg.d, covariance=Lam)
    ep = task.sample(cfg.train_size, cfg.n, generator=generator(derive_seed(0, "train", "merged")), dtype=F64)
    train = full_batch(cfg.train, cfg.train_size)
    attn, net = ctx.execute(
        [
            TrainingRun(
                name="attention", model=spec, task=ep, train=train, init_key=INIT_KEY, regime="full_batch", Lambda=Lam
            ),
            TrainingRun(name="mlp", model=mlp, task=ep, train=train, regime="full_batch"),
        ]
    )
    tr, tr_mlp = attn.trajectory, net.trajectory
    assert tr is not None and tr_mlp is not None and tr.train_loss is not None and tr_mlp.train_loss is not None
    return MergedResults(
        Lambda=Lam,
        time=tr.time,
        loss=tr.loss,
        train_loss=tr.train_loss,
        mlp_train_loss=tr_mlp.train_loss,
        v=tr.params["v"],
        U=tr.params["U"],
        mlp_W1=tr_mlp.params["W1"],
        blocks={k: tr.params[k] for k in ("u", "v_vec") if k in tr.params},
        odd_ratio=odd_moment_ratio(ep) if cfg.all_blocks else 0.0,
    )


def merged_drop_time(results: MergedResults, cfg: Setup) -> float:
    """Time the ATTN_M loss crosses (L(M_0) + L(M_D))/2."""
    levels = ad.plateau_losses(results.Lambda, 1 / cfg.n)
    return float(ad.crossing_times(results.time, results.loss, (levels[:1] + levels[-1:]) / 2)[0])


def snapshots(results: MergedResults, cfg: Setup) -> tuple[int, int]:
    """Record indices of the plateau (0.6·t_drop) and of the end."""
    t_drop = merged_drop_time(results, cfg)
    t = results.time
    i_plateau = int(torch.searchsorted(t, torch.tensor(0.6 * finite(t_drop, float(t[-1])), dtype=F64)))
    return min(i_plateau, t.numel() - 1), t.numel() - 1
