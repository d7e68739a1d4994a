"""The set-up shared by the cards of Ahn et al. 2023: the task and trainer of Sec. 4.3, the per-seed training
runs, the Thm-3 S-optimum, the GD / Σ⁻¹-PGD baselines of App. D, and the plot panels several cards draw.
Closed forms and optima come from :mod:`iclab.theory.preconditioned_gd`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self, cast

import torch
from torch import Tensor, nn

from iclab import algorithms
from iclab.core.errors import require, require_int
from iclab.core.numerics import dist_to_identity, sym_sqrt
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig, Pattern
from iclab.plotting import band, heatmap, save, subplots
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression, WeightPrior
from iclab.theory import preconditioned_gd as th
from iclab.training import ModelSpec, TrainConfig, TrainingRun, TrainResult

#: The authors' trainer (Sec. 4.3 and the settings of their code): AdamW β = (0.99, 0.9), lr 0.02
#: halved every 2000 steps, 30 000 steps of 20 000 prompts resampled every 100, per-matrix clipping 0.01.
PAPER_TRAIN: dict[str, Any] = dict(
    optimizer="adamw",
    lr=0.02,
    betas=(0.99, 0.9),
    steps=30_000,
    batch_size=20_000,
    resample_every=100,
    train_size=None,  # a fixed training set (L-BFGS runs)
    schedule="step",
    step_every=2000,
    clip=0.01,
    lbfgs_history=600,
    lbfgs_max_iter=4,
    lbfgs_line_search=None,
    eval_every=100,
    eval_batch=20_000,
    snapshot_every=100,
    dtype="float32",
)

#: L-BFGS on one fixed training set (its size is the card's), never resampled: Fig. 3c, and the quick presets of
#: Figs 6 and 7 (which evaluate the final model)
LBFGS: dict[str, Any] = dict(optimizer="lbfgs", lr=0.1, resample_every=0, schedule="constant", clip=None)
LBFGS_QUICK: dict[str, Any] = dict(LBFGS, eval_batch=20_000, eval_every=50, select_last=0)

#: The quick presets' Adam + cosine, in place of the authors' AdamW β = (0.99, 0.9) step schedule: it reaches the
#: optimum in a few thousand steps where the paper's schedule needs tens of thousands. Thm 2 (no figure, so no
#: authors' trainer) uses it at every preset.
ADAM_QUICK: dict[str, Any] = dict(optimizer="adam", lr=0.05, betas=(0.9, 0.999), schedule="cosine")

#: The training part of every smoke preset: seconds (claims it cannot meet carry a ``smoke`` reason).
SMOKE: dict[str, Any] = dict(seeds=1, steps=20, batch_size=256, eval_batch=256, eval_every=10)


def paper_train(**changes: Any) -> TrainConfig:
    """The authors' :data:`PAPER_TRAIN` settings with a card's ``changes`` (e.g. the L-BFGS notebook's)."""
    return TrainConfig(**{**PAPER_TRAIN, **changes})


@dataclass(frozen=True, kw_only=True)
class LinearSetup:
    """The training set-up of Ahn et al. 2023, Sec. 4.3: d = 5, n = 20, L = 3, Σ = UᵀDU with the paper's
    spectrum and a random U per seed, init std 1e-4 (the authors' code), and the trainer ``train``."""

    seeds: int = 5
    d: int = 5
    n: int = 20
    n_layers: int = 3
    spectrum: tuple[float, ...] = AHN2023_SPECTRUM
    rotation: Literal["haar", "svd-uniform", "none"] = "haar"
    init_std: float = 1e-4
    train: TrainConfig = field(default_factory=paper_train)

    def __post_init__(self) -> None:
        require_ints(self, "seeds", "d", "n", "n_layers")
        # d and the spectrum must agree (Σ = UᵀDU is d × d): d = 100000 beside a 5-entry spectrum would train d = 5
        require(self, "spectrum", len(self.spectrum) == self.d, f"{self.d} floats, one per dimension (d = {self.d})")
        unset = TrainConfig().checkpoint_every  # training_run checkpoints every train.steps / 10 itself
        require(self, "train.checkpoint_every", self.train.checkpoint_every == unset,
                f"left at {unset}: these cards checkpoint every train.steps / 10", self.train.checkpoint_every)  # fmt: skip


def require_ints(owner: Any, *names: str) -> None:
    """Each ``owner.<name>`` must be an int >= 1."""
    for name in names:
        require_int(owner, name, getattr(owner, name), 1)


def make_task(setup: LinearSetup, seed: int, weight_prior: WeightPrior) -> LinearRegression:
    """Run ``seed``'s problem: Σ = UᵀDU with its own random U (the paper: 5 runs, 5 different U)."""
    return LinearRegression.random_rotation(
        setup.spectrum,
        generator=generator(derive_seed(seed, "task")),
        rotation=setup.rotation,
        weight_prior=weight_prior,
    )


def _snapshot(model: LinearTransformer, pattern: Pattern) -> dict[str, Tensor]:
    out = {"P": model.P[:, 0], "Q": model.Q[:, 0]} if pattern == "full" else {"A": model.A[:, 0]}
    if pattern == "pattern11":
        out["B"] = model.B[:, 0]
    return out


def training_run(
    setup: LinearSetup,
    *,
    name: str,
    seed: int,
    task: LinearRegression,
    pattern: Pattern,
    n: int | None = None,
    n_layers: int | None = None,
    snapshot: bool = True,
    train: TrainConfig | None = None,
) -> TrainingRun:
    """One linear transformer trained on ``task`` for one seed (init ``derive_seed(seed, "init")``), by ``train``
    (default ``setup.train``)."""
    model = LinearTransformerConfig(
        d=task.d, n_layers=n_layers or setup.n_layers, pattern=pattern, init_std=setup.init_std
    )
    train = train or setup.train
    train = dataclasses.replace(train, checkpoint_every=max(1, train.steps // 10), progress=True)
    return TrainingRun(
        name=name,
        model=ModelSpec(LinearTransformer, model),
        task=functools.partial(task.sample, n=n or setup.n),
        train=train,
        seed=seed,
        init_key=("init",),
        snapshot=functools.partial(_snapshot, pattern=pattern) if snapshot and train.snapshot_every else None,
    )


@dataclass
class SeedRun:
    """What the figures plot of one seed's run: the test-loss curve, the parameter snapshots stacked over
    snapshot steps (``A`` (S, L, d, d), ``B`` for pattern (11)) and the run's Σ."""

    seed: int
    steps: Tensor  # (T,) int64
    test_loss: Tensor  # (T,) float64
    snap_steps: Tensor  # (S,)
    A: Tensor
    Sigma: Tensor
    B: Tensor | None = None


def seed_runs(setup: LinearSetup, ctx: RunContext, *, pattern: Pattern, weight_prior: WeightPrior) -> list[SeedRun]:
    """Train one model per seed, each on its own Σ, and collect its curve and snapshots."""
    tasks = [make_task(setup, s, weight_prior) for s in range(setup.seeds)]
    runs = [training_run(setup, name=f"seed{s}", seed=s, task=t, pattern=pattern) for s, t in enumerate(tasks)]
    out = []
    for s, (task, res) in enumerate(zip(tasks, ctx.execute(runs), strict=True)):
        steps, loss = res.curve_tensor("test_loss")
        snaps = res.snapshots
        out.append(
            SeedRun(
                seed=s,
                steps=steps,
                test_loss=loss,
                snap_steps=torch.tensor(res.snapshot_steps),
                A=snaps["A"],
                B=snaps.get("B"),
                Sigma=task.Sigma,
            )
        )
    return out


def final_test_loss(result: TrainResult) -> Tensor:
    return result.curve_tensor("test_loss")[1][-1]


# ---------------------------------------------------------------------------------------------------------------
# Σ-weighted distances and the Thm-3 S-optimum


def sigma_conj(A: Tensor, Sigma: Tensor) -> Tensor:
    """Σ^½ A Σ^½ (over the last two axes): a_i Σ⁻¹ becomes a_i I."""
    S = sym_sqrt(Sigma)
    return S @ A @ S


def dist_curves(run: SeedRun) -> tuple[Tensor, Tensor]:
    """Dist(A_i, I) and Dist(Σ^½A_iΣ^½, I) over the snapshots, each (S, L)."""
    return dist_to_identity(run.A), dist_to_identity(sigma_conj(run.A, run.Sigma))


def mean_final_loss(runs: list[SeedRun]) -> float:
    """The final test loss averaged over runs."""
    return torch.tensor([r.test_loss[-1] for r in runs]).mean().item()


def learned_steps(runs: list[SeedRun], *, rotate: bool = True) -> Tensor:
    """The learned steps a_i: each layer's mean diagonal of the final Σ^½A_iΣ^½ (of A_i without ``rotate``), sorted
    per run, then averaged over runs (L,)."""
    final = [sigma_conj(r.A[-1], r.Sigma) if rotate else r.A[-1] for r in runs]
    return torch.stack([torch.sort(torch.diagonal(A, dim1=-2, dim2=-1).mean(-1)).values for A in final]).mean(0)


@dataclass
class SparseReference:
    """The Thm-3 S-optimum of pattern (8): the best steps a_i (A_i = a_iΣ⁻¹) and their loss."""

    a: Tensor  # (L,) float64
    loss: float


@dataclass
class SparseRuns:
    """The results of a card that trains the sparse pattern: one run per seed and the Thm-3 S-optimum."""

    runs: list[SeedRun]
    reference: SparseReference

    @classmethod
    def train(
        cls, setup: LinearSetup, ctx: RunContext, pattern: Pattern, prior: WeightPrior, samples: int = 200_000
    ) -> Self:
        """One model per seed (:func:`seed_runs`) and the S-optimum of the set-up (:func:`sparse_reference`)."""
        runs = seed_runs(setup, ctx, pattern=pattern, weight_prior=prior)
        return cls(runs=runs, reference=sparse_reference(setup.d, setup.n, setup.n_layers, samples))


def sparse_reference(d: int, n: int, L: int, samples: int = 200_000) -> SparseReference:
    """The Thm-3 S-optimum: exact for L <= 4, estimated from ``samples`` Wishart draws beyond."""
    a, loss = th.theorem3_optimum(d, n, L, samples=samples, generator=generator(derive_seed(0, "thm3", d, n, L)))
    return SparseReference(a=torch.as_tensor(a, dtype=torch.float64), loss=float(loss))


def layer_dist_panel(ax: Any, runs: list[SeedRun], i: int, title: str) -> None:
    """Mean ± std over runs of Dist(A_i, I) (red) and Dist(Σ^½A_iΣ^½, I) (blue) of layer ``i`` over the snapshots."""
    x = runs[0].snap_steps.numpy()
    band(ax, x, torch.stack([dist_to_identity(r.A[:, i]) for r in runs]), label=f"A_{i}", color="tab:red")
    rot = torch.stack([dist_to_identity(sigma_conj(r.A[:, i], r.Sigma)) for r in runs])
    band(ax, x, rot, label=f"Σ^½A_{i}Σ^½", color="tab:blue")
    ax.set(ylim=(0, 1.02), xlabel="iteration", ylabel="distance to Id", title=title)
    ax.legend(fontsize=7)


def rotated_heatmaps(run: SeedRun, path: Path) -> Path:
    """Σ^½A_iΣ^½ of every layer of ``run`` at the end, one heat map each (Figs 2 and 5)."""
    final = sigma_conj(run.A[-1], run.Sigma)
    fig, axes = subplots(1, final.shape[0], size=(2.6, 2.6))
    for i in range(final.shape[0]):
        heatmap(axes[0, i], final[i], title=f"Σ^½ A_{i} Σ^½")
    return save(fig, path)


def one_panel(size: tuple[float, float] = (4.4, 3.2)) -> tuple[Any, Any]:
    """A figure with a single panel: (figure, axes)."""
    fig, axes = subplots(1, 1, size=size)
    return fig, axes[0, 0]


def log_loss_panel(ax: Any, runs: list[SeedRun], title: str, reference: float | None = None, label: str = "") -> None:
    """Mean ± std over runs of the log test loss, with a dashed reference loss if given."""
    band(ax, runs[0].steps.numpy(), torch.stack([r.test_loss for r in runs]), log=True, color="k", label="test loss")
    if reference is not None:
        ax.axhline(math.log(reference), ls="--", color="tab:green", label=label)
        ax.legend(fontsize=7)
    ax.set(xlabel="iteration", ylabel="log(loss)", title=title)


# ---------------------------------------------------------------------------------------------------------------
# Figures 6 and 7 (App. D): trained transformer vs GD, Σ⁻¹-PGD and least squares

#: Reference test losses of 3 steps of Σ⁻¹-PGD / GD by N and log-losses of L steps at N = 20 (Monte-Carlo, 1e5-2e5
#: prompts: the paper spectrum, w⋆ ~ N(0, Σ⁻¹), all N examples, best constant normalised step).
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
    """``select_last``: the transformer evaluated is the one of the last ``select_last`` parameter snapshots (every
    ``train.snapshot_every`` steps, the final model included) with the lowest loss on the validation episode, as
    the authors' notebooks do (their comment: "given short(er) training steps, may have some unstable
    solutions"); 0 = the final model."""

    step_bounds: tuple[float, float] = (1e-3, 1.5)  # bracket of the constant-step searches
    select_last: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int(self, "select_last", self.select_last, 0)
        require(
            self,
            "select_last",
            not self.select_last or self.train.snapshot_every > 0,
            "0 unless train.snapshot_every > 0 (it selects among the parameter snapshots)",
        )

    def train_for(self, n: int, L: int) -> TrainConfig:
        """The trainer of the (n, L) point: ``train`` (a card whose authors change it by point overrides this)."""
        return self.train


@dataclass
class Baselines:
    """Test losses of L steps of GD and of Σ⁻¹-PGD (best constant step each) and of least squares."""

    gd: float
    gd_step: float
    pgd: float
    pgd_step: float
    ols: float


@dataclass
class ComparisonRow:
    """One (N, L, seed) point of Fig. 6 / 7: the trained transformer's test loss beside the baselines'."""

    n: int
    L: int
    seed: int
    tf: float
    gd: float
    pgd: float
    ols: float
    gd_step: float
    pgd_step: float
    tf_step: int = -1  # the training step of the transformer evaluated (select_last), -1 = the final model


def baselines(cfg: BaselineConfig, task: LinearRegression, n: int, L: int, seed: int) -> tuple[Baselines, Any, Any]:
    """GD and Σ⁻¹-PGD with the best constant step (chosen on a validation batch, as the authors'
    code does), and the Bayes / whitened minimum-norm least-squares predictor, on a test batch;
    returns the losses, the validation episode and the test episode."""
    batch = cfg.train.eval_batch
    val = task.sample(batch, n, generator=generator(derive_seed(seed, "val", n)), dtype=torch.float64)
    test = task.sample(batch, n, generator=generator(derive_seed(seed, "test", n)), dtype=torch.float64)
    eye, prec = torch.eye(task.d, dtype=torch.float64), torch.linalg.inv(task.Sigma)
    out: dict[str, float] = {}
    for name, pre in (("gd", eye), ("pgd", prec)):

        def val_loss(s: float, pre: Tensor = pre) -> float:
            return th.episode_loss(algorithms.pgd(pre, [s] * L), val)

        step, _ = th.best_constant_step(val_loss, cfg.step_bounds)
        out[name] = th.episode_loss(algorithms.pgd(pre, [step] * L), test)
        out[f"{name}_step"] = step
    out["ols"] = th.episode_loss(algorithms.BayesPosteriorMean(), test)
    return Baselines(**out), val, test


def _parameters(model: nn.Module) -> dict[str, Tensor]:
    return {k: p.detach() for k, p in model.named_parameters()}


def select_snapshot(result: TrainResult, last: int, val: Any) -> tuple[LinearTransformer, int]:
    """The model (float64, CPU) of the last ``last`` snapshots of ``result`` with the lowest loss on ``val``, and
    its step: the authors' model selection of Figs 6 and 7 (the best of the last 10 / 20 checkpoints, every 100
    steps, on a validation batch)."""
    model = cast(LinearTransformer, result.model).double().cpu()
    params = dict(model.named_parameters())

    def load(i: int) -> None:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(result.snapshots[k][i])

    count = len(result.snapshot_steps)
    losses = {}
    for i in range(max(count - last, 0), count):
        load(i)
        losses[i] = th.episode_loss(model, val)
    i = min(losses, key=lambda i: (math.isnan(losses[i]), losses[i]))  # the first lowest; a nan never wins
    load(i)
    return model, result.snapshot_steps[i]


def compare(cfg: BaselineConfig, ctx: RunContext, points: list[tuple[int, int]], by: str) -> list[ComparisonRow]:
    """For each (n, L) in ``points`` and each seed: one pattern-(11) transformer trained on the seed's task by
    ``cfg.train_for(n, L)`` (all runs executed together, named ``n<n>-seed<s>`` or ``L<L>-seed<s>`` by ``by``),
    then the baselines on the seed's task and the transformer's loss on the same test episode."""
    jobs, runs = [], []
    for n, L in points:
        for s in range(cfg.seeds):
            task = make_task(cfg, s, "inverse_covariance")
            jobs.append((n, L, s, task))
            name = f"{by}{n if by == 'n' else L}-seed{s}"
            train = cfg.train_for(n, L)
            run = training_run(
                cfg, name=name, seed=s, task=task, pattern="pattern11", n=n, n_layers=L, snapshot=False, train=train
            )
            if cfg.select_last:
                run = dataclasses.replace(run, snapshot=_parameters)
            runs.append(run)
    rows = []
    for (n, L, s, task), res in zip(jobs, ctx.execute(runs), strict=True):
        base, val, test = baselines(cfg, task, n, L, s)
        model, step = (
            select_snapshot(res, cfg.select_last, val)
            if cfg.select_last
            else (cast(LinearTransformer, res.model).double().cpu(), -1)
        )
        tf = th.episode_loss(model, test)
        rows.append(ComparisonRow(n=n, L=L, seed=s, tf=tf, tf_step=step, **dataclasses.asdict(base)))
    return rows


def method_plot(rows: list[ComparisonRow], by: str, lines: tuple[tuple[str, str, str], ...], log: bool) -> Any:
    """The one panel of Fig. 6 / 7: for each (key, label, style) of ``lines``, ``row.<key>`` averaged over seeds (its
    log with ``log``) against ``row.<by>``; returns (figure, axes) for the card to finish."""
    fig, ax = one_panel()
    for key, label, style in lines:
        m = mean_by(rows, key, by, log=log)
        ax.plot(list(m), list(m.values()), style, label=label, ms=4)
    return fig, ax


def mean_by(rows: list[ComparisonRow], key: str, by: str, *, log: bool = False) -> dict[int, float]:
    """Mean of ``row.<key>`` (of its log with ``log``: what the authors' Figs 6 and 7 plot) over seeds, by
    ``row.<by>`` (``n`` or ``L``), in first-seen order."""
    out: dict[int, list[float]] = {}
    for r in rows:
        v = getattr(r, key)
        out.setdefault(getattr(r, by), []).append(math.log(v) if log else v)
    return {k: sum(v) / len(v) for k, v in out.items()}
