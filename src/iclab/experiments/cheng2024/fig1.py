"""Fig. 1 of Cheng, Chen, Sra 2024: log test ICL loss against the number of demonstrations n for a 3-layer
transformer (A free), every attention activation h̃ ∈ {linear, relu, exp, softmax} on every K-GP (K ∈ {linear,
relu, exp}; d = 5, x = Σ^{1/2}ξ), with the Bayes predictor (eq. 13) on the same test prompts as the floor (dashed).
§3.3's Observation 1 ("ignoring h̃^softmax, the best prediction error is achieved when h̃ matches K") and
Observation 2 (softmax beats exp on K^exp data once n is not tiny).

Run: ``iclab run cheng2024.fig1 --preset quick``

Claims:
- matched_htilde_best_on_linear: fraction of n where h̃ = linear has the lowest loss on K^linear among the
  non-softmax h̃ (Observation 1) >= tol.matched_frac
- matched_htilde_best_on_relu: the same on K^relu
- softmax_beats_exp_on_exp: fraction of n >= 6 where loss(softmax) < loss(exp) on K^exp (Observation 2)
  >= tol.softmax_frac
- no_model_beats_bayes: min over models of the paired (loss − Bayes)/s.e. >= tol.bayes_z_min (−3)
- bayes_risk_matches_reference: the test sets' mean posterior variance within tol.bayes_rtol of an independent
  Monte-Carlo estimate of the Bayes risk (±1 %)

Time on 2 CPU cores: quick 70-120 s (1 seed, n ∈ {6, 14}, 200 steps of 1000 prompts; 24 models); paper 3.9
core-hours projected (3 seeds, n = 2..14, 3000 steps of 30 000 prompts; 252 models), 2.2 h measured with
``--workers 2`` (4/5), ≈ 30 min on 8 Ray workers.

What did not match: quick losses are not converged (relu on K^relu 0.39 at n = 14 vs the A ≡ 0 family's 0.32), so
quick judges the orderings at ≥ 0.5 of the grid; exp heads train at ``exp_lr`` = 0.01 (they diverge at 0.05). At the
paper's budget exp beats softmax at n = 6 in every seed (1.18 vs 1.25) and the two are within 1.2 % at n = 8-12:
Observation 2 holds clearly at n = 14 only. See docs/papers/cheng2024.md and docs/errata.md (Cheng et al. 2024).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from iclab.experiments.cheng2024._setup import (
    QUICK,
    SMOKE,
    UNTRAINED,
    GridSetup,
    ModelRow,
    bayes_matches_reference,
    loss_panel,
    matched_claim,
    mean,
    model_job,
    no_model_beats_bayes,
    train_and_measure,
)
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.plotting import save, subplots


@dataclass(frozen=True, kw_only=True)
class Fig1Tolerances:
    bayes_rtol: float = 0.05  # Bayes risk of the test sets vs the Monte-Carlo reference (±1%)
    matched_frac: float = 1.0  # fraction of n where the matched h̃ wins (Observation 1)
    softmax_frac: float = 1.0  # fraction of n >= 6 where softmax beats exp on K^exp (Observation 2)
    bayes_z_min: float = -3.0  # no model beats Bayes by more than 3 paired standard errors


@dataclass(frozen=True, kw_only=True)
class Fig1Config(GridSetup):
    tol: Fig1Tolerances = field(default_factory=Fig1Tolerances)


@dataclass
class Fig1Results:
    rows: list[ModelRow]  # one per (K, h̃, n, seed)


def run(cfg: Fig1Config, ctx: RunContext) -> Fig1Results:
    jobs = [
        model_job(cfg, seed=s, kernel=k, activations=(a,), n=n, n_layers=cfg.n_layers, name=f"{k}-{a}-n{n}-s{s}")
        for k in cfg.kernels
        for a in cfg.attentions
        for n in cfg.ns
        for s in range(cfg.seeds)
    ]
    return Fig1Results(rows=train_and_measure(cfg, jobs, ctx))


def plot(results: Fig1Results, cfg: Fig1Config, out: Path) -> list[Path]:
    fig, axes = subplots(1, len(cfg.kernels))
    for i, k in enumerate(cfg.kernels):
        title = f"({'abc'[i % 3]}) K^{k} labels, L = {cfg.n_layers}"
        loss_panel(axes[0, i], results.rows, "n", k, cfg.attentions, title)
    return [save(fig, out / "fig1.png")]


def claims(results: Fig1Results, cfg: Fig1Config) -> list[ClaimResult]:
    rows, out = results.rows, []
    rivals = tuple(a for a in cfg.attentions if a != "softmax")
    for k in ("linear", "relu"):
        if k in cfg.kernels and k in rivals and len(rivals) > 1:
            name, lo = f"matched_htilde_best_on_{k}", cfg.tol.matched_frac
            out.append(matched_claim(name, rows, k, "n", cfg.ns, rivals, lo=lo, why="Observation 1"))
    ns = [n for n in cfg.ns if n >= 6]
    if "exp" in cfg.kernels and {"exp", "softmax"} <= set(cfg.attentions) and ns:
        loss = functools.partial(mean, rows, kernel="exp")  # mean loss on K^exp
        wins = [loss(attention="softmax", n=n) < loss(attention="exp", n=n) for n in ns]
        detail = f"fraction of n in {ns} with loss(softmax) < loss(exp) on K^exp, L = {cfg.n_layers} (Observation 2); wins {wins}"
        frac = sum(wins) / len(wins)
        out.append(check("softmax_beats_exp_on_exp", frac, lo=cfg.tol.softmax_frac, detail=detail, smoke=UNTRAINED))
    bayes = bayes_matches_reference(rows, cfg, cfg.tol.bayes_rtol)
    return [*out, no_model_beats_bayes(rows, cfg.tol.bayes_z_min), *bayes]


# quick: 200 steps (cost), the claims' margins are wide (losses vs 250 steps in docs/papers/cheng2024.md)
CARD = card(
    Fig1Config,
    "Fig. 1: log test loss vs n for a 3-layer transformer, every activation h̃ on every K-GP",
    smoke=dict(SMOKE, ns=(6,), kernels=("exp",)),
    quick=dict(QUICK, steps=200, ns=(6, 14), bayes_rtol=0.1, matched_frac=0.5, softmax_frac=0.5),
)
