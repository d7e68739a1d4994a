"""Fig. 1 of Cheng, Chen, Sra 2024: log test ICL loss against the number of demonstrations n for a 3-layer
transformer, every attention activation h̃ ∈ {linear, relu, exp, softmax} on every K-GP (K ∈ {linear, relu,
exp}), with the Bayes predictor (eq. 13) on the same test prompts as the floor. §3.3's Observation 1
("ignoring h̃^softmax, the best prediction error is achieved when h̃ matches K") and Observation 2 (softmax
beats exp on K^exp data once n is not tiny).

Run: ``iclab run cheng2024.fig1 --preset quick``

Claims:
- matched_htilde_best_on_linear: fraction of n where h̃ = linear has the lowest loss on K^linear among the
  non-softmax h̃ (Observation 1) >= tol.matched_frac
- matched_htilde_best_on_relu: the same on K^relu
- softmax_beats_exp_on_exp: fraction of n >= 6 where loss(softmax) < loss(exp) on K^exp (Observation 2)
  >= tol.softmax_frac
- no_model_beats_bayes: min over models of the paired (loss − Bayes)/s.e. >= tol.bayes_z_min (−3)
- bayes_risk_matches_reference: the test sets' mean posterior variance within tol.bayes_rtol of spec 000 §6.0

Time on the 2-core CPU: quick (1 seed, n ∈ {6, 14}, 200 steps of 1000 prompts; 24 models) 70-120 s;
paper (3 seeds, n = 2..14, 3000 steps of 30 000 prompts; 252 models): 11.4 core-hours probed (session 14), the
longest model 7 min, so ≈ 4 h with ``--workers 2`` or ≈ 1 h on 8 Ray workers. A reduced run (1 seed, n ∈ {6, 14},
1000 steps) gives 4/5 in 7 min (session 14; docs/papers/cheng2024.md).

What did not match (docs/papers/cheng2024.md): quick losses are not converged (relu on K^relu 0.39 at n = 14
vs the A ≡ 0-family optimum 0.32), so quick judges the orderings at ≥ 0.5 of the grid; exp heads train at
``exp_lr`` = 0.01 (they diverge at quick's 0.05), a confound for the softmax-vs-exp ordering, a ≈ 4% effect. At
the paper's budget (3 seeds, 3000 steps) exp beats softmax at n = 6 in every seed (1.18 vs 1.25; the A ≡ 0 family
ties there); at n = 8-12 the two are within 1.2 %, the sign changing by seed: Observation 2 holds clearly at n = 14
only, a finding (docs/errata.md, seed 000).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from iclab.experiments.cheng2024._setup import (
    ATTENTIONS,
    KERNEL_NAMES,
    QUICK,
    SMOKE,
    UNTRAINED,
    GPSetup,
    ModelRow,
    bayes_matches_reference,
    loss_panel,
    matched_best,
    mean,
    model_job,
    no_model_beats_bayes,
    require_ints,
    require_names,
    train_and_measure,
)
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.plotting import save, subplots


@dataclass(frozen=True, kw_only=True)
class Fig1Tolerances:
    bayes_rtol: float = 0.05  # Bayes risk of the test sets vs spec 000 §6.0 (MC ±1%)
    matched_frac: float = 1.0  # fraction of n where the matched h̃ wins (spec claim 13)
    softmax_frac: float = 1.0  # fraction of n >= 6 where softmax beats exp on K^exp (spec claim 14)
    bayes_z_min: float = -3.0  # no model beats Bayes by more than 3 paired standard errors


@dataclass(frozen=True, kw_only=True)
class Fig1Config(GPSetup):
    kernels: tuple[str, ...] = KERNEL_NAMES
    attentions: tuple[str, ...] = ATTENTIONS
    ns: tuple[int, ...] = (2, 4, 6, 8, 10, 12, 14)  # 1(a,b) stop at 12; 1(c) reaches 14 (Observation 2)
    tol: Fig1Tolerances = field(default_factory=Fig1Tolerances)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_names(self, "kernels", self.kernels, KERNEL_NAMES)
        require_names(self, "attentions", self.attentions, ATTENTIONS)
        require_ints(self, "ns", self.ns)


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
            ns = cfg.ns
            frac, wins = matched_best(rows, k, "n", ns, rivals)
            out.append(
                check(
                    f"matched_htilde_best_on_{k}",
                    frac,
                    lo=cfg.tol.matched_frac,
                    detail=f"fraction of n {list(ns)} where h̃ = {k} has the lowest loss among {list(rivals)} (Observation 1); wins {wins}",
                )
            )
    if "exp" in cfg.kernels and {"exp", "softmax"} <= set(cfg.attentions):
        ns = [n for n in cfg.ns if n >= 6]
        if ns:
            wins = [
                mean(rows, kernel="exp", attention="softmax", n=n) < mean(rows, kernel="exp", attention="exp", n=n)
                for n in ns
            ]
            out.append(
                check(
                    "softmax_beats_exp_on_exp",
                    sum(wins) / len(wins),
                    lo=cfg.tol.softmax_frac,
                    detail=f"fraction of n in {ns} with loss(softmax) < loss(exp) on K^exp, L = {cfg.n_layers} (Observation 2); wins {wins}",
                )
            )
    out.append(no_model_beats_bayes(rows, cfg.tol.bayes_z_min))
    ref = bayes_matches_reference(rows, cfg, cfg.tol.bayes_rtol)
    if ref is not None:
        out.append(ref)
    return out


FIG1 = register(
    Experiment(
        name="cheng2024.fig1",
        title="Fig. 1: log test loss vs n for a 3-layer transformer, every activation h̃ on every K-GP",
        config=Fig1Config,
        presets={
            "smoke": dict(SMOKE, ns=(6,), kernels=("exp",)),
            # 200 steps (cost): the claims' margins are wide; losses vs 250 steps in docs/papers/cheng2024.md
            "quick": dict(QUICK, steps=200, ns=(6, 14), bayes_rtol=0.1, matched_frac=0.5, softmax_frac=0.5),
            "paper": dict(),
        },
        run=run,
        plot=plot,
        claims=claims,
        description="d=5, x = Σ^{1/2}ξ, ξ on the sphere, labels ~ N(0, K₊(ξ)); L=3, A free; dashed: Bayes (eq. 13) on the same test prompts.",
        smoke_unchecked={"softmax_beats_exp_on_exp": UNTRAINED},
    )
)
