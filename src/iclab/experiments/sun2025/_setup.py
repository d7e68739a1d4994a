"""The set-up shared by the sun2025 cards: App. I's training settings, the polynomial task, the bilinear models,
one :class:`~iclab.training.TrainingRun` per (model, seed), the test-length sweep and the shared panels.

Choices where the paper is silent (docs/papers/sun2025.md, "Stability"): the label row enters the prompt as
y/√E[y²] and the read-out is rescaled (an exact reparameterisation of the paper's P, Q), W_1 = P = 0 at init (every
block starts as the identity), N(0, 0.02²) for W_0 and Q, global gradient-norm clipping at 1, test lengths 25-300,
error bands ± 1 std over seeds. Without the first two, deep models (L ≥ 4) reach NaN at lr 1e-3 (L = 12 already
overflows at a N(0, 0.05²) init); with them L ≤ 6 trains at lr 1e-3, while L = 12 at small batches and short prompts
still hits rare per-prompt overshoots.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import Tensor

from iclab import tasks
from iclab.core.episode import Episode
from iclab.core.errors import is_int, require, require_int
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig
from iclab.plotting import band
from iclab.theory import mc_loss
from iclab.theory import polynomial_features as pf
from iclab.training import ModelSpec, TrainConfig, TrainingRun

#: The training part of every smoke preset: seconds (claims it cannot meet carry a smoke reason).
SMOKE = dict(seeds=1, steps=6, batch_size=64, n=20, eval_batch=256, eval_every=3, snapshot_every=3, test_batch=512)
#: quick: 1 seed, short prompts, a 10× larger learning rate with warm-up and cosine decay (minutes on 2 cores;
#: fine for L <= 2; L = 4 diverges at this lr even with the stabilising parameterisation).
QUICK = dict(
    seeds=1,
    n=50,
    batch_size=256,
    steps=700,
    lr=1e-2,
    warmup_steps=50,
    schedule="cosine",
    eval_every=50,
    snapshot_every=100,
    eval_batch=4096,
    test_batch=20_000,
    subnet_batch=4096,
)


def paper_train(**changes: Any) -> TrainConfig:
    """App. I: Adam lr 1e-3, no weight decay, 4000 fresh prompts per step, 20 000 steps; the paper names no ε
    (PyTorch's 1e-8) and no clipping (global norm 1 here, see the module docstring). A rare prompt whose in-context
    iteration overshoots gives an inf gradient: that step is skipped (``skip_nonfinite``). ℓ-block sub-network losses
    (Fig. 5-9) every 500 steps."""
    base = TrainConfig(
        steps=20_000,
        batch_size=4000,
        optimizer="adam",
        lr=1e-3,
        eps=1e-8,
        schedule="constant",
        warmup_steps=0,
        clip=1.0,
        clip_mode="global",
        skip_nonfinite=True,
        eval_every=100,
        eval_batch=4000,
        snapshot_every=500,
        dtype="float32",
    )
    return dataclasses.replace(base, **changes)


def require_ints(owner: Any, name: str, values: Any, low: int, *, min_len: int = 1) -> None:
    """``owner.name`` must be a tuple of at least ``min_len`` distinct ints >= ``low``."""
    ok = isinstance(values, tuple | list) and len(values) >= min_len and all(is_int(v, low) for v in values)
    ok = ok and len(set(values)) == len(values)
    require(owner, name, ok, f"a tuple of at least {min_len} distinct int(s) >= {low}", values)


def require_positive_ints(owner: Any, *names: str) -> None:
    """Each ``owner.<name>`` must be an int >= 1."""
    for name in names:
        require_int(owner, name, getattr(owner, name), 1)


def require_choices(owner: Any, name: str, values: Any, allowed: tuple[str, ...]) -> None:
    ok = isinstance(values, tuple | list) and len(values) >= 1 and all(v in allowed for v in values)
    require(
        owner,
        name,
        ok and len(set(values)) == len(values),
        f"a non-empty tuple of distinct entries of {allowed}",
        values,
    )


@dataclass(frozen=True, kw_only=True)
class BilinearSetup:
    """The task, the model options and App. I's training (``train``) shared by every trained sun2025 card; 5 seeds."""

    seeds: int = 5
    d: int = 3
    d_bar: int = 12
    n: int = 200  # n_train
    monomials: str = "quadratic"
    init_std: float = 0.02
    init: Literal["gaussian", "identity"] = "identity"  # W_1 = P = 0 at init: every block is the identity
    normalise_labels: bool = True  # label_scale = √E[y²] (an exact reparameterisation; see the module docstring)
    subnet_batch: int = 4000  # prompts of the ℓ-block sub-network losses (Fig. 5-9)
    test_ns: tuple[int, ...] = (25, 50, 100, 150, 200, 250, 300)
    test_batch: int = 100_000
    train: TrainConfig = field(default_factory=paper_train)

    def __post_init__(self) -> None:
        """Reject bad sizes before any model trains (a d̄ too small for the last d of a sweep used to fail only after
        the earlier d had trained). Subclasses check their own tuple fields first, then call this."""
        require_int(self, "seeds", self.seeds, 1)
        require_int(self, "d", self.d, 1)
        require_int(self, "n", self.n, 1, "context pairs per training prompt")
        require_ints(self, "test_ns", self.test_ns, 1)
        require_int(self, "test_batch", self.test_batch, 2, "Monte-Carlo prompts per test length")
        require_int(self, "subnet_batch", self.subnet_batch, 1)
        require_int(self, "d_bar", self.d_bar, 1)
        unset = TrainConfig().checkpoint_every  # the cards checkpoint every train.steps / 10 themselves
        require(self, "train.checkpoint_every", self.train.checkpoint_every == unset,
                f"left at {unset}: these cards checkpoint every train.steps / 10", self.train.checkpoint_every)  # fmt: skip
        for d in self._model_ds():
            low = self._min_d_bar(d)
            require(
                self,
                "d_bar",
                self.d_bar >= low,
                f"an int >= {low} for d = {d} (BilinearTransformerConfig's minimum: d + 1, d + 2 for a sparse FFN)",
            )

    def _model_ds(self) -> tuple[int, ...]:
        """The input dimensions d of the models built from ``d_bar``."""
        return (self.d,)

    def _min_d_bar(self, d: int) -> int:
        """The smallest d̄ that :class:`BilinearTransformerConfig` accepts for the FFNs this experiment builds."""
        return d + 1


def make_task(cfg: BilinearSetup, d: int | None = None) -> tasks.PolynomialRegression:
    return tasks.PolynomialRegression(d=cfg.d if d is None else d, monomials=cfg.monomials)


def model_base(cfg: BilinearSetup, d: int) -> dict[str, Any]:
    """The model options shared by every trained model: d, d̄ and the stabilising parameterisation."""
    scale = math.sqrt(make_task(cfg, d).zero_predictor_loss()) if cfg.normalise_labels else 1.0
    return dict(d=d, d_bar=cfg.d_bar, init_std=cfg.init_std, init=cfg.init, label_scale=scale)


def block_losses(model: BilinearTransformer, episode: Episode) -> Tensor:
    """(L+1,) test loss of the ℓ-block sub-networks, ℓ = 0..L (App. H)."""
    assert episode.y_query is not None
    return ((model.block_predictions(episode, fused=True) - episode.y_query) ** 2).mean(-1)


def _block_loss_snapshot(model: BilinearTransformer, *, episode: Episode) -> dict[str, Tensor]:
    """The trainer's snapshot: the ℓ-block sub-network losses on a fixed episode (Fig. 5-9)."""
    return {"block_loss": block_losses(model, episode)}


def bilinear_run(
    cfg: BilinearSetup,
    device: torch.device,
    *,
    seed: int,
    task: tasks.PolynomialRegression,
    model_cfg: BilinearTransformerConfig,
    name: str,
    n: int | None = None,
) -> TrainingRun:
    """One model trained on ``task`` for one seed (its run directory: ``name``); snapshots hold the sub-network losses
    on ``cfg.subnet_batch`` prompts drawn on ``device`` from ``derive_seed(seed, "subnet")``; the model's init is
    ``generator(derive_seed(seed, "init", name))``.

    ``n``: context pairs per training prompt, ``cfg.n`` when None (an explicit value, even an invalid one, is used).
    """
    n = cfg.n if n is None else n
    dtype = getattr(torch, cfg.train.dtype)
    sub = task.sample(cfg.subnet_batch, n, generator=generator(derive_seed(seed, "subnet"), device), dtype=dtype)
    return TrainingRun(
        name=name,
        model=ModelSpec(BilinearTransformer, model_cfg),
        task=functools.partial(task.sample, n=n),
        train=dataclasses.replace(cfg.train, checkpoint_every=max(1, cfg.train.steps // 10)),
        seed=seed,
        init_key=("init", name),
        snapshot=functools.partial(_block_loss_snapshot, episode=sub),
    )


def loss_vs_length(
    model: BilinearTransformer, task: Any, ns: tuple[int, ...], batch: int, seed: int
) -> list[tuple[float, float]]:
    """(mean, standard error) of the float64 test loss at every test length.

    The bilinear transformer is a polynomial in the prompt, finite in exact arithmetic, so a nan error can only be an
    overflow inside the stack (inf − inf): on prompts far shorter than its training ones a deep model explodes, and
    such a length's loss is reported as inf (overflowed float64), not nan.
    """
    m = model.double().cpu()
    out = []
    for n in ns:
        g = generator(derive_seed(seed, "test-length", n))
        mean, se = mc_loss(m, task, n, batch, generator=g, chunks=max(1, batch * n // 2_000_000))
        out.append((math.inf, math.inf) if math.isnan(mean) else (mean, se))
    model.float()
    return out


@dataclass
class ModelRow:
    """One trained model of one seed: its training curves, sub-network losses and test loss at every test length."""

    d: int
    model: str  # the model's label, e.g. "linear", "L4", "sparse", "n_train=100", "ffn_first-L2"
    seed: int
    n_train: int
    steps: Tensor  # (T,) steps of the training test-loss curve
    test_loss: Tensor  # (T,) float64
    snap_steps: Tensor  # (S,) steps of the sub-network snapshots
    block_loss: Tensor  # (S, L+1) ℓ-block sub-network losses
    length_loss: Tensor  # (len(test_ns),) float64 Monte-Carlo test loss at every test length
    length_se: Tensor  # (len(test_ns),) its standard error
    floor_gap: tuple[float, float] | None = None  # linear_depth: paired gap to the affine oracle (mean, se)


#: one group of models trained together: {label: model config}, the input dimension d, the training length n
#: (None: ``cfg.n``)
ModelGroup = tuple[dict[str, BilinearTransformerConfig], int, int | None]


def run_models(
    cfg: BilinearSetup,
    ctx: RunContext,
    models: dict[str, BilinearTransformerConfig],
    d: int,
    n: int | None = None,
    measure: Callable[[BilinearTransformer, int], dict[str, Any]] | None = None,
) -> list[ModelRow]:
    """Train every model for every seed (one :class:`TrainingRun` each, run directory ``d{d}-{label}-n{n}-seed{s}``)
    and measure each; one row each. ``measure(model, seed)`` sets further fields of the row."""
    return run_model_groups(cfg, ctx, [(models, d, n)], measure)


def run_model_groups(
    cfg: BilinearSetup,
    ctx: RunContext,
    groups: list[ModelGroup],
    measure: Callable[[BilinearTransformer, int], dict[str, Any]] | None = None,
) -> list[ModelRow]:
    """:func:`run_models` for several (models, d, n) groups, every run in one batch (so that every worker of
    ``--workers`` / Ray stays busy); rows in group, label, seed order."""
    jobs = []  # (label, seed, d, n_train, task, model config)
    for models, d, n in groups:
        task, n_train = make_task(cfg, d), cfg.n if n is None else n
        jobs += [(label, s, d, n_train, task, models[label]) for label in models for s in range(cfg.seeds)]
    runs = [
        bilinear_run(
            cfg, ctx.device, seed=s, task=task, model_cfg=mc, name=f"d{d}-{label}-n{n_train}-seed{s}", n=n_train
        )
        for label, s, d, n_train, task, mc in jobs
    ]
    rows = []
    for (label, s, d, n_train, task, _), res in zip(jobs, ctx.execute(runs), strict=True):
        model = cast(BilinearTransformer, res.model)
        steps, loss = res.curve("test_loss")
        lengths = loss_vs_length(model, task, cfg.test_ns, cfg.test_batch, s)
        row = ModelRow(
            d=d,
            model=label,
            seed=s,
            n_train=n_train,
            steps=torch.tensor(steps),
            test_loss=torch.tensor(loss, dtype=torch.float64),
            snap_steps=torch.tensor(res.snapshot_steps),
            block_loss=res.snapshots["block_loss"],
            length_loss=torch.tensor([m for m, _ in lengths]),
            length_se=torch.tensor([s_ for _, s_ in lengths]),
        )
        rows.append(dataclasses.replace(row, **measure(model, s)) if measure is not None else row)
    return rows


def at(cfg: BilinearSetup, row: ModelRow, n: int) -> tuple[float, float]:
    """(loss, standard error) of ``row`` at test length ``n`` (the nearest of ``cfg.test_ns``)."""
    ns = cfg.test_ns
    i = ns.index(n) if n in ns else min(range(len(ns)), key=lambda k: abs(ns[k] - n))
    return float(row.length_loss[i]), float(row.length_se[i])


def upper(cfg: BilinearSetup, row: ModelRow, n: int, k: float = 3.0) -> float:
    """loss + ``k`` standard errors of ``row`` at test length ``n``."""
    loss, se = at(cfg, row, n)
    return loss + k * se


def mean_at(rows: list[ModelRow], cfg: BilinearSetup, n: int) -> float:
    """Mean over ``rows`` (seeds) of the loss at test length ``n``."""
    return sum(at(cfg, r, n)[0] for r in rows) / len(rows)


def affine_stats(cfg: BilinearSetup) -> pf.FeatureStats:
    """Lemma-8 statistics of the features (1, x) that a linear TF's query carries (Prop. 1)."""
    return pf.feature_statistics(pf.linear_feature_polys(cfg.d), cfg.d, cfg.monomials)


def decorate(ax: Any, xlabel: str, ylabel: str = "", title: str = "", *, xlog: bool = False) -> None:
    """The look of every sun2025 panel: a log y axis (and x axis if ``xlog``), labels, title and a small legend."""
    if xlog:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7)


def length_panel(ax: Any, cfg: BilinearSetup, rows: list[ModelRow], title: str, floor: float | None) -> None:
    """Test loss vs test length, mean ± spread over seeds, one band per model label (log scale)."""
    for label in dict.fromkeys(r.model for r in rows):
        rs = [r for r in rows if r.model == label]
        band(ax, list(cfg.test_ns), torch.stack([r.length_loss for r in rs]), label=str(label), marker="o", ms=3)
    if floor is not None:
        ax.axhline(floor, ls="--", color="gray", lw=0.8, label="affine floor (Prop. 1)")
    decorate(ax, "test prompt length n", "ICL test loss", title)


def model_curves(ax: Any, rows: list[ModelRow], title: str) -> None:
    """Test loss over training, mean ± spread over seeds, one band per model label (log scale)."""
    for label in dict.fromkeys(r.model for r in rows):
        rs = [r for r in rows if r.model == label]
        band(ax, rs[0].steps.numpy(), torch.stack([r.test_loss for r in rs]), label=label)
    decorate(ax, "iteration", title=title)
