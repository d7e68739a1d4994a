"""The set-up every wang2025 card shares (the authors' code): the training protocol, the authors' learning-rate table,
the cross-entropy loss, one fixed-L-contexts training run with its early-stopped test numbers, the §6.1 task with
its Bayes rate, and the panels of the GD-per-depth figures.

Protocol: one W_e per experiment (data seed 0), a fixed training set of L contexts per seed drawn once
(``train.train_size``), minibatches of 512, validation and test sets of 2048 contexts; the validation NLL, test NLL
and test accuracy are recorded every ``train.snapshot_every`` updates (the trainer's snapshot function,
:func:`eval_metrics`) and the reported numbers are the test values at the best validation NLL (early stopping,
:func:`record`). Differences from the authors' code: docs/papers/wang2025.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from iclab.algorithms.classification import accuracy, nll
from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.learner import Learner
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models.categorical_attention import (
    CategoricalTransformer,
    CategoricalTransformerConfig,
    SingleStepCategorical,
)
from iclab.plotting import band
from iclab.tasks.categorical import RBFMixtureCategorical
from iclab.training import ModelSpec, TrainConfig, TrainingRun
from iclab.training.trainer import SnapshotFn, TrainResult

COLORS = {"gd": "tab:blue", "free": "tab:red", "probe": "k"}
LABELS = {"gd": "GD", "free": "Trained TF"}
MODES = ("gd", "free")


def ce_loss(model: nn.Module, episode: Episode) -> Tensor:
    """Cross-entropy of the query label: −(1/B) Σ log p(y_{N+1} | x_{N+1}, context) (§4)."""
    assert episode.label_query is not None  # a classification episode
    return nn.functional.cross_entropy(cast(Learner, model).predict(episode), episode.label_query)


def _paper_train() -> TrainConfig:
    """The trainer settings shared by every model (the authors' code): minibatch 512, global-norm clip 1.0, the val/test
    metrics every 100 updates; the rest is set per model by :func:`run_train_config`."""
    return TrainConfig(batch_size=512, clip=1.0, clip_mode="global", eval_every=0, snapshot_every=100)


#: TrainConfig fields set for each run (:func:`run_train_config`, the run's seed): a value in ``train`` would be
#: ignored, so it is refused
_PER_RUN = (
    "steps", "lr", "optimizer", "betas", "schedule", "step_every", "step_gamma", "train_size", "eval_batch",
    "checkpoint_every", "seed",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CatSetup:
    """Training set-up shared by every figure; defaults are the paper's (JAX code) settings.

    ``train`` holds the trainer settings shared by every model (minibatch — capped at L —, clip, ``snapshot_every``
    = updates between the val/test evaluations, dtype); the optimiser (Adam for GD, AdamW β = (0.9, 0.98) for the
    Trained TF), lr and schedule, the number of updates and the training-set size are set per model.
    """

    seeds: int = 5
    d: int = 10
    num_classes: int = 25
    d_embed: int = 5
    n: int = 125  # N context pairs
    data_scale: float = 10.0  # λ of eq. (45)
    kernel: Literal["linear", "rbf", "exp", "laplacian", "softmax"] = "softmax"
    epochs: int = 5000  # passes over the L training contexts (updates = epochs · ⌈L / 512⌉) …
    max_updates: int | None = None  # … capped here (quick presets)
    lr_gd: float | None = None  # None: the authors' lr and staircase for the model (``paper_optimiser``)
    lr_tf: float | None = None  # a number: that lr, constant
    init_std: float = 0.01  # free matrices
    val_size: int = 2048
    test_size: int = 2048
    bayes_contexts: int = 4096
    train: TrainConfig = field(default_factory=_paper_train)

    def __post_init__(self) -> None:
        for name in ("lr_gd", "lr_tf"):
            v = getattr(self, name)
            require(self, name, v is None or v > 0, "null (the authors' table) or a float > 0", v)
        require_int(self, "seeds", self.seeds, 1)
        default = TrainConfig()
        for name in _PER_RUN:
            value, unset = getattr(self.train, name), getattr(default, name)
            require(self, f"train.{name}", value == unset, f"left at {unset!r}: it is set per model (updates from "
                    "epochs / max_updates, lr from lr_gd / lr_tf or the authors' table)", value)  # fmt: skip

    #: which row set of the authors' lr table applies: "synthetic" (§6.1, App. F) or "image" (§6.2)
    data: ClassVar[Literal["synthetic", "image"]] = "synthetic"

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.train.dtype)

    def updates(self, L: int) -> int:
        per_epoch = max(1, math.ceil(L / min(self.train.batch_size, L)))
        total = self.epochs * per_epoch
        return total if self.max_updates is None else min(total, self.max_updates)


@dataclass(frozen=True, kw_only=True)
class DepthSetup(CatSetup):
    """The set-up of a GD-per-depth figure (Figs. 3 and 4 right): the GD model with each number of blocks on L
    fixed training contexts."""

    L: int = 2048
    blocks: tuple[int, ...] = (1, 2, 3, 4, 5, 6)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int(self, "L", self.L, 1)


_TABLE_KERNEL = {"softmax": "softmax", "exp": "softmax", "rbf": "rbf", "laplacian": "rbf", "linear": "linear"}


def paper_optimiser(
    kernel: str, n_blocks: int, mode: str, data: Literal["synthetic", "image"] = "synthetic"
) -> dict[str, Any]:
    """The authors' learning rate and staircase decay for one model (their code's ``conf_init``), as
    :class:`~iclab.training.TrainConfig` fields ``lr``, ``schedule`` and, for ``'step'``, ``step_every``/``step_gamma``.

    Synthetic data (§6.1, App. F): Trained TF (``mode='free'``) 1e-3 with one block; with two or more, softmax 5e-4
    (no schedule), rbf 1e-5 and linear 5e-4 with ×0.5 every 500 updates. GD: 1e-3 with one block or more than three,
    else softmax 5e-4 (no schedule), rbf 2e-4 and linear 1e-4; GD decays ×0.8 every 1000 updates (rbf with two or
    more blocks ×0.85) except where "no schedule" is stated. Image episodes (§6.2): 1e-3 for both models, but GD with
    the linear kernel and one block 5e-5. The table has no exp or Laplacian row: exp uses softmax's (both exponentiate
    a dot product), Laplacian rbf's (both are distance kernels); docs/errata.md (Wang et al. 2025).
    """
    require("paper_optimiser", "mode", mode in MODES, "'gd' or 'free'", mode)
    require("paper_optimiser", "kernel", kernel in _TABLE_KERNEL, f"one of {sorted(_TABLE_KERNEL)}", kernel)
    require_int("paper_optimiser", "n_blocks", n_blocks, 1)
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


def _optimiser(setup: CatSetup, model: nn.Module | ModelSpec, mode: str, lr: float | None) -> dict[str, Any]:
    """TrainConfig fields for one run: ``lr`` if given, else the setup's ``lr_gd``/``lr_tf`` (constant), else the
    authors' table for this model's kernel and depth (:func:`paper_optimiser`); ``model`` built or a ModelSpec."""
    lr = lr if lr is not None else (setup.lr_gd if mode == "gd" else setup.lr_tf)
    if lr is not None:
        return {"lr": lr, "schedule": "constant"}
    cls = model.cls if isinstance(model, ModelSpec) else type(model)
    cfg: Any = model.config  # a CategoricalTransformerConfig
    n_blocks = 1 if issubclass(cls, SingleStepCategorical) else cfg.n_blocks
    return paper_optimiser(cfg.kernel, n_blocks, mode, setup.data)


def run_train_config(
    setup: CatSetup,
    model: nn.Module | ModelSpec,
    mode: str,
    L: int,
    *,
    lr: float | None = None,
    steps: int | None = None,
) -> TrainConfig:
    """The TrainConfig of one model trained on L fixed contexts: ``setup.train`` with ``steps`` updates (default
    ``setup.updates(L)``), minibatches of min(batch_size, L), Adam (GD) / AdamW β = (0.9, 0.98) (Trained TF), the
    lr of :func:`_optimiser`, the val/test metrics every min(snapshot_every, steps) updates, 4 checkpoints."""
    steps = setup.updates(L) if steps is None else steps
    gd = mode == "gd"
    return dataclasses.replace(
        setup.train,
        steps=steps,
        batch_size=min(setup.train.batch_size, L),
        train_size=L,
        optimizer="adam" if gd else "adamw",
        **_optimiser(setup, model, mode, lr),
        betas=(0.9, 0.999) if gd else (0.9, 0.98),
        eval_batch=min(setup.test_size, 256),
        snapshot_every=max(1, min(setup.train.snapshot_every, steps)),
        checkpoint_every=max(1, steps // 4),
    )


def eval_metrics(
    model: nn.Module, *, val: Episode, test: Episode, extra: SnapshotFn | None = None
) -> dict[str, Tensor]:
    """The trainer's snapshot: validation NLL, test NLL and accuracy, and ``extra(model)``'s curves."""
    assert val.label_query is not None and test.label_query is not None  # classification episodes
    lv = cast(Learner, model).predict(val)
    lt = cast(Learner, model).predict(test)
    more = extra(model) if extra is not None else {}
    return {
        "val_nll": nll(lv, val.label_query),
        "test_nll": nll(lt, test.label_query),
        "test_acc": accuracy(lt, test.label_query),
        **more,
    }


def fixed_L_run(
    setup: CatSetup,
    name: str,
    model: nn.Module | ModelSpec,
    sample: Any,
    L: int,
    *,
    seed: int,
    mode: str,
    val: Episode,
    test: Episode,
    lr: float | None = None,
    steps: int | None = None,
    extra: SnapshotFn | None = None,
    init_key: tuple[str | int, ...] = ("init",),
    train_overrides: dict[str, Any] | None = None,
) -> TrainingRun:
    """One model trained on a fixed set of L contexts (``sample``: the task's sampler) with the cross-entropy loss,
    recording :func:`eval_metrics` (plus ``extra``'s curves); ``train_overrides``: TrainConfig fields (e.g. an lr
    schedule). :func:`record` turns its result into the early-stopped test numbers."""
    val, test = val.to(dtype=setup.dtype), test.to(dtype=setup.dtype)
    train = run_train_config(setup, model, mode, L, lr=lr, steps=steps)
    if train_overrides:
        train = dataclasses.replace(train, **train_overrides)
    return TrainingRun(
        name=name,
        model=model,
        task=sample,
        train=train,
        seed=seed,
        init_key=init_key,
        loss=ce_loss,
        snapshot=functools.partial(eval_metrics, val=val, test=test, extra=extra),
        test_episode=test,
    )


_METRICS = ("val_nll", "test_nll", "test_acc")


@dataclass
class RunRecord:
    """One trained model: its curves, recorded every ``snapshot_every`` updates, and its early-stopped test
    numbers (the test accuracy / NLL at the snapshot of least validation NLL)."""

    steps: Tensor  # (S,) updates at which the curves were recorded
    val_nll: Tensor  # (S,)
    test_nll: Tensor  # (S,)
    test_acc: Tensor  # (S,)
    best_step: int
    acc: float
    nll: float
    seconds: float
    extra: dict[str, Tensor] = field(default_factory=dict)  # further snapshot curves, (S, ...) each


def record(res: TrainResult) -> RunRecord:
    """The curves and early-stopped test numbers of one :func:`fixed_L_run` result."""
    snaps = res.snapshots
    best = int(torch.argmin(snaps["val_nll"]))
    return RunRecord(
        steps=torch.tensor(res.snapshot_steps),
        val_nll=snaps["val_nll"],
        test_nll=snaps["test_nll"],
        test_acc=snaps["test_acc"],
        best_step=res.snapshot_steps[best],
        acc=float(snaps["test_acc"][best]),
        nll=float(snaps["test_nll"][best]),
        seconds=res.seconds,
        extra={k: v for k, v in snaps.items() if k not in _METRICS},
    )


@dataclass
class RunGroup:
    """The seeds of one model: their records and the mean / std of the early-stopped test accuracy and NLL."""

    runs: list[RunRecord]
    acc: float
    acc_std: float
    nll: float
    nll_std: float


def summary(runs: list[RunRecord]) -> RunGroup:
    acc = torch.tensor([r.acc for r in runs], dtype=torch.float64)
    nl = torch.tensor([r.nll for r in runs], dtype=torch.float64)
    sd = lambda t: float(t.std()) if t.numel() > 1 else 0.0  # noqa: E731
    return RunGroup(runs=runs, acc=float(acc.mean()), acc_std=sd(acc), nll=float(nl.mean()), nll_std=sd(nl))


@dataclass
class BayesRates:
    """The Bayes classifier on the test queries (E[max p], its accuracy and NLL) and its Monte-Carlo rate."""

    test_max_prob: float
    test_acc: float
    test_nll: float
    mc_rate: float
    mc_stderr: float


def bayes_rates(task: Any, test: Episode, contexts: int) -> BayesRates:
    """Bayes numbers of ``task`` on ``test`` (float64, with ``p_query``) and its Monte-Carlo rate (seed 0)."""
    mc = task.bayes_rate(generator=generator(derive_seed(0, "bayes")), contexts=contexts, points=16)
    p = test.task["p_query"]
    assert test.label_query is not None
    return BayesRates(
        test_max_prob=float(p.amax(-1).mean()),  # E[max p] on the test queries
        test_acc=float((p.argmax(-1) == test.label_query).double().mean()),
        test_nll=float(-p.gather(1, test.label_query[:, None]).log().mean()),
        mc_rate=mc.mean,
        mc_stderr=mc.stderr,
    )


def held_out(setup: CatSetup, source: Any) -> tuple[Episode, Episode]:
    """The validation set (the setup's dtype) and the test set (float64) of ``source``'s sampler, data seed 0."""
    val = source.sample(setup.val_size, setup.n, generator=generator(derive_seed(0, "val")), dtype=setup.dtype)
    test = source.sample(setup.test_size, setup.n, generator=generator(derive_seed(0, "test")), dtype=torch.float64)
    return val, test


def synthetic(setup: CatSetup) -> tuple[RBFMixtureCategorical, Episode, Episode, BayesRates]:
    """The §6.1 task with one W_e, its validation and test sets, and the Bayes rate (test set and Monte Carlo)."""
    task = RBFMixtureCategorical.draw(
        generator=generator(derive_seed(0, "W_e")),
        d=setup.d,
        num_classes=setup.num_classes,
        d_embed=setup.d_embed,
        scale=setup.data_scale,
    )
    val, test = held_out(setup, task)
    bayes = bayes_rates(task, test, setup.bayes_contexts)
    return task, val, test.to(dtype=setup.dtype), bayes


def model_spec(
    setup: CatSetup, n_blocks: int, mode: str, *, cls: type[nn.Module] = CategoricalTransformer, **kw: Any
) -> ModelSpec:
    """The K-block categorical transformer (``mode='gd'``: GD, ``'free'``: the Trained TF; ``cls``: e.g. the
    single-step model) with the setup's kernel unless ``kw`` gives one, built from the run's ``init`` generator."""
    cfg = CategoricalTransformerConfig(
        d=setup.d,
        d_embed=setup.d_embed,
        num_classes=setup.num_classes,
        n_blocks=n_blocks,
        mode=mode,  # type: ignore[arg-type]  # a str; CategoricalTransformerConfig checks it
        init_std=setup.init_std,
        **{"kernel": setup.kernel, **kw},
    )
    return ModelSpec(cls, cfg)


def seed_runs(setup: CatSetup, name: str, model: ModelSpec, sample: Any, L: int, **kw: Any) -> list[TrainingRun]:
    """:func:`fixed_L_run` of one model for every seed, named ``<name>-seed<s>`` (``kw``: its keywords)."""
    return [fixed_L_run(setup, f"{name}-seed{s}", model, sample, L, seed=s, **kw) for s in range(setup.seeds)]


def train_groups(ctx: RunContext, groups: list[list[TrainingRun]]) -> list[RunGroup]:
    """Train every group of runs (one model's seeds) in one batch; each group's records and summary."""
    return [summary([record(r) for r in results]) for results in ctx.execute_groups(groups)]


def gd_per_depth(cfg: DepthSetup, ctx: RunContext, sample: Any, val: Episode, test: Episode) -> dict[int, RunGroup]:
    """The GD model with each number of blocks in ``cfg.blocks``, every seed, on ``cfg.L`` fixed contexts:
    {K: RunGroup}."""
    groups = [
        seed_runs(cfg, f"gd-K{K}", model_spec(cfg, K, "gd"), sample, cfg.L, mode="gd", val=val, test=test)
        for K in cfg.blocks
    ]
    return dict(zip(cfg.blocks, train_groups(ctx, groups), strict=True))


def gd_curves(axes: Any, gd: dict[int, RunGroup], blocks: list[int], color: Any, prefix: str) -> None:
    """Test accuracy (left) and NLL (right) over updates, ± std over seeds, one band per block count."""
    for i, K in enumerate(blocks):
        runs = gd[K].runs
        x = runs[0].steps.numpy()
        for ax, key in zip(axes[0], ("test_acc", "test_nll"), strict=True):
            band(ax, x, torch.stack([getattr(r, key) for r in runs]), label=f"{prefix}{K} block(s)", color=color(i))


def label_curves(axes: Any, acc_label: str, fontsize: int) -> None:
    """Axis labels and legends of :func:`gd_curves`' two panels (after their reference lines are drawn)."""
    for ax, name in zip(axes[0], (acc_label, "NLL"), strict=True):
        ax.set_xlabel("optimizer updates")
        ax.set_ylabel(name)
        ax.legend(fontsize=fontsize)


#: smoke: seconds, checks that everything runs (claims a few updates cannot meet are listed as not checked)
SMOKE: dict[str, Any] = dict(
    seeds=1, n=20, batch_size=32, max_updates=4, snapshot_every=2, val_size=64, test_size=64, bayes_contexts=64
)
#: quick (one seed, ~1 min per figure on 2 CPU cores): minibatch 128 instead of 512 and 150 updates; lr 0.03 for
#: both models. At lr 3e-3 the free Trained TF was far from converged after 150 updates (1 block, L = 4096: acc
#: 0.51); at lr 0.03 it reaches 0.71 (GD 0.74), so the quick claims keep near-paper tolerances. Figures with
#: K >= 2 blocks (full N+1 attention in every block but the last) use minibatch 64 and fewer updates.
QUICK: dict[str, Any] = dict(
    seeds=1,
    batch_size=128,
    max_updates=150,
    snapshot_every=25,
    val_size=512,
    test_size=512,
    lr_gd=0.03,
    lr_tf=0.03,
    bayes_contexts=1024,
)
