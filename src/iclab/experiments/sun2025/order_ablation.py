"""Sun et al. 2025, Sec. 2.2 remark (spec 003 claim 20; not an experiment of the paper): the paper's blocks run
[bilinear FFN → LSA], the usual transformer order is [LSA → FFN]; the remark says the order does not matter much. The
same FFN and LSA layers in either order, L ∈ {2, 4} blocks, quadratic ICL at d = 3, d̄ = 12 and Fig. 1's training.

    iclab run sun2025.order_ablation --preset quick

Claims, one pair per L in ``blocks``, named here for L = 2 (also ``_L4`` at paper):

- orders_comparable_L2: larger / smaller mean loss of the two orders at n_train <= ``tol.ratio_tol`` (claim 20).
- both_orders_below_linear_floor_L2: max over orders and seeds of (loss + ``floor_sigmas``·σ) <= the Prop. 1 floor
  d(d+3)/2 (claims 9, 20).

Time on the 2-core CPU: quick 23 s (L = 2, n = 50, 700 steps). paper: not run here (2 orders × 2 depths × 5 seeds ×
20 000 steps × 4000 prompts; hours on a GPU).

Did not match: the FFN never writes the label row, so the last FFN of an attention-first stack cannot reach the
read-out (at equal L it has L − 1 useful FFNs): "comparable" needs a tolerance even if the remark is right. At quick
L = 4 diverges at lr 1e-2, and at L = 3 the ffn-first model hits outlier prompts (ratio 21.7): that is the
instability, not evidence about the order. See docs/papers/sun2025.md ("`sun2025.order_ablation`", "Stability").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.experiments.sun2025._setup import (
    QUICK,
    SMOKE,
    BilinearSetup,
    ModelRow,
    affine_stats,
    at,
    length_panel,
    mean_at,
    model_base,
    model_curves,
    require_choices,
    require_ints,
    run_models,
)
from iclab.models.bilinear import ORDERS, BilinearTransformerConfig
from iclab.plotting import band, save, subplots


@dataclass(frozen=True, kw_only=True)
class OrderAblationTolerances:
    ratio_tol: float = 1.5  # comparable: the larger mean loss is at most this times the smaller


@dataclass(frozen=True, kw_only=True)
class OrderAblationConfig(BilinearSetup):
    blocks: tuple[int, ...] = (2, 4)
    orders: tuple[str, ...] = ("ffn_first", "attention_first")
    floor_sigmas: float = 3.0  # the floor claim's statistic: loss + this many Monte-Carlo standard errors
    tol: OrderAblationTolerances = field(default_factory=OrderAblationTolerances)

    def __post_init__(self) -> None:
        require_ints(self, "blocks", self.blocks, 1)
        require_choices(self, "orders", self.orders, ORDERS)
        super().__post_init__()


@dataclass
class OrderAblationResults:
    rows: list[ModelRow]  # every (order, L, seed); model label "{order}-L{L}"
    floor: float  # Prop. 1's affine floor d(d+3)/2


def split_label(label: str) -> tuple[str, int]:
    """'ffn_first-L2' -> ('ffn_first', 2)."""
    order, L = label.rsplit("-L", 1)
    return order, int(L)


def run(cfg: OrderAblationConfig, ctx: RunContext) -> OrderAblationResults:
    base = model_base(cfg, cfg.d)
    models = {f"{o}-L{L}": BilinearTransformerConfig(**base, n_blocks=L, order=o) for L in cfg.blocks for o in cfg.orders}  # fmt: skip
    return OrderAblationResults(rows=run_models(cfg, ctx, models, cfg.d), floor=affine_stats(cfg).floor)


def _rows(rows: list[ModelRow], order: str | None = None, L: int | None = None) -> list[ModelRow]:
    return [r for r in rows if (order is None or split_label(r.model)[0] == order) and (L is None or split_label(r.model)[1] == L)]  # fmt: skip


def plot(results: OrderAblationResults, cfg: OrderAblationConfig, out: Path) -> list[Path]:
    rows = results.rows
    fig, axes = subplots(1, 3)
    ax = axes[0, 0]
    for o in cfg.orders:
        ys = torch.tensor([[at(cfg, r, cfg.n)[0] for L in cfg.blocks for r in _rows(rows, o, L) if r.seed == s] for s in range(cfg.seeds)])  # fmt: skip
        band(ax, list(cfg.blocks), ys, label=o, marker="o", ms=4)
    ax.axhline(results.floor, ls="--", color="gray", lw=0.8, label="linear-TF floor (Prop. 1)")
    ax.set_yscale("log")
    ax.set_xticks(list(cfg.blocks))
    ax.set_xlabel("blocks L (2L layers)")
    ax.set_ylabel(f"ICL test loss at n = {cfg.n}")
    ax.set_title(f"block order, d = {cfg.d}, d̄ = {cfg.d_bar}")
    ax.legend(fontsize=7)
    length_panel(axes[0, 1], cfg, rows, "loss vs test length", results.floor)
    model_curves(axes[0, 2], rows, "training curves")
    return [save(fig, out / "order_ablation.png")]


def claims(results: OrderAblationResults, cfg: OrderAblationConfig) -> list[ClaimResult]:
    rows, floor, k = results.rows, results.floor, cfg.floor_sigmas
    out = []
    for L in cfg.blocks:
        means = {o: mean_at(_rows(rows, o, L), cfg, cfg.n) for o in cfg.orders}
        ratio = max(means.values()) / min(means.values())
        out.append(check(f"orders_comparable_L{L}", ratio, hi=cfg.tol.ratio_tol, detail=f"larger / smaller mean loss at n = {cfg.n}: {({o: round(m, 4) for o, m in means.items()})} (claim 20; the attention-first model's last FFN cannot reach the read-out, so it has L − 1 useful FFNs)"))  # fmt: skip
        worst = max(at(cfg, r, cfg.n)[0] + k * at(cfg, r, cfg.n)[1] for r in _rows(rows, L=L))
        out.append(check(f"both_orders_below_linear_floor_L{L}", worst, hi=floor, detail=f"max over orders, seeds of (loss + {k:g}σ) vs the Prop. 1 floor d(d+3)/2 (claims 9, 20)"))  # fmt: skip
    return out


ORDER_ABLATION = register(
    Experiment(
        name="sun2025.order_ablation",
        title="Sec. 2.2 remark: [FFN → LSA] blocks (the paper's) vs [LSA → FFN] (the usual order) at equal depth",
        config=OrderAblationConfig,
        presets={
            # floor_sigmas = 0 only keeps the smoke value of both_orders_below_linear_floor_L2 (not checked at smoke)
            "smoke": dict(**SMOKE, d=2, d_bar=7, blocks=(2,), test_ns=(10, 20), floor_sigmas=0.0),
            "quick": dict(**QUICK, blocks=(2,), test_ns=(25, 50, 100)),
            "paper": dict(),
        },
        run=run,
        plot=plot,
        claims=claims,
        description="Quadratic ICL, d = 3, d̄ = 12, Fig. 1's training settings; the same bilinear FFN and LSA layers in either order (label row masked in the FFN either way). Not an experiment of the paper (spec §5.1, claim 20).",
        smoke_unchecked={
            "both_orders_below_linear_floor_L2": "6 training steps: both at their initial loss",
        },
    )
)
