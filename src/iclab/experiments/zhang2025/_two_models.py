"""The run and claims shared by Figs 7 and 8: ATTN_M (one drop) and ATTN_S of rank one (a staircase at eq. 19 or 26)
trained on the same data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from iclab.experiments.registry import ClaimResult, RunContext, check
from iclab.experiments.zhang2025._setup import Curves, Setup, covariance, loss_panel, reduced_spec, train_batched
from iclab.models.reduced_attention import MergedAttention, SeparateAttention
from iclab.plotting import save, subplots
from iclab.theory import attention_dynamics as ad


@dataclass(frozen=True, kw_only=True)
class TwoModelTolerances:
    level_atol: float = 0.01  # ATTN_S plateaus vs eq. (19)/(26)
    slope_tol: float = 1e-4  # |dL/dt|·τ below which the slowest point of a segment is a plateau
    final_rtol: float = 0.05  # ATTN_M's final loss vs L(M_D)


@dataclass(frozen=True, kw_only=True)
class TwoModelConfig(Setup):
    """ATTN_M and ATTN_S rank one on the same data; ``train`` trains ATTN_S, ATTN_M takes ``merged_lr`` and
    ``merged_steps`` instead of its lr and steps."""

    merged_heads: int = 8
    merged_w_init: float = 1e-3
    merged_lr: float = 0.05
    merged_steps: int = 4000
    next_token: bool = False
    tol: TwoModelTolerances = field(default_factory=TwoModelTolerances)


@dataclass
class TwoModelResults:
    Lambda: Tensor
    inv_n: float  # 1/N, or E(1/N) for the next-token loss
    levels: Tensor  # L(M_0..M_D), eq. (19) or (26)
    merged: Curves
    separate: Curves


def run_two_models(cfg: TwoModelConfig, ctx: RunContext) -> TwoModelResults:
    Lam = covariance(cfg)
    inv_n = ad.expected_inv_n(cfg.n) if cfg.next_token else 1.0 / cfg.n
    m = reduced_spec(MergedAttention, cfg, n_heads=cfg.merged_heads, w_init=cfg.merged_w_init)
    s = reduced_spec(SeparateAttention, cfg, n_heads=cfg.n_heads, w_init=cfg.w_init)
    levels = ad.plateau_losses(Lam, inv_n)
    merged_train = dataclasses.replace(cfg.train, lr=cfg.merged_lr, steps=cfg.merged_steps)
    stop, nt = float(levels[-1]), cfg.next_token
    rm = train_batched(
        ctx,
        cfg,
        m,
        Lam,
        name="merged",
        tag="M",
        train=merged_train,
        init_key=("init", "M"),
        next_token=nt,
        stop_at=stop,
    )
    rs = train_batched(
        ctx, cfg, s, Lam, name="separate", tag="S", train=cfg.train, init_key=("init", "S"), next_token=nt, stop_at=stop
    )
    return TwoModelResults(
        Lambda=Lam,
        inv_n=inv_n,
        levels=levels,
        merged=Curves(time=rm.time, loss=rm.loss, train_loss=rm.train_loss, params={}),
        separate=Curves(time=rs.time, loss=rs.loss, train_loss=rs.train_loss, params={}),
    )


def _curve(r: Curves) -> Tensor:
    """The curve the paper plots: the training loss for finite P, the population loss otherwise."""
    return r.train_loss if r.train_loss is not None else r.loss


def plot_two_models(results: TwoModelResults, cfg: TwoModelConfig, out: Path, name: str) -> list[Path]:
    fig, axes = subplots(1, 2)
    lv = results.levels
    eq = "(26)" if cfg.next_token else "(19)"
    loss_panel(
        axes[0, 0],
        results.merged.time,
        _curve(results.merged),
        lv[[0, -1]],
        f"linear ATTN_M (H={cfg.merged_heads}), dashed: eq. {eq}",
    )
    loss_panel(
        axes[0, 1],
        results.separate.time,
        _curve(results.separate),
        lv,
        f"linear ATTN_S (H={cfg.n_heads}, R=1), dashed: eq. {eq}",
    )
    return [save(fig, out / f"{name}.png")]


def two_model_claims(results: TwoModelResults, cfg: TwoModelConfig) -> tuple[list[ClaimResult], Tensor, Tensor]:
    """The claims of Figs 7 and 8, the ATTN_S plateau values (S, D+1) and which of them are plateaus."""
    lv, tol = results.levels, cfg.tol
    rm, rs = results.merged, results.separate
    cm, cs = rm.loss, rs.loss  # population loss of the iterates: no sampling noise in the evaluation
    drops_m = [ad.count_drops(rm.time, cm[i]) for i in range(cm.shape[0])]
    val_list, slope_list = zip(*(ad.plateau_values(rs.time, cs[i], lv) for i in range(cs.shape[0])), strict=True)
    vals, slopes = torch.stack(val_list), torch.stack(slope_list)
    ok = slopes <= tol.slope_tol
    err = float((vals - lv).abs()[ok].max()) if ok.any() else 1e9
    out = [
        check(
            "merged_one_drop",
            max(drops_m),
            expected=1,
            atol=0,
            detail=f"abrupt drops of each ATTN_M seed's loss: {drops_m}",
        ),
        check(
            "merged_final_loss",
            float(cm[:, -1].mean()),
            expected=float(lv[-1]),
            rtol=tol.final_rtol,
            detail="mean final ATTN_M loss vs L(M_D)",
            smoke="50 steps: ATTN_M is still on its plateau at tr Λ = 1",
        ),
        check(
            "separate_plateau_levels",
            err,
            hi=tol.level_atol,
            detail=f"max |L − L(M_m)| over the {int(ok.sum())}/{ok.numel()} (seed, m) segments with a plateau (slope ≤ "
            f"{tol.slope_tol:g}/τ); L = population loss of the weights trained on P sequences (the training loss "
            "carries an O(1/√P) offset from E_P y_q² ≠ tr Λ)",
            smoke="100 steps: no ATTN_S plateau is detected yet (measured 1e9, the no-plateau value)",
        ),
        check(
            "separate_several_drops",
            int(
                torch.isfinite(torch.stack([ad.drop_times(rs.time, cs[i], lv) for i in range(cs.shape[0])]))
                .sum(-1)
                .min()
            ),
            lo=2,
            detail="min over seeds of the number of drops L(M_{m−1}) → L(M_m) completed",
            smoke="100 steps: ATTN_S has not dropped yet",
        ),
    ]
    return out, vals, ok
