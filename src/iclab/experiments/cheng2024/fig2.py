"""Fig. 2 of Cheng, Chen, Sra 2024: log test ICL loss against the number of layers L ∈ 1..8 at n = 14 and
n = 6, on K^relu and K^exp data, for three attention activations (relu, exp, softmax: the paper does not name
its three; A free), with the Bayes predictor (eq. 13) on the same test prompts (dashed). §3.3: the matched h̃ is
best (Observation 1, softmax ignored), the relu model's gap to Bayes does not close with depth (the A ≡ 0 family's
optimum leaves 0.10), and h̃ = exp overtakes softmax on K^exp at n = 6 for deep models (2d).

Run: ``iclab run cheng2024.fig2 --preset quick``

Claims:
- relu_bayes_gap_persists: loss(h̃ relu) − Bayes on K^relu at n = 14 and the deepest L >= tol.relu_gap_min
- matched_relu_best_n14, matched_relu_best_n6 (one per n): fraction of L >= 2 where h̃ = relu is best among
  the non-softmax h̃ on K^relu >= tol.deep_frac
- exp_best_on_exp_at_n6_when_deep: fraction of L >= tol.deep_from where h̃ = exp is best on K^exp at n = 6
  (softmax a rival) >= tol.deep_frac
- no_model_beats_bayes: min over models of the paired (loss − Bayes)/s.e. >= tol.bayes_z_min (−3)

Time on 2 CPU cores: quick 31-63 s (9 models); paper 15.7 core-hours (288 models; those at L ≥ 4 in float64), ≈ 2 h on 8 Ray workers.

What did not match: at quick softmax edges relu (no rival, as the paper says), a one-seed deep relu model can stall,
and the ≈ 3 % n = 6 exp/softmax ordering is left to ``paper`` (docs/papers/cheng2024.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from iclab.core.errors import require_int
from iclab.experiments.cheng2024._setup import (
    QUICK,
    SMOKE,
    UNTRAINED,
    GridSetup,
    ModelRow,
    loss_panel,
    matched_claim,
    mean,
    model_job,
    no_model_beats_bayes,
    require_ints,
    train_and_measure,
)
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.plotting import save, subplots


@dataclass(frozen=True, kw_only=True)
class Fig2Tolerances:
    relu_gap_min: float = 0.05  # the relu-Bayes gap on K^relu at n = 14 stays open (Fig. 2a)
    deep_from: int = 5  # exp best on K^exp at n = 6 for L >= deep_from (Fig. 2d)
    deep_frac: float = 1.0  # fraction of the L grid where the matched h̃ must win
    bayes_z_min: float = -3.0  # no model beats Bayes by more than 3 paired standard errors

    def __post_init__(self) -> None:
        require_int(self, "deep_from", self.deep_from, 1)


@dataclass(frozen=True, kw_only=True)
class Fig2Config(GridSetup):
    kernels: tuple[str, ...] = ("relu", "exp")
    attentions: tuple[str, ...] = ("relu", "exp", "softmax")  # the paper does not say which three
    ns: tuple[int, ...] = (14, 6)
    layers: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    tol: Fig2Tolerances = field(default_factory=Fig2Tolerances)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_ints(self, "layers", self.layers)


@dataclass
class Fig2Results:
    rows: list[ModelRow]  # one per (K, n, h̃, L, seed)


def run(cfg: Fig2Config, ctx: RunContext) -> Fig2Results:
    jobs = [
        model_job(cfg, seed=s, kernel=k, activations=(a,), n=n, n_layers=L, name=f"{k}-{a}-n{n}-L{L}-s{s}")
        for k in cfg.kernels
        for n in cfg.ns
        for a in cfg.attentions
        for L in cfg.layers
        for s in range(cfg.seeds)
    ]
    return Fig2Results(rows=train_and_measure(cfg, jobs, ctx))


def plot(results: Fig2Results, cfg: Fig2Config, out: Path) -> list[Path]:
    fig, axes = subplots(len(cfg.ns), len(cfg.kernels))
    for i, n in enumerate(cfg.ns):
        for j, k in enumerate(cfg.kernels):
            sub = [r for r in results.rows if r.n == n]
            loss_panel(axes[i, j], sub, "L", k, cfg.attentions, f"K^{k} labels, n = {n}")
    return [save(fig, out / "fig2.png")]


def claims(results: Fig2Results, cfg: Fig2Config) -> list[ClaimResult]:
    rows, out, tol, lo = results.rows, [], cfg.tol, cfg.tol.deep_frac
    Lmax = max(cfg.layers)
    if "relu" in cfg.kernels and "relu" in cfg.attentions and 14 in cfg.ns:
        on_relu = functools.partial(mean, rows, kernel="relu", n=14, L=Lmax)  # a mean over the K^relu, n = 14 rows
        gap = on_relu(attention="relu") - on_relu("bayes")
        detail = f"loss(h̃ relu) − Bayes on K^relu, n = 14, L = {Lmax} (Fig. 2a; the A = 0 family's optimum leaves 0.10)"
        out.append(check("relu_bayes_gap_persists", gap, lo=tol.relu_gap_min, detail=detail))
    # Observation 1 is stated "ignoring h̃^softmax" (§3.3: "From Figures 1(a), 1(b), 2(a), 2(c), 2(d)"),
    # so softmax is no rival here, as in Fig. 1's claim.
    rivals = tuple(a for a in cfg.attentions if a != "softmax")
    grid = tuple(L for L in cfg.layers if L >= 2)
    if "relu" in cfg.kernels and "relu" in rivals and len(rivals) > 1 and grid:
        for n in cfg.ns:
            sub, name = [r for r in rows if r.n == n], f"matched_relu_best_n{n}"
            out.append(matched_claim(name, sub, "relu", "L", grid, rivals, lo=lo, why="Observation 1", smoke=UNTRAINED))
    deep = [depth for depth in cfg.layers if depth >= tol.deep_from]
    if "exp" in cfg.kernels and {"exp", "softmax"} <= set(cfg.attentions) and 6 in cfg.ns and deep:
        sub, name = [r for r in rows if r.n == 6], "exp_best_on_exp_at_n6_when_deep"
        out.append(matched_claim(name, sub, "exp", "L", deep, cfg.attentions, lo=lo, why="n = 6, Fig. 2d"))
    return [*out, no_model_beats_bayes(rows, tol.bayes_z_min)]


# quick: the K^relu half at n = 14 (Fig. 2a), L ∈ {1, 3, 5}, 250 steps. exp_lr 0.005: at 0.01 the 5-layer exp model
# on K^relu data diverged in float32 (loss 1e22 by step 90) through every code path (token, fused, C); such models now
# train in float64 (float64_depth, docs/errata.md).
CARD = card(
    Fig2Config,
    "Fig. 2: log test loss vs number of layers (n = 14 and n = 6) on K^relu and K^exp",
    smoke=dict(SMOKE, ns=(6,), layers=(1, 2), kernels=("relu",)),
    quick=dict(QUICK, ns=(14,), layers=(1, 3, 5), kernels=("relu",), relu_gap_min=0.05, deep_frac=0.5, exp_lr=0.005),
)
