"""Sun, Jadbabaie, Azizan 2025, "On the Role of Transformer Feed-Forward Layers in Nonlinear In-Context
Learning" (arXiv 2501.18187).

Run: ``iclab reproduce sun2025 --preset quick`` (minutes on 2 CPU cores; smaller n, batch and step counts and
a larger learning rate than the paper) or ``--preset paper`` (App. I: Adam lr 1e-3, 4000 fresh prompts per
step, 20 000 steps, 5 seeds; hours on a GPU).

Reference values are derived in spec 003 §3-4 and recomputed exactly by
:mod:`iclab.theory.polynomial_features`. Choices where the paper is silent (docs/papers/sun2025.md, "Stability"):
the label row enters the prompt as y/√E[y²] and the read-out is rescaled (an exact reparameterisation of the
paper's P, Q), W_1 = P = 0 at init (every block starts as the identity), N(0, 0.02²) for W_0 and Q, global
gradient-norm clipping at 1, test lengths 25-300, error bands ± 1 std over seeds. Without the first two, deep
models (L ≥ 4) reach NaN at lr 1e-3 (L = 12 already overflows at a N(0, 0.05²) init); with them L ≤ 6 trains at
lr 1e-3, while L = 12 at small batches and short prompts still hits rare per-prompt overshoots.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from iclab import algorithms, constructions, tasks
from iclab.core.errors import is_int, require, require_int
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.models.bilinear import FFNS, ORDERS, BilinearTransformer, BilinearTransformerConfig
from iclab.plotting import band, save, subplots
from iclab.theory import mc_loss
from iclab.theory import polynomial_features as pf
from iclab.training import TrainConfig, TrainResult, train

#: The training part of every smoke preset: seconds, checks only that everything runs.
SMOKE = dict(seeds=1, steps=6, batch_size=64, n=20, eval_batch=256, eval_every=3, snapshot_every=3, test_batch=512)
#: quick: 1 seed, short prompts, a 10× larger learning rate with warm-up and cosine decay (minutes on 2 cores;
#: fine for L <= 2; L = 4 diverges at this lr even with the stabilising parameterisation).
QUICK = dict(seeds=1, n=50, batch_size=256, steps=700, lr=1e-2, warmup_steps=50, schedule="cosine", eval_every=50, snapshot_every=100,
             eval_batch=4096, test_batch=20_000, subnet_batch=4096)  # fmt: skip
#: Spec claim 19 (Fig. 9): d = 3, L = 4 converges to a final test loss <= 1e-3 (std over 5 seeds ~1e-5).
CONVERGED_LOSS_L4_D3 = 1e-3


def _require_ints(owner: Any, name: str, values: Any, low: int, *, min_len: int = 1) -> None:
    """``owner.name`` must be a tuple of at least ``min_len`` distinct ints >= ``low``."""
    ok = isinstance(values, tuple | list) and len(values) >= min_len and all(is_int(v, low) for v in values)
    ok = ok and len(set(values)) == len(values)
    require(owner, name, ok, f"a tuple of at least {min_len} distinct int(s) >= {low}", values)


def _require_choices(owner: Any, name: str, values: Any, allowed: tuple[str, ...]) -> None:
    ok = isinstance(values, tuple | list) and len(values) >= 1 and all(v in allowed for v in values)
    require(owner, name, ok and len(set(values)) == len(values), f"a non-empty tuple of distinct entries of {allowed}", values)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BilinearSetup:
    """App. I training settings (Adam lr 1e-3, no weight decay, 4000 fresh prompts per step, 20 000 steps, 5 seeds)."""

    seeds: int = 5
    d: int = 3
    d_bar: int = 12
    n: int = 200  # n_train
    monomials: str = "quadratic"
    init_std: float = 0.02
    init: Literal["gaussian", "identity"] = "identity"  # W_1 = P = 0 at init: every block is the identity
    normalise_labels: bool = True  # label_scale = √E[y²] (an exact reparameterisation; see the module docstring)
    lr: float = 1e-3
    eps: float = 1e-8  # Adam's ε (the paper names none: PyTorch's default)
    steps: int = 20_000
    batch_size: int = 4000
    schedule: Literal["constant", "step", "cosine"] = "constant"
    warmup_steps: int = 0
    clip: float | None = 1.0  # global norm; the paper names none (see the module docstring)
    skip_nonfinite: bool = (
        True  # a rare prompt whose in-context iteration overshoots gives an inf gradient: skip that step
    )
    eval_every: int = 100
    eval_batch: int = 4000
    snapshot_every: int = 500  # ℓ-block sub-network losses (Fig. 5-9)
    subnet_batch: int = 4000
    test_ns: tuple[int, ...] = (25, 50, 100, 150, 200, 250, 300)
    test_batch: int = 100_000
    dtype: Literal["float32", "float64"] = "float32"

    def __post_init__(self) -> None:
        """Reject bad sizes before any model trains (a d̄ too small for the last d of a sweep used to fail only after
        the earlier d had trained). Subclasses check their own tuple fields first, then call this."""
        require_int(self, "seeds", self.seeds, 1)
        require_int(self, "d", self.d, 1)
        require_int(self, "n", self.n, 1, "context pairs per training prompt")
        _require_ints(self, "test_ns", self.test_ns, 1)
        require_int(self, "test_batch", self.test_batch, 2, "Monte-Carlo prompts per test length")
        require_int(self, "subnet_batch", self.subnet_batch, 1)
        require_int(self, "d_bar", self.d_bar, 1)
        for d in self._model_ds():
            low = self._min_d_bar(d)
            require(self, "d_bar", self.d_bar >= low, f"an int >= {low} for d = {d} (BilinearTransformerConfig's minimum: d + 1, d + 2 for a sparse FFN)")  # fmt: skip

    def _model_ds(self) -> tuple[int, ...]:
        """The input dimensions d of the models built from ``d_bar``."""
        return (self.d,)

    def _min_d_bar(self, d: int) -> int:
        """The smallest d̄ that :class:`BilinearTransformerConfig` accepts for the FFNs this experiment builds."""
        return d + 1

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(
            steps=self.steps, batch_size=self.batch_size, optimizer="adam", lr=self.lr, eps=self.eps, schedule=self.schedule, warmup_steps=self.warmup_steps,
            clip=self.clip, clip_mode="global", skip_nonfinite=self.skip_nonfinite, eval_every=self.eval_every, eval_batch=self.eval_batch,
            snapshot_every=self.snapshot_every, checkpoint_every=max(1, self.steps // 10), seed=seed, dtype=self.dtype,
        )  # fmt: skip


def _task(cfg: BilinearSetup, d: int | None = None) -> tasks.PolynomialRegression:
    return tasks.PolynomialRegression(d=cfg.d if d is None else d, monomials=cfg.monomials)


def _model_base(cfg: BilinearSetup, d: int) -> dict[str, Any]:
    """The model options shared by every trained model: d, d̄ and the stabilising parameterisation."""
    scale = math.sqrt(_task(cfg, d).zero_predictor_loss()) if cfg.normalise_labels else 1.0
    return dict(d=d, d_bar=cfg.d_bar, init_std=cfg.init_std, init=cfg.init, label_scale=scale)


def _block_losses(model: BilinearTransformer, episode: Any) -> Tensor:
    """(L+1,) test loss of the ℓ-block sub-networks, ℓ = 0..L (App. H)."""
    return ((model.block_predictions(episode) - episode.y_query) ** 2).mean(-1)


def train_bilinear(
    cfg: BilinearSetup, ctx: RunContext, *, seed: int, task: tasks.PolynomialRegression, model_cfg: BilinearTransformerConfig,
    name: str, n: int | None = None,
) -> tuple[BilinearTransformer, TrainResult]:  # fmt: skip
    """Train one model in ``ctx.out_dir/name`` (resumable); snapshots hold the sub-network losses.

    ``n``: context pairs per training prompt, ``cfg.n`` when None (an explicit value, even an invalid one, is used).
    """
    n = cfg.n if n is None else n
    model = BilinearTransformer(model_cfg, generator=generator(derive_seed(seed, "init", name)))
    dtype = getattr(torch, cfg.dtype)
    sub = task.sample(cfg.subnet_batch, n, generator=generator(derive_seed(seed, "subnet"), ctx.device), dtype=dtype)
    res = train(
        model, functools.partial(task.sample, n=n), cfg.train_config(seed), out_dir=ctx.subdir(name), device=ctx.device,
        snapshot_fn=lambda m: {"block_loss": _block_losses(m, sub)}, progress=ctx.progress, description=name,
    )  # fmt: skip
    return model, res


def loss_vs_length(model: BilinearTransformer, task: Any, ns: tuple[int, ...], batch: int, seed: int) -> list[tuple[float, float]]:  # fmt: skip
    """(mean, standard error) of the float64 test loss at every test length."""
    m = model.double().cpu()
    out = []
    for n in ns:
        g = generator(derive_seed(seed, "test-length", n))
        out.append(mc_loss(m, task, n, batch, generator=g, chunks=max(1, batch * n // 2_000_000)))
    model.float()
    return out


def _run_models(
    cfg: BilinearSetup, ctx: RunContext, models: dict[str, BilinearTransformerConfig], d: int, n: int | None = None,
    measure: Callable[[BilinearTransformer, int], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Train every model for every seed; one row each. ``measure(model, seed)`` adds entries to the row."""
    task, n_train = _task(cfg, d), cfg.n if n is None else n
    rows = []
    for label, mcfg in models.items():
        for s in range(cfg.seeds):
            model, res = train_bilinear(cfg, ctx, seed=s, task=task, model_cfg=mcfg, name=f"d{d}-{label}-n{n_train}-seed{s}", n=n_train)  # fmt: skip
            steps, loss = res.curve("test_loss")
            lengths = loss_vs_length(model, task, cfg.test_ns, cfg.test_batch, s)
            rows.append({
                "d": d, "model": label, "seed": s, "n_train": n_train, "steps": torch.tensor(steps),
                "test_loss": torch.tensor(loss, dtype=torch.float64), "snap_steps": torch.tensor(res.snapshot_steps),
                "block_loss": res.snapshots["block_loss"], "length_loss": torch.tensor([m for m, _ in lengths]),
                "length_se": torch.tensor([s_ for _, s_ in lengths]),
            })  # fmt: skip
            if measure is not None:
                rows[-1].update(measure(model, s))
    return rows


def _at(cfg: BilinearSetup, row: dict[str, Any], n: int) -> tuple[float, float]:
    i = cfg.test_ns.index(n) if n in cfg.test_ns else min(range(len(cfg.test_ns)), key=lambda k: abs(cfg.test_ns[k] - n))  # fmt: skip
    return float(row["length_loss"][i]), float(row["length_se"][i])


# --------------------------------------------------------------------------------------------
# Figure 1 (a-c) and Figures 5-9: quadratic ICL, linear vs bilinear transformers, sub-network curves


@dataclass(frozen=True, kw_only=True)
class Fig1Config(BilinearSetup):
    ds: tuple[int, ...] = (3, 4)
    blocks: tuple[int, ...] = (2, 4, 6)
    linear_layers: int = 6
    margin: float = 0.5  # bilinear loss must be below margin × the linear floor (spec claim 9)

    def __post_init__(self) -> None:
        _require_ints(self, "ds", self.ds, 1)
        _require_ints(self, "blocks", self.blocks, 1)
        require_int(self, "linear_layers", self.linear_layers, 1)
        require(self, "margin", isinstance(self.margin, int | float) and self.margin > 0, "a float > 0")
        super().__post_init__()

    def _model_ds(self) -> tuple[int, ...]:
        return tuple(self.ds)


def _fig1_models(cfg: Fig1Config, d: int) -> dict[str, BilinearTransformerConfig]:
    base = _model_base(cfg, d)
    out = {"linear": BilinearTransformerConfig(**base, n_blocks=cfg.linear_layers, ffn="none")}
    out.update({f"L{L}": BilinearTransformerConfig(**base, n_blocks=L) for L in cfg.blocks})
    return out


def least_squares_baseline(cfg: BilinearSetup, d: int) -> list[float]:
    """Least squares on the task's monomials (the Bayes posterior mean for w ~ N(0, I)) at every test length."""
    task, ls = _task(cfg, d), algorithms.FeatureLeastSquares(cfg.monomials)
    batch = max(2, cfg.test_batch // 10)
    return [mc_loss(ls, task, n, batch, generator=generator(derive_seed(0, "ls", d, n)), chunks=max(1, batch * n // 1_000_000))[0] for n in cfg.test_ns]  # fmt: skip


def run_fig1(cfg: Fig1Config, ctx: RunContext) -> dict[str, Any]:
    rows = [r for d in cfg.ds for r in _run_models(cfg, ctx, _fig1_models(cfg, d), d)]
    return {"rows": rows, "least_squares": {d: least_squares_baseline(cfg, d) for d in cfg.ds}}


def _length_panel(ax: Any, cfg: BilinearSetup, rows: list[dict[str, Any]], key: str, title: str, floor: float | None) -> None:  # fmt: skip
    for label in dict.fromkeys(r[key] for r in rows):
        rs = [r for r in rows if r[key] == label]
        band(ax, list(cfg.test_ns), torch.stack([r["length_loss"] for r in rs]), label=str(label), marker="o", ms=3)
    if floor is not None:
        ax.axhline(floor, ls="--", color="gray", lw=0.8, label="affine floor (Prop. 1)")
    ax.set_yscale("log")
    ax.set_xlabel("test prompt length n")
    ax.set_ylabel("ICL test loss")
    ax.set_title(title)
    ax.legend(fontsize=7)


def _curves_panel(ax: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Test-loss curve of the full model and of its ℓ-block sub-networks (Fig. 5-9)."""
    x = rows[0]["snap_steps"].numpy()
    L = rows[0]["block_loss"].shape[-1] - 1
    for ell in range(1, L + 1):
        band(ax, x, torch.stack([r["block_loss"][:, ell] for r in rows]), label=f"ℓ = {ell}" + (" (full)" if ell == L else ""))  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("test loss")
    ax.set_title(title)
    ax.legend(fontsize=7)


def plot_fig1(results: dict[str, Any], cfg: Fig1Config, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, len(cfg.ds) + 1)
    for i, d in enumerate(cfg.ds):
        ax = axes[0, i]
        ls = results["least_squares"][d]
        if max(ls) > 1e-8:
            ax.plot(cfg.test_ns, ls, "k:", lw=0.8, label="least squares on monomials")
        else:  # n >= #monomials: noise-free least squares interpolates, a line at 1e-28 would squash the panel
            ax.plot([], [], "k:", lw=0.8, label="least squares on monomials: 0 (exact)")
        panel = {3: "a", 4: "b"}.get(d, str(i))  # the paper's panels: (a) d = 3, (b) d = 4
        _length_panel(ax, cfg, [r for r in rows if r["d"] == d], "model", f"({panel}) d = {d}, d̄ = {cfg.d_bar}", pf.affine_floor(d))  # fmt: skip
    _short_prompt_panel(axes[0, -1], cfg, [r for r in rows if r["d"] == cfg.ds[-1]])
    paths = [save(fig, out / "fig1.png")]
    fig, axes = subplots(len(cfg.ds), len(cfg.blocks))
    for i, d in enumerate(cfg.ds):
        for j, L in enumerate(cfg.blocks):
            _curves_panel(axes[i, j], [r for r in rows if r["d"] == d and r["model"] == f"L{L}"], f"d = {d}, L = {L} (Fig. 5-9)")  # fmt: skip
    paths.append(save(fig, out / "fig5_9.png"))
    return paths


def _short_prompt_panel(ax: Any, cfg: Fig1Config, rows: list[dict[str, Any]]) -> None:
    """Fig. 1(c): the models of the last d on log-log axes with a c/n line through the deepest model's loss
    at the longest test length. The paper says only that (c) shows the loss rising for shorter prompts "aligned with
    Thm. 2" (spec 003 §4.2 [FLAG]); the 1/n line is Thm. 2's rate, so the panel shows how far each model follows it."""
    _length_panel(ax, cfg, rows, "model", f"(c) d = {cfg.ds[-1]}: short prompts, log-log", None)  # (a)'s colours
    bil = [r for r in rows if r["model"] != "linear"]
    deepest = max(bil, key=lambda r: int(r["model"][1:]), default=None)
    if deepest is not None:
        ns = torch.tensor(cfg.test_ns, dtype=torch.float64)
        c = float(deepest["length_loss"][-1]) * cfg.test_ns[-1]
        ax.plot(ns.numpy(), (c / ns).numpy(), ls="--", color="gray", lw=0.8, label=f"∝ 1/n (Thm. 2 rate, through {deepest['model']})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(list(cfg.test_ns), [str(n) for n in cfg.test_ns], minor=False)
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=7)


def _mean(rows: list[dict[str, Any]], cfg: BilinearSetup, n: int) -> float:
    return sum(_at(cfg, r, n)[0] for r in rows) / len(rows)


def claims_fig1(results: dict[str, Any], cfg: Fig1Config) -> list[ClaimResult]:
    rows, out = results["rows"], []
    for d in cfg.ds:
        floor = pf.affine_floor(d)
        lin = [r for r in rows if r["d"] == d and r["model"] == "linear"]
        worst = min(_at(cfg, r, cfg.n)[0] + 3 * _at(cfg, r, cfg.n)[1] for r in lin)
        out.append(check(f"linear_tf_above_affine_floor_d{d}", worst, lo=floor, detail=f"min over seeds of (loss + 3σ) of the {cfg.linear_layers}-layer linear TF at n = {cfg.n}; Prop. 1 floor d(d+3)/2 (claim 7)"))  # fmt: skip
        bil = {L: [r for r in rows if r["d"] == d and r["model"] == f"L{L}"] for L in cfg.blocks}
        if any(L >= 2 for L in cfg.blocks):
            best_bad = max(
                _at(cfg, r, cfg.n)[0] for L, rs in bil.items() if L >= 2 for r in rs
            )  # the paper's L ∈ {2, 4, 6}
            out.append(check(f"bilinear_below_linear_floor_d{d}", best_bad, hi=cfg.margin * floor, detail=f"max over L >= 2, seeds of the bilinear loss at n = {cfg.n} vs {cfg.margin} × floor (claim 9)"))  # fmt: skip
        means = [_mean(bil[L], cfg, cfg.n) for L in cfg.blocks]
        inversions = sum(b > a for a, b in itertools.pairwise(means))
        out.append(check(f"depth_helps_d{d}", inversions, hi=0, detail=f"inversions of the mean loss over L = {cfg.blocks}: {[round(m, 4) for m in means]} (claim 10)"))  # fmt: skip
        if d == 4 and cfg.d_bar < math.comb(d + 2, 2):
            out += _single_block_bound_claims(cfg, bil, dict(zip(cfg.blocks, means, strict=True)))
        if d == 3 and 4 in cfg.blocks:
            out.append(_converged_claim(cfg, bil[4]))
        finals = [r["block_loss"][-1] for rs in bil.values() for r in rs]
        mono = sum(bool((f[1:] <= f[:-1] * 1.02).all()) for f in finals) / len(finals)
        out.append(check(f"subnetwork_loss_decreases_with_l_d{d}", mono, lo=0.8, detail="fraction of trained models whose ℓ-block sub-network losses decrease in ℓ ≥ 1 (2 % slack) (claim 15)"))  # fmt: skip
        short = min(cfg.test_ns)
        worse = sum(_at(cfg, r, short)[0] > _at(cfg, r, cfg.n)[0] for rs in bil.values() for r in rs) / sum(len(rs) for rs in bil.values())  # fmt: skip
        out.append(check(f"short_prompts_are_worse_d{d}", worse, lo=1.0, detail=f"fraction of bilinear models with a higher loss at n_test = {short} than at n_train = {cfg.n} (claim 16)"))  # fmt: skip
    return out


def _single_block_bound_claims(
    cfg: Fig1Config, bil: dict[int, list[dict[str, Any]]], means: dict[int, float]
) -> list[ClaimResult]:
    """Spec claim 11 (Fig. 1b, corrected Prop. 4): at d = 4 and d̄ < C(d+2, 2) EVERY trained depth L >= 2 has a mean
    loss below the one-block bound (2.298 at d̄ = 12; the paper prints 3), and a single block (L = 1) stays above it
    (a finite-n loss of one block is above its n → ∞ value, which Prop. 4 bounds)."""
    d = 4
    bound, printed = pf.prop4_bound(d, cfg.d_bar), pf.paper_prop4_bound(d, cfg.d_bar)
    out = []
    deep = {L: m for L, m in means.items() if L >= 2}
    if deep:
        worst = max(deep, key=lambda L: deep[L])
        per = {L: round(m, 4) for L, m in deep.items()}
        out.append(check("deep_models_beat_single_block_bound_d4", deep[worst], hi=bound, detail=f"max over L >= 2 of the mean loss at n = {cfg.n} (L = {worst}; per L {per}) vs the corrected Prop-4 bound {bound:.3f} for one block at d̄ = {cfg.d_bar} (paper's: {printed:.0f}) (claim 11)"))  # fmt: skip
    if 1 in bil:
        single = min(_at(cfg, r, cfg.n)[0] + 3 * _at(cfg, r, cfg.n)[1] for r in bil[1])
        out.append(check("single_block_above_bound_d4", single, lo=bound, detail=f"min over seeds of (loss + 3σ) of the L = 1 model at n = {cfg.n} vs the corrected Prop-4 bound {bound:.3f} at d̄ = {cfg.d_bar}: one block cannot go below it (claim 11)"))  # fmt: skip
    return out


def _converged_claim(cfg: Fig1Config, rows: list[dict[str, Any]]) -> ClaimResult:
    """Spec claim 19 (Fig. 9, a soft check): d = 3, L = 4 converges, mean final loss <= 1e-3 (seed std ~1e-5)."""
    losses = [_at(cfg, r, cfg.n)[0] for r in rows]
    mean = sum(losses) / len(losses)
    std = math.sqrt(sum((v - mean) ** 2 for v in losses) / (len(losses) - 1)) if len(losses) > 1 else float("nan")
    return check("converged_L4_d3", mean, hi=CONVERGED_LOSS_L4_D3, detail=f"mean over {len(losses)} seed(s) of the L = 4 loss at n = {cfg.n}, d = 3; std over seeds {std:.3g} (paper: ~1e-5) (claim 19, soft)")  # fmt: skip


FIG1 = register(
    Experiment(
        name="sun2025.fig1",
        title="Fig. 1, 5-9: quadratic ICL, 6-layer linear TF vs bilinear TFs with L blocks; ℓ-block sub-network curves",
        config=Fig1Config,
        presets={
            "smoke": dict(**SMOKE, ds=(2,), d_bar=7, blocks=(1, 2), linear_layers=2, test_ns=(10, 20), margin=10.0),
            # quick: d = 3 only, L ∈ {1, 2}: L = 4 reaches NaN at batch 256, n = 50 even with label_scale and the identity
            # init (step 150 at lr 1e-2, 360 at 3e-3; docs/papers/sun2025.md "Stability"). The margin is the floor itself
            # (the paper preset asks for half of it).
            "quick": dict(**QUICK, ds=(3,), blocks=(1, 2), linear_layers=3, test_ns=(25, 50, 100), margin=1.0),
            "paper": dict(),
        },
        run=run_fig1,
        plot=plot_fig1,
        claims=claims_fig1,
        description="x ~ N(0, I_d), every quadratic coefficient iid N(0, 1), prompt [1; x; 0; y] with d̄ = 12. Linear TF = the same LSA layers without FFNs (Prop. 1 floor 9 / 14). Fig. 5-9: test loss of the ℓ-block sub-networks during training.",
    )
)

# --------------------------------------------------------------------------------------------
# Figures 2 and 10: the sparse cubic, dense vs sparse bilinear layers


@dataclass(frozen=True, kw_only=True)
class Fig2Config(BilinearSetup):
    d: int = 4
    d_bar: int = 15
    n: int = 100
    monomials: str = "sparse_cubic"
    n_blocks: int = 5  # the 10-layer models
    linear_layers: int = 5
    variants: tuple[str, ...] = ("dense", "sparse", "sparse_strict")
    test_ns: tuple[int, ...] = (25, 50, 100, 150, 200)

    def __post_init__(self) -> None:
        _require_choices(self, "variants", self.variants, tuple(f for f in FFNS if f != "none"))
        require_int(self, "n_blocks", self.n_blocks, 1)
        require_int(self, "linear_layers", self.linear_layers, 1)
        super().__post_init__()

    def _min_d_bar(self, d: int) -> int:
        return d + 2 if any(v.startswith("sparse") for v in self.variants) else d + 1


def run_fig2(cfg: Fig2Config, ctx: RunContext) -> dict[str, Any]:
    base = _model_base(cfg, cfg.d)
    models = {v: BilinearTransformerConfig(**base, n_blocks=cfg.n_blocks, ffn=v) for v in cfg.variants}
    models["linear"] = BilinearTransformerConfig(**base, n_blocks=cfg.linear_layers, ffn="none")
    return {"rows": _run_models(cfg, ctx, models, cfg.d)}


def _model_curves(ax: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Test loss over training, mean ± spread over seeds, one band per model label (log scale)."""
    for label in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == label]
        band(ax, rs[0]["steps"].numpy(), torch.stack([r["test_loss"] for r in rs]), label=label)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_title(title)
    ax.legend(fontsize=7)


def plot_fig2(results: dict[str, Any], cfg: Fig2Config, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 2)
    _length_panel(axes[0, 0], cfg, rows, "model", "(Fig. 2) cubic, d = 4, d̄ = 15", 5.0)
    axes[0, 0].axhline(2.0, ls=":", color="gray", lw=0.8, label="quadratic-feature floor")
    _model_curves(axes[0, 1], rows, "(Fig. 10) training curves")
    return [save(fig, out / "fig2_10.png")]


def claims_fig2(results: dict[str, Any], cfg: Fig2Config) -> list[ClaimResult]:
    rows = results["rows"]

    def mean(label: str) -> float:
        return _mean([r for r in rows if r["model"] == label], cfg, cfg.n)

    out = [
        check(
            "dense_beats_sparse",
            mean("dense") / mean("sparse"),
            hi=1.0,
            detail=f"dense {mean('dense'):.3f} / sparse {mean('sparse'):.3f} at n = {cfg.n} (claim 17)",
        ),
        check(
            "sparse_beats_linear",
            mean("sparse") / mean("linear"),
            hi=1.0,
            detail=f"sparse {mean('sparse'):.3f} / linear {mean('linear'):.3f} (claim 17)",
        ),
        check(
            "linear_above_floor_5",
            min(_at(cfg, r, cfg.n)[0] + 3 * _at(cfg, r, cfg.n)[1] for r in rows if r["model"] == "linear"),
            lo=5.0,
            detail="min over seeds of (loss + 3σ) of the linear TF; the cubic affine floor is 5 (Prop. 1)",
        ),
    ]
    dense = max(_at(cfg, r, cfg.n)[0] + 3 * _at(cfg, r, cfg.n)[1] for r in rows if r["model"] == "dense")
    out.append(
        check(
            "dense_below_quadratic_floor_2",
            dense,
            hi=2.0,
            detail="max over seeds of (loss + 3σ) of the dense model; 2 is the loss of the best predictor of degree "
            "<= 2 in x_q for any n (x1x2x3, x2x3x4 are orthogonal to them, spec §1.3): the dense FFNs composed "
            "cubic features (claim 17)",
        )
    )
    if "sparse_strict" in cfg.variants:
        strict = min(_at(cfg, r, cfg.n)[0] + 3 * _at(cfg, r, cfg.n)[1] for r in rows if r["model"] == "sparse_strict")
        out.append(check("strict_sparse_above_quadratic_floor_2", strict, lo=2.0, detail="P rows of (1, x) held at 0: the prediction is quadratic in x_q, so the loss stays >= 2 (spec §2.3)"))  # fmt: skip
    return out


FIG2 = register(
    Experiment(
        name="sun2025.fig2",
        title="Fig. 2, 10: sparse cubic ICL, 10-layer dense vs sparse bilinear TF (+ 5-layer linear TF)",
        config=Fig2Config,
        presets={
            "smoke": dict(**SMOKE, d_bar=7, n_blocks=1, linear_layers=1, test_ns=(10, 20)),
            "quick": dict(
                # 3000 steps: at 400 every model is still at the affine floor (dense 5.06, sparse 5.17, linear 5.79);
                # at 1000 dense and sparse tie (2.85 / 2.87); at 3000 the dense model is below the quadratic floor 2
                **{**QUICK, "steps": 3000, "n": 50, "test_batch": 5000},
                n_blocks=2,
                linear_layers=2,
                test_ns=(25, 50, 100),
            ),
            "paper": dict(),
        },
        run=run_fig2,
        plot=plot_fig2,
        claims=claims_fig2,
        description="f = w_0 + Σ w_i x_i + w_12 x1x2 + w_23 x2x3 + w_34 x3x4 + w_123 x1x2x3 + w_234 x2x3x4. 'sparse' is eq. (11) with free attention (the paper's); 'sparse_strict' also zeroes the attention's P rows of (1, x) (spec 003 §2.3).",
    )
)

# --------------------------------------------------------------------------------------------
# Figure 3: loss of the untrained Thm-2 construction vs n


@dataclass(frozen=True, kw_only=True)
class Fig3Config:
    d: int = 4
    d_bar: int = 15
    ns: tuple[int, ...] = (25, 50, 100, 200, 400, 800, 1600)
    prompts: int = 100_000  # the paper's 100 per n leave r² = 0.97
    seed: int = 0
    slope_tol: float = 0.05
    r2_min: float = 0.99

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        q = math.comb(self.d + 2, 2)
        require(self, "d_bar", is_int(self.d_bar, q), f"an int >= C(d+2, 2) = {q} (one scratch row per quadratic monomial)")  # fmt: skip
        _require_ints(self, "ns", self.ns, 1, min_len=2)  # a log-log slope needs two n
        require_int(self, "prompts", self.prompts, 2)


def run_fig3(cfg: Fig3Config, ctx: RunContext) -> dict[str, Any]:
    model = constructions.kernel_gd_block(cfg.d, d_bar=cfg.d_bar)
    task = tasks.quadratic(cfg.d)
    rows = []
    for n in cfg.ns:
        g = generator(derive_seed(cfg.seed, "fig3", n))
        mean, se = mc_loss(model, task, n, cfg.prompts, generator=g, chunks=max(1, cfg.prompts * n // 1_000_000))
        rows.append({"n": n, "loss": mean, "se": se})
    x = torch.log(torch.tensor(cfg.ns, dtype=torch.float64))
    y = torch.log(torch.tensor([r["loss"] for r in rows], dtype=torch.float64))
    A = torch.stack([x, torch.ones_like(x)], 1)
    coef = torch.linalg.lstsq(A, y.unsqueeze(1)).solution.squeeze(1)
    r2 = 1 - float(((y - A @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    return {"rows": rows, "slope": float(coef[0]), "intercept": float(coef[1]), "r2": r2, "K": pf.construction_constant(cfg.d)}  # fmt: skip


def plot_fig3(results: dict[str, Any], cfg: Fig3Config, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    ax = axes[0, 0]
    ns = [r["n"] for r in rows]
    ax.errorbar(ns, [r["loss"] for r in rows], yerr=[3 * r["se"] for r in rows], fmt="o", ms=4, label="construction (MC ± 3σ)")  # fmt: skip
    ax.plot(ns, [results["K"] / n for n in ns], "k-", lw=0.8, label=f"K(d)/n = {results['K']:.0f}/n (exact)")
    ax.plot(ns, [pf.paper_theorem2_loss(cfg.d, n) for n in ns], "r--", lw=0.8, label="Thm 2 as printed")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel("ICL loss")
    ax.set_title(f"slope {results['slope']:.3f}, r² = {results['r2']:.4f}")
    ax.legend(fontsize=7)
    return [save(fig, out / "fig3.png")]


def claims_fig3(results: dict[str, Any], cfg: Fig3Config) -> list[ClaimResult]:
    rows, K = results["rows"], results["K"]
    z = max(abs(r["loss"] - K / r["n"]) / r["se"] for r in rows)
    ratio = min(r["loss"] / pf.paper_theorem2_loss(cfg.d, r["n"]) for r in rows)
    return [
        check(
            "loglog_slope_is_minus_one",
            results["slope"],
            expected=-1.0,
            atol=cfg.slope_tol,
            detail="least-squares slope of log loss vs log n (claim 3)",
        ),
        check("loglog_r2", results["r2"], lo=cfg.r2_min, detail="paper: r² = 0.97 with 100 prompts per n (claim 3)"),
        check(
            "loss_is_K_over_n",
            z,
            hi=3.5,
            detail=f"max over n of |MC − K(d)/n|/σ, K({cfg.d}) = {K:.0f} [derived] (claim 4)",
        ),
        check(
            "paper_thm2_value_fails",
            ratio,
            lo=10.0,
            detail=f"min over n of MC loss / ((d+2)(d+1)+d)/(2n): the printed value is {K / (pf.paper_theorem2_loss(cfg.d, 1)):.0f}× too small (errata)",
        ),
    ]


FIG3 = register(
    Experiment(
        name="sun2025.fig3",
        title="Fig. 3: loss of the untrained Thm-2 construction vs n is K(d)/n (log-log slope −1)",
        config=Fig3Config,
        presets={
            "smoke": dict(d=2, d_bar=6, ns=(10, 20, 40), prompts=2000, slope_tol=0.5, r2_min=0.5),
            "quick": dict(ns=(25, 50, 100, 200, 400), prompts=20_000, slope_tol=0.1, r2_min=0.98),
            "paper": dict(),
        },
        run=run_fig3,
        plot=plot_fig3,
        claims=claims_fig3,
        description="The App.-C construction (d = 4, d̄ = 15, Γ = −Λ⁻¹) evaluated by float64 Monte Carlo; the exact loss is 874/n, not the paper's 17/n.",
    )
)

# --------------------------------------------------------------------------------------------
# Figure 4: effect of the training prompt length


@dataclass(frozen=True, kw_only=True)
class Fig4Config(BilinearSetup):
    n_blocks: int = 4  # the 8-layer model
    n_trains: tuple[int, ...] = (100, 150, 200, 250)  # App. H (App. I says 280 for the last one)

    def __post_init__(self) -> None:
        require_int(self, "n_blocks", self.n_blocks, 1)
        _require_ints(self, "n_trains", self.n_trains, 1)
        super().__post_init__()


def run_fig4(cfg: Fig4Config, ctx: RunContext) -> dict[str, Any]:
    mcfg = BilinearTransformerConfig(**_model_base(cfg, cfg.d), n_blocks=cfg.n_blocks)
    rows = [r for n in cfg.n_trains for r in _run_models(cfg, ctx, {f"n_train={n}": mcfg}, cfg.d, n=n)]
    return {"rows": rows}


def plot_fig4(results: dict[str, Any], cfg: Fig4Config, out: Path) -> list[Path]:
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    _length_panel(axes[0, 0], cfg, results["rows"], "model", f"d = {cfg.d}, L = {cfg.n_blocks} (Fig. 4)", None)
    return [save(fig, out / "fig4.png")]


def claims_fig4(results: dict[str, Any], cfg: Fig4Config) -> list[ClaimResult]:
    rows = results["rows"]
    longest, shortest = max(cfg.test_ns), min(cfg.test_ns)

    def mean(n_train: int, n_test: int) -> float:
        return _mean([r for r in rows if r["n_train"] == n_train], cfg, n_test)

    lo, hi = min(cfg.n_trains), max(cfg.n_trains)
    crossing = lo != hi  # Fig. 4's crossing compares two training lengths: made only with >= 2 n_trains
    out = []
    if crossing:
        out.append(
            check(
                "longer_training_prompts_win_on_long_tests",
                mean(hi, longest) / mean(lo, longest),
                hi=1.0,
                detail=f"loss at n_test = {longest}: n_train = {hi} ({mean(hi, longest):.4g}) over n_train = {lo} ({mean(lo, longest):.4g}) (claim 16)",
            )
        )
    out.append(
        check(
            "short_tests_degrade_for_long_training_prompts",
            mean(hi, shortest) / mean(hi, hi if hi in cfg.test_ns else longest),
            lo=1.0,
            detail=f"n_train = {hi}: loss at n_test = {shortest} over the loss at n_test = n_train (claim 16)",
        )
    )
    if crossing:
        out.append(
            check(
                "longer_training_prompts_lose_on_short_tests",
                mean(hi, shortest) / mean(lo, shortest),
                lo=1.0,
                detail=f"loss at n_test = {shortest}: n_train = {hi} ({mean(hi, shortest):.4g}) over n_train = {lo} ({mean(lo, shortest):.4g}), the other half of Fig. 4's crossing; made only with >= 2 n_trains (claim 16)",
            )
        )
    return out


FIG4 = register(
    Experiment(
        name="sun2025.fig4",
        title="Fig. 4: test loss vs test length for several training lengths (8-layer bilinear TF, d = 3)",
        config=Fig4Config,
        presets={
            "smoke": dict(**SMOKE, d=2, d_bar=7, n_blocks=1, n_trains=(10, 20), test_ns=(5, 10, 20)),
            "quick": dict(**{**QUICK, "steps": 400}, n_blocks=2, n_trains=(25, 100), test_ns=(10, 25, 100)),
            "paper": dict(),
        },
        run=run_fig4,
        plot=plot_fig4,
        claims=claims_fig4,
        description="d̄ = 12 (App. I; App. H's d̄ = 4 leaves no scratch row). Error bands ± 1 std (the paper: ½ std).",
    )
)

# --------------------------------------------------------------------------------------------
# Theorem 5: freeze the FFN at the construction, train the attention


@dataclass(frozen=True, kw_only=True)
class Theorem5Config(BilinearSetup):
    seeds: int = 3
    snapshot_every: int = 0
    steps: int = 5000
    lr: float = 3e-3
    schedule: Literal["constant", "step", "cosine"] = "cosine"
    loss_rtol: float = 0.02
    pattern_tol: float = 1e-2
    gamma_rtol: float = 0.1

    def _model_ds(self) -> tuple[int, ...]:
        return ()  # the model is built with d̄ = C(d+2, 2) (the construction's FFN), not ``d_bar``


def _effective_gamma(model: BilinearTransformer, q: int) -> tuple[Tensor, float]:
    """Γ_eff = P_DD · Q[:q, :q] and the largest read-out-relevant off-pattern entry relative to it (Thm 5)."""
    P, Q = model.P[0, 0].detach().double().cpu(), model.Q[0, 0].detach().double().cpu()
    gamma = P[-1, -1] * Q[:q, :q]
    off = max(float(P[-1, :q].abs().max() * Q.abs().max()), float(Q[-1, :q].abs().max() * P[-1, -1].abs()))
    return gamma, off / float(gamma.abs().max())


def run_theorem5(cfg: Theorem5Config, ctx: RunContext) -> dict[str, Any]:
    q = math.comb(cfg.d + 2, 2)
    task = tasks.quadratic(cfg.d)
    stats = pf.quadratic_stats(cfg.d)
    W0, W1 = constructions.quadratic_ffn_weights(cfg.d, q)
    rows = []
    for s in range(cfg.seeds):
        model = BilinearTransformer(BilinearTransformerConfig(d=cfg.d, d_bar=q, n_blocks=1, init_std=cfg.init_std), generator=generator(derive_seed(s, "init")))  # fmt: skip
        model.load_weights(W0=W0[None].float(), W1=W1[None].float())
        for p in model.ffn.parameters():
            p.requires_grad_(False)
        res = train(model, functools.partial(task.sample, n=cfg.n), cfg.train_config(s), out_dir=ctx.subdir(f"seed{s}"), device=ctx.device, progress=ctx.progress, description=f"thm5-seed{s}")  # fmt: skip
        gamma, off = _effective_gamma(model, q)
        steps, loss = res.curve("test_loss")
        rows.append({"seed": s, "gamma": gamma, "off_pattern": off, "exact_loss": pf.one_block_loss(gamma, cfg.n, stats), "steps": torch.tensor(steps), "test_loss": torch.tensor(loss)})  # fmt: skip
    g_star = pf.optimal_gamma(cfg.n, stats)
    return {"rows": rows, "gamma_star": g_star, "optimal_loss": pf.one_block_loss(g_star, cfg.n, stats), "construction_loss": pf.construction_constant(cfg.d) / cfg.n}  # fmt: skip


def plot_theorem5(results: dict[str, Any], cfg: Theorem5Config, out: Path) -> list[Path]:
    from iclab.plotting import heatmap

    rows = results["rows"]
    fig, axes = subplots(1, 3)
    ax = axes[0, 0]
    band(ax, rows[0]["steps"].numpy(), torch.stack([r["test_loss"] for r in rows]), label="test loss")
    ax.axhline(results["optimal_loss"], ls="--", color="tab:green", label="L(Γ*)")
    ax.axhline(results["construction_loss"], ls=":", color="tab:red", label="L(−Λ⁻¹) = K/n")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.legend(fontsize=7)
    heatmap(axes[0, 1], rows[0]["gamma"], title="learned Γ", annotate=False)
    heatmap(axes[0, 2], results["gamma_star"], title="Γ* (exact)", annotate=False)
    return [save(fig, out / "theorem5.png")]


def claims_theorem5(results: dict[str, Any], cfg: Theorem5Config) -> list[ClaimResult]:
    rows, opt, g_star = results["rows"], results["optimal_loss"], results["gamma_star"]
    gerr = max(float(torch.linalg.matrix_norm(r["gamma"] - g_star) / torch.linalg.matrix_norm(g_star)) for r in rows)
    return [
        check(
            "learned_loss_reaches_L_gamma_star",
            max(r["exact_loss"] for r in rows) / opt - 1,
            lo=-1e-9,
            hi=cfg.loss_rtol,
            detail=f"exact loss of the learned Γ over L(Γ*) = {opt:.4f}, minus 1 (claim 12; spec §4.3: 1.877 / 3.407 at d = 3 / 4, n = 200)",
        ),
        check(
            "attention_is_5_sparse",
            max(r["off_pattern"] for r in rows),
            hi=cfg.pattern_tol,
            detail="largest read-out-relevant off-pattern product (P_{D,x̄}·|Q|, Q_{D,x̄}·P_DD) over |Γ_eff| (claim 12)",
        ),
        check(
            "learned_gamma_is_gamma_star",
            gerr,
            hi=cfg.gamma_rtol,
            detail="max over seeds ‖Γ − Γ*‖_F/‖Γ*‖_F, Γ = P_DD Q[:q, :q] (claim 12)",
        ),
    ]


THEOREM5 = register(
    Experiment(
        name="sun2025.theorem5",
        title="Thm 5: with the FFN frozen at the construction, trained attention finds Γ* = −(S + Φ̄/n)⁻¹SΛ⁻¹",
        config=Theorem5Config,
        presets={
            "smoke": dict(**{**SMOKE, "snapshot_every": 0}, d=2, loss_rtol=100.0, pattern_tol=100.0, gamma_rtol=100.0),
            "quick": dict(
                seeds=1,
                d=2,
                n=50,
                steps=1500,
                batch_size=1000,
                lr=1e-2,
                eval_batch=4096,
                eval_every=100,
                loss_rtol=0.03,
                # At quick the learned Γ is itself only within ~10 % of Γ*, and the off-pattern products
                # shrink with it (0.069 measured); the paper preset keeps 1e-2.
                pattern_tol=0.1,
                gamma_rtol=0.2,
            ),
            "paper": dict(),
        },
        run=run_theorem5,
        plot=plot_theorem5,
        claims=claims_theorem5,
        description="d̄ = C(d+2, 2), W_0, W_1 of App. C frozen, full P, Q trained with Adam; the learned Γ is scored by the exact Lemma-8 loss.",
    )
)

# --------------------------------------------------------------------------------------------
# Thm 6/9 BCD construction losses and the Prop-4 counterexample (no training)

#: spec 003 §3.6 (6 × 10 000 prompts, n = 200, Γ^{(ℓ)} = −block Gram⁻¹), L = 0..6.
BCD_REFERENCE = {3: (15.69, 6.34, 3.23, 1.03, 0.545, 0.300, 0.155), 4: (23.13, 11.40, 7.37, 4.08, 1.75, 1.06, 0.722)}


@dataclass(frozen=True, kw_only=True)
class ConstructionsConfig:
    ds: tuple[int, ...] = (3, 4)
    n: int = 200
    n_blocks: int = 6
    prompts: int = 100_000
    reference_rse: float = 0.03  # the spec's table: 1-3 % standard error
    prop4_n: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        _require_ints(self, "ds", self.ds, 1)
        require_int(self, "n", self.n, 1)
        require_int(self, "n_blocks", self.n_blocks, 1)
        require_int(self, "prompts", self.prompts, 2)
        require_int(self, "prop4_n", self.prop4_n, 1)


def run_constructions(cfg: ConstructionsConfig, ctx: RunContext) -> dict[str, Any]:
    """Monte Carlo of the ℓ-block read-outs. The bulk runs through ``algorithms.BlockCoordinateDescent`` (≈10×
    faster); the construction itself is compared with it on the first prompts of every chunk (``max_diff``)."""
    out: dict[str, Any] = {"bcd": {}}
    for d in cfg.ds:
        gammas = constructions.bcd_reference_gammas(d, cfg.n_blocks)
        model, algo = constructions.bcd(d, gammas), algorithms.BlockCoordinateDescent(-gammas.transpose(-1, -2))
        task = tasks.quadratic(d)
        sums = torch.zeros(cfg.n_blocks + 1, dtype=torch.float64)
        sq, count, diff = torch.zeros_like(sums), 0, 0.0
        g = generator(derive_seed(cfg.seed, "bcd", d))
        chunk = max(1, 2_000_000 // cfg.n)
        with torch.no_grad():
            while count < cfg.prompts:
                ep = task.sample(min(chunk, cfg.prompts - count), cfg.n, generator=g, dtype=torch.float64)
                preds = algo.iterates(ep)  # (L+1, B)
                few = ep[: min(64, ep.batch_size)]
                scale = float(preds.abs().max())
                diff = max(diff, float((model.block_predictions(few) - preds[:, : few.batch_size]).abs().max()) / scale)
                err = (preds - ep.y_query) ** 2
                sums += err.sum(1)
                sq += (err**2).sum(1)
                count += ep.batch_size
        mean = sums / count
        out["bcd"][d] = {"loss": mean, "se": ((sq / count - mean**2) / count).sqrt(), "max_diff": diff}
    feats = [{(0,): 1 - 1 / math.sqrt(2), (2,): 1 / math.sqrt(2)}, {(1,): 1.0}]
    stats = pf.feature_statistics(feats, 1)
    g = generator(derive_seed(cfg.seed, "prop4"))
    mean, se = mc_loss(constructions.prop4_counterexample(), tasks.quadratic(1), cfg.prop4_n, max(2, cfg.prompts // 10), generator=g, chunks=max(1, cfg.prompts * cfg.prop4_n // 20_000_000))  # fmt: skip
    out["prop4"] = {"mc": mean, "se": se, "exact": pf.one_block_loss(-torch.diag(torch.tensor([0.5, 1.0], dtype=torch.float64)), cfg.prop4_n, stats), "limit": 2 - math.sqrt(2)}  # fmt: skip
    return out


def plot_constructions(results: dict[str, Any], cfg: ConstructionsConfig, out: Path) -> list[Path]:
    fig, axes = subplots(1, 1, size=(4.4, 3.2))
    ax = axes[0, 0]
    for d, r in results["bcd"].items():
        ls = list(range(len(r["loss"])))
        ax.errorbar(ls, r["loss"].tolist(), yerr=(3 * r["se"]).tolist(), fmt="o-", ms=3, label=f"construction d = {d}")
        ref = BCD_REFERENCE.get(d, ())[: len(ls)]
        ax.plot(range(len(ref)), ref, "x", color="gray", label=f"spec §3.6 d = {d}")
    ax.set_yscale("log")
    ax.set_xlabel("blocks L (BCD steps)")
    ax.set_ylabel("ICL loss")
    ax.set_title(f"Thm 9 construction, n = {cfg.n}")
    ax.legend(fontsize=7)
    return [save(fig, out / "bcd.png")]


def claims_constructions(results: dict[str, Any], cfg: ConstructionsConfig) -> list[ClaimResult]:
    out = []
    for d, r in results["bcd"].items():
        loss, se = r["loss"], r["se"]
        out.append(check(f"bcd_construction_equals_algorithm_d{d}", r["max_diff"], hi=1e-10, detail="max relative |construction − BCD iterates| over every ℓ-block read-out (Thm 6/9, float64)"))  # fmt: skip
        out.append(check(f"bcd_loss_decreases_d{d}", float((loss[1:] > loss[:-1] + 3 * se[1:]).sum()), hi=0, detail=f"increases beyond 3σ over L = 0..{cfg.n_blocks}: {[round(v, 3) for v in loss.tolist()]} (claim 14)"))  # fmt: skip
        ref = torch.tensor(BCD_REFERENCE.get(d, ())[: len(loss)], dtype=torch.float64)
        if len(ref):
            z = ((loss[: len(ref)] - ref).abs() / (se[: len(ref)] ** 2 + (cfg.reference_rse * ref) ** 2).sqrt()).max()
            out.append(check(f"bcd_matches_spec_table_d{d}", float(z), hi=3.0, detail=f"max |MC − table|/σ with the table's {cfg.reference_rse:.0%} error; table {ref.tolist()} (claim 14)"))  # fmt: skip
    p = results["prop4"]
    out += [
        check(
            "prop4_counterexample_below_printed_bound",
            p["mc"] + 3 * p["se"],
            hi=1.0,
            detail=f"d = 1, d̃ = 2 at n = {cfg.prop4_n}: MC loss + 3σ vs the printed bound 1; exact {p['exact']:.4f}, limit 2 − √2 = {p['limit']:.4f} (claim 18)",
        ),
        check(
            "prop4_counterexample_matches_lemma8",
            abs(p["mc"] - p["exact"]) / p["se"],
            hi=3.0,
            detail="|MC − exact| / σ",
        ),
    ]
    return out


CONSTRUCTIONS = register(
    Experiment(
        name="sun2025.constructions",
        title="Thm 6/9: 2L-layer BCD construction losses; Prop. 4 counterexample (d = 1)",
        config=ConstructionsConfig,
        presets={
            "smoke": dict(ds=(3,), n=50, n_blocks=2, prompts=2000, reference_rse=10.0, prop4_n=100),
            "quick": dict(prompts=20_000, prop4_n=1000),
            "paper": dict(),
        },
        run=run_constructions,
        plot=plot_constructions,
        claims=claims_constructions,
        description="Γ^{(ℓ)} = −(population Gram of block ℓ)⁻¹, d̄ = 2d+1; float64 Monte Carlo of every ℓ-block read-out. Prop. 4 counterexample: FFN overwrites the constant with 1 + (x²−1)/√2.",
    )
)

# --------------------------------------------------------------------------------------------
# Prop. 1 across depth (spec claim 8): linear transformers of every depth stay above the affine floor


@dataclass(frozen=True, kw_only=True)
class LinearDepthConfig(BilinearSetup):
    depths: tuple[int, ...] = (1, 3, 6, 12)  # L attention layers, no FFN (the Prop. 1 model class)
    snapshot_every: int = 0  # the ℓ-layer read-outs are not needed here
    test_ns: tuple[int, ...] = (200,)  # the loss is read at n_train
    floor_sigmas: float = 3.0  # a loss may sit this many Monte-Carlo standard errors below the floor
    gap_tol: float = 0.0  # every depth must reach the exact one-layer optimum L₁*(n) within 3σ + gap_tol

    def __post_init__(self) -> None:
        _require_ints(self, "depths", self.depths, 1)
        super().__post_init__()


def _affine_stats(cfg: BilinearSetup) -> pf.FeatureStats:
    """Lemma-8 statistics of the features (1, x) that a linear TF's query carries (Prop. 1)."""
    return pf.feature_statistics(pf.linear_feature_polys(cfg.d), cfg.d, cfg.monomials)


def affine_oracle_gap(model: BilinearTransformer, cfg: BilinearSetup, batch: int, seed: int) -> tuple[float, float]:
    """(mean, standard error) of (ŷ − y_q)² − (ŷ_aff − y_q)² over float64 test prompts at n = ``cfg.n``.

    ŷ_aff = φ(x_q)ᵀΛ⁻¹R w is the best affine predictor in x_q for the prompt's own coefficients w (φ = (1, x),
    Λ = E φφᵀ, R = E φ x^aᵀ), whose mean squared error is exactly the Prop.-1 floor (d(d+3)/2 for quadratics). Prop. 1
    says the mean is >= 0 for every linear TF. Both errors are taken on the same prompts, so the heavy y_q² tail
    cancels: the standard error is far below that of the loss itself, and floor + mean is an unbiased, lower-variance
    estimate of the model's loss (a control variate).
    """
    m, task = model.double().cpu(), _task(cfg)
    lin = pf.linear_feature_polys(cfg.d)
    a = tasks.polynomial.monomial_set(cfg.d, cfg.monomials)
    coef = torch.linalg.solve(pf.gram(lin), pf.gram(lin, pf.monomial_polys(a)))  # (d+1, M): β(w) = Λ⁻¹ R w
    g = generator(derive_seed(seed, "affine-oracle-gap", cfg.n))
    chunks = max(1, batch * cfg.n // 2_000_000)
    diffs = []
    with torch.no_grad():
        for size in (batch // chunks + (i < batch % chunks) for i in range(chunks)):
            ep = task.sample(size, cfg.n, generator=g, dtype=torch.float64)
            phi = torch.cat([torch.ones_like(ep.x_query[:, :1]), ep.x_query], dim=-1)  # (B, d+1)
            oracle = torch.einsum("bp,pm,bm->b", phi, coef, ep.task["w"])  # (B,)
            diffs.append((m.predict(ep) - ep.y_query) ** 2 - (oracle - ep.y_query) ** 2)
    model.float()
    dd = torch.cat(diffs)
    return float(dd.mean()), float(dd.std() / math.sqrt(dd.numel()))


def run_linear_depth(cfg: LinearDepthConfig, ctx: RunContext) -> dict[str, Any]:
    base = _model_base(cfg, cfg.d)
    models = {f"L{L}": BilinearTransformerConfig(**base, n_blocks=L, ffn="none") for L in cfg.depths}
    rows = _run_models(cfg, ctx, models, cfg.d, measure=lambda m, s: {"floor_gap": affine_oracle_gap(m, cfg, cfg.test_batch, s)})  # fmt: skip
    stats, task = _affine_stats(cfg), _task(cfg)
    g = generator(derive_seed(0, "affine-ls", cfg.d, cfg.n))
    ls = mc_loss(algorithms.FeatureLeastSquares(1), task, cfg.n, cfg.test_batch, generator=g, chunks=max(1, cfg.test_batch * cfg.n // 2_000_000))  # fmt: skip
    return {"rows": rows, "floor": stats.floor, "one_layer": pf.optimal_loss(cfg.n, stats), "affine_ls": ls}


def _floor_cv(results: dict[str, Any], r: dict[str, Any]) -> tuple[float, float]:
    """(floor + mean paired gap, its standard error): the control-variate loss estimate of one trained model."""
    gap, se = r["floor_gap"]
    return results["floor"] + gap, se


def _depth_losses(results: dict[str, Any], cfg: LinearDepthConfig) -> Tensor:
    """(seeds, depths) control-variate test loss at n_train."""
    rows = results["rows"]
    return torch.tensor([[_floor_cv(results, r)[0] for L in cfg.depths for r in rows if r["model"] == f"L{L}" and r["seed"] == s] for s in range(cfg.seeds)])  # fmt: skip


def plot_linear_depth(results: dict[str, Any], cfg: LinearDepthConfig, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 2)
    ax = axes[0, 0]
    losses = _depth_losses(results, cfg)
    band(ax, list(cfg.depths), losses, label="trained linear TF", marker="o", ms=4)
    ses = [max(_floor_cv(results, r)[1] for r in rows if r["model"] == f"L{L}") for L in cfg.depths]
    ax.errorbar(cfg.depths, losses.mean(0).tolist(), yerr=[cfg.floor_sigmas * s for s in ses], fmt="none", ecolor="k", capsize=3, lw=0.8)  # fmt: skip
    ax.axhline(results["floor"], ls="--", color="gray", lw=0.8, label=f"affine floor {results['floor']:.3g} (Prop. 1)")
    ax.axhline(results["one_layer"], ls=":", color="tab:green", lw=0.8, label=f"best 1-layer (5)-sparse LSA, n = {cfg.n} (exact)")  # fmt: skip
    ax.axhline(results["affine_ls"][0], ls="-.", color="tab:red", lw=0.8, label=f"least squares on (1, x), n = {cfg.n}")
    ax.set_xscale("log")
    ax.set_xticks(list(cfg.depths), [str(L) for L in cfg.depths])
    ax.set_xlabel("linear TF depth L")
    ax.set_ylabel(f"ICL test loss at n = {cfg.n}")
    ax.set_title(f"Prop. 1 at every depth (d = {cfg.d}); bars ± {cfg.floor_sigmas:g}σ (paired)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[0, 1]
    for L in cfg.depths:
        rs = [r for r in rows if r["model"] == f"L{L}"]
        band(ax, rs[0]["steps"].numpy(), torch.stack([r["test_loss"] for r in rs]), label=f"L = {L}")
    ax.axhline(results["floor"], ls="--", color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("test loss (training eval batch)")
    ax.legend(fontsize=7)
    return [save(fig, out / "linear_depth.png")]


def claims_linear_depth(results: dict[str, Any], cfg: LinearDepthConfig) -> list[ClaimResult]:
    rows, floor, one, k = results["rows"], results["floor"], results["one_layer"], cfg.floor_sigmas
    cv = [(*_floor_cv(results, r), r["model"]) for r in rows]
    worst = min((m + k * s, name) for m, s, name in cv)
    trained = max((m - k * s) - one for m, s, _ in cv)
    n_gap = [round(cfg.n * (float(m) - floor), 1) for m in _depth_losses(results, cfg).mean(0)]
    per = ", ".join(f"{name} {m:.3f} ± {s:.3f}" for m, s, name in cv)
    return [
        check(
            "no_depth_below_affine_floor",
            worst[0],
            lo=floor,
            detail=f"min over depths {cfg.depths} and seeds of (loss + {k:g}σ) at n = {cfg.n} (lowest: {worst[1]}), loss = floor + mean[(ŷ − y)² − (ŷ_aff − y)²] on common prompts, σ its paired standard error; Prop. 1's floor d(d+3)/2 holds at every n (no finite-n correction). Per model: {per} (claim 8)",
        ),
        check(
            "every_depth_reaches_one_layer_optimum",
            trained,
            hi=cfg.gap_tol,
            detail=f"max over depths, seeds of (loss − {k:g}σ) − L₁*(n), L₁*({cfg.n}) = {one:.4f} the exact best one-layer (5)-sparse LSA (spec §3.1): the runs are trained, so the floor check is not vacuous. n·(loss − floor) per depth: {n_gap} (the O(1/n) gap of claim 8)",
        ),
    ]


LINEAR_DEPTH = register(
    Experiment(
        name="sun2025.linear_depth",
        title="Prop. 1 at every depth: linear TFs with L = 1, 3, 6, 12 layers stay above the affine floor d(d+3)/2",
        config=LinearDepthConfig,
        presets={
            "smoke": dict(**{**SMOKE, "snapshot_every": 0}, d=2, d_bar=7, depths=(1, 2), test_ns=(20,), gap_tol=100.0),
            # quick: lr 3e-3 and Adam ε = 1e-3 (QUICK's lr 1e-2: the 12-layer linear TF's test loss is NaN by step 250;
            # ε = 1e-8: NaN at step 50 at 3e-3 and inf at step 100 at 1e-3; docs/papers/sun2025.md "Stability").
            # gap_tol 1.5: 700 steps leave L = 1 short of L₁*(50) (its identity init starts on a saddle).
            "quick": dict(**{**QUICK, "snapshot_every": 0, "lr": 3e-3, "eps": 1e-3}, test_ns=(50,), gap_tol=1.5),
            "paper": dict(),
        },
        run=run_linear_depth,
        plot=plot_linear_depth,
        claims=claims_linear_depth,
        description="The linear TF (ffn='none': L LSA layers with full P, Q on [1; x; 0; y], d̄ = 12) on random quadratics, d = 3, Fig. 1's training settings. Reference lines: the floor 9, the exact best one-layer (5)-sparse LSA and least squares on (1, x) from the n context pairs.",
    )
)

# --------------------------------------------------------------------------------------------
# Sec. 2.2 remark (spec claim 20): FFN → LSA blocks vs the usual LSA → FFN order


@dataclass(frozen=True, kw_only=True)
class OrderAblationConfig(BilinearSetup):
    blocks: tuple[int, ...] = (2, 4)
    orders: tuple[str, ...] = ("ffn_first", "attention_first")
    ratio_tol: float = 1.5  # comparable: the larger mean loss is at most this times the smaller
    floor_sigmas: float = 3.0

    def __post_init__(self) -> None:
        _require_ints(self, "blocks", self.blocks, 1)
        _require_choices(self, "orders", self.orders, ORDERS)
        super().__post_init__()


def run_order_ablation(cfg: OrderAblationConfig, ctx: RunContext) -> dict[str, Any]:
    base = _model_base(cfg, cfg.d)
    models = {f"{o}-L{L}": BilinearTransformerConfig(**base, n_blocks=L, order=o) for L in cfg.blocks for o in cfg.orders}  # fmt: skip
    rows = _run_models(cfg, ctx, models, cfg.d)
    for r in rows:
        r["order"], r["L"] = r["model"].rsplit("-L", 1)[0], int(r["model"].rsplit("-L", 1)[1])
    return {"rows": rows, "floor": _affine_stats(cfg).floor}


def plot_order_ablation(results: dict[str, Any], cfg: OrderAblationConfig, out: Path) -> list[Path]:
    rows = results["rows"]
    fig, axes = subplots(1, 3)
    ax = axes[0, 0]
    for o in cfg.orders:
        ys = torch.tensor([[_at(cfg, r, cfg.n)[0] for L in cfg.blocks for r in rows if r["order"] == o and r["L"] == L and r["seed"] == s] for s in range(cfg.seeds)])  # fmt: skip
        band(ax, list(cfg.blocks), ys, label=o, marker="o", ms=4)
    ax.axhline(results["floor"], ls="--", color="gray", lw=0.8, label="linear-TF floor (Prop. 1)")
    ax.set_yscale("log")
    ax.set_xticks(list(cfg.blocks))
    ax.set_xlabel("blocks L (2L layers)")
    ax.set_ylabel(f"ICL test loss at n = {cfg.n}")
    ax.set_title(f"block order, d = {cfg.d}, d̄ = {cfg.d_bar}")
    ax.legend(fontsize=7)
    _length_panel(axes[0, 1], cfg, rows, "model", "loss vs test length", results["floor"])
    _model_curves(axes[0, 2], rows, "training curves")
    return [save(fig, out / "order_ablation.png")]


def claims_order_ablation(results: dict[str, Any], cfg: OrderAblationConfig) -> list[ClaimResult]:
    rows, floor, k = results["rows"], results["floor"], cfg.floor_sigmas
    out = []
    for L in cfg.blocks:
        means = {o: _mean([r for r in rows if r["order"] == o and r["L"] == L], cfg, cfg.n) for o in cfg.orders}
        ratio = max(means.values()) / min(means.values())
        out.append(check(f"orders_comparable_L{L}", ratio, hi=cfg.ratio_tol, detail=f"larger / smaller mean loss at n = {cfg.n}: {({o: round(m, 4) for o, m in means.items()})} (claim 20; the attention-first model's last FFN cannot reach the read-out, so it has L − 1 useful FFNs)"))  # fmt: skip
        worst = max(_at(cfg, r, cfg.n)[0] + k * _at(cfg, r, cfg.n)[1] for r in rows if r["L"] == L)
        out.append(check(f"both_orders_below_linear_floor_L{L}", worst, hi=floor, detail=f"max over orders, seeds of (loss + {k:g}σ) vs the Prop. 1 floor d(d+3)/2 (claims 9, 20)"))  # fmt: skip
    return out


ORDER_ABLATION = register(
    Experiment(
        name="sun2025.order_ablation",
        title="Sec. 2.2 remark: [FFN → LSA] blocks (the paper's) vs [LSA → FFN] (the usual order) at equal depth",
        config=OrderAblationConfig,
        presets={
            "smoke": dict(**SMOKE, d=2, d_bar=7, blocks=(2,), test_ns=(10, 20), ratio_tol=100.0, floor_sigmas=0.0),
            "quick": dict(**QUICK, blocks=(2,), test_ns=(25, 50, 100)),
            "paper": dict(),
        },
        run=run_order_ablation,
        plot=plot_order_ablation,
        claims=claims_order_ablation,
        description="Quadratic ICL, d = 3, d̄ = 12, Fig. 1's training settings; the same bilinear FFN and LSA layers in either order (label row masked in the FFN either way). Not an experiment of the paper (spec §5.1, claim 20).",
    )
)
