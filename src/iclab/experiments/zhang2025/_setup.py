"""The set-up shared by the zhang2025 cards: the data (Λ, N), the GD regimes, one batched training run in chunks
(:func:`train_batched`), the token-level layers of Figs 5 and 14, and the shared loss panels.

Conventions: models carry the paper's 1/N (eq. M, S), the loss is the query MSE without ½ (eq. 5), time is
t/τ = 2·lr·step. ``regime='population'`` integrates the exact population gradient flow
(:func:`iclab.training.population.population_flow`); ``regime='full_batch'`` is the paper's plain GD on P fixed
sequences per seed. The code's hyper-parameters map to this parametrisation as: ATTN_M lr' = N·lr, init ×√N;
ATTN_S lr' = N^{2/3}·lr, init ×N^{1/3}, so the code's ATTN_S run (lr 0.02, 10 001 epochs, init
0.01) is lr 0.2, 10 001 steps, w_init ≈ 0.07 here. Theory overlays (dashed): eq. (19)/(26) plateau levels,
eq. (10)/(51) white time course, the ODE (21), all from :mod:`iclab.theory.attention_dynamics`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from iclab.core.config import added_setting
from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.tasks.linear_regression import LinearRegression, rotated_covariance
from iclab.theory import attention_dynamics as ad
from iclab.training import ModelSpec, TrainConfig, TrainingRun, Trajectory
from iclab.training.config import DType

F64 = torch.float64
PAPER_SPECTRUM = (0.4, 0.3, 0.2, 0.1)  # Figs 1, 3, 5, 6, 8, 11 (the official notebook)
INV_D8 = tuple(1.0 / d for d in range(1, 9))  # Figs 4, 12: λ_d ∝ 1/d (normalised to trace 1)
Regime = Literal["population", "full_batch"]
DYNAMICS = ("reduced", "all_blocks")


def sgd(*, lr: float, steps: int, eval_every: int = 10, dtype: DType = "float64") -> TrainConfig:
    """Plain GD as the paper trains (``torch.optim.SGD`` without momentum), float64 unless ``dtype`` says otherwise;
    ``eval_every`` is the interval at which the reduced regimes record the parameters and losses. The full-batch
    size P is the card's ``train_size`` (set as ``batch_size = train_size`` when a run is built)."""
    return TrainConfig(optimizer="sgd", lr=lr, steps=steps, eval_every=eval_every, dtype=dtype)


@dataclass(frozen=True, kw_only=True)
class Setup:
    """One training set-up of the paper: data (Λ, N), model size, init and the GD regime (``train``)."""

    seeds: int = 6
    d: int = 4
    n: int = 31  # context length N (the code's --seq_len 32 includes the query)
    spectrum: tuple[float, ...] = PAPER_SPECTRUM  # eigenvalues of Λ, normalised to trace 1 as in the code
    lambda_seed: int = 0  # Λ's eigenvectors: one random rotation, shared by all seeds
    n_heads: int = 5
    w_init: float = 0.07  # eq. (34)/(36) scale (the code's init 0.01, mapped)
    regime: Regime = "full_batch"
    train_size: int = 80_000  # P sequences per seed (full_batch only): the data the card samples
    chunk: int = 5000  # population flow runs in chunks and stops early once every seed sits at L(M_D)
    train: TrainConfig = field(default_factory=lambda: sgd(lr=0.2, steps=10_001))
    # 'all_blocks': every weight of the one-layer attention trains (the zero blocks of Sec. 2.3-2.4 start at zero
    # and move, App. G) by full-batch GD on the ``train_size`` sequences of each seed, whatever ``regime`` says:
    # in the population limit the blocks stay at zero and the route is the reduced one
    dynamics: Literal["reduced", "all_blocks"] = added_setting("reduced")
    #: the cards whose claims are stated for dynamics='all_blocks' (Figs 1 and 3)
    all_blocks_claims: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # d and the spectrum of Λ must agree (Λ is d × d): a longer d would silently train at len(spectrum)
        require(self, "spectrum", len(self.spectrum) == self.d, f"{self.d} floats, one per dimension (d = {self.d})")
        require(self, "dynamics", self.dynamics in DYNAMICS, f"one of {DYNAMICS}")
        require(
            self,
            "dynamics",
            self.dynamics == "reduced" or self.all_blocks_claims,
            "'reduced' for this card ('all_blocks' is a setting of zhang2025.fig1 and zhang2025.fig3)",
        )

    @property
    def all_blocks(self) -> bool:
        return self.dynamics == "all_blocks"


def full_batch(train: TrainConfig, P: int) -> TrainConfig:
    """``train`` on the whole fixed set of P sequences every step."""
    return dataclasses.replace(train, batch_size=P, train_size=P)


def covariance(cfg: Setup) -> Tensor:
    """Λ = Uᵀ diag(λ) U with λ normalised to trace 1 and U Haar-random from ``lambda_seed`` (float64)."""
    lam = torch.tensor(cfg.spectrum, dtype=F64)
    lam = lam / lam.sum()
    return rotated_covariance(tuple(lam.tolist()), generator=generator(derive_seed(cfg.lambda_seed, "Lambda")))


@dataclass(kw_only=True)
class Curves:
    """One trained batched model: time (T,), exact population loss (S, T) (training loss without Λ),
    training loss (S, T) for finite P (None for the population flow), parameters name -> (S, T, ...)."""

    time: Tensor
    loss: Tensor
    params: dict[str, Tensor]
    train_loss: Tensor | None = None


def join(parts: list[Trajectory]) -> Curves:
    """Join the trajectories of consecutive chunks of a batched model (each chunk repeats the previous
    chunk's last record)."""
    time, loss, train = [], [], []
    params: dict[str, list[Tensor]] = {k: [] for k in parts[0].params}
    t0 = 0.0
    for i, tr in enumerate(parts):
        sl = slice(0 if i == 0 else 1, None)
        time.append(tr.time[sl] + t0)
        loss.append(tr.loss[:, sl])
        if tr.train_loss is not None:
            train.append(tr.train_loss[:, sl])
        for k, v in tr.params.items():
            params[k].append(v[:, sl])
        t0 = float(time[-1][-1])
    return Curves(
        time=torch.cat(time),
        loss=torch.cat(loss, dim=1),
        train_loss=torch.cat(train, dim=1) if train else None,
        params={k: torch.cat(v, dim=1) for k, v in params.items()},
    )


def reduced_spec(cls: type[nn.Module], cfg: Setup, **kwargs: Any) -> ModelSpec:
    """A batched reduced model (``MergedAttention``/``SeparateAttention``) in float64, ``cfg.seeds`` seeds; with
    ``dynamics='all_blocks'`` the same model with its zero blocks as parameters (same init draws, blocks at 0)."""
    extra = dict(all_blocks=True) if cfg.all_blocks else {}
    return ModelSpec(cls, kwargs=dict(d=cfg.d, n_seeds=cfg.seeds, **kwargs, **extra), dtype="float64")


def training_sets(cfg: Setup, Lambda: Tensor, tag: str, seeds: int) -> list[Episode]:
    """The fixed training set of each seed: P = ``cfg.train_size`` sequences, seed s from
    ``derive_seed(s, "train", tag)``."""
    task = LinearRegression(d=cfg.d, covariance=Lambda)
    return [
        task.sample(cfg.train_size, cfg.n, generator=generator(derive_seed(s, "train", tag)), dtype=F64)
        for s in range(seeds)
    ]


def odd_moment_ratio(episode: Episode) -> float:
    """ε = ‖E_P(y_q f)‖ on the zero-block coordinates / ‖E_P(y_q f)‖ on the reduced ones, f = x_q ⊗ vec(s) the
    all-blocks feature (:func:`~iclab.models.reduced_attention.all_blocks_statistic`).

    On the zero-block coordinates E(y_q f) is odd in w (y_q (Λ̂ + x_q x_qᵀ/N) x_q, y_q (1/N Σ y_n²) x_q), so it is 0
    in the population and the blocks stay at zero (App. D.1, F.1); on P sequences it is O(1/√P). It is the rate
    at which the blocks grow from zero relative to the reduced weights while the loss sits at L(M_0) (residual
    ≈ y_q): the first-order size of what the finite set adds to the reduced dynamics."""
    from iclab.models.reduced_attention import all_blocks_statistic, cubic_feature

    assert episode.y_query is not None
    d = episode.d
    f = cubic_feature(all_blocks_statistic(episode), episode.x_query)  # (P, d·D²), index a·D² + c·D + b
    c = (f.T @ episode.y_query / f.shape[0]).reshape(d, d + 1, d + 1)
    reduced = torch.zeros(d + 1, d + 1, dtype=torch.bool)
    reduced[:d, d] = reduced[d, :d] = True  # s_cD = s_Dc = β_c
    return float(c[:, ~reduced].norm() / c[:, reduced].norm())


def train_batched(
    ctx: RunContext,
    cfg: Setup,
    model: ModelSpec | nn.Module,
    Lambda: Tensor,
    *,
    name: str,
    tag: str,
    train: TrainConfig,
    init_key: tuple[str | int, ...] = ("init",),
    next_token: bool = False,
    stop_at: float | None = None,
) -> Curves:
    """Train a batched (``n_seeds`` = S) reduced model in ``cfg.regime``, its init from
    ``derive_seed(0, *init_key)`` (a :class:`ModelSpec`) or as given (a module); ``loss`` is the exact population
    loss of the iterates (L(W) with 1/N, or E(1/N) for ``next_token``).

    ``population``: one :class:`TrainingRun` per chunk of ``cfg.chunk`` steps, each continuing the previous
    chunk's module, stopping once every seed is within 1e-9 of ``stop_at``. ``full_batch`` (and every
    ``dynamics='all_blocks'`` run): one run on S training sets of P sequences (:func:`training_sets`).
    """
    if cfg.regime == "population" and not cfg.all_blocks:
        inv_n = ad.expected_inv_n(cfg.n) if next_token else 1.0 / cfg.n
        parts: list[Trajectory] = []
        done = 0
        while done < train.steps:
            k = min(cfg.chunk, train.steps - done)
            run = TrainingRun(
                name=f"{name}-chunk{len(parts)}",
                model=model,
                task=Lambda,
                train=dataclasses.replace(train, steps=k),
                init_key=init_key,
                regime="population",
                inv_n=inv_n,
            )
            res = ctx.train(run)
            model = res.model  # the next chunk continues from here
            assert res.trajectory is not None
            parts.append(res.trajectory)
            done += k
            if stop_at is not None and float((parts[-1].loss[:, -1] - stop_at).abs().max()) < 1e-9:
                break
        return join(parts)
    n_seeds: Any = model.kwargs.get("n_seeds") if isinstance(model, ModelSpec) else model.n_seeds
    eps = training_sets(cfg, Lambda, tag, n_seeds or 1)
    run = TrainingRun(
        name=name,
        model=model,
        task=eps,
        train=full_batch(train, cfg.train_size),
        init_key=init_key,
        regime="full_batch",
        Lambda=Lambda,
        next_token=next_token,
    )
    res = ctx.train(run)
    assert res.trajectory is not None
    return join([res.trajectory])


def token_spec(
    d: int,
    n_heads: int,
    *,
    key_query: str,
    activation: str,
    init_std: float,
    zero_blocks: bool = True,
    dtype: DType = "float64",
) -> ModelSpec:
    """One attention layer on (d+1)-wide tokens as in the authors' code: the query is a source too
    (X Xᵀ includes the query column), no residual, read-out +[Z]_{d+1,N+1}; float64 unless ``dtype`` says otherwise.
    Its init key is ``("init", key_query, activation)``."""
    cfg = LinearTransformerConfig(
        d=d,
        n_layers=1,
        n_heads=n_heads,
        key_query=key_query,  # type: ignore[arg-type]  # a str; LinearTransformerConfig checks it
        rank=1 if key_query == "separate" else None,
        activation=activation,  # type: ignore[arg-type]  # a str; LinearTransformerConfig checks it
        sources="all",
        residual=False,
        zero_blocks=zero_blocks,
        readout="positive",
        init_std=init_std,
    )
    return ModelSpec(LinearTransformer, cfg, dtype=dtype)


def finite(x: float, fallback: float = 1e9) -> float:
    return float(x) if math.isfinite(float(x)) else fallback


def monotone_share(x: Tensor) -> float:
    """Share of consecutive finite entries that decrease."""
    ok = torch.isfinite(x)
    x = x[ok]
    return float((x[1:] < x[:-1]).double().mean()) if x.numel() > 1 else 0.0


def theory_lines(ax: Any, levels: Tensor, **kw: Any) -> None:
    for lv in levels.tolist():
        ax.axhline(lv, ls="--", color="gray", lw=0.8, **kw)


def loss_panel(ax: Any, time: Tensor, loss: Tensor, levels: Tensor | None, title: str, xlabel: str = "t / τ") -> None:
    for s in range(loss.shape[0]):
        ax.plot(time.numpy(), loss[s].numpy(), lw=1.0)
    if levels is not None:
        theory_lines(ax, levels)
    ax.set_xscale("symlog", linthresh=max(float(time[-1]) / 1000, 1e-9))  # early plateaus are short
    ax.set_xlim(left=0)  # the dashed theory lines would otherwise stretch the axis into negative time
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=9)
