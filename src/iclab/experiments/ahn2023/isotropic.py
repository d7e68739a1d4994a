"""Thm 1, Σ = I: one linear-attention layer learns A = n/(n+d+1)·I, one GD step (Ahn et al. 2023, eq. 7).
``iclab run ahn2023.isotropic --preset quick``: 30 s on 2 cores (``paper``: Fig. 1's trainer, not run). Claim:
- A_is_the_thm1_step: max over seeds of ‖A − n/(n+d+1)·I‖_F / ‖n/(n+d+1)·I‖_F below 0.05. Matched (0.007)."""

from dataclasses import dataclass, field

from iclab.experiments.ahn2023._setup import SMOKE, LinearSetup, SeedRun, seed_runs
from iclab.experiments.registry import Experiment, check, register
from iclab.plotting import heatmap, save, subplots
from iclab.theory.preconditioned_gd import theorem1_isotropic_scale as thm1_step


# fmt: off
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
    runs: list[SeedRun]  # one per seed; run.A (snapshots, 1 layer, d, d)
def run(cfg: IsotropicConfig, ctx) -> IsotropicResults:
    return IsotropicResults(seed_runs(cfg, ctx, pattern="sparse", weight_prior="identity"))
def plot(res: IsotropicResults, cfg: IsotropicConfig, out):
    fig, axes = subplots(1, 1)
    heatmap(axes[0, 0], res.runs[0].A[-1, 0], title=f"A, seed 0; Thm 1: {thm1_step(cfg.d, cfg.n):.3f}·I")
    return [save(fig, out / "isotropic.png")]
def claims(res: IsotropicResults, cfg: IsotropicConfig):  # ‖A − aI‖² = ‖A‖² − 2a·tr A + a²d
    a, d = thm1_step(cfg.d, cfg.n), cfg.d
    err = max(float((A.pow(2).sum() - 2 * a * A.trace() + a * a * d).sqrt()) / (a * d**0.5) for A in (r.A[-1, 0] for r in res.runs))
    return [check("A_is_the_thm1_step", err, hi=cfg.tol.rel_err, detail="one GD step with Γ⋆ = n/(n+d+1)·I")]

register(Experiment(name="ahn2023.isotropic", title="Thm 1, Σ = I: one layer learns the GD step n/(n+d+1)",
    config=IsotropicConfig, run=run, plot=plot, claims=claims, presets={"smoke": SMOKE, "paper": {}, "quick": dict(
        seeds=2, optimizer="adam", lr=0.05, betas=(0.9, 0.999), schedule="cosine", steps=600, batch_size=4000, resample_every=1)},
    smoke_unchecked={"A_is_the_thm1_step": "20 training steps: A is still near its initialisation"}))
