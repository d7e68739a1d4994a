"""Thm 1 of Ahn et al. 2023 with Σ = I: one linear-attention layer learns A = n/(n+d+1)·I, one step of GD (eq. 7).

Run: ``iclab run ahn2023.isotropic --preset quick`` (30 s on 2 CPU cores; ``paper`` uses Fig. 1's trainer)

Claims:
- A_is_the_thm1_step: max over seeds of ‖A − n/(n+d+1)·I‖_F / ‖n/(n+d+1)·I‖_F ≤ tol.rel_err (quick: 0.007)
"""

from dataclasses import dataclass, field
from pathlib import Path

from iclab.experiments.ahn2023._setup import ADAM_QUICK, SMOKE, LinearSetup, SeedRun, seed_runs
from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.plotting import heatmap, save, subplots
from iclab.theory.preconditioned_gd import theorem1_isotropic_scale as thm1_step


@dataclass(frozen=True, kw_only=True)
class Tolerances:
    rel_err: float = 0.05


@dataclass(frozen=True, kw_only=True)
class IsotropicConfig(LinearSetup):
    spectrum: tuple[float, ...] = (1.0,) * 5
    n_layers: int = 1
    tol: Tolerances = field(default_factory=Tolerances)


@dataclass
class IsotropicResults:
    runs: list[SeedRun]  # one per seed; run.A is (snapshots, 1 layer, d, d)


def run(cfg: IsotropicConfig, ctx: RunContext) -> IsotropicResults:
    return IsotropicResults(seed_runs(cfg, ctx, pattern="sparse", weight_prior="identity"))


def plot(res: IsotropicResults, cfg: IsotropicConfig, out: Path) -> list[Path]:
    fig, axes = subplots(1, 1)
    heatmap(axes[0, 0], res.runs[0].A[-1, 0], title=f"A, seed 0; Thm 1: {thm1_step(cfg.d, cfg.n):.3f}·I")
    return [save(fig, out / "isotropic.png")]


def claims(res: IsotropicResults, cfg: IsotropicConfig) -> list[ClaimResult]:
    a, d = thm1_step(cfg.d, cfg.n), cfg.d  # ‖A − aI‖_F² = ‖A‖_F² − 2a·tr A + a²d
    err = max(
        float((A.pow(2).sum() - 2 * a * A.trace() + a * a * d).sqrt()) / (a * d**0.5)
        for A in (r.A[-1, 0] for r in res.runs)
    )
    why = "20 training steps: A is still near its initialisation"
    return [check("A_is_the_thm1_step", err, hi=cfg.tol.rel_err, detail="one GD step, Γ⋆ = n/(n+d+1)·I", smoke=why)]


QUICK = dict(ADAM_QUICK, seeds=2, steps=600, batch_size=4000, resample_every=1)
CARD = card(IsotropicConfig, "Thm 1, Σ = I: one layer learns the GD step n/(n+d+1)", smoke=SMOKE, quick=QUICK)
