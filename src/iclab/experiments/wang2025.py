"""Wang, Convertino, Cheng, Henao, Carin 2025, "On Understanding Attention-Based In-Context Learning for
Categorical Data" (ICML 2025).

Run: ``iclab reproduce wang2025 --preset quick`` (the seven experiments here take ≈ 3-4 min on 2 busy CPU
cores; one seed, minibatch 64-128, 100-400 updates, reduced L grids) or ``--preset paper`` (spec 004 §4.0: 5 seeds,
minibatch 512, 5000 epochs over L contexts; days on a CPU, hours on a GPU).

Models: :class:`iclab.models.CategoricalTransformer` (K blocks; ``mode='gd'`` is the paper's "GD", ``'free'``
the "Trained TF") and :class:`iclab.models.SingleStepCategorical` (App. F). Data: §6.1
:class:`~iclab.tasks.categorical.RBFMixtureCategorical` (d = 10, C = 25, d' = 5, N = 125, λ = 10), App. F
:class:`~iclab.tasks.categorical.QuadrantCategorical` (d = 2, C = 20, N = 100), and the digits stand-in for
in-context ImageNet (:func:`~iclab.tasks.image_episodes.digits_episodes`, 5-way 10-shot, disjoint classes).

Experiments: ``fig2`` / ``fig2_rbf`` (1 block, softmax / RBF attention) and ``fig4_left`` (2 blocks): GD vs
Trained TF vs L; ``fig3``: GD with 1-6 blocks; ``fig4_right``: digits episodes vs linear probing; ``appf``:
single-step models on quadrant data; ``gd_init``: §5 / App. I in practice (spec claim 20), the Trained TF started
at the GD model.

Protocol (spec §4.0): one W_e per experiment (data seed 0), a fixed training set of L contexts per seed drawn
once (``TrainConfig.train_size``), minibatches of 512, validation and test sets of 2048 contexts; the
validation NLL, test NLL and test accuracy are recorded every ``eval_every`` updates (a snapshot function
of the trainer) and the reported numbers are the test values at the best validation NLL (early stopping).
Differences from the authors' code are listed in docs/papers/wang2025.md: the GD model's E slot is erased by
the exact hard mask (identical to their λ = 1e5 rbf head on distinct x), W_e gets the full gradient of all its
tied uses, each seed draws its own training set, global-norm clipping 1.0 instead of 0.001.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from iclab.algorithms.classification import BudgetProbe, LinearProbe, accuracy, nll
from iclab.constructions.categorical_attention import gd_form
from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.core.numerics import dist_to_identity
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.models.categorical_attention import (
    CategoricalTransformer,
    CategoricalTransformerConfig,
    SingleStepCategorical,
)
from iclab.plotting import band, heatmap, save, subplots
from iclab.tasks.categorical import QuadrantCategorical, RBFMixtureCategorical, query_grid
from iclab.tasks.image_episodes import FeatureEpisodes, digits_episodes, feature_file_episodes
from iclab.training import TrainConfig, train

COLORS = {"gd": "tab:blue", "free": "tab:red", "probe": "k"}
LABELS = {"gd": "GD", "free": "Trained TF"}


def ce_loss(model: nn.Module, episode: Episode) -> Tensor:
    """Cross-entropy of the query label: −(1/B) Σ log p(y_{N+1} | x_{N+1}, context) (§4)."""
    return nn.functional.cross_entropy(model.predict(episode), episode.label_query)  # type: ignore[operator]


@dataclass(frozen=True, kw_only=True)
class CatSetup:
    """Training set-up shared by every figure (spec §4.0); defaults are the paper's (JAX code) settings."""

    seeds: int = 5
    d: int = 10
    num_classes: int = 25
    d_embed: int = 5
    n: int = 125  # N context pairs
    data_scale: float = 10.0  # λ of eq. (45)
    kernel: Literal["linear", "rbf", "exp", "laplacian", "softmax"] = "softmax"
    batch_size: int = 512
    epochs: int = 5000  # passes over the L training contexts (updates = epochs · ⌈L / 512⌉) …
    max_updates: int | None = None  # … capped here (quick presets)
    lr_gd: float | None = None  # None: the authors' lr and staircase for the model (``paper_optimiser``)
    lr_tf: float | None = None  # a number: that lr, constant
    clip: float | None = 1.0  # global-norm clip
    init_std: float = 0.01  # free matrices
    eval_every: int = 100  # updates between validation/test evaluations
    val_size: int = 2048
    test_size: int = 2048
    bayes_contexts: int = 4096
    dtype: Literal["float32", "float64"] = "float32"

    def __post_init__(self) -> None:
        for name in ("lr_gd", "lr_tf"):
            v = getattr(self, name)
            require(self, name, v is None or v > 0, "null (the authors' table, spec §4.0) or a float > 0", v)
        require(self, "seeds", isinstance(self.seeds, int) and self.seeds >= 1, "an int >= 1", self.seeds)

    #: which row set of the authors' lr table applies (spec §4.0): "synthetic" (§6.1, App. F) or "image" (§6.2)
    data: ClassVar[Literal["synthetic", "image"]] = "synthetic"

    def updates(self, L: int) -> int:
        per_epoch = max(1, math.ceil(L / min(self.batch_size, L)))
        total = self.epochs * per_epoch
        return total if self.max_updates is None else min(total, self.max_updates)


_TABLE_KERNEL = {"softmax": "softmax", "exp": "softmax", "rbf": "rbf", "laplacian": "rbf", "linear": "linear"}


def paper_optimiser(
    kernel: str, n_blocks: int, mode: str, data: Literal["synthetic", "image"] = "synthetic"
) -> dict[str, Any]:
    """The authors' learning rate and staircase decay for one model (spec 004 §4.0, their ``conf_init``), as
    :class:`~iclab.training.TrainConfig` fields ``lr``, ``schedule`` and, for ``'step'``, ``step_every``/``step_gamma``.

    Synthetic data (§6.1, App. F): Trained TF (``mode='free'``) 1e-3 with one block; with two or more, softmax 5e-4
    (no schedule), rbf 1e-5 and linear 5e-4 with ×0.5 every 500 updates. GD: 1e-3 with one block or more than three,
    else softmax 5e-4 (no schedule), rbf 2e-4 and linear 1e-4; GD decays ×0.8 every 1000 updates (rbf with two or
    more blocks ×0.85) except where "no schedule" is stated. Image episodes (§6.2): 1e-3 for both models, but GD with
    the linear kernel and one block 5e-5. The table has no exp or Laplacian row: exp uses softmax's (both exponentiate
    a dot product), Laplacian rbf's (both are distance kernels); docs/errata.md, seed 004.
    """
    require("paper_optimiser", "mode", mode in ("gd", "free"), "'gd' or 'free'", mode)
    require("paper_optimiser", "kernel", kernel in _TABLE_KERNEL, f"one of {sorted(_TABLE_KERNEL)}", kernel)
    require("paper_optimiser", "n_blocks", isinstance(n_blocks, int) and n_blocks >= 1, "an int >= 1", n_blocks)
    require("paper_optimiser", "data", data in ("synthetic", "image"), "'synthetic' or 'image'", data)
    row, deep = _TABLE_KERNEL[kernel], n_blocks >= 2
    if mode == "free":
        lr = 1e-3 if data == "image" or not deep else {"softmax": 5e-4, "rbf": 1e-5, "linear": 5e-4}[row]
        decay = (500, 0.5) if deep and row != "softmax" else None
    else:
        if data == "image":
            lr = 5e-5 if row == "linear" and not deep else 1e-3
        else:
            lr = 1e-3 if not deep or n_blocks > 3 else {"softmax": 5e-4, "rbf": 2e-4, "linear": 1e-4}[row]
        no_schedule = data == "synthetic" and 2 <= n_blocks <= 3 and row == "softmax"
        decay = None if no_schedule else (1000, 0.85 if deep and row == "rbf" else 0.8)
    if decay is None:
        return {"lr": lr, "schedule": "constant"}
    return {"lr": lr, "schedule": "step", "step_every": decay[0], "step_gamma": decay[1]}


def _optimiser(setup: CatSetup, model: nn.Module, mode: str, lr: float | None) -> dict[str, Any]:
    """TrainConfig fields for one run: ``lr`` if given, else the setup's ``lr_gd``/``lr_tf`` (constant), else the
    authors' table for this model's kernel and depth (:func:`paper_optimiser`)."""
    lr = lr if lr is not None else (setup.lr_gd if mode == "gd" else setup.lr_tf)
    if lr is not None:
        return {"lr": lr, "schedule": "constant"}
    cfg = model.config  # type: ignore[union-attr]
    n_blocks = 1 if isinstance(model, SingleStepCategorical) else cfg.n_blocks
    return paper_optimiser(cfg.kernel, n_blocks, mode, setup.data)


def _train_run(
    setup: CatSetup,
    ctx: RunContext,
    model: nn.Module,
    sample: Any,
    L: int,
    *,
    seed: int,
    mode: str,
    val: Episode,
    test: Episode,
    name: str,
    lr: float | None = None,
    steps: int | None = None,
    extra_snapshot: Callable[[nn.Module], dict[str, Tensor]] | None = None,
    train_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train on a fixed set of L contexts; curves of val NLL, test NLL/accuracy; early-stopped test numbers.

    ``steps``: updates (default ``setup.updates(L)``); ``extra_snapshot(model)``: more curves recorded with the
    metrics (returned under their own keys); ``train_overrides``: TrainConfig fields (e.g. an lr schedule).
    """
    dtype = getattr(torch, setup.dtype)
    val, test = val.to(dtype=dtype), test.to(dtype=dtype)

    def metrics(m: nn.Module) -> dict[str, Tensor]:
        lv = m.predict(val)  # type: ignore[operator]
        lt = m.predict(test)  # type: ignore[operator]
        extra = extra_snapshot(m) if extra_snapshot is not None else {}
        return {
            "val_nll": nll(lv, val.label_query),
            "test_nll": nll(lt, test.label_query),
            "test_acc": accuracy(lt, test.label_query),
            **extra,
        }

    steps = setup.updates(L) if steps is None else steps
    gd = mode == "gd"
    cfg = TrainConfig(
        steps=steps,
        batch_size=min(setup.batch_size, L),
        train_size=L,
        optimizer="adam" if gd else "adamw",
        **_optimiser(setup, model, mode, lr),
        betas=(0.9, 0.999) if gd else (0.9, 0.98),
        clip=setup.clip,
        clip_mode="global",
        eval_every=0,
        eval_batch=min(setup.test_size, 256),
        snapshot_every=max(1, min(setup.eval_every, steps)),
        checkpoint_every=max(1, steps // 4),
        seed=seed,
        dtype=setup.dtype,
    )
    if train_overrides:
        cfg = dataclasses.replace(cfg, **train_overrides)
    res = train(
        model,
        sample,
        cfg,
        out_dir=ctx.subdir(name),
        device=ctx.device,
        loss_fn=ce_loss,
        test_episode=test,
        snapshot_fn=metrics,
        progress=ctx.progress,
        description=name,
    )
    snaps = res.snapshots
    best = int(torch.argmin(snaps["val_nll"]))
    return {
        "steps": torch.tensor(res.snapshot_steps),
        **snaps,  # val_nll, test_nll, test_acc and the extra curves, (S, ...) each
        "best_step": res.snapshot_steps[best],
        "acc": float(snaps["test_acc"][best]),
        "nll": float(snaps["test_nll"][best]),
        "seconds": res.seconds,
    }


def _synthetic(setup: CatSetup) -> tuple[RBFMixtureCategorical, Episode, Episode, dict[str, float]]:
    """The §6.1 task with one W_e, its validation and test sets, and the Bayes rate (test set and Monte Carlo)."""
    task = RBFMixtureCategorical.draw(
        generator=generator(derive_seed(0, "W_e")),
        d=setup.d,
        num_classes=setup.num_classes,
        d_embed=setup.d_embed,
        scale=setup.data_scale,
    )
    dtype = getattr(torch, setup.dtype)
    val = task.sample(setup.val_size, setup.n, generator=generator(derive_seed(0, "val")), dtype=dtype)
    test = task.sample(setup.test_size, setup.n, generator=generator(derive_seed(0, "test")), dtype=torch.float64)
    mc = task.bayes_rate(generator=generator(derive_seed(0, "bayes")), contexts=setup.bayes_contexts, points=16)
    bayes = {
        "test_max_prob": float(test.task["p_query"].amax(-1).mean()),  # E[max p] on the test queries
        "test_acc": float((test.task["p_query"].argmax(-1) == test.label_query).double().mean()),
        "mc_rate": mc.mean,
        "mc_stderr": mc.stderr,
        "test_nll": float(-test.task["p_query"].gather(1, test.label_query[:, None]).log().mean()),
    }
    return task, val, test.to(dtype=dtype), bayes


def _model(setup: CatSetup, n_blocks: int, mode: str, seed: int, **kw: Any) -> CategoricalTransformer:
    cfg = CategoricalTransformerConfig(
        d=setup.d,
        d_embed=setup.d_embed,
        num_classes=setup.num_classes,
        n_blocks=n_blocks,
        kernel=setup.kernel,
        mode=mode,  # type: ignore[arg-type]
        init_std=setup.init_std,
        **kw,
    )
    return CategoricalTransformer(cfg, generator=generator(derive_seed(seed, "init")))


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    acc = torch.tensor([r["acc"] for r in runs], dtype=torch.float64)
    nl = torch.tensor([r["nll"] for r in runs], dtype=torch.float64)
    sd = lambda t: float(t.std()) if t.numel() > 1 else 0.0  # noqa: E731
    return {"acc": float(acc.mean()), "acc_std": sd(acc), "nll": float(nl.mean()), "nll_std": sd(nl)}


# --------------------------------------------------------------------------------------------------------
# Fig. 2 (1 block) and Fig. 4 left (2 blocks): GD vs Trained TF as a function of L


@dataclass(frozen=True, kw_only=True)
class SweepLConfig(CatSetup):
    n_blocks: int = 1
    L_grid: tuple[int, ...] = (2048, 4096, 8192, 12288, 16384, 20480, 24576, 32768)
    gap_small_L: float = 0.0  # paper (2 blocks): acc_GD − acc_TF >= 0.15 at the smallest L
    match_acc_tol: float = 0.02  # |acc_TF − acc_GD| at the largest L (claims 11-12)
    #: the matching claims are checked only when the largest L reaches this: the paper's 2-block TF matches GD at
    #: L = 32768 and is 0.19 below it at L = 2048 (spec §5 claim 12), so a sweep that stops short of it checks that
    #: the gap closes as L grows (``tf_approaches_gd_with_L``) instead of a match the paper does not report there
    match_min_L: int = 0
    match_nll_tol: float = 0.05
    gd_acc_expected: float | None = None  # e.g. 0.718 at L = 2048 for 2 blocks (§4.1)
    gd_acc_tol: float = 0.03
    data_efficiency_tol: float = 0.01  # claim 13
    bayes_slack: float = 0.0  # GD acc <= Bayes E[max p] + slack + 3 s.e.


def run_sweep_L(cfg: SweepLConfig, ctx: RunContext) -> dict[str, Any]:
    task, val, test, bayes = _synthetic(cfg)
    sample = functools.partial(task.sample, n=cfg.n)
    out: dict[str, Any] = {"bayes": bayes, "L": list(cfg.L_grid), "gd": {}, "free": {}}
    for L in cfg.L_grid:
        for mode in ("gd", "free"):
            runs = [
                _train_run(
                    cfg,
                    ctx,
                    _model(cfg, cfg.n_blocks, mode, s),
                    sample,
                    L,
                    seed=s,
                    mode=mode,
                    val=val,
                    test=test,
                    name=f"{mode}-L{L}-seed{s}",
                )
                for s in range(cfg.seeds)
            ]
            out[mode][L] = {"runs": runs, **_summary(runs)}
    return out


def plot_sweep_L(results: dict[str, Any], cfg: SweepLConfig, out: Path) -> list[Path]:
    fig, axes = subplots(1, 2)
    Ls = results["L"]
    for mode in ("gd", "free"):
        acc = torch.tensor([[r["acc"] for r in results[mode][L]["runs"]] for L in Ls]).T
        nl = torch.tensor([[r["nll"] for r in results[mode][L]["runs"]] for L in Ls]).T
        band(axes[0, 0], Ls, acc, label=LABELS[mode], color=COLORS[mode], marker="o")
        band(axes[0, 1], Ls, nl, label=LABELS[mode], color=COLORS[mode], marker="o")
    axes[0, 0].axhline(results["bayes"]["test_max_prob"], ls="--", color="tab:green", label="Bayes E[max p]")
    axes[0, 1].axhline(results["bayes"]["test_nll"], ls="--", color="tab:green", label="Bayes NLL")
    for ax, name in zip(axes[0], ("top-1 accuracy", "NLL"), strict=True):
        ax.set_xlabel("training contexts L")
        ax.set_ylabel(name)
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
        ax.set_title(f"{cfg.n_blocks} block(s), {cfg.kernel} attention", fontsize=9)
    fig_name = ("fig2" if cfg.n_blocks == 1 else "fig4_left") + ("" if cfg.kernel == "softmax" else f"_{cfg.kernel}")
    return [save(fig, out / f"{fig_name}.png")]


def claims_sweep_L(results: dict[str, Any], cfg: SweepLConfig) -> list[ClaimResult]:
    Ls = results["L"]
    lo, hi = Ls[0], Ls[-1]
    gd, tf, bayes = results["gd"], results["free"], results["bayes"]
    gd_runs = [r["acc"] for r in gd[lo]["runs"]]
    se = bayes["mc_stderr"]
    tf_nll = [tf[L]["nll"] for L in Ls]
    gap = {L: (gd[L]["acc"] - tf[L]["acc"], tf[L]["nll"] - gd[L]["nll"]) for L in Ls}
    out = []
    if hi >= cfg.match_min_L:
        out += [
            check(
                "tf_matches_gd_acc_at_largest_L",
                abs(tf[hi]["acc"] - gd[hi]["acc"]),
                hi=cfg.match_acc_tol,
                detail=f"L = {hi}: TF {tf[hi]['acc']:.4f} vs GD {gd[hi]['acc']:.4f} (claims 11-12)",
            ),
            check(
                "tf_matches_gd_nll_at_largest_L",
                abs(tf[hi]["nll"] - gd[hi]["nll"]),
                hi=cfg.match_nll_tol,
                detail=f"L = {hi}: TF {tf[hi]['nll']:.4f} vs GD {gd[hi]['nll']:.4f}",
            ),
        ]
    out += [
        check(
            "tf_approaches_gd_with_L",
            max(gap[hi][0] - gap[lo][0], gap[hi][1] - gap[lo][1]),
            hi=0.0,
            detail=f"GD − TF accuracy gap {[round(gap[L][0], 4) for L in Ls]} and TF − GD NLL gap "
            f"{[round(gap[L][1], 4) for L in Ls]} over L = {Ls}: both smaller at L = {hi} than at L = {lo}"
            + (
                f"; TF ≈ GD is checked from L = {cfg.match_min_L} (the paper's matching L)"
                if hi < cfg.match_min_L
                else ""
            ),
        ),
        check(
            "gd_below_bayes_rate",
            max(g["acc"] for g in gd.values()) - bayes["test_max_prob"],
            hi=cfg.bayes_slack + 3 * max(se, 0.5 / math.sqrt(cfg.test_size)),
            detail=f"max GD acc − Bayes E[max p] on the test queries ({bayes['test_max_prob']:.4f}; MC rate "
            f"{bayes['mc_rate']:.4f} ± {se:.4f}) (claim 15)",
        ),
        check(
            "gd_is_data_efficient",
            abs(gd[lo]["acc"] - gd[hi]["acc"]),
            hi=cfg.data_efficiency_tol,
            detail=f"GD acc at L = {lo}: {gd[lo]['acc']:.4f}, at L = {hi}: {gd[hi]['acc']:.4f} (claim 13)",
        ),
        check(
            "tf_improves_with_L",
            tf[hi]["acc"] - tf[lo]["acc"],
            lo=0.0,
            detail=f"TF acc {[round(tf[L]['acc'], 4) for L in Ls]} over L = {Ls}",
        ),
        check(
            "tf_nll_decreases_with_L",
            max((b - a for a, b in itertools.pairwise(tf_nll)), default=0.0),  # vacuous for a single L
            hi=0.02,
            detail=f"largest increase of TF NLL between successive L: {[round(v, 4) for v in tf_nll]} (claim 12)",
        ),
        check(
            "gd_beats_tf_at_smallest_L",
            gd[lo]["acc"] - tf[lo]["acc"],
            lo=cfg.gap_small_L,
            detail=f"L = {lo}: GD {gd[lo]['acc']:.4f} vs TF {tf[lo]['acc']:.4f} (paper, 2 blocks: 0.718 vs 0.524)",
        ),
    ]
    if cfg.gd_acc_expected is not None:
        out.append(
            check(
                "gd_accuracy_matches_paper",
                gd[lo]["acc"],
                expected=cfg.gd_acc_expected,
                atol=cfg.gd_acc_tol,
                detail=f"GD acc at L = {lo}, runs {[round(a, 4) for a in gd_runs]} (§4.1)",
            )
        )
    return out


SMOKE: dict[str, Any] = dict(
    seeds=1, n=20, batch_size=32, max_updates=4, eval_every=2, val_size=64, test_size=64, bayes_contexts=64
)
SMOKE_CLAIMS: dict[str, Any] = dict(match_acc_tol=1.0, match_nll_tol=10.0, data_efficiency_tol=1.0, bayes_slack=1.0)
#: quick (one seed, ~1 min per figure on 2 CPU cores): minibatch 128 instead of 512 and 150 updates; lr 0.03 for
#: both models. At lr 3e-3 the free Trained TF was far from converged after 150 updates (1 block, L = 4096: acc
#: 0.51); at lr 0.03 it reaches 0.71 (GD 0.74), so the quick claims keep near-paper tolerances. Figures with
#: K >= 2 blocks (full N+1 attention in every block but the last) use minibatch 64 and fewer updates.
QUICK: dict[str, Any] = dict(
    seeds=1,
    batch_size=128,
    max_updates=150,
    eval_every=25,
    val_size=512,
    test_size=512,
    lr_gd=0.03,
    lr_tf=0.03,
    bayes_contexts=1024,
)

FIG2 = register(
    Experiment(
        name="wang2025.fig2",
        title="Fig. 2: one attention block, GD vs Trained TF vs number of training contexts L",
        config=SweepLConfig,
        presets={
            "smoke": dict(**SMOKE, L_grid=(32, 64), **SMOKE_CLAIMS),
            "quick": dict(**QUICK, L_grid=(512, 4096), match_acc_tol=0.05, match_nll_tol=0.2, data_efficiency_tol=0.03),
            "paper": dict(n_blocks=1, L_grid=(2048, 4096, 8192, 16384, 32768)),
        },
        run=run_sweep_L,
        plot=plot_sweep_L,
        claims=claims_sweep_L,
        description="§6.1 data (d=10, C=25, d'=5, N=125, λ=10), softmax attention, 1 block; test accuracy and NLL "
        "at the best validation NLL; the dashed line is the Bayes E[max p] / NLL on the same test queries.",
    )
)

FIG2_RBF = register(
    Experiment(
        name="wang2025.fig2_rbf",
        title="Fig. 2 with RBF attention: one block, GD vs Trained TF vs L",
        config=SweepLConfig,
        presets={
            "smoke": dict(**SMOKE, kernel="rbf", L_grid=(32, 64), **SMOKE_CLAIMS),
            "quick": dict(
                **QUICK,
                kernel="rbf",
                L_grid=(512, 4096),
                match_acc_tol=0.05,
                match_nll_tol=0.2,
                data_efficiency_tol=0.03,
            ),
            # spec §4.0: 1-layer rbf lr 1e-3 for both GD and TF (paper_optimiser)
            "paper": dict(n_blocks=1, kernel="rbf", L_grid=(2048, 4096, 8192, 16384, 32768)),
        },
        run=run_sweep_L,
        plot=plot_sweep_L,
        claims=claims_sweep_L,
        description="As Fig. 2 with the RBF kernel exp(−‖W_K e_i − W_Q e_j‖²/2) (÷ N) in the attention block, for GD "
        "(W_Q = W_K = a[I_d 0]) and the Trained TF; the spec reads Fig. 2 as showing RBF and softmax (§4.1).",
    )
)

FIG4_LEFT = register(
    Experiment(
        name="wang2025.fig4_left",
        title="Fig. 4 (left): two attention blocks, GD vs Trained TF vs L",
        config=SweepLConfig,
        presets={
            "smoke": dict(**SMOKE, n_blocks=2, L_grid=(32, 64), **SMOKE_CLAIMS),
            "quick": {
                **QUICK,
                "batch_size": 64,
                "max_updates": 100,
                "eval_every": 20,
                "n_blocks": 2,
                "L_grid": (512, 2048),
                # the paper's own 2-block TF is 0.524 at L = 2048 and matches GD only at L = 32768 (claim 12): at
                # quick's L <= 2048 the claim is that the gap closes with L, the match is the paper preset's. (A
                # larger L adds nothing here: 100 updates of 64 see 6400 contexts, so L = 8192 is fresh sampling.)
                "match_min_L": 32768,
                "data_efficiency_tol": 0.03,
                "gd_acc_expected": 0.718,
                "gd_acc_tol": 0.05,
                "gap_small_L": 0.05,
            },
            "paper": dict(n_blocks=2, gd_acc_expected=0.718, match_acc_tol=0.02, gap_small_L=0.15),
        },
        run=run_sweep_L,
        plot=plot_sweep_L,
        claims=claims_sweep_L,
        description="As Fig. 2 with 2 blocks (paper: GD 0.718 → 0.727, TF 0.524 → 0.720 over L = 2048 … 32768).",
    )
)

# --------------------------------------------------------------------------------------------------------
# Fig. 3: GD with 1-6 blocks over training


@dataclass(frozen=True, kw_only=True)
class DepthConfig(CatSetup):
    L: int = 2048
    blocks: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    depth_gain_min: float = 0.005  # acc(2) − acc(1) (paper +0.016)
    nll_gain_min: float = 0.13  # NLL(1) − min NLL(4-6) (paper 0.14)
    gd_acc_expected: float = 0.718  # 2 blocks (§4.1)
    gd_acc_tol: float = 0.03


def run_depth(cfg: DepthConfig, ctx: RunContext) -> dict[str, Any]:
    task, val, test, bayes = _synthetic(cfg)
    sample = functools.partial(task.sample, n=cfg.n)
    return {"bayes": bayes, "blocks": list(cfg.blocks), "gd": _gd_per_depth(cfg, ctx, sample, val, test)}


def _gd_per_depth(cfg: Any, ctx: RunContext, sample: Any, val: Any, test: Any) -> dict[int, dict[str, Any]]:
    """The GD model with each number of blocks in ``cfg.blocks``, every seed: {K: runs + summary}."""
    out: dict[int, dict[str, Any]] = {}
    for K in cfg.blocks:
        runs = []
        for s in range(cfg.seeds):
            model, name = _model(cfg, K, "gd", s), f"gd-K{K}-seed{s}"
            runs.append(_train_run(cfg, ctx, model, sample, cfg.L, seed=s, mode="gd", val=val, test=test, name=name))
        out[K] = {"runs": runs, **_summary(runs)}
    return out


def _gd_curves(axes: Any, gd: dict[int, dict[str, Any]], blocks: list[int], color: Any, prefix: str) -> None:
    """Test accuracy (left) and NLL (right) over updates, ± std over seeds, one band per block count."""
    for i, K in enumerate(blocks):
        runs = gd[K]["runs"]
        x = runs[0]["steps"].numpy()
        for ax, key in zip(axes[0], ("test_acc", "test_nll"), strict=True):
            band(ax, x, torch.stack([r[key] for r in runs]), label=f"{prefix}{K} block(s)", color=color(i))


def plot_depth(results: dict[str, Any], cfg: DepthConfig, out: Path) -> list[Path]:
    fig, axes = subplots(1, 2)
    cmap = __import__("matplotlib").colormaps["viridis"]
    blocks = results["blocks"]
    _gd_curves(axes, results["gd"], blocks, lambda i: cmap(i / max(1, len(blocks) - 1)), "")
    axes[0, 0].axhline(results["bayes"]["test_max_prob"], ls="--", color="tab:green", label="Bayes")
    for ax, name in zip(axes[0], ("top-1 accuracy", "NLL"), strict=True):
        ax.set_xlabel("optimizer updates")
        ax.set_ylabel(name)
        ax.legend(fontsize=6)
    return [save(fig, out / "fig3.png")]


def claims_depth(results: dict[str, Any], cfg: DepthConfig) -> list[ClaimResult]:
    gd, blocks = results["gd"], results["blocks"]
    acc = {K: gd[K]["acc"] for K in blocks}
    nl = {K: gd[K]["nll"] for K in blocks}
    deep = [K for K in blocks if K >= 4] or blocks[-1:]
    out = [
        check(
            "gd_accuracy_below_bayes",
            max(acc.values()) - results["bayes"]["test_max_prob"],
            hi=3 * 0.5 / math.sqrt(cfg.test_size),
            detail=f"acc by blocks {acc} (claim 15)",
        ),
        check(
            "deeper_gd_has_lower_nll",
            nl[blocks[0]] - min(nl[K] for K in deep),
            lo=cfg.nll_gain_min,
            detail=f"NLL by blocks {nl} (claim 14: NLL(4-6) <= NLL(1) − 0.13)",
        ),
    ]
    if 1 in acc and 2 in acc:
        out.append(
            check(
                "two_blocks_beat_one",
                acc[2] - acc[1],
                lo=cfg.depth_gain_min,
                detail="acc(2) − acc(1); paper +0.016 (claim 14)",
            )
        )
        out.append(
            check(
                "gd_two_block_accuracy_matches_paper",
                acc[2],
                expected=cfg.gd_acc_expected,
                atol=cfg.gd_acc_tol,
                detail="paper 0.7177 ± 0.0023 at L = 2048 (§4.1)",
            )
        )
    return out


FIG3 = register(
    Experiment(
        name="wang2025.fig3",
        title="Fig. 3: the GD transformer with 1-6 blocks over training (L = 2048)",
        config=DepthConfig,
        presets={
            "smoke": dict(**SMOKE, L=64, blocks=(1, 2), depth_gain_min=-1.0, nll_gain_min=-10.0, gd_acc_tol=1.0),
            "quick": {
                **QUICK,
                "blocks": (1, 2, 4),  # 1, 2 and one deep model are what the claims compare
                "batch_size": 64,
                "max_updates": 100,
                "eval_every": 20,
                "nll_gain_min": 0.05,
                "depth_gain_min": 0.0,
                "gd_acc_tol": 0.05,
            },
            "paper": dict(),
        },
        run=run_depth,
        plot=plot_depth,
        claims=claims_depth,
        description="Test accuracy and NLL during training of the GD model (α_k ∈ R^5 per block, kernel scale, W_e "
        "learned); paper: 0.702 / 0.718 / 0.729 / 0.731 / 0.728 / 0.727 for 1-6 blocks.",
    )
)

# --------------------------------------------------------------------------------------------------------
# Fig. 4 right: digits episodes (in-context ImageNet stand-in), GD 1-3 blocks vs linear probing


@dataclass(frozen=True, kw_only=True)
class ImageConfig(CatSetup):
    data: ClassVar[Literal["synthetic", "image"]] = "image"
    d: int = 64
    num_classes: int = 5
    d_embed: int = 5  # the paper's value is stripped (spec §4.2 [FLAG])
    n: int = 50  # 5-way 10-shot
    # the paper does not say; the authors' code has softmax and linear runs and their Fig. 4 notebook plots the
    # linear ones (spec §4.2 [FLAG]). K linear-kernel GD steps are K GD steps of a linear classifier in
    # feature space, the function class of the linear probe
    kernel: Literal["linear", "rbf", "exp", "laplacian", "softmax"] = "linear"
    extractor: Literal["random_relu", "pixels"] = "random_relu"
    width: int = 64
    #: your own features instead of the digits stand-in: an .npz with 'features' (N, F), 'labels' (N,) and optionally
    #: 'train_classes' / 'test_classes' (``tasks.feature_file_episodes``); set d = F (e.g. 512 for VGG16 features)
    features_path: str | None = None
    L: int = 2048
    blocks: tuple[int, ...] = (1, 2, 3)
    probe_l2: float = 1e-2  # the converged reference probe (LinearProbe)
    probe_steps: int = 500  # the authors' probe: AdamW steps at lr 1e-3 from a small init (BudgetProbe)
    probe_tol: float = 0.02  # claim 18: GD (2-3 blocks) within this of the authors' probe


def image_episodes(cfg: ImageConfig) -> tuple[FeatureEpisodes, FeatureEpisodes]:
    """Training and test episodes of Fig. 4 (right): the user's feature file if given, else the digits stand-in;
    the episode shape (ways = C, shots = N / C, feature width = d) is checked against the config first."""
    require(cfg, "n", cfg.n % cfg.num_classes == 0, f"a multiple of num_classes = {cfg.num_classes} (ways × shots)")
    shots = cfg.n // cfg.num_classes
    if cfg.features_path is None:
        train = digits_episodes("train", ways=cfg.num_classes, shots=shots, extractor=cfg.extractor, width=cfg.width)
        test = digits_episodes("test", ways=cfg.num_classes, shots=shots, extractor=cfg.extractor, width=cfg.width)
    else:
        train, test = feature_file_episodes(cfg.features_path, ways=cfg.num_classes, shots=shots)
    F = train.feature_dim
    require(cfg, "d", cfg.d == F, f"the feature width F = {F}" + (f" of {cfg.features_path}" if cfg.features_path else f" of the '{cfg.extractor}' extractor"))  # fmt: skip
    return train, test


def run_image(cfg: ImageConfig, ctx: RunContext) -> dict[str, Any]:
    dtype = getattr(torch, cfg.dtype)
    train_eps, test_eps = image_episodes(cfg)
    val = test_eps.sample(cfg.val_size, cfg.n, generator=generator(derive_seed(0, "val")), dtype=dtype)
    test = test_eps.sample(cfg.test_size, cfg.n, generator=generator(derive_seed(0, "test")), dtype=torch.float64)
    probes = {
        "probe": BudgetProbe(num_classes=cfg.num_classes, steps=cfg.probe_steps).predict(test),
        "probe_converged": LinearProbe(num_classes=cfg.num_classes, l2=cfg.probe_l2).predict(test),
    }
    sample = functools.partial(train_eps.sample, n=cfg.n)
    return {
        **{
            k: {"acc": float(accuracy(v, test.label_query)), "nll": float(nll(v, test.label_query))}
            for k, v in probes.items()
        },
        "blocks": list(cfg.blocks),
        "gd": _gd_per_depth(cfg, ctx, sample, val, test.to(dtype=dtype)),
    }


def plot_image(results: dict[str, Any], cfg: ImageConfig, out: Path) -> list[Path]:
    fig, axes = subplots(1, 2)
    palette = ("tab:blue", "tab:orange", "tab:purple", "tab:brown")
    _gd_curves(axes, results["gd"], results["blocks"], lambda i: palette[i % 4], "GD ")
    for key, ls, label in (
        ("probe", "--", "linear probing (500 AdamW steps)"),
        ("probe_converged", ":", "L2 probe, converged"),
    ):
        if key in results:
            axes[0, 0].axhline(results[key]["acc"], ls=ls, color="k", label=label)
            axes[0, 1].axhline(results[key]["nll"], ls=ls, color="k", label=label)
    for ax, name in zip(axes[0], ("accuracy (held-out classes)", "NLL"), strict=True):
        ax.set_xlabel("optimizer updates")
        ax.set_ylabel(name)
        ax.legend(fontsize=7)
    return [save(fig, out / "fig4_right.png")]


def claims_image(results: dict[str, Any], cfg: ImageConfig) -> list[ClaimResult]:
    probe, gd = results["probe"], results["gd"]
    deep = [K for K in results["blocks"] if K >= 2]
    best_deep = max(gd[K]["acc"] for K in deep) if deep else gd[results["blocks"][-1]]["acc"]
    return [
        check(
            "deep_gd_matches_linear_probing",
            abs(best_deep - probe["acc"]),
            hi=cfg.probe_tol,
            detail=f"GD acc by blocks { {K: round(gd[K]['acc'], 4) for K in gd} } vs the authors' probe "
            f"{probe['acc']:.4f} (claim 18; converged L2 probe {results['probe_converged']['acc']:.4f})",
        ),
        check(
            "one_block_not_above_deeper",
            gd[results["blocks"][0]]["acc"] - best_deep,
            hi=0.01,
            detail="1 block is slightly below 2-3 blocks (§6.2)",
        ),
    ]


FIG4_RIGHT = register(
    Experiment(
        name="wang2025.fig4_right",
        title="Fig. 4 (right): in-context classification of held-out digit classes, GD 1-3 blocks vs linear probing",
        config=ImageConfig,
        presets={
            "smoke": {**SMOKE, "n": 50, "L": 64, "blocks": (1, 2), "probe_tol": 1.0},
            "quick": {**QUICK, "L": 1024, "batch_size": 64, "probe_tol": 0.03},
            "paper": dict(),
        },
        run=run_image,
        plot=plot_image,
        claims=claims_image,
        description="Offline stand-in for §6.2: scikit-learn digits, classes 0-4 train / 5-9 test, 5-way 10-shot "
        "(N = 50), a fixed seeded random-ReLU feature extractor (64 features), the linear kernel (the authors' "
        "plotting notebook); linear probing = the authors' per-episode probe (500 AdamW steps, no bias), with "
        "the L2-regularised probe solved to optimality as a second reference.",
    )
)

# --------------------------------------------------------------------------------------------------------
# App. F, Figs. 6-9: single-step models on quadrant data, five kernels


@dataclass(frozen=True, kw_only=True)
class AppFConfig(CatSetup):
    d: int = 2
    num_classes: int = 20
    d_embed: int = 5
    n: int = 100
    data_scale: float = 1.0
    kernels: tuple[str, ...] = ("linear", "rbf", "exp", "laplacian", "softmax")
    L: int = 2048
    grid: int = 101
    map_kernel: str = "rbf"  # Fig. 7
    matrix_kernel: str = "softmax"  # Figs. 8-9
    kernel_gap_min: float = 0.05  # claim 16
    gd_tf_tol: float = 0.05
    form_tol: float = 0.2  # claim 10


def _single(cfg: AppFConfig, kernel: str, mode: str, seed: int) -> SingleStepCategorical:
    mcfg = CategoricalTransformerConfig(
        d=2,
        d_embed=cfg.d_embed,
        num_classes=cfg.num_classes,
        n_blocks=1,
        kernel=kernel,
        mode=mode,
        init_std=cfg.init_std,
    )  # type: ignore[arg-type]
    return SingleStepCategorical(mcfg, generator=generator(derive_seed(seed, "init", kernel)))


def gd_form_metrics(model: SingleStepCategorical) -> dict[str, float]:
    """App. F / spec §3.4: rel. deviation from a multiple of I of AᵀB (Q/K x-blocks) and E·D (P·W_V U → F), leakage."""
    d, dp = model.config.d, model.config.d_embed
    WQ, WK, WV, P = (m.detach().double() for m in (model.W_Q, model.W_K, model.W_V, model.P))
    A, B = WQ[:, :d], WK[:, :d]
    gamma = P[-dp:, :] @ WV[:, d : d + dp]  # E · D
    leak = (torch.cat([WQ[:, d:], WK[:, d:]]).norm() / torch.cat([A, B]).norm()).item()
    p_out = (P[:-dp].norm() / P.norm()).item()
    return {
        "AtB": dist_to_identity(A.T @ B).item(),
        "ED": dist_to_identity(gamma).item(),
        "qk_leakage": leak,
        "P_outside_f": p_out,
    }


def run_appf(cfg: AppFConfig, ctx: RunContext) -> dict[str, Any]:
    task = QuadrantCategorical.draw(
        generator=generator(derive_seed(0, "W_e")), num_classes=cfg.num_classes, d_embed=cfg.d_embed
    )
    dtype = getattr(torch, cfg.dtype)
    val = task.sample(cfg.val_size, cfg.n, generator=generator(derive_seed(0, "val")), dtype=dtype)
    test = task.sample(cfg.test_size, cfg.n, generator=generator(derive_seed(0, "test")), dtype=torch.float64)
    mc = task.bayes_rate(generator=generator(derive_seed(0, "bayes")), contexts=cfg.bayes_contexts, points=16)
    sample = functools.partial(task.sample, n=cfg.n)
    out: dict[str, Any] = {
        "bayes": {
            "mc_rate": mc.mean,
            "mc_stderr": mc.stderr,
            "test_max_prob": float(test.task["p_query"].amax(-1).mean()),
        },
        "kernels": list(cfg.kernels),
        "gd": {},
        "free": {},
    }
    models: dict[tuple[str, str], SingleStepCategorical] = {}
    for kernel in cfg.kernels:
        for mode in ("gd", "free"):
            runs = []
            for s in range(cfg.seeds):
                m = _single(cfg, kernel, mode, s)
                runs.append(
                    _train_run(
                        cfg,
                        ctx,
                        m,
                        sample,
                        cfg.L,
                        seed=s,
                        mode=mode,
                        val=val,
                        test=test.to(dtype=dtype),
                        name=f"{mode}-{kernel}-seed{s}",
                    )
                )
                if s == 0:
                    models[(kernel, mode)] = m
            out[mode][kernel] = {"runs": runs, **_summary(runs)}
    # Fig. 7: p(c | x) over a grid for one test context, GD and TF (one multi-query pass each); check vs single passes
    ctx_ep = test[torch.arange(1)]
    grid = query_grid(cfg.grid)
    maps, multi_err = {}, 0.0
    for mode in ("gd", "free"):
        m = models.get((cfg.map_kernel, mode))
        if m is None:
            continue
        m64 = m.to(torch.float64)
        with torch.no_grad():
            probs = torch.softmax(m64.predict_points(ctx_ep, grid), -1)[0]  # (grid², C)
            sub = grid[:: max(1, grid.shape[0] // 50)]
            single = torch.cat([m64.predict(dataclasses.replace(ctx_ep, x_query=p[None])) for p in sub])
            multi_err = max(multi_err, (m64.predict_points(ctx_ep, sub)[0] - single).abs().max().item())
        maps[mode] = probs.float()
    true = torch.softmax(task.W_e.T[ctx_ep.task["quadrant_categories"][0]] @ task.W_e, -1)  # (4, C) per quadrant
    out["maps"] = {
        "probs": maps,
        "grid": cfg.grid,
        "quadrant_probs": true.float(),
        "top": sorted(set(true.argmax(-1).tolist()))[:3],
        "multi_query_err": multi_err,
    }
    mk = models.get((cfg.matrix_kernel, "free"))
    if mk is not None:
        out["matrices"] = {k: getattr(mk, k).detach().double().clone() for k in ("W_Q", "W_K", "W_V", "P")}
        out["form"] = gd_form_metrics(mk)
    return out


def plot_appf(results: dict[str, Any], cfg: AppFConfig, out: Path) -> list[Path]:
    ks = results["kernels"]
    fig, axes = subplots(1, len(ks), size=(2.8, 2.4))
    for i, k in enumerate(ks):
        ax = axes[0, i]
        for mode in ("gd", "free"):
            runs = results[mode][k]["runs"]
            for r in runs:
                ax.plot(r["steps"].numpy(), r["test_acc"].numpy(), color=COLORS[mode], alpha=0.3, lw=0.8)
            band(
                ax,
                runs[0]["steps"].numpy(),
                torch.stack([r["test_acc"] for r in runs]),
                color=COLORS[mode],
                label=LABELS[mode],
            )
        ax.axhline(results["bayes"]["test_max_prob"], ls="--", color="tab:green", label="mean max prob")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("updates")
        ax.set_ylim(0, 1)
    axes[0, 0].set_ylabel("top-1 accuracy")
    axes[0, 0].legend(fontsize=6)
    paths = [save(fig, out / "fig6.png")]
    maps = results["maps"]
    if maps["probs"]:
        top = maps["top"]
        fig, axes = subplots(len(maps["probs"]), len(top), size=(2.4, 2.2))
        for r, (mode, probs) in enumerate(maps["probs"].items()):
            for c_i, c in enumerate(top):
                ax = axes[r, c_i]
                ax.imshow(
                    probs[:, c].reshape(maps["grid"], maps["grid"]).numpy(),
                    origin="lower",
                    extent=(-1, 1, -1, 1),
                    vmin=0,
                    vmax=1,
                    cmap="viridis",
                )
                ax.set_title(f"{LABELS[mode]}: p(c={c})", fontsize=8)
        paths.append(save(fig, out / "fig7.png"))
    if "matrices" in results:
        mats = results["matrices"]
        fig, axes = subplots(1, 4, size=(2.6, 2.6))
        for i, k in enumerate(("W_K", "W_Q", "W_V", "P")):
            heatmap(axes[0, i], mats[k].abs(), title=f"|{k}|", annotate=False)
        paths.append(save(fig, out / "fig8.png"))
        d, dp = cfg.d, cfg.d_embed
        fig, axes = subplots(1, 2, size=(2.8, 2.8))
        heatmap(axes[0, 0], mats["W_Q"][:, :d].T @ mats["W_K"][:, :d], title="AᵀB (x block)")
        heatmap(axes[0, 1], mats["P"][-dp:, :] @ mats["W_V"][:, d : d + dp], title="E·D (U → f)")
        paths.append(save(fig, out / "fig9.png"))
    return paths


def claims_appf(results: dict[str, Any], cfg: AppFConfig) -> list[ClaimResult]:
    gd, tf, ks = results["gd"], results["free"], results["kernels"]
    out = [
        check(
            "accuracy_below_mean_max_prob",
            max(gd[k]["acc"] for k in ks) - results["bayes"]["test_max_prob"],
            hi=3 * 0.5 / math.sqrt(cfg.test_size),
            detail=f"Bayes E[max p] = {results['bayes']['test_max_prob']:.4f} (MC {results['bayes']['mc_rate']:.4f}; "
            "paper < 0.6, spec 0.545 ± 0.13 over W_e)",
        ),
        check(
            "gd_matches_tf_per_kernel",
            max(abs(gd[k]["acc"] - tf[k]["acc"]) for k in ks),
            hi=cfg.gd_tf_tol,
            detail=f"GD {[round(gd[k]['acc'], 3) for k in ks]} vs TF {[round(tf[k]['acc'], 3) for k in ks]} "
            f"for {ks} (claim 16)",
        ),
        check(
            "multi_query_pass_equals_single_passes",
            results["maps"]["multi_query_err"],
            hi=1e-10,
            detail="float64 max |logit difference| on grid points (claim 17)",
        ),
    ]
    if "linear" in ks and len(ks) > 1:
        best = max(gd[k]["acc"] for k in ks if k != "linear")
        out.append(
            check(
                "linear_kernel_is_worse",
                best - gd["linear"]["acc"],
                lo=cfg.kernel_gap_min,
                detail="best non-linear kernel acc − linear acc, GD models (claim 16)",
            )
        )
    if "form" in results:
        f = results["form"]
        out.append(
            check(
                "learned_qk_is_scaled_identity",
                f["AtB"],
                hi=cfg.form_tol,
                detail=f"rel. deviation of AᵀB from a multiple of I; leakage {f['qk_leakage']:.3f} (claim 10)",
            )
        )
        out.append(
            check(
                "learned_value_is_scaled_identity",
                f["ED"],
                hi=cfg.form_tol,
                detail=f"rel. deviation of E·D from a multiple of I; ‖P outside f‖/‖P‖ {f['P_outside_f']:.3f}",
            )
        )
    return out


APPF = register(
    Experiment(
        name="wang2025.appf",
        title="App. F, Figs. 6-9: single-step GD vs Trained TF on quadrant data, five kernels",
        config=AppFConfig,
        presets={
            "smoke": dict(
                **SMOKE,
                L=64,
                kernels=("linear", "rbf", "softmax"),
                grid=11,
                kernel_gap_min=-1.0,
                gd_tf_tol=1.0,
                form_tol=10.0,
            ),
            "quick": {
                **QUICK,
                "L": 2048,
                "max_updates": 400,  # single-step steps are cheap (~30 ms); E·D needs them (0.42 at 150, 0.34 at 300)
                "eval_every": 50,
                "kernels": ("linear", "rbf", "softmax"),
                "gd_tf_tol": 0.05,
                "form_tol": 0.35,
            },
            "paper": dict(),
        },
        run=run_appf,
        plot=plot_appf,
        claims=claims_appf,
        description="d=2, C=20, d'=5, N=100; one self-attention layer on (x; w_{e,y} − w̄_e; 0). Fig. 6 accuracy "
        "curves (light: seeds), Fig. 7 p(c|x) over a 101×101 grid (RBF kernel), Figs. 8-9 the learned Trained-TF "
        "matrices (softmax kernel) and their x-block AᵀB and U→f block E·D.",
    )
)

# --------------------------------------------------------------------------------------------------------
# §5 / App. I in practice (spec claim 20): the Trained TF initialised at the GD model (the authors' gd_init)


@dataclass(frozen=True, kw_only=True)
class GdInitConfig(CatSetup):
    """The authors' ``gd_init`` run (spec §4.0, claim 20): pre-train the GD model, load its construction into the
    Trained-TF skeleton (eq. 26-44), train that at lr 1e-5 and watch whether it leaves the GD form."""

    n_blocks: int = 1
    L: int = 2048
    lr_tf: float = 1e-5  # the authors' lr with gd_init (all kernels, §6.1 data)
    tf_decay_every: int | None = 500  # staircase lr × tf_decay every 500 updates (their TF schedule, on with gd_init)
    tf_decay: float = 0.5
    contrast_lrs: tuple[float, ...] = (1e-3,)  # more TF runs from the same init (figure and details only)
    gd_updates: int | None = None  # GD pre-training updates; None: as many as the TF gets
    gd_embed_init: Literal["generator", "random"] = "generator"  # GD's W_e starts at the generator's (shifted)
    grad_contexts: int = 32768  # fresh contexts for the Q/K gradient, in grad_groups equal groups
    grad_groups: int = 8
    grad_scales: tuple[float, ...] = (1.0, 0.25)  # the gradient at W_Q = W_K = c·a·I: c = 1 is the init; all in S
    grad_noise_k: float = 2.0  # claim (a): ‖off-identity part of the mean gradient‖ <= k · its standard error
    form_tol: float = 0.1  # claim (b): rel. deviation of AᵀB from a multiple of I (spec claim 20: <= 0.1)
    loss_rise_tol: float = 0.01  # claim (c): test NLL of the TF − that of the GD model, at every snapshot
    init_tol: float = 1e-4  # |test NLL of the TF at step 0 − GD's| (float32 rounding only)

    def __post_init__(self) -> None:
        super().__post_init__()
        pos = "an int >= 1"
        require(self, "n_blocks", isinstance(self.n_blocks, int) and self.n_blocks >= 1, pos)
        require(self, "L", isinstance(self.L, int) and self.L >= 1, pos)
        require(self, "lr_tf", self.lr_tf > 0, "a float > 0")
        require(self, "tf_decay_every", self.tf_decay_every is None or self.tf_decay_every >= 1, "null or " + pos)
        require(self, "tf_decay", 0 < self.tf_decay <= 1, "a float in (0, 1]")
        require(self, "contrast_lrs", all(lr > 0 for lr in self.contrast_lrs), "a tuple of floats > 0")
        require(self, "gd_updates", self.gd_updates is None or self.gd_updates >= 0, "null or an int >= 0")
        require(self, "gd_embed_init", self.gd_embed_init in ("generator", "random"), "'generator' or 'random'")
        require(self, "grad_groups", isinstance(self.grad_groups, int) and self.grad_groups >= 2, "an int >= 2")
        require(
            self,
            "grad_scales",
            len(self.grad_scales) >= 1 and all(c > 0 for c in self.grad_scales),
            "a non-empty tuple of floats > 0",
        )
        require(
            self,
            "grad_contexts",
            self.grad_contexts >= self.grad_groups and self.grad_contexts % self.grad_groups == 0,
            f"a multiple of grad_groups ({self.grad_groups})",
        )
        for name in ("grad_noise_k", "form_tol", "loss_rise_tol", "init_tol"):
            require(self, name, getattr(self, name) > 0, "a float > 0")


def gd_init_model(gd: CategoricalTransformer) -> CategoricalTransformer:
    """The Trained-TF skeleton (``mode='free'``) holding the GD construction of a GD-mode model (eq. 26-44).

    Head 1: W_Q = W_K = a[I_d 0], P·W_V = diag(α_k)(U − E) → F; head 2: W_Q = W_K = λ[I_d 0] (λ = 1e5), −E → E;
    cross-attention: f → E(w_e)|_f; W_e copied. With one block, head 2 is the Trained TF's ordinary kernel head
    (erasure 'kernel', the skeleton of Fig. 2): its output lands in E slots that the readout never reads, so the
    model equals GD whatever that head computes. With K >= 2 blocks the context E slots are read, so head 2 is
    the exact RBF erasure head (erasure 'rbf'; the dot-product softmax head is wrong on ~12% of cube rows,
    docs/errata.md), with W_Q, W_K still free parameters.
    """
    cfg = gd.config
    require("gd_init_model", "gd", cfg.mode == "gd", "a mode='gd' CategoricalTransformer", cfg.mode)
    dtype = gd.W_free.dtype
    exact = CategoricalTransformer(dataclasses.replace(cfg, erasure="rbf"), generator=generator(0)).to(dtype)
    exact.load_state_dict(gd.state_dict())
    form = gd_form(exact)
    erasure = "kernel" if cfg.n_blocks == 1 else "rbf"
    tf = CategoricalTransformer(dataclasses.replace(form.config, erasure=erasure), generator=generator(0)).to(dtype)
    tf.load_state_dict(form.state_dict())
    return tf


def _qk_x_blocks(model: CategoricalTransformer) -> tuple[Tensor, Tensor]:
    """Head 1's (kernel head's) x columns A = W_Q[:, x], B = W_K[:, x] of every block, (K, D, d) each, float64."""
    d = model.config.d
    A = torch.stack([blk.W_Q[0, :, :d] for blk in model.blocks]).detach().double()
    B = torch.stack([blk.W_K[0, :, :d] for blk in model.blocks]).detach().double()
    return A, B


def qk_form_metrics(model: CategoricalTransformer, init: CategoricalTransformer | None = None) -> dict[str, Tensor]:
    """How far head 1 of each block of a free model is from the GD form (spec §3.4, claim 20), (K,) tensors.

    ``qk_rel_dev``: dist_to_identity(AᵀB) = ‖AᵀB − (tr/d)I‖_F/‖AᵀB‖_F, A = W_Q[:, x], B = W_K[:, x] (0 at the
    GD form a²I); ``qk_leak``: ‖W_{Q,K}[:, non-x]‖_F / ‖W_{Q,K}[:, x]‖_F (0 at the GD form). With ``init``:
    ``qk_drift`` ‖AᵀB − A₀ᵀB₀‖_F/‖A₀ᵀB₀‖_F and ``value_drift`` the same for P·W_V's F ← U block (diag(α_k))."""
    d, dp = model.config.d, model.config.d_embed
    A, B = _qk_x_blocks(model)
    M = A.mT @ B  # (K, d, d)
    rest = torch.stack([torch.cat([blk.W_Q[0, :, d:], blk.W_K[0, :, d:]]) for blk in model.blocks]).detach().double()
    out = {
        "qk_rel_dev": dist_to_identity(M),
        "qk_leak": rest.flatten(1).norm(dim=1) / torch.cat([A, B], 1).flatten(1).norm(dim=1),
    }
    if init is not None:
        A0, B0 = _qk_x_blocks(init)
        M0 = A0.mT @ B0
        out["qk_drift"] = (M - M0).flatten(1).norm(dim=1) / M0.flatten(1).norm(dim=1)

        def value(m: CategoricalTransformer) -> Tensor:  # (K, d', d'): F ← U block of P₁ W_V,₁
            return torch.stack([(blk.P[0] @ blk.W_V[0])[-dp:, d : d + dp] for blk in m.blocks]).detach().double()

        V, V0 = value(model), value(init)
        out["value_drift"] = (V - V0).flatten(1).norm(dim=1) / V0.flatten(1).norm(dim=1)
    return out


def qk_gradient_metrics(model: CategoricalTransformer, episodes: Episode, groups: int, chunk: int = 256) -> dict:
    """The query-CE gradient w.r.t. head 1's x-blocks W_Q[x, x], W_K[x, x] of each block (§5, App. I eq. 57).

    The contexts are split into ``groups`` equal groups; G_g is the gradient of group g's mean loss and Ḡ their
    mean (the gradient on all contexts). Theorem 2 says the population gradient at W_Q = W_K = aI is t·I; a
    finite batch adds sampling noise, so besides ``rel_dev`` = dist_to_identity(Ḡ) this returns the split
    Ḡ = t̄ I + R̄ (t = tr/d) with standard errors across groups: ``off`` ‖R̄‖_F, ``off_se`` (Σ_g ‖R_g − R̄‖²_F
    / (g(g−1)))^½, ``id`` t̄, ``id_se``, ``norm`` ‖Ḡ‖_F, and ``grad`` Ḡ itself. Leading axes (K, 2) = (block,
    Q/K). Computed in float64 on a copy of the model.
    """
    require(
        "qk_gradient_metrics",
        "groups",
        groups >= 2 and episodes.batch_size % groups == 0,
        f"an int >= 2 dividing the batch ({episodes.batch_size})",
        groups,
    )
    m = _copy_f64(model)
    d, per = m.config.d, episodes.batch_size // groups
    params = [blk.W_Q for blk in m.blocks] + [blk.W_K for blk in m.blocks]
    K = len(m.blocks)
    ep = episodes.to(dtype=torch.float64)
    G = torch.zeros(groups, 2, K, d, d, dtype=torch.float64)
    for g in range(groups):
        for start in range(g * per, (g + 1) * per, chunk):
            part = ep[start : min(start + chunk, (g + 1) * per)]
            loss = ce_loss(m, part) * (part.batch_size / per)
            grads = torch.autograd.grad(loss, params)
            G[g] += torch.stack([gr[0, :d, :d] for gr in grads]).reshape(2, K, d, d)
    G = G.transpose(1, 2)  # (groups, K, 2, d, d)
    eye = torch.eye(d, dtype=torch.float64)
    t = torch.diagonal(G, dim1=-2, dim2=-1).mean(-1)  # (groups, K, 2)
    R = G - t[..., None, None] * eye
    Gm, tm, Rm = G.mean(0), t.mean(0), R.mean(0)
    return {
        "rel_dev": dist_to_identity(Gm),
        "off": Rm.flatten(-2).norm(dim=-1),
        "off_se": ((R - Rm).flatten(-2).norm(dim=-1).square().sum(0) / (groups * (groups - 1))).sqrt(),
        "id": tm,
        "id_se": t.std(0) / math.sqrt(groups),
        "norm": Gm.flatten(-2).norm(dim=-1),
        "grad": Gm,
    }


def _copy_f64(model: CategoricalTransformer) -> CategoricalTransformer:
    m = CategoricalTransformer(model.config, generator=generator(0)).double()
    m.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return m


def _rescaled(gd: CategoricalTransformer, c: float) -> CategoricalTransformer:
    """A copy of a GD-mode model with its kernel scale a multiplied by c (still W_Q = W_K ∝ I: in S of §5)."""
    m = CategoricalTransformer(gd.config, generator=generator(0)).to(gd.W_free.dtype)
    m.load_state_dict(gd.state_dict())
    with torch.no_grad():
        m.scale.mul_(c)
    return m


def run_gd_init(cfg: GdInitConfig, ctx: RunContext) -> dict[str, Any]:
    task, val, test, bayes = _synthetic(cfg)
    sample = functools.partial(task.sample, n=cfg.n)
    dtype = getattr(torch, cfg.dtype)
    schedule = (
        {}
        if cfg.tf_decay_every is None
        else {"schedule": "step", "step_every": cfg.tf_decay_every, "step_gamma": cfg.tf_decay}
    )
    lrs = [cfg.lr_tf, *(lr for lr in cfg.contrast_lrs if lr != cfg.lr_tf)]
    out: dict[str, Any] = {"bayes": bayes, "lrs": lrs, "seeds": []}
    for s in range(cfg.seeds):
        gd = _model(cfg, cfg.n_blocks, "gd", s)
        if cfg.gd_embed_init == "generator":
            with torch.no_grad():
                gd.set_embeddings((task.W_e - task.W_e[:, -1:]).to(gd.W_free.dtype))  # (1) is shift invariant
        gd_steps = cfg.updates(cfg.L) if cfg.gd_updates is None else cfg.gd_updates
        gd_run = None
        if gd_steps > 0:
            gd_run = _train_run(
                cfg, ctx, gd, sample, cfg.L, seed=s, mode="gd", val=val, test=test, name=f"gd-seed{s}", steps=gd_steps
            )
        gd = gd.to(dtype)
        with torch.no_grad():
            gd_nll = float(nll(gd.predict(test.to(dtype=dtype)), test.label_query))
        init = gd_init_model(gd)
        grad_eps = task.sample(
            cfg.grad_contexts, cfg.n, generator=generator(derive_seed(s, "grad")), dtype=torch.float64
        )
        grad = {
            c: qk_gradient_metrics(gd_init_model(_rescaled(gd, c)), grad_eps, cfg.grad_groups) for c in cfg.grad_scales
        }
        ref = _copy_f64(init)
        runs = {}
        for lr in lrs:
            tf = gd_init_model(gd)
            runs[lr] = _train_run(
                cfg,
                ctx,
                tf,
                sample,
                cfg.L,
                seed=s,
                mode="free",
                val=val,
                test=test,
                name=f"tf-lr{lr:g}-seed{s}",
                lr=lr,
                extra_snapshot=lambda m, ref=ref: qk_form_metrics(m, ref),
                train_overrides=schedule,
            )
        out["seeds"].append(
            {
                "gd_nll": gd_nll,
                "gd_alpha": gd.alpha.detach().double().clone(),
                "gd_scale": float(gd.scale.detach()),
                "gd_run": gd_run,
                "grad": grad,
                "tf": runs,
            }
        )
    return out


def plot_gd_init(results: dict[str, Any], cfg: GdInitConfig, out: Path) -> list[Path]:
    seeds, lrs = results["seeds"], results["lrs"]
    scales = list(seeds[0]["grad"])
    fig, axes = subplots(1, 2 + len(scales))
    palette = ("tab:red", "tab:purple", "tab:orange", "tab:brown")
    for i, lr in enumerate(lrs):
        color, tag = palette[i % 4], f"TF from GD, lr {lr:g}" + (" (paper)" if i == 0 else "")
        x = seeds[0]["tf"][lr]["steps"].numpy()
        dev = torch.stack([r["tf"][lr]["qk_rel_dev"].amax(-1) for r in seeds])  # (seeds, S) worst block
        band(axes[0, 0], x[1:], dev[:, 1:], label=tag, color=color, marker=".")
        drift = torch.stack([r["tf"][lr]["qk_drift"].amax(-1) for r in seeds])
        band(axes[0, 0], x[1:], drift[:, 1:], color=color, ls="--")
        rise = torch.stack([r["tf"][lr]["test_nll"] - r["gd_nll"] for r in seeds])
        band(axes[0, 1], x, rise, label=tag, color=color, marker=".")
    axes[0, 0].axhline(cfg.form_tol, color="k", ls=":", label=f"tolerance {cfg.form_tol:g}")
    axes[0, 0].set_yscale("log", nonpositive="mask")
    axes[0, 0].set_ylabel("rel. dev. of AᵀB from cI (solid)\nrel. change of AᵀB (dashed)")
    axes[0, 1].axhline(0.0, color="tab:blue", label="GD model")
    axes[0, 1].axhline(cfg.loss_rise_tol, color="k", ls=":", label=f"+{cfg.loss_rise_tol:g}")
    axes[0, 1].set_ylabel("test NLL − GD's test NLL")
    for ax in axes[0, :2]:
        ax.set_xlabel("optimizer updates")
        ax.legend(fontsize=6)
    for i, c in enumerate(scales):
        g = seeds[0]["grad"][c]
        where = "at init" if c == 1 else f"at W_Q = W_K = {c:g}·aI"
        heatmap(axes[0, 2 + i], g["grad"][0, 0], annotate=False,
                title=f"∇ W_Q[x,x] {where}\nrel. dev. {float(g['rel_dev'][0, 0]):.2f}, "
                f"noise floor {float(g['off_se'][0, 0] / g['norm'][0, 0]):.2f}")  # fmt: skip
    return [save(fig, out / "gd_init.png")]


def claims_gd_init(results: dict[str, Any], cfg: GdInitConfig) -> list[ClaimResult]:
    seeds, lr = results["seeds"], results["lrs"][0]
    runs = [r["tf"][lr] for r in seeds]
    grads = [g for r in seeds for g in r["grad"].values()]
    ratio = max(float((g["off"] / g["off_se"]).max()) for g in grads)

    def per_scale(f: Callable[[dict[str, Tensor]], Tensor], worst: Callable = max) -> str:  # over seeds, blocks, Q/K
        return ", ".join(f"c={c:g}: {worst(worst(f(r['grad'][c]).flatten().tolist()) for r in seeds):.3g}"
                         for c in cfg.grad_scales)  # fmt: skip

    floor = per_scale(lambda g: g["off_se"] / g["norm"])
    contrast = "; ".join(
        f"lr {c:g}: max rel. dev. {max(float(r['tf'][c]['qk_rel_dev'].max()) for r in seeds):.3g}, max NLL rise "
        f"{max(float((r['tf'][c]['test_nll'] - r['gd_nll']).max()) for r in seeds):+.4f}"
        for c in results["lrs"][1:]
    )
    return [
        check(
            "tf_init_is_the_gd_model",
            max(abs(float(r["test_nll"][0]) - s["gd_nll"]) for r, s in zip(runs, seeds, strict=True)),
            hi=cfg.init_tol,
            detail=f"|test NLL of the TF at step 0 − GD's|; GD test NLL {[round(s['gd_nll'], 4) for s in seeds]}",
        ),
        check(
            "qk_gradient_on_gd_form_is_scaled_identity",
            ratio,
            hi=cfg.grad_noise_k,
            detail=f"‖off-identity part of ∇‖/its s.e., max over seeds, blocks, W_Q/W_K and W_Q = W_K = c·aI for c in "
            f"{cfg.grad_scales} (c = 1: the init; {cfg.grad_contexts} contexts, {cfg.grad_groups} groups; §5 eq. 57). "
            f"By c: rel. dev. (dist_to_identity) {per_scale(lambda g: g['rel_dev'])}; noise floor s.e./‖∇‖ {floor} "
            f"(rel. dev. ≳ {cfg.grad_noise_k:g} × floor would fail); |tr/d|/s.e. "
            f"{per_scale(lambda g: g['id'].abs() / g['id_se'], min)} (smallest)",
        ),
        check(
            "learned_qk_stays_scaled_identity",
            max(float(r["qk_rel_dev"].max()) for r in runs),
            hi=cfg.form_tol,
            detail=f"max over training of dist_to_identity(AᵀB), head 1 (claim 20); rel. change of AᵀB "
            f"{max(float(r['qk_drift'].max()) for r in runs):.3g}, of P·W_V (U→F) "
            f"{max(float(r['value_drift'].max()) for r in runs):.3g}; contrast {contrast or 'none'}",
        ),
        check(
            "qk_leakage_stays_small",
            max(float(r["qk_leak"].max()) for r in runs),
            hi=cfg.form_tol,
            detail="max over training of ‖W_{Q,K}[:, non-x]‖/‖W_{Q,K}[:, x]‖, head 1 (spec §3.4; 0 at init)",
        ),
        check(
            "loss_does_not_rise_above_gd",
            max(float((r["test_nll"] - s["gd_nll"]).max()) for r, s in zip(runs, seeds, strict=True)),
            hi=cfg.loss_rise_tol,
            detail=f"max over training of test NLL(TF) − test NLL(GD model); final "
            f"{[round(float(r['test_nll'][-1] - s['gd_nll']), 5) for r, s in zip(runs, seeds, strict=True)]}",
        ),
    ]


GD_INIT = register(
    Experiment(
        name="wang2025.gd_init",
        title="§5 in practice (claim 20): the Trained TF initialised at the GD model stays there",
        config=GdInitConfig,
        presets={
            "smoke": dict(
                **SMOKE,
                L=64,
                lr_tf=1e-5,
                contrast_lrs=(),
                grad_contexts=64,
                grad_groups=4,
                grad_noise_k=100.0,
                form_tol=10.0,
                loss_rise_tol=10.0,
                init_tol=1.0,
            ),
            "quick": {
                **QUICK,
                "lr_tf": 1e-5,  # the paper's gd_init lr (QUICK's 0.03 is for training from scratch)
                "grad_contexts": 4096,
            },
            "paper": dict(),
        },
        run=run_gd_init,
        plot=plot_gd_init,
        claims=claims_gd_init,
        description="§6.1 data, softmax attention, 1 block: GD pre-trained (its W_e starting at the generator's), its "
        "construction loaded into the free skeleton, trained at the authors' gd_init lr 1e-5 (×0.5 every 500 "
        "updates). Left: rel. deviation of head 1's AᵀB from a multiple of I (solid) and its relative change "
        "(dashed); middle: test NLL above the GD model's; right: the Q/K gradient at init (one seed, block 1).",
    )
)
