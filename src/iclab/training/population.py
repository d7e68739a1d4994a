"""The training regimes of Zhang, Singh, Latham, Saxe 2025: population flow, full-batch GD, online SGD.

Every function trains a reduced linear-attention model (:class:`~iclab.models.MergedAttention`,
:class:`~iclab.models.SeparateAttention`, optionally with a leading seed axis) in place and returns a
:class:`Trajectory`. The loss is the query MSE without ½ (eq. 5), so a GD step with learning rate η is
an Euler step of τ dθ/dt = −½ ∂L/∂θ with Δt/τ = 2η: ``Trajectory.time`` = 2·η·step.

* :func:`population_flow` — GD on the exact population loss L(W) = tr Λ − 2 tr(Λ² W) + tr(Wᵀ E(Λ̂²) W Λ)
  (eq. 5 expanded for w ~ N(0, I), as in the proof of eq. 63, App. E.4), the gradient flow of eq. (14)/(84)
  and App. D with no sampling at all. This is not SGD on sampled episodes, so it is its own small integrator
  instead of :func:`iclab.training.train`: one step is a few (d, d) products, independent of any data size.
* :func:`full_batch_gd` — the paper's regime: plain GD on a fixed training set of P sequences. The
  models read the data only through ŷ = βᵀ W x_q, so the training loss is a quadratic in vec(W) with
  the moments of the cubic feature z = vec(β x_qᵀ) (eq. 7, 44): they are computed once per dataset,
  and each step then costs O(d⁴) whatever P is (``method='samples'`` keeps the O(P d²) per-step
  evaluation from β and x_q, for checking). Other modules (e.g. softmax token-level models) fall back
  to autograd on ``model.predict``.
* :func:`online_sgd` — SGD on a fresh batch every step, through the shared trainer.

All blocks: a model built with ``all_blocks=True`` (the zero blocks of Sec. 2.3-2.4 as parameters, App. G) reads
the token second moment s instead of β (:func:`~iclab.models.reduced_attention.all_blocks_statistic`); the same
moment route then trains every weight of the one-layer linear attention on the finite set (z = x_q ⊗ vec s has
D(D+1)² entries: a (100, 100) second moment for D = 4), and the exact population loss of the iterates comes from
:func:`~iclab.theory.attention_dynamics.all_blocks_population_moments` (fixed N only, no ``next_token``).
:func:`population_flow` of such a model is GD on that exact loss.

Next-token loss (eq. 23): ``next_token=True`` trains on every prefix of each sequence
(:func:`~iclab.models.reduced_attention.prefix_statistics`); the population counterpart is
:func:`population_flow` with ``inv_n = expected_inv_n(N_max)`` (eq. 26).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.learner import Learner
from iclab.models.reduced_attention import _ReducedAttention, context_statistic, cubic_feature, prefix_statistics
from iclab.theory.attention_dynamics import all_blocks_population_moments, population_loss, second_moment_hat
from iclab.training import _reduced_flow as reduced_flow
from iclab.training.config import DType, TrainConfig
from iclab.training.results import StepTiming, Trajectory
from iclab.training.trainer import train

__all__ = ["Trajectory", "full_batch_gd", "online_sgd", "population_flow"]


# --- helpers --------------------------------------------------------------------------------------


def _check_common(owner: str, model: nn.Module, lr: float, steps: int, record_every: int) -> None:
    require(owner, "lr", float(lr) > 0, "a float > 0", lr)
    require_int(owner, "steps", steps, 0)
    require_int(owner, "record_every", record_every, 1)


def _require_reduced(owner: str, model: nn.Module) -> _ReducedAttention:
    require(
        owner,
        "model",
        isinstance(model, _ReducedAttention),
        "a reduced linear-attention model (MergedAttention or SeparateAttention)",
        type(model).__name__,
    )
    assert isinstance(model, _ReducedAttention)
    return model


def _record_steps(steps: int, record_every: int) -> list[int]:
    out = list(range(0, steps + 1, record_every))
    return out if out[-1] == steps else [*out, steps]


def _seeds_first(t: Tensor, batched: bool) -> Tensor:
    """(T, S, ...) -> (S, T, ...) when the model carries seeds."""
    return t.movedim(0, 1).contiguous() if batched else t


def _context_length(owner: str, inv_n: float) -> int:
    """N from inv_n = 1/N: the all-blocks population moments need a fixed context length."""
    n = round(1.0 / float(inv_n)) if float(inv_n) > 0 else 0
    require(owner, "inv_n", n >= 1 and abs(n * float(inv_n) - 1) < 1e-12, "1/N for a fixed N (all_blocks)", inv_n)
    return n


def _quadratic(moments: tuple[Tensor, Tensor, Tensor], W: Tensor) -> Tensor:
    """E(y − vec(W)ᵀ z)² = yy − 2 cᵀw + wᵀ M w for the moments (M, c, yy) of z: (…, k, d) -> (…)."""
    M, c, yy = moments
    w = W.mT.flatten(-2)  # vec(W), columns stacked like z
    return yy - 2 * (c * w).sum(-1) + (w * (w @ M.mT)).sum(-1)


def _population(model: _ReducedAttention, params: dict[str, Tensor], Lambda: Tensor, inv_n: float) -> Tensor:
    """Exact population loss of stacked snapshots (T, [S], ...) -> (T, [S])."""
    W = model.effective_matrix(params)
    Lam = Lambda.to(device=W.device, dtype=W.dtype)
    if model.all_blocks:
        return _quadratic(all_blocks_population_moments(Lam, _context_length("population loss", inv_n)), W)
    return population_loss(W, Lam, inv_n)


def _finish(
    model: _ReducedAttention,
    snaps: dict[str, list[Tensor]],
    rec: list[int],
    lr: float,
    loss: Tensor,
    train_loss: Tensor | None,
    meta: dict[str, Any],
) -> Trajectory:
    batched = model.n_seeds is not None
    params = {k: _seeds_first(torch.stack(v), batched).cpu() for k, v in snaps.items()}
    steps = torch.tensor(rec, dtype=torch.long)
    return Trajectory(
        steps=steps,
        time=2.0 * lr * steps.to(torch.float64),
        loss=_seeds_first(loss, batched).cpu(),
        params=params,
        train_loss=None if train_loss is None else _seeds_first(train_loss, batched).cpu(),
        meta={"lr": float(lr), "n_seeds": model.n_seeds, **meta},
    )


def _nonfinite(owner: str, params: dict[str, Tensor], lr: float) -> None:
    if not all(bool(torch.isfinite(v).all()) for v in params.values()):
        raise FloatingPointError(f"{owner}: parameters became non-finite (lr={lr}); lower the learning rate")


# --- population flow -------------------------------------------------------------------------------


@torch.no_grad()
def population_flow(
    model: nn.Module, Lambda: Tensor, *, inv_n: float, lr: float, steps: int, record_every: int = 1
) -> Trajectory:
    """GD with learning rate ``lr`` on the exact population loss (Euler steps of eq. 14/84, Δt = 2·lr·τ).

    x ~ N(0, Λ), w ~ N(0, I), noiseless, ``inv_n`` = 1/N (fixed context length) or E(1/N) (varying
    length / next-token loss, eq. 26). Per step: W = effective matrix, G = Λ² − E(Λ̂²) W Λ (eq. 57),
    θ ← θ + 2·lr·(−½ ∂L/∂θ)(G) from :meth:`parameter_flow`. All seeds of a batched model step together.
    Updates ``model`` in place; the recorded losses come from
    :func:`iclab.theory.attention_dynamics.population_loss` on the snapshots.
    """
    owner = "population_flow"
    _check_common(owner, model, lr, steps, record_every)
    m = _require_reduced(owner, model)
    params = m.params()
    ref = params["v"]
    Lam = torch.as_tensor(Lambda).to(device=ref.device, dtype=ref.dtype)
    if m.all_blocks:  # the same GD on the exact population moments of the all-blocks feature
        mom = all_blocks_population_moments(Lam, _context_length(owner, inv_n))
        given = _full_batch_reduced(m, [mom], lr, steps, record_every, "given", owner)
        return _finish(m, *given[:2], lr, given[2], None, {"mode": "population_flow", "inv_n": float(inv_n)})
    A = second_moment_hat(Lam, inv_n)  # E(Λ̂²), validates Λ and inv_n
    L2 = Lam @ Lam
    rec = _record_steps(steps, record_every)
    snaps: dict[str, list[Tensor]] = {k: [] for k in params}

    def advance(n: int) -> None:  # n steps; in one C call where it takes the model (_reduced_flow)
        if n and reduced_flow.population_steps(m, params, n, 2.0 * lr, L2, A, Lam):
            return
        for _ in range(n):
            W = m.effective_matrix(params)  # (…, d, d)
            G = L2 - A @ W @ Lam  # −½ ∂L/∂W, eq. (57)
            for k, g in m.parameter_flow(G, params).items():
                params[k].add_(g, alpha=2.0 * lr)

    done = 0
    for step in rec:
        advance(step - done)
        done = step
        for k, v in params.items():
            snaps[k].append(v.clone())
    _nonfinite(owner, params, lr)
    m.load_params(params)
    stacked = {k: torch.stack(v) for k, v in snaps.items()}
    loss = _population(m, stacked, Lam, inv_n)
    return _finish(m, snaps, rec, lr, loss, None, {"mode": "population_flow", "inv_n": float(inv_n)})


# --- full-batch GD on a fixed training set ---------------------------------------------------------


def _statistics(
    episode: Episode, next_token: bool, model: _ReducedAttention | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(β, x_q, y_q) of every regression problem in the training set: (P, d), (P, d), (P,); vec s (P, (d+1)²) in
    place of β for an all-blocks ``model``."""
    if model is not None and model.all_blocks:
        require("full_batch_gd", "next_token", not next_token, "False for an all_blocks model (fixed N)", True)
        if episode.y_query is None:
            raise ValueError("full_batch_gd needs training episodes with y_query (the targets)")
        return model.statistic(episode), episode.x_query, episode.y_query
    if next_token:
        beta, xq, yq = prefix_statistics(episode)
        d = episode.d
        return beta.reshape(-1, d), xq.reshape(-1, d), yq.reshape(-1)
    if episode.y_query is None:
        raise ValueError("full_batch_gd needs training episodes with y_query (the targets)")
    return context_statistic(episode), episode.x_query, episode.y_query


def _moments(beta: Tensor, xq: Tensor, yq: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """E_P(z zᵀ) (d², d²), E_P(y z) (d²,), E_P(y²) () for the cubic feature z = vec(β x_qᵀ) (eq. 7)."""
    z = cubic_feature(beta, xq)  # (P, d²), column-stacked: ŷ = vec(W)ᵀ z
    P = z.shape[0]
    return z.T @ z / P, z.T @ yq / P, yq.pow(2).mean()


@torch.no_grad()
def _full_batch_reduced(
    m: _ReducedAttention,
    data: list[tuple[Tensor, Tensor, Tensor]],
    lr: float,
    steps: int,
    record_every: int,
    method: str,
    owner: str = "full_batch_gd",
) -> tuple[dict[str, list[Tensor]], list[int], Tensor]:
    """GD on the MSE of each seed's data: ``data`` holds (β, x_q, y_q) per seed, or with ``method='given'`` the
    moments (M, c, yy) of z themselves (e.g. population moments)."""
    params = m.params()
    d, width = m.d, m.stat_dim
    per_seed = len(data) > 1
    stack = (lambda ts: torch.stack(ts)) if per_seed else (lambda ts: ts[0])
    if method in ("moments", "given"):
        mom = data if method == "given" else [_moments(*t) for t in data]
        M, c, yy = (stack([x[i] for x in mom]) for i in range(3))  # ([S,] d², d²), ([S,] d²), ([S,])
    else:
        beta, xq, yq = (stack([x[i] for x in data]) for i in range(3))  # ([S,] P, d), ..., ([S,] P)
    rec = _record_steps(steps, record_every)
    snaps: dict[str, list[Tensor]] = {k: [] for k in params}
    losses: list[Tensor] = []

    def gradient(with_loss: bool) -> tuple[Tensor, Tensor | None]:  # (−½ ∂L/∂W, the training MSE) at the parameters
        W = m.effective_matrix(params)  # ([S,] d, d)
        if method in ("moments", "given"):
            w = W.mT.flatten(-2)  # ([S,] d²): vec(W), columns stacked like z
            Mw = (M @ w.unsqueeze(-1)).squeeze(-1)
            G = (c - Mw).unflatten(-1, (d, width)).mT  # mean(r β x_qᵀ) = −½ ∂L/∂W
            return G, yy - 2 * (c * w).sum(-1) + (w * Mw).sum(-1) if with_loss else None
        r = yq - torch.einsum("...pi,...ij,...pj->...p", beta, W, xq)  # ([S,] P) residuals
        G = torch.einsum("...p,...pi,...pj->...ij", r, beta, xq) / r.shape[-1]
        return G, r.pow(2).mean(-1) if with_loss else None

    G: Tensor | None = None  # the gradient at the current parameters, where a recorded step computed it
    step = 0
    for target in rec:
        # the steps up to the next recorded one: the moment route in one C call where it takes the model
        fast = target > step and method in ("moments", "given")
        if fast and reduced_flow.moment_steps(m, params, target - step, 2.0 * lr, M, c):
            step = target
        while step < target:
            for k, g in m.parameter_flow(G if G is not None else gradient(False)[0], params).items():
                params[k].add_(g, alpha=2.0 * lr)
            G, step = None, step + 1
        G, loss = gradient(True)
        losses.append(cast(Tensor, loss))
        for k, v in params.items():
            snaps[k].append(v.clone())
    _nonfinite(owner, params, lr)
    m.load_params(params)
    return snaps, rec, torch.stack(losses)


def _full_batch_autograd(
    model: nn.Module,
    episode: Episode,
    lr: float,
    steps: int,
    record_every: int,
    out_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    description: str = "full_batch_gd",
) -> tuple[dict[str, list[Tensor]], list[int], Tensor, StepTiming | None]:
    """Plain full-batch GD for any module with ``predict``, through the one trainer: SGD without
    momentum on the fixed set (``train_size = batch_size = P``), the parameters and the training MSE
    recorded at the steps of :func:`_record_steps`, and the trainer's step timer. With ``out_dir`` the trainer
    checkpoints there (every ``checkpoint_every`` steps, and when asked to stop) and resumes bit for bit."""

    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    require("full_batch_gd", "model", bool(named), "a module with trainable parameters", type(model).__name__)
    y_query = episode.y_query
    if y_query is None:
        raise ValueError("full_batch_gd needs training episodes with y_query (the targets)")
    rec = _record_steps(steps, record_every)

    def mse() -> Tensor:
        with torch.no_grad():
            return (cast(Learner, model).predict(episode) - y_query).pow(2).mean()

    if steps == 0:
        return {k: [p.detach().clone()] for k, p in named}, rec, mse().reshape(1), None
    dtype = named[0][1].dtype
    cfg = TrainConfig(
        steps=steps, batch_size=episode.batch_size, train_size=episode.batch_size, optimizer="sgd", lr=lr,
        eval_every=0, log_every=record_every, snapshot_every=record_every, checkpoint_every=checkpoint_every,
        dtype=cast(DType, str(dtype).removeprefix("torch.")), progress=False,
    )  # fmt: skip
    result = train(
        model,
        lambda batch, *, generator, dtype: episode,  # the fixed training set; no randomness to draw
        cfg,
        out_dir=out_dir,
        device=episode.device,
        test_episode=episode,
        snapshot_fn=lambda m: {k: p.detach() for k, p in m.named_parameters() if p.requires_grad},
        description=description,
    )
    by_step = {int(r["step"]): r["train_loss"] for r in result.history}  # MSE before that step's update
    losses = [by_step[t] if t < steps else result.final_test_loss for t in rec]  # after the last update
    snaps = {k: list(v.to(device=episode.device, dtype=dtype).unbind(0)) for k, v in result.snapshots.items()}
    _nonfinite("full_batch_gd", {k: p.detach() for k, p in named}, lr)
    return snaps, rec, torch.tensor(losses, dtype=dtype, device=episode.device), result.timing


def full_batch_gd(
    model: nn.Module,
    episodes: Episode | Sequence[Episode],
    *,
    lr: float,
    steps: int,
    record_every: int = 1,
    Lambda: Tensor | None = None,
    inv_n: float | None = None,
    next_token: bool = False,
    method: Literal["moments", "samples"] = "moments",
    out_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    description: str = "full_batch_gd",
) -> Trajectory:
    """Plain GD (``torch.optim.SGD`` without momentum, whole set every step) on the MSE of a fixed
    training set of P sequences — the regime of every figure of the paper (its "gradient descent"; the
    authors' code steps ``torch.optim.SGD`` on the whole training set).

    ``episodes``: one training set, or one per seed (a sequence of S episodes for a model with
    ``n_seeds = S``; a single set is shared by all seeds). ``Lambda`` (and ``inv_n``, default 1/N or
    E(1/N) with ``next_token``) makes ``loss`` the exact population loss of the iterates;
    ``train_loss`` is always the training MSE. ``next_token``: the loss of eq. (23) over all prefixes.

    Reduced models use the sufficient statistics: ``method='moments'`` (default) pre-computes the
    (d², d²) second moment of z = vec(β x_qᵀ) once, ``'samples'`` keeps β and x_q (P, d). Both are the
    same GD up to float rounding. An ``all_blocks`` model trains every weight of the one-layer attention in the
    same way (vec s in place of β; ``loss`` with ``Lambda`` is then its exact population loss). Any other module
    with ``predict`` is trained by autograd on the full batch through :func:`iclab.training.train` (single seed,
    no ``next_token``): e.g. the token-level :class:`~iclab.models.LinearTransformer`, which the moment route
    equals step by step. Such a module's run checkpoints in ``out_dir`` (every ``checkpoint_every`` steps and when
    asked to stop, :mod:`iclab.training.stop`) and a later call with the same arguments continues it bit for bit
    (a finished one is loaded; ``description`` names it in a stop's message); the moment route takes milliseconds to
    seconds and keeps no checkpoint.
    """
    owner = "full_batch_gd"
    _check_common(owner, model, lr, steps, record_every)
    require(owner, "method", method in ("moments", "samples"), "'moments' or 'samples'", method)
    eps = [episodes] if isinstance(episodes, Episode) else list(episodes)
    require(owner, "episodes", len(eps) >= 1, "an Episode or a non-empty sequence of them", episodes)
    n_ctx = eps[0].n
    if inv_n is None and Lambda is not None:
        from iclab.theory.attention_dynamics import expected_inv_n

        inv_n = expected_inv_n(n_ctx) if next_token else 1.0 / n_ctx
    meta = {"mode": "full_batch_gd", "P": eps[0].batch_size, "n": n_ctx, "next_token": next_token}
    if not isinstance(model, _ReducedAttention):
        require(owner, "episodes", len(eps) == 1, "one training set for a module without seeds", f"{len(eps)} sets")
        require(owner, "next_token", not next_token, "False for token-level modules", next_token)
        require(owner, "Lambda", Lambda is None, "None for modules without an effective matrix", "a matrix")
        snaps, rec, train, timing = _full_batch_autograd(
            model, eps[0], lr, steps, record_every, out_dir, checkpoint_every, description
        )
        params = {k: torch.stack(v).cpu() for k, v in snaps.items()}
        steps_t = torch.tensor(rec, dtype=torch.long)
        time_t = 2.0 * lr * steps_t.to(torch.float64)
        return Trajectory(steps_t, time_t, train.cpu(), params, train.cpu(), {"lr": lr, **meta}, timing=timing)
    S = model.n_seeds
    require(
        owner,
        "episodes",
        len(eps) == 1 or len(eps) == S,
        f"one training set or one per seed ({S})",
        f"{len(eps)} training sets",
    )
    ref = model.v
    data = []
    for ep in eps:
        require(owner, "episodes", ep.d == model.d, f"episodes with d = {model.d}", f"d = {ep.d}")
        beta, xq, yq = (t.to(device=ref.device, dtype=ref.dtype) for t in _statistics(ep, next_token, model))
        data.append((beta, xq, yq))
    snaps, rec, train = _full_batch_reduced(model, data, lr, steps, record_every, method)
    if Lambda is None:
        loss = train
    else:
        assert inv_n is not None  # set above when Lambda is given
        loss = _population(model, {k: torch.stack(v) for k, v in snaps.items()}, torch.as_tensor(Lambda), inv_n)
        meta["inv_n"] = float(inv_n)
    return _finish(model, snaps, rec, lr, loss, train, meta)


# --- online SGD through the shared trainer ---------------------------------------------------------


def online_sgd(
    model: nn.Module,
    task: Any,
    *,
    batch: int,
    lr: float,
    steps: int,
    n: int,
    generator: torch.Generator,
    record_every: int = 1,
    Lambda: Tensor | None = None,
    inv_n: float | None = None,
    next_token: bool = False,
) -> Trajectory:
    """SGD (no momentum) on a fresh batch of ``batch`` sequences with ``n`` context pairs every step,
    run by :func:`iclab.training.train`; seeds of a batched model each get their own gradient (the
    loss is summed over seeds) but see the same batches.

    ``loss`` is the exact population loss of the recorded iterates, with Λ = ``task.Sigma`` and
    inv_n = 1/n (E(1/N) with ``next_token``) unless given; the task must then be noiseless with
    w ~ N(0, I). The trainer's seed is drawn from ``generator``.
    """
    from iclab.theory.attention_dynamics import expected_inv_n

    owner = "online_sgd"
    _check_common(owner, model, lr, steps, record_every)
    m = _require_reduced(owner, model)
    require_int(owner, "steps", steps, 1)
    require_int(owner, "batch", batch, 1)
    require_int(owner, "n", n, 1)
    if Lambda is None:
        ok = (
            getattr(task, "Sigma", None) is not None
            and getattr(task, "noise_std", None) == 0
            and getattr(task, "weight_prior", None) == "identity"
        )
        require(owner, "Lambda", ok, "given, unless the task is noiseless with w ~ N(0, I) and has .Sigma", None)
        Lambda = task.Sigma
    if inv_n is None:
        inv_n = expected_inv_n(n) if next_token else 1.0 / n
    ref = m.v
    dtype_name = {torch.float32: "float32", torch.float64: "float64"}.get(ref.dtype)
    require(owner, "model", dtype_name is not None, "float32 or float64 parameters", ref.dtype)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))

    def loss_fn(model_: nn.Module, episode: Episode) -> Tensor:
        beta, xq, yq = _statistics(episode, next_token, m)
        return (m.from_statistics(beta, xq) - yq).pow(2).mean(-1).sum()

    cfg = TrainConfig(
        steps=steps,
        batch_size=batch,
        optimizer="sgd",
        lr=lr,
        resample_every=1,
        eval_every=0,
        eval_batch=batch,
        snapshot_every=record_every,
        checkpoint_every=0,
        log_every=record_every,
        seed=seed,
        dtype=cast(DType, dtype_name),  # checked above
        progress=False,
    )
    result = train(
        m,
        lambda b, *, generator, dtype: task.sample(b, n, generator=generator, dtype=dtype),
        cfg,
        device=ref.device,
        loss_fn=loss_fn,
        snapshot_fn=lambda mod: {k: getattr(mod, k) for k in m.names},
    )
    snaps = {k: list(v.to(ref.dtype).unbind(0)) for k, v in result.snapshots.items()}
    rec = list(result.snapshot_steps)
    loss = _population(m, {k: torch.stack(v) for k, v in snaps.items()}, torch.as_tensor(Lambda), inv_n)
    meta = {"mode": "online_sgd", "batch": batch, "n": n, "inv_n": float(inv_n), "seed": seed, "next_token": next_token}
    return _finish(m, snaps, rec, lr, loss, None, meta)
