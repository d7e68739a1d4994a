"""Ahn, Cheng, Daneshmand, Sra 2023, "Transformers learn to implement preconditioned gradient
descent for in-context learning" (NeurIPS 2023).

Run: ``iclab reproduce ahn2023 --preset quick`` (a few minutes on 2 CPU cores) or ``--preset paper``
(the paper's settings: hours on a CPU, minutes on a GPU).

Reference numbers are derived in spec 002 §5.0 and recomputed by :mod:`iclab.theory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from iclab import algorithms, constructions
from iclab.core.numerics import dist_to_identity, sym_sqrt
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.common import LinearSetup, curve, make_task, seed_runs, train_model
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.plotting import band, heatmap, save, subplots
from iclab.tasks import LinearRegression
from iclab.theory import preconditioned_gd as th

#: The training part of every smoke preset: seconds, checks only that everything runs.
SMOKE = dict(seeds=1, steps=20, batch_size=256, eval_batch=256, eval_every=10)

# --------------------------------------------------------------------------------------------
# Figures 1 and 2: pattern (8), Theorem 3


@dataclass(frozen=True, kw_only=True)
class Fig1Config(LinearSetup):
    final_loss_rtol: float = 0.05  # vs the Thm-3 S-optimum (spec 002 claim 12)
    dist_tol: float = 0.1  # Dist(Σ^{1/2}A_iΣ^{1/2}, I) at the end
    scalar_rtol: float = 0.1  # sorted tr(Σ^{1/2}A_iΣ^{1/2})/d vs the S-optimal steps
    reference_samples: int = 200_000  # Wishart draws for the Thm-3 S-optimum


def _sigma_conj(A: torch.Tensor, Sigma: torch.Tensor) -> torch.Tensor:
    S = sym_sqrt(Sigma)
    return S @ A @ S


def _sparse_reference(d: int, n: int, L: int, samples: int) -> dict[str, Any]:
    a, loss = th.theorem3_optimum(d, n, L, samples=samples, generator=generator(derive_seed(0, "thm3", d, n, L)))
    return {"a": torch.as_tensor(a, dtype=torch.float64), "loss": float(loss)}


def run_fig1(cfg: Fig1Config, ctx: RunContext) -> dict[str, Any]:
    runs = seed_runs(cfg, ctx, pattern="sparse", weight_prior="inverse_covariance")
    return {"runs": runs, "reference": _sparse_reference(cfg.d, cfg.n, cfg.n_layers, cfg.reference_samples)}


def _log_loss_panel(
    ax: Any, runs: list[dict[str, Any]], title: str, reference: float | None = None, label: str = ""
) -> None:
    """Mean ± std over runs of the log test loss, with a dashed reference loss if given."""
    band(
        ax,
        runs[0]["steps"].numpy(),
        torch.stack([r["test_loss"] for r in runs]),
        log=True,
        color="k",
        label="test loss",
    )
    if reference is not None:
        ax.axhline(math.log(reference), ls="--", color="tab:green", label=label)
        ax.legend(fontsize=7)
    ax.set_xlabel("iteration")
    ax.set_ylabel("log(loss)")
    ax.set_title(title)


def _dist_curves(run: dict[str, Any], key: str = "A") -> tuple[torch.Tensor, torch.Tensor]:
    A = run[key]  # (S, L, d, d)
    return dist_to_identity(A), dist_to_identity(_sigma_conj(A, run["Sigma"]))


def plot_fig1(results: dict[str, Any], cfg: Fig1Config, out: Path) -> list[Path]:
    runs, L = results["runs"], cfg.n_layers
    fig, axes = subplots(1, L + 1)
    x = runs[0]["snap_steps"].numpy()
    raw = torch.stack([_dist_curves(r)[0] for r in runs])  # (R, S, L)
    rot = torch.stack([_dist_curves(r)[1] for r in runs])
    for i in range(L):
        ax = axes[0, i]
        band(ax, x, raw[:, :, i], label=f"A_{i}", color="tab:red")
        band(ax, x, rot[:, :, i], label=f"Σ^½A_{i}Σ^½", color="tab:blue")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("iteration")
        ax.set_ylabel("distance to Id")
        ax.set_title(f"({'abc'[i] if i < 3 else i}) layer {i}")
        ax.legend(fontsize=7)
    _log_loss_panel(axes[0, L], runs, "(d) in-context loss", results["reference"]["loss"], "Thm 3 S-optimum")
    f1 = save(fig, out / "fig1.png")
    fig, axes = subplots(1, L, size=(2.6, 2.6))
    final = _sigma_conj(runs[0]["A"][-1], runs[0]["Sigma"])
    for i in range(L):
        heatmap(axes[0, i], final[i], title=f"Σ^½ A_{i} Σ^½")
    return [f1, save(fig, out / "fig2.png")]


def claims_fig1(results: dict[str, Any], cfg: Fig1Config) -> list[ClaimResult]:
    runs, ref = results["runs"], results["reference"]
    final_loss = torch.tensor([r["test_loss"][-1] for r in runs]).mean().item()
    raw = torch.stack([_dist_curves(r)[0][-1] for r in runs])  # (R, L)
    rot = torch.stack([_dist_curves(r)[1][-1] for r in runs])
    d = cfg.d
    sigma_inv_dist = dist_to_identity(torch.diag(1 / torch.tensor(cfg.spectrum, dtype=torch.float64))).item()
    scal = torch.stack(
        [
            torch.sort(torch.diagonal(_sigma_conj(r["A"][-1], r["Sigma"]), dim1=-2, dim2=-1).sum(-1) / d).values
            for r in runs
        ]
    ).mean(0)
    rel = ((scal - torch.sort(ref["a"]).values).abs() / torch.sort(ref["a"]).values).max().item()
    return [
        check(
            "final_loss_equals_thm3_S_optimum",
            final_loss,
            expected=ref["loss"],
            rtol=cfg.final_loss_rtol,
            detail="mean final test loss over runs; the paper's 'almost 0' is this S-optimum (spec 002 §3.1)",
        ),
        check(
            "rotated_A_is_scaled_identity",
            rot.max().item(),
            hi=cfg.dist_tol,
            detail="max over runs and layers of Dist(Σ^½A_iΣ^½, I): A_i → a_i Σ⁻¹ (Thm 3)",
        ),
        check(
            "raw_A_stays_far_from_identity",
            raw.min().item(),
            expected=sigma_inv_dist,
            atol=0.05,
            detail="Dist(A_i, I) ends at Dist(Σ⁻¹, I): not plain GD (the flat red lines)",
        ),
        check(
            "step_sizes_match_S_optimum",
            rel,
            hi=cfg.scalar_rtol,
            detail=f"max relative error of sorted tr(Σ^½A_iΣ^½)/d {[round(v, 3) for v in scal.tolist()]} vs {[round(v, 3) for v in torch.sort(ref['a']).values.tolist()]}",
        ),
    ]


FIG1 = register(
    Experiment(
        name="ahn2023.fig1",
        title="Fig. 1-2: L=3 linear transformer with pattern (8) learns Σ⁻¹-preconditioned GD (Thm 3)",
        config=Fig1Config,
        presets={
            "smoke": dict(
                **SMOKE, snapshot_every=10, reference_samples=2000, final_loss_rtol=10.0, dist_tol=1.0, scalar_rtol=10.0
            ),
            # quick: Adam β = (0.9, 0.999), lr 0.05, cosine, 2000 steps of 4000 prompts reaches the S-optimum
            # that the paper's AdamW β = (0.99, 0.9) schedule needs ~30k steps of 20 000 prompts for.
            "quick": dict(
                seeds=3,
                optimizer="adam",
                lr=0.05,
                betas=(0.9, 0.999),
                schedule="cosine",
                steps=2000,
                batch_size=4000,
                eval_batch=20_000,
                snapshot_every=50,
                eval_every=50,
                final_loss_rtol=0.05,
                dist_tol=0.15,
                scalar_rtol=0.15,
            ),
            "paper": dict(),
        },
        run=run_fig1,
        plot=plot_fig1,
        claims=claims_fig1,
        description="d=5, n=20, Σ = UᵀDU with D = diag(1, 1, 1/4, 1/16, 1), w⋆ ~ N(0, Σ⁻¹); AdamW, batch resampled every 100 steps, per-matrix clipping 0.01. Red: Dist(A_i, I); blue: Dist(Σ^½A_iΣ^½, I). Fig. 2: Σ^½A_iΣ^½ of run 0 at the end.",
    )
)

# --------------------------------------------------------------------------------------------
# Figures 3, 4, 5: pattern (11), Theorem 4


@dataclass(frozen=True, kw_only=True)
class Fig3Config(LinearSetup):
    optimizer: str = "lbfgs"  # type: ignore[assignment]  # the Fig. 3c text and the L-BFGS notebook
    lr: float = 0.1
    seeds: int = 3
    steps: int = 2000
    train_size: int | None = 20_000  # one fixed batch, never resampled
    resample_every: int = 0
    schedule: str = "constant"  # type: ignore[assignment]
    clip: float | None = None
    snapshot_every: int = 10
    eval_every: int = 10
    loss_hi: float = 2e-3  # "converging to 0": the S-optimum is ≈ 7e-4 (spec 002 claim 15-16)
    dist_tol: float = 0.1
    projection_samples: int = 200_000  # fresh prompts for the trained-vs-projected-onto-S comparison
    projection_rtol: float = 0.02  # projecting onto S may not raise the fresh-prompt loss by more than this


def run_fig3(cfg: Fig3Config, ctx: RunContext) -> dict[str, Any]:
    return {"runs": seed_runs(cfg, ctx, pattern="pattern11", weight_prior="inverse_covariance")}


def plot_fig3(results: dict[str, Any], cfg: Fig3Config, out: Path) -> list[Path]:
    runs, L = results["runs"], cfg.n_layers
    x = runs[0]["snap_steps"].numpy()
    fig, axes = subplots(2, L)
    for i in range(L - 1):
        band(
            axes[0, i], x, torch.stack([dist_to_identity(r["B"][:, i]) for r in runs]), label=f"B_{i}", color="tab:blue"
        )
        axes[0, i].set_ylim(0, 1.02)
        axes[0, i].set_title(f"({'ab'[i] if i < 2 else i}) Dist(B_{i}, I)")
        axes[0, i].set_xlabel("iteration")
    _log_loss_panel(axes[0, L - 1], runs, "(c) log in-context loss")
    for i in range(L):
        ax = axes[1, i]
        band(ax, x, torch.stack([dist_to_identity(r["A"][:, i]) for r in runs]), label=f"A_{i}", color="tab:red")
        band(
            ax,
            x,
            torch.stack([dist_to_identity(_sigma_conj(r["A"][:, i], r["Sigma"])) for r in runs]),
            label=f"Σ^½A_{i}Σ^½",
            color="tab:blue",
        )
        ax.set_ylim(0, 1.02)
        ax.set_title(f"({'def'[i] if i < 3 else i}) layer {i}")
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    f3 = save(fig, out / "fig3.png")
    fig, axes = subplots(1, L - 1, size=(2.6, 2.6))
    for i in range(L - 1):
        heatmap(axes[0, i], runs[0]["B"][-1, i], title=f"B_{i}")
    f4 = save(fig, out / "fig4.png")
    fig, axes = subplots(1, L, size=(2.6, 2.6))
    final = _sigma_conj(runs[0]["A"][-1], runs[0]["Sigma"])
    for i in range(L):
        heatmap(axes[0, i], final[i], title=f"Σ^½ A_{i} Σ^½")
    return [f3, f4, save(fig, out / "fig5.png")]


def _projected_onto_S(run: dict[str, Any], cfg: Fig3Config) -> tuple[float, float]:
    """Fresh-prompt losses of the trained (11) model and of its projection onto Thm 4's set S.

    S: A_i = a_i Σ⁻¹, B_i = b_i I. The projection keeps each matrix's best scalar, a_i = tr(Σ^½A_iΣ^½)/d
    and b_i = tr(B_i)/d (the α of Dist(·, I)). Both models see the same ``projection_samples`` prompts
    (common random numbers), in float64.
    """
    Sigma = run["Sigma"].to(torch.float64)
    A, B = run["A"][-1].to(torch.float64), run["B"][-1].to(torch.float64)
    d, L = Sigma.shape[0], A.shape[0]
    inv, half = torch.linalg.inv(Sigma), sym_sqrt(Sigma)
    a = torch.stack([torch.trace(half @ Ai @ half) / d for Ai in A])
    b = torch.stack([torch.trace(Bi) / d for Bi in B])
    eye = torch.eye(d, dtype=torch.float64)
    task = LinearRegression(d=d, covariance=Sigma, weight_prior="inverse_covariance")
    losses = []
    for blocks in ({"A": A, "B": B}, {"A": a[:, None, None] * inv, "B": b[:, None, None] * eye}):
        model = LinearTransformer(LinearTransformerConfig(d=d, n_layers=L, pattern="pattern11", init_std=0.0))
        model = model.double().load_matrices(**blocks)
        chunks = max(1, cfg.projection_samples // 20_000)
        gen = generator(derive_seed(0, "fig3-projection"))
        losses.append(th.mc_loss(model, task, cfg.n, cfg.projection_samples, generator=gen, chunks=chunks)[0])
    return losses[0], losses[1]


def claims_fig3(results: dict[str, Any], cfg: Fig3Config) -> list[ClaimResult]:
    runs, L = results["runs"], cfg.n_layers
    final_loss = torch.tensor([r["test_loss"][-1] for r in runs]).mean().item()
    distB = torch.stack([dist_to_identity(r["B"][-1, : L - 1]) for r in runs])
    distA = torch.stack([dist_to_identity(_sigma_conj(r["A"][-1], r["Sigma"])) for r in runs])
    norms = torch.stack([torch.linalg.matrix_norm(_sigma_conj(r["A"][-1], r["Sigma"])) for r in runs])  # (R, L)
    increasing = float((norms[:, 1:] > norms[:, :-1]).all(dim=1).double().mean())
    projected = [_projected_onto_S(r, cfg) for r in runs]
    return [
        check(
            "loss_far_below_sparse_optimum",
            final_loss,
            hi=cfg.loss_hi,
            detail="mean final test loss; sparse (8) S-optimum is 0.133, the (11) S-optimum ≈ 7e-4 (spec 002 §3.2)",
        ),
        check(
            "B_is_scaled_identity",
            distB.max().item(),
            hi=cfg.dist_tol,
            detail="max Dist(B_i, I), i < L-1 (B_{L-1} does not affect the loss)",
        ),
        check(
            "rotated_A_is_scaled_identity", distA.max().item(), hi=cfg.dist_tol, detail="max Dist(Σ^½A_iΣ^½, I) (Thm 4)"
        ),
        check(
            "step_norms_increase_with_depth",
            increasing,
            lo=0.5,
            detail="fraction of runs with ‖A_0‖ < ‖A_1‖ < ‖A_2‖ (App. D)",
        ),
        check(
            "projection_onto_S_does_not_hurt",
            max(p / t - 1 for t, p in projected),
            hi=cfg.projection_rtol,
            detail="max over runs of loss(A_i → a_iΣ⁻¹, B_i → b_iI) / loss(trained) − 1 on "
            f"{cfg.projection_samples} fresh prompts: trained {[f'{t:.2e}' for t, _ in projected]}, "
            f"projected {[f'{p:.2e}' for _, p in projected]}. What the trained model has outside Thm 4's S "
            "is fitted to its fixed training batch, not to the task",
        ),
    ]


FIG3 = register(
    Experiment(
        name="ahn2023.fig3",
        title="Fig. 3-5: L=3 linear transformer with pattern (11) learns GD++ with Σ⁻¹ preconditioning (Thm 4)",
        config=Fig3Config,
        presets={
            "smoke": dict(
                seeds=1,
                steps=5,
                train_size=256,
                batch_size=256,
                eval_batch=256,
                snapshot_every=1,
                eval_every=1,
                loss_hi=100.0,
                projection_samples=2000,
                projection_rtol=1e6,
                dist_tol=1.0,
            ),
            # quick: one run, 400 L-BFGS iterations on 8000 prompts: test loss ≈ 1.3e-3, Dist(B_i, I) ≈ 0.32, not
            # the paper's 7e-4 (that needs the 20 000-prompt batch and ~700 iterations of the paper preset). At 250
            # iterations Dist(B_i, I) sat at 0.48-0.51, on the tolerance, and flipped with float32 rounding.
            "quick": dict(
                seeds=1, steps=400, train_size=8000, batch_size=8000, eval_batch=20_000, loss_hi=1e-2, dist_tol=0.5
            ),
            "paper": dict(),
        },
        run=run_fig3,
        plot=plot_fig3,
        claims=claims_fig3,
        description="d=5, n=20 (the authors' code; the text says 10), L-BFGS on one fixed batch as in Fig. 3c. Fig. 4: B_0, B_1; Fig. 5: Σ^½A_iΣ^½ at the end of run 0.",
    )
)

# --------------------------------------------------------------------------------------------
# Theorem 1: a single layer with full P, Q learns Γ⋆ (eq. 6)


@dataclass(frozen=True, kw_only=True)
class Theorem1Config(LinearSetup):
    ns: tuple[int, ...] = (5, 10, 20, 100)
    seeds: int = 3
    n_layers: int = 1
    optimizer: str = "adam"  # type: ignore[assignment]
    lr: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    steps: int = 10_000  # at 5000, |P_{D,1:d}|, |Q_{D,1:d}| were still 5.9% of P_DD at n = 5 (2.6% at 10 000)
    step_every: int = 1000
    clip: float | None = None
    snapshot_every: int = 0
    loss_rtol: float = 0.01
    mc_rtol: float = 0.02  # sampling allowance of the Monte-Carlo test loss
    gamma_rtol: float = 0.05


def _effective_gamma(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """−P_{D,D}·Q_{1:d,1:d}ᵀ: the preconditioner a 1-layer model applies (eq. 13-14)."""
    return -(P[-1, -1] * Q[:-1, :-1]).T


def run_theorem1(cfg: Theorem1Config, ctx: RunContext) -> dict[str, Any]:
    rows = []
    for n in cfg.ns:
        for s in range(cfg.seeds):
            task = make_task(cfg, s, "identity")
            model, res = train_model(
                cfg, ctx, seed=s, task=task, pattern="full", n=n, name=f"n{n}-seed{s}", snapshot=False
            )
            P, Q = model.P[0, 0].detach().double().cpu(), model.Q[0, 0].detach().double().cpu()
            G = _effective_gamma(P, Q)
            G_star = th.theorem1_preconditioner(task.Sigma, n)
            S = sym_sqrt(task.Sigma)
            steps, loss = curve(res)
            rows.append({
                "n": n, "seed": s, "steps": steps, "test_loss": loss,
                "closed_form_loss": th.one_layer_loss(G, task.Sigma, n),
                "optimal_loss": th.theorem1_loss(task.Sigma, n),
                "gamma": G, "gamma_star": G_star,
                "gamma_err": (torch.linalg.matrix_norm(G - G_star) / torch.linalg.matrix_norm(G_star)).item(),
                "gamma_err_sigma": (torch.linalg.matrix_norm(S @ (G - G_star) @ S) / torch.linalg.matrix_norm(S @ G_star @ S)).item(),
                "offdiag": max(P[-1, :-1].abs().max().item(), Q[-1, :-1].abs().max().item()) / max(P[-1, -1].abs().item(), 1e-12),
                "dist": dist_to_identity(G).item(), "dist_star": dist_to_identity(G_star).item(),
            })  # fmt: skip
    return {"rows": rows}


def plot_theorem1(results: dict[str, Any], cfg: Theorem1Config, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 3)
    ax = axes[0, 0]
    for n in cfg.ns:
        rs = [r for r in rows if r["n"] == n]
        band(ax, rs[0]["steps"].numpy(), torch.stack([r["test_loss"] for r in rs]), label=f"n={n}")
        ax.axhline(rs[0]["optimal_loss"], ls="--", color=ax.lines[-1].get_color(), lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_title("test loss (dashed: f⋆, Thm 1)")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    ns = torch.tensor(cfg.ns, dtype=torch.float64)
    ax.plot(cfg.ns, [r["dist_star"] for r in rows if r["seed"] == 0], "k--", label="Dist(Γ⋆, I) (eq. 6)")
    ax.plot([r["n"] for r in rows], [r["dist"] for r in rows], "o", label="learned")
    ax.set_xscale("log")
    ax.set_xlabel("n")
    ax.set_title("preconditioner shape")
    ax.legend(fontsize=7)
    del ns
    r0 = [r for r in rows if r["seed"] == 0][-1]
    heatmap(axes[0, 2], torch.cat([r0["gamma"], r0["gamma_star"]], dim=1), title=f"learned Γ | Γ⋆ (n={r0['n']})")
    return [save(fig, out / "theorem1.png")]


def claims_theorem1(results: dict[str, Any], cfg: Theorem1Config) -> list[ClaimResult]:
    rows = results["rows"]
    loss_err = max(r["test_loss"][-1].item() / r["optimal_loss"] - 1 for r in rows)
    cf_err = max(r["closed_form_loss"] / r["optimal_loss"] - 1 for r in rows)
    raw = max(r["gamma_err"] for r in rows)
    return [
        check(
            "learned_gamma_loss_reaches_f_star",
            cf_err,
            lo=-1e-9,
            hi=cfg.loss_rtol,
            detail="max over n, seeds of the exact loss of the learned Γ over f⋆, minus 1 (≥ 0: Γ⋆ is optimal)",
        ),
        check(
            "trained_test_loss_near_f_star",
            loss_err,
            hi=cfg.loss_rtol + cfg.mc_rtol,
            detail=f"Monte-Carlo test loss over f⋆ − 1 (± {cfg.mc_rtol:.0%} sampling allowance)",
        ),
        check(
            "learned_preconditioner_equals_gamma_star",
            max(r["gamma_err_sigma"] for r in rows),
            hi=cfg.gamma_rtol,
            detail=f"max ‖Σ^½(Γ − Γ⋆)Σ^½‖_F/‖Σ^½Γ⋆Σ^½‖_F, the metric the loss sees; raw Frobenius error {raw:.3f}, Γ = −P_DD Q_{{1:d,1:d}}ᵀ",
        ),
        check(
            "irrelevant_entries_vanish",
            max(r["offdiag"] for r in rows),
            hi=cfg.gamma_rtol,
            detail="max |P_{D,1:d}|, |Q_{D,1:d}| relative to P_{D,D}",
        ),
    ]


THEOREM1 = register(
    Experiment(
        name="ahn2023.theorem1",
        title="Thm 1: one layer of linear attention learns the preconditioner Γ⋆ = ((n+1)/n Σ + tr(Σ)/n I)⁻¹",
        config=Theorem1Config,
        presets={
            "smoke": dict(**SMOKE, ns=(5,), loss_rtol=100.0, gamma_rtol=100.0),
            "quick": dict(
                ns=(5, 20),
                seeds=1,
                steps=2500,
                batch_size=2000,
                eval_batch=20_000,
                schedule="cosine",
                eval_every=50,
                lr=0.02,
                loss_rtol=0.02,
                mc_rtol=0.04,
                gamma_rtol=0.15,
            ),
            "paper": dict(),
        },
        run=run_theorem1,
        plot=plot_theorem1,
        claims=claims_theorem1,
        description="Full (d+1)×(d+1) P, Q, w⋆ ~ N(0, I), x ~ N(0, Σ) with the paper's spectrum. Not a figure of the paper: it checks Thm 1's global minimiser is what training finds (Zhang, Frei, Bartlett 2023 prove GD converges there).",
    )
)

# --------------------------------------------------------------------------------------------
# Theorem 5: ReLU attention


@dataclass(frozen=True, kw_only=True)
class Theorem5Config:
    d: int = 5
    n: int = 20
    mc_batch: int = 400_000
    grid: tuple[float, ...] = (0.6, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.4)
    seed: int = 0
    loss_rtol: float = 0.01


def run_theorem5(cfg: Theorem5Config, ctx: RunContext) -> dict[str, Any]:
    task = LinearRegression(d=cfg.d)
    c_star = th.theorem5_scale(cfg.d, cfg.n)
    ep = task.sample(cfg.mc_batch, cfg.n, generator=generator(derive_seed(cfg.seed, "thm5")), dtype=torch.float64)
    eye = torch.eye(cfg.d, dtype=torch.float64)
    relu = [
        ((constructions.one_layer(f * c_star * eye, activation="relu").predict(ep) - ep.y_query) ** 2).mean().item()
        for f in cfg.grid
    ]
    lin_c = cfg.n / (cfg.n + cfg.d + 1)
    lin = [((algorithms.pgd(eye, [f * lin_c]).predict(ep) - ep.y_query) ** 2).mean().item() for f in cfg.grid]
    return {
        "c_star": c_star,
        "grid": list(cfg.grid),
        "relu_loss": relu,
        "linear_loss": lin,
        "linear_c": lin_c,
        "theory_loss": th.theorem5_loss(cfg.d, cfg.n),
        "linear_theory_loss": cfg.d * (cfg.d + 1) / (cfg.n + cfg.d + 1),
    }


def plot_theorem5(results: dict[str, Any], cfg: Theorem5Config, out: Path) -> list[Path]:
    fig, axes = subplots(1, 1, size=(4.2, 3.0))
    ax = axes[0, 0]
    ax.plot(results["grid"], results["relu_loss"], "o-", label=f"ReLU attention, c = f·{results['c_star']:.3f}")
    ax.plot(results["grid"], results["linear_loss"], "s-", label=f"linear attention, c = f·{results['linear_c']:.3f}")
    ax.axhline(results["theory_loss"], ls="--", color="tab:blue", lw=0.8, label="d(2d+3)/(n+2d+3)")
    ax.axhline(results["linear_theory_loss"], ls="--", color="tab:orange", lw=0.8, label="d(d+1)/(n+d+1)")
    ax.set_xlabel("f (multiple of the optimal scale)")
    ax.set_ylabel("in-context loss")
    ax.legend(fontsize=7)
    return [save(fig, out / "theorem5.png")]


def claims_theorem5(results: dict[str, Any], cfg: Theorem5Config) -> list[ClaimResult]:
    grid, relu = results["grid"], results["relu_loss"]
    at_one = relu[grid.index(1.0)] if 1.0 in grid else float("nan")
    best = grid[min(range(len(grid)), key=relu.__getitem__)]
    return [
        check(
            "relu_loss_at_c_star",
            at_one,
            expected=results["theory_loss"],
            rtol=cfg.loss_rtol,
            detail="MC loss of Q_0 = −2n/(n+2d+3)[[I,0],[0,0]] vs d(2d+3)/(n+2d+3)",
        ),
        check(
            "c_star_is_the_best_scale",
            best,
            expected=1.0,
            atol=0.051,
            detail="grid point with the lowest MC loss (common random numbers)",
        ),
        check(
            "relu_worse_than_linear",
            at_one - results["linear_loss"][grid.index(1.0)],
            lo=0.0,
            detail="ReLU passes half the signal: its optimum is worse than the linear one",
        ),
    ]


THEOREM5 = register(
    Experiment(
        name="ahn2023.theorem5",
        title="Thm 5: single-layer ReLU attention is optimal at Q_0 = −2n/(n+2d+3)[[I,0],[0,0]]",
        config=Theorem5Config,
        presets={
            "smoke": dict(mc_batch=2000, grid=(0.5, 1.0, 1.5), loss_rtol=1.0),
            "quick": dict(mc_batch=200_000, loss_rtol=0.015),
            "paper": dict(mc_batch=1_000_000),
        },
        run=run_theorem5,
        plot=plot_theorem5,
        claims=claims_theorem5,
        description="Isotropic x, w⋆ ~ N(0, I), d=5, n=20. Loss of the Thm-5 construction along the line c·[[I,0],[0,0]] against the linear model's (eq. 7); the paper has no figure for this.",
    )
)


# --------------------------------------------------------------------------------------------
# Figures 6 and 7 (App. D): trained transformer vs GD, Σ⁻¹-PGD and least squares

#: Spec 002 §5.0 (paper spectrum, w⋆ ~ N(0, Σ⁻¹), all N examples, best constant normalised step).
PGD3_BY_N = dict(
    zip(range(2, 21, 2), (3.385, 2.313, 1.630, 1.175, 0.869, 0.663, 0.518, 0.410, 0.328, 0.268), strict=True)
)
GD3_BY_N = dict(
    zip(range(2, 21, 2), (3.848, 3.070, 2.553, 2.209, 1.963, 1.785, 1.647, 1.542, 1.453, 1.383), strict=True)
)
LOG_GD_BY_L = {1: 0.810, 2: 0.495, 3: 0.324, 4: 0.183}  # N = 20
LOG_PGD_BY_L = {1: 0.143, 2: -0.696, 3: -1.319, 4: -1.825}


@dataclass(frozen=True, kw_only=True)
class BaselineConfig(LinearSetup):
    step_bounds: tuple[float, float] = (1e-3, 1.5)  # bracket of the constant-step searches
    baseline_rtol: float = 0.05


def _baselines(cfg: BaselineConfig, task: Any, n: int, L: int, seed: int) -> dict[str, float]:
    """GD and Σ⁻¹-PGD with the best constant step (chosen on a validation batch, as the authors'
    code does), and the Bayes / whitened minimum-norm least-squares predictor, on a test batch."""
    val = task.sample(cfg.eval_batch, n, generator=generator(derive_seed(seed, "val", n)), dtype=torch.float64)
    test = task.sample(cfg.eval_batch, n, generator=generator(derive_seed(seed, "test", n)), dtype=torch.float64)
    eye, prec = torch.eye(task.d, dtype=torch.float64), torch.linalg.inv(task.Sigma)
    out = {}
    for name, pre in (("gd", eye), ("pgd", prec)):
        step, _ = th.best_constant_step(
            lambda s, pre=pre: th.episode_loss(algorithms.pgd(pre, [s] * L), val), cfg.step_bounds
        )
        out[name] = th.episode_loss(algorithms.pgd(pre, [step] * L), test)
        out[f"{name}_step"] = step
    out["ols"] = th.episode_loss(algorithms.BayesPosteriorMean(), test)
    return out, test  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class Fig6Config(BaselineConfig):
    ns: tuple[int, ...] = (2, 4, 6, 8, 10, 12, 14, 16, 18, 20)
    # the authors' variable_N notebook
    lr: float = 0.01
    betas: tuple[float, float] = (0.99, 0.99)
    steps: int = 8000
    batch_size: int = 40_000
    resample_every: int = 1
    clip: float | None = 0.001
    snapshot_every: int = 0
    eval_every: int = 500


def run_fig6(cfg: Fig6Config, ctx: RunContext) -> dict[str, Any]:
    rows = []
    for n in cfg.ns:
        for s in range(cfg.seeds):
            task = make_task(cfg, s, "inverse_covariance")
            base, test = _baselines(cfg, task, n, cfg.n_layers, s)
            model, _ = train_model(
                cfg, ctx, seed=s, task=task, pattern="pattern11", n=n, name=f"n{n}-seed{s}", snapshot=False
            )
            tf = th.episode_loss(model.double().cpu(), test)
            rows.append({"n": n, "seed": s, "tf": tf, **base})
    return {"rows": rows}


def _mean_by(rows: list[dict[str, Any]], key: str, by: str) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for r in rows:
        out.setdefault(r[by], []).append(r[key])
    return {k: sum(v) / len(v) for k, v in out.items()}


def plot_fig6(results: dict[str, Any], cfg: Fig6Config, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    ax = axes[0, 0]
    for key, label, style in (
        ("tf", f"{cfg.n_layers}-layer TF (11)", "o-"),
        ("pgd", f"{cfg.n_layers}-step Σ⁻¹-PGD", "s-"),
        ("gd", f"{cfg.n_layers}-step GD", "^-"),
        ("ols", "least squares (whitened min-norm)", "x--"),
    ):
        m = _mean_by(rows, key, "n")
        ax.plot(list(m), list(m.values()), style, label=label, ms=4)
    ax.set_xlabel("number of ICL examples N")
    ax.set_ylabel("test loss")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return [save(fig, out / "fig6.png")]


def claims_fig6(results: dict[str, Any], cfg: Fig6Config) -> list[ClaimResult]:
    rows = results["rows"]
    tf, pgd, gd, ols = (_mean_by(rows, k, "n") for k in ("tf", "pgd", "gd", "ols"))
    big = [n for n in cfg.ns if n >= 6]
    out = []
    ref_ns = [n for n in cfg.ns if n in PGD3_BY_N] if cfg.n_layers == 3 and cfg.d == 5 else []
    if ref_ns:
        err = max(max(abs(pgd[n] / PGD3_BY_N[n] - 1), abs(gd[n] / GD3_BY_N[n] - 1)) for n in ref_ns)
        out.append(
            check(
                "baselines_match_reference",
                err,
                hi=cfg.baseline_rtol,
                detail="max relative gap of GD3 / PGD3 losses to spec 002 §5.0 over N",
            )
        )
    ols_err = max(abs(ols[n] - max(cfg.d - n, 0)) / max(cfg.d - n, 1) for n in cfg.ns)
    out.append(
        check(
            "least_squares_loss_is_d_minus_N",
            ols_err,
            hi=cfg.baseline_rtol,
            detail="whitened min-norm least squares has loss max(d − N, 0)",
        )
    )
    if big:
        frac = sum(tf[n] < pgd[n] < gd[n] for n in big) / len(big)
        out.append(
            check(
                "tf_beats_pgd_beats_gd",
                frac,
                lo=1.0,
                detail=f"fraction of N ≥ 6 with TF < PGD3 < GD3; TF {[round(tf[n], 3) for n in big]}",
            )
        )
    return out


FIG6 = register(
    Experiment(
        name="ahn2023.fig6",
        title="Fig. 6: test loss vs number of in-context examples, 3-layer TF vs GD, Σ⁻¹-PGD, least squares",
        config=Fig6Config,
        presets={
            "smoke": dict(
                ns=(2, 6), seeds=1, steps=5, batch_size=256, eval_batch=512, eval_every=5, baseline_rtol=10.0
            ),
            "quick": dict(
                # quick: L-BFGS on 4000 fixed prompts; below N ≈ d it overfits to a heavy-tailed test loss,
                # so the quick preset starts at N = 8 (the paper preset trains N = 2..20 online with Adam).
                ns=(8, 12, 16, 20),
                seeds=1,
                optimizer="lbfgs",
                lr=0.1,
                steps=100,
                train_size=4000,
                batch_size=4000,
                resample_every=0,
                schedule="constant",
                clip=None,
                eval_batch=20_000,
                eval_every=50,
            ),
            "paper": dict(),
        },
        run=run_fig6,
        plot=plot_fig6,
        claims=claims_fig6,
        description="d=5, Σ = UᵀDU, w⋆ ~ N(0, Σ⁻¹). GD and PGD use the best constant step on the normalised gradient, chosen on a validation batch; the authors' code also drops one example (off-by-one, docs/errata.md), we do not.",
    )
)


@dataclass(frozen=True, kw_only=True)
class Fig7Config(BaselineConfig):
    layers: tuple[int, ...] = (1, 2, 3, 4)
    # the authors' variable_L notebook
    lr: float = 0.01
    steps: int = 20_000
    step_every: int = 4000
    snapshot_every: int = 0
    eval_every: int = 500
    reference_samples: int = 200_000
    log_atol: float = 0.05


def run_fig7(cfg: Fig7Config, ctx: RunContext) -> dict[str, Any]:
    rows = []
    for L in cfg.layers:
        for s in range(cfg.seeds):
            task = make_task(cfg, s, "inverse_covariance")
            base, test = _baselines(cfg, task, cfg.n, L, s)
            model, _ = train_model(
                cfg, ctx, seed=s, task=task, pattern="pattern11", n_layers=L, name=f"L{L}-seed{s}", snapshot=False
            )
            rows.append({"L": L, "seed": s, "tf": th.episode_loss(model.double().cpu(), test), **base})
    sparse = {L: _sparse_reference(cfg.d, cfg.n, L, cfg.reference_samples)["loss"] for L in cfg.layers}
    return {"rows": rows, "sparse_optimum": sparse}


def plot_fig7(results: dict[str, Any], cfg: Fig7Config, out: Path) -> list[Path]:

    rows = results["rows"]
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    ax = axes[0, 0]
    for key, label, style in (
        ("tf", "L-layer TF (11)", "o-"),
        ("pgd", "L-step Σ⁻¹-PGD", "s-"),
        ("gd", "L-step GD", "^-"),
    ):
        m = _mean_by(rows, key, "L")
        ax.plot(list(m), [math.log(v) for v in m.values()], style, label=label, ms=4)
    sp = results["sparse_optimum"]
    ax.plot(list(sp), [math.log(v) for v in sp.values()], "k--", lw=0.8, label="pattern (8) S-optimum (Thm 3)")
    ax.set_xlabel("number of layers / steps L")
    ax.set_ylabel("log(loss)")
    ax.legend(fontsize=7)
    return [save(fig, out / "fig7.png")]


def claims_fig7(results: dict[str, Any], cfg: Fig7Config) -> list[ClaimResult]:

    rows, sp = results["rows"], results["sparse_optimum"]
    tf, pgd, gd = (_mean_by(rows, k, "L") for k in ("tf", "pgd", "gd"))
    out = []
    if cfg.d == 5 and cfg.n == 20:
        err = max(
            max(abs(math.log(gd[L]) - LOG_GD_BY_L[L]), abs(math.log(pgd[L]) - LOG_PGD_BY_L[L]))
            for L in cfg.layers
            if L in LOG_GD_BY_L
        )
        out.append(
            check(
                "baselines_match_reference",
                err,
                hi=cfg.log_atol,
                detail="max |log-loss gap| of GD / PGD to spec 002 §5.0",
            )
        )
    if 1 in cfg.layers:
        out.append(
            check(
                "one_layer_tf_equals_pgd",
                math.log(tf[1]) - math.log(pgd[1]),
                atol=cfg.log_atol,
                expected=0.0,
                detail="at L = 1 the optimum is one Σ⁻¹-PGD step (Thm 1/3)",
            )
        )
    deep = [L for L in cfg.layers if L >= 2]
    if deep:
        gap = max(math.log(tf[L]) - math.log(sp[L]) for L in deep)
        out.append(
            check(
                "tf_at_or_below_sparse_optimum",
                gap,
                hi=cfg.log_atol,
                detail=f"max over L ≥ 2 of log TF − log S-opt(8); TF log-loss {[round(math.log(tf[L]), 2) for L in deep]}",
            )
        )
        out.append(
            check(
                "tf_beats_pgd",
                sum(tf[L] < pgd[L] for L in deep) / len(deep),
                lo=1.0,
                detail="fraction of L ≥ 2 with TF < constant-step PGD",
            )
        )
    return out


FIG7 = register(
    Experiment(
        name="ahn2023.fig7",
        title="Fig. 7: log test loss vs depth L, L-layer TF vs L steps of GD and Σ⁻¹-PGD (N = 20)",
        config=Fig7Config,
        presets={
            "smoke": dict(
                layers=(1, 2),
                seeds=1,
                steps=5,
                batch_size=256,
                eval_batch=512,
                eval_every=5,
                reference_samples=2000,
                log_atol=100.0,
            ),
            # quick: 200 L-BFGS iterations (the paper: Adam, 20k steps). At 100 the L = 4 model was still on its
            # plateau in some runs (log-loss -2.6 vs the S-optimum's -2.9), depending on float32 rounding.
            "quick": dict(
                seeds=1,
                optimizer="lbfgs",
                lr=0.1,
                steps=200,
                train_size=3000,
                batch_size=3000,
                resample_every=0,
                schedule="constant",
                clip=None,
                eval_batch=20_000,
                eval_every=50,
                log_atol=0.1,
            ),
            "paper": dict(),
        },
        run=run_fig7,
        plot=plot_fig7,
        claims=claims_fig7,
        description="d=5, N=20, w⋆ ~ N(0, Σ⁻¹). The dashed line is the best pattern-(8) transformer (Thm 3 S-optimum); the trained pattern-(11) model goes below it.",
    )
)

# --------------------------------------------------------------------------------------------
# Theorem 2: two layers, symmetric eq.-(8) blocks, isotropic data


@dataclass(frozen=True, kw_only=True)
class Theorem2Config(LinearSetup):
    n_layers: int = 2
    spectrum: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)
    seeds: int = 3
    optimizer: str = "adam"  # type: ignore[assignment]
    lr: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "cosine"  # type: ignore[assignment]
    steps: int = 3000
    batch_size: int = 20_000
    init_std: float = 0.1  # a random symmetric start, so "diagonal" is learned, not inherited
    loss_rtol: float = 0.02
    diag_tol: float = 0.05
    scalar_rtol: float = 0.05  # sorted mean diagonals vs the Thm-3 step sizes a_i


def run_theorem2(cfg: Theorem2Config, ctx: RunContext) -> dict[str, Any]:
    runs = seed_runs(cfg, ctx, pattern="sparse_symmetric", weight_prior="identity")
    return {"runs": runs, "reference": _sparse_reference(cfg.d, cfg.n, cfg.n_layers, 200_000)}  # exact for L <= 4


def _offdiag_ratio(A: torch.Tensor) -> torch.Tensor:
    """‖A − diag(A)‖_F / ‖A‖_F over the last two axes."""
    diag = torch.diag_embed(torch.diagonal(A, dim1=-2, dim2=-1))
    return torch.linalg.matrix_norm(A - diag) / torch.linalg.matrix_norm(A)


def plot_theorem2(results: dict[str, Any], cfg: Theorem2Config, out: Path) -> list[Path]:
    runs, L = results["runs"], cfg.n_layers
    fig, axes = subplots(1, L + 1)
    x = runs[0]["snap_steps"].numpy()
    for i in range(L):
        ax = axes[0, i]
        band(
            ax,
            x,
            torch.stack([_offdiag_ratio(r["A"][:, i]) for r in runs]),
            label="off-diagonal share",
            color="tab:purple",
        )
        band(ax, x, torch.stack([dist_to_identity(r["A"][:, i]) for r in runs]), label="Dist(A, I)", color="tab:blue")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"layer {i}")
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    _log_loss_panel(axes[0, L], runs, "log loss", results["reference"]["loss"], "best scalar A_ℓ = a_ℓ I")
    return [save(fig, out / "theorem2.png")]


def claims_theorem2(results: dict[str, Any], cfg: Theorem2Config) -> list[ClaimResult]:
    runs, ref = results["runs"], results["reference"]
    final = torch.tensor([r["test_loss"][-1] for r in runs]).mean().item()
    offdiag = max(_offdiag_ratio(r["A"][-1]).max().item() for r in runs)
    scal = torch.stack([torch.sort(torch.diagonal(r["A"][-1], dim1=-2, dim2=-1).mean(-1)).values for r in runs]).mean(0)
    return [
        check(
            "loss_equals_scalar_optimum",
            final,
            expected=ref["loss"],
            rtol=cfg.loss_rtol,
            detail="Thm 2 with scalar blocks: the exact 2-step optimum φ⋆ (0.3612 at n=20, d=5)",
        ),
        check(
            "learned_blocks_are_diagonal",
            offdiag,
            hi=cfg.diag_tol,
            detail="max ‖A_ℓ − diag A_ℓ‖_F/‖A_ℓ‖_F: a global minimiser with diagonal A_ℓ (Thm 2)",
        ),
        check(
            "learned_blocks_are_scalar",
            max(dist_to_identity(r["A"][-1]).max().item() for r in runs),
            hi=cfg.diag_tol,
            detail="Dist(A_ℓ, I): the diagonal is constant (not proved by the paper; spec 002 claim 13)",
        ),
        check(
            "step_sizes_match",
            ((scal - ref["a"]).abs() / ref["a"]).max().item(),
            hi=cfg.scalar_rtol,
            detail=f"sorted mean diagonals {[round(v, 3) for v in scal.tolist()]} vs {[round(v, 3) for v in ref['a'].tolist()]}",
        ),
    ]


THEOREM2 = register(
    Experiment(
        name="ahn2023.theorem2",
        title="Thm 2: two symmetric eq.-(8) layers on isotropic data learn diagonal (in fact scalar) preconditioners",
        config=Theorem2Config,
        presets={
            "smoke": dict(**SMOKE, snapshot_every=10, loss_rtol=10.0, diag_tol=1.0),
            "quick": dict(
                seeds=2, steps=1500, batch_size=4000, snapshot_every=50, eval_every=50, loss_rtol=0.03, diag_tol=0.08
            ),
            "paper": dict(),
        },
        run=run_theorem2,
        plot=plot_theorem2,
        claims=claims_theorem2,
        description="x, w⋆ ~ N(0, I), d=5, n=20, L=2, A_ℓ symmetric (eq. 8). The paper proves that some global minimiser is diagonal; training from a random symmetric start finds a scalar one, a_ℓ = {0.516, 1.250}.",
    )
)
