"""Population gradient flow, full-batch GD and online SGD for the reduced attention models
(Zhang, Singh, Latham, Saxe 2025, eq. 5, 14, 57, 84; conservation laws 55, 83, 89; next-token loss 23).

Exactness in float64 to 1e-10 (chain rule, batched seeds, sufficient statistics vs samples vs autograd);
statistical claims (population loss and gradient = Monte Carlo) at 3σ with fixed seeds.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import iclab
from conftest import F64, assert_close
from iclab import models, tasks
from iclab.models.reduced_attention import context_statistic, prefix_statistics
from iclab.tasks.linear_regression import rotated_covariance
from iclab.theory.attention_dynamics import expected_inv_n, population_gradient, population_loss
from iclab.training import Trajectory, full_batch_gd, online_sgd, population_flow

D, N = 4, 31
SPEC_LAMBDA = (0.4, 0.3, 0.2, 0.1)  # Fig. 3: tr Λ = 1
PLATEAUS = torch.tensor([1.0, 0.64058, 0.37737, 0.20980, 0.13600], dtype=F64)  # eq. (19), the dashed lines of Fig. 3a


def _lambda(seed: int = 0) -> torch.Tensor:
    return rotated_covariance(SPEC_LAMBDA, generator=iclab.generator(seed))


def _model(kind: str, *, seed: int = 1, w_init: float = 1.0, n_seeds: int | None = None, H: int = 3, R: int = 2):
    g = iclab.generator(seed)
    if kind == "merged":
        return models.MergedAttention(D, H, w_init=w_init, generator=g, n_seeds=n_seeds).to(F64)
    return models.SeparateAttention(D, H, R, w_init=w_init, generator=g, n_seeds=n_seeds).to(F64)


def _task(Lambda: torch.Tensor) -> tasks.LinearRegression:
    return tasks.LinearRegression(d=D, covariance=Lambda)


# --- chain rule and the population statistics ------------------------------------------------------


@pytest.mark.parametrize("n_seeds", [None, 2])
@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_parameter_flow_is_minus_half_autograd(kind: str, n_seeds: int | None) -> None:
    """parameter_flow(G(W)) = −½ ∂L/∂θ for the population loss, with G from theory.population_gradient."""
    model, Lam = _model(kind, n_seeds=n_seeds), _lambda()
    loss = population_loss(model.effective_matrix(), Lam, 1 / N).sum()
    grads = torch.autograd.grad(loss, [getattr(model, k) for k in model.names])
    with torch.no_grad():
        flow = model.parameter_flow(population_gradient(model.effective_matrix(), Lam, 1 / N))
    for k, g in zip(model.names, grads, strict=True):
        assert_close(flow[k], -0.5 * g)


def _mc(Lam: torch.Tensor, W: torch.Tensor, *, batch: int, n: int, seed: int, next_token: bool = False):
    """Per-sequence squared errors and per-sequence −½ ∂ℓ/∂W = r β x_qᵀ (averaged over prefixes)."""
    ep = _task(Lam).sample(batch, n, generator=iclab.generator(seed), dtype=F64)
    if next_token:
        beta, xq, yq = prefix_statistics(ep)  # (B, n, d), (B, n, d), (B, n)
    else:
        beta, xq, yq = context_statistic(ep)[:, None], ep.x_query[:, None], ep.y_query[:, None]
    r = yq - torch.einsum("bmi,ij,bmj->bm", beta, W, xq)
    return r.pow(2).mean(1), torch.einsum("bm,bmi,bmj->bij", r, beta, xq) / r.shape[1]


@pytest.mark.parametrize("next_token", [False, True])
def test_population_loss_and_gradient_equal_monte_carlo(next_token: bool) -> None:
    """L(W) and G(W) with 1/N (or E(1/N) for the next-token loss, eq. 23/26) match the sample means
    within 3 standard errors, for a W with loss well away from 0 and from tr Λ."""
    Lam = _lambda(3)
    W = 1.5 * torch.linalg.inv(Lam) / 4 + 0.3 * torch.randn(D, D, generator=iclab.generator(4), dtype=F64)
    n = 8 if next_token else N
    inv_n = expected_inv_n(n) if next_token else 1 / n
    losses, grads = _mc(Lam, W, batch=100_000 if not next_token else 30_000, n=n, seed=5, next_token=next_token)
    se = losses.std() / losses.numel() ** 0.5
    L = population_loss(W, Lam, inv_n)
    assert 0.05 < float(L) < 0.95 * float(torch.trace(Lam))
    assert abs(float(losses.mean() - L)) < 3 * float(se), (float(losses.mean()), float(L), float(se))
    G, g_se = population_gradient(W, Lam, inv_n), grads.std(0) / grads.shape[0] ** 0.5
    z = ((grads.mean(0) - G) / g_se).abs()
    assert float(z.max()) < 4.0, z  # 16 entries: max |z| < 4 (each < 3σ would fail ~4% of seeds)
    assert float((grads.mean(0) - G).abs().max()) < 0.02 * float(G.abs().max()) + 5 * float(g_se.max())


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_population_gradient_is_autograd_of_mc_loss_in_expectation(kind: str) -> None:
    """Autograd of the Monte-Carlo MSE on K independent batches: its mean is −2·parameter_flow(G)."""
    model, Lam = _model(kind, w_init=2.0), _lambda(6)
    K, B = 30, 2000
    task = _task(Lam)
    samples: dict[str, list[torch.Tensor]] = {k: [] for k in model.names}
    for i in range(K):
        ep = task.sample(B, N, generator=iclab.generator(100 + i), dtype=F64)
        loss = (model.predict(ep) - ep.y_query).pow(2).mean()
        for k, g in zip(model.names, torch.autograd.grad(loss, [getattr(model, k) for k in model.names]), strict=True):
            samples[k].append(g)
    with torch.no_grad():
        flow = model.parameter_flow(population_gradient(model.effective_matrix(), Lam, 1 / N))
    for k in model.names:
        s = torch.stack(samples[k])  # (K, ...)
        z = ((s.mean(0) + 2 * flow[k]) / (s.std(0) / K**0.5)).abs()
        assert float(z.max()) < 4.0, (k, z.max())


# --- population flow -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_population_flow_is_gd_on_the_population_loss(kind: str) -> None:
    """Each step is θ ← θ − lr ∂L/∂θ (autograd on theory.population_loss); time = 2·lr·step;
    the recorded loss is L at the recorded parameters; the model ends at the last iterate."""
    Lam, lr, steps = _lambda(), 0.3, 7
    model, ref = _model(kind), _model(kind)
    traj = population_flow(model, Lam, inv_n=1 / N, lr=lr, steps=steps, record_every=3)
    assert traj.steps.tolist() == [0, 3, 6, 7]
    assert_close(traj.time, 2 * lr * traj.steps.to(F64))
    params = [getattr(ref, k) for k in ref.names]
    recorded = []
    for step in range(steps + 1):
        loss = population_loss(ref.effective_matrix(), Lam, 1 / N)
        if step in traj.steps.tolist():
            recorded.append(loss.detach())
            i = traj.steps.tolist().index(step)
            for k in ref.names:
                assert_close(traj.params[k][i], getattr(ref, k).detach())
        if step < steps:
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p.sub_(g, alpha=lr)
    assert_close(traj.loss, torch.stack(recorded))
    assert all(torch.equal(getattr(model, k), traj.params[k][-1]) for k in model.names)
    assert traj.train_loss is None and traj.meta["mode"] == "population_flow"


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_batched_seeds_equal_single_runs(kind: str) -> None:
    Lam = _lambda()
    batched = _model(kind, n_seeds=3, w_init=0.5)
    singles = [batched.select(s) for s in range(3)]
    traj = population_flow(batched, Lam, inv_n=1 / N, lr=0.2, steps=50, record_every=10)
    assert traj.loss.shape == (3, 6) and traj.params["v"].shape == (3, 6, 3)
    for s, single in enumerate(singles):
        one = population_flow(single, Lam, inv_n=1 / N, lr=0.2, steps=50, record_every=10)
        assert_close(traj.loss[s], one.loss, rtol=1e-12, atol=1e-12)
        for k in single.names:
            assert_close(traj.params[k][s], one.params[k], rtol=1e-12, atol=1e-12)


def _drift(model, traj: Trajectory) -> float:
    """max over the run of |C(t) − C(0)|, relative to the final squared weight scale."""
    cons = model.conserved_quantities(traj.params)
    scale = float(traj.params["v"][-1].pow(2).max())
    return max(float((c - c[:1]).abs().max()) for c in cons.values()) / scale


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_conservation_laws_drift_vanishes_with_lr(kind: str) -> None:
    """Eq. (55) [ATTN_M] and (83)/(89) [ATTN_S, rank 2]: constant under gradient flow; under GD they drift
    by O(lr) over a fixed time span (O(lr²) per step), so halving lr halves the drift."""
    Lam, t_end = _lambda(), 60.0
    drifts = []
    for lr in (0.04, 0.02, 0.01):
        model = _model(kind, w_init=0.8, H=3, R=2)
        traj = population_flow(model, Lam, inv_n=1 / N, lr=lr, steps=round(t_end / (2 * lr)), record_every=5)
        assert float(traj.loss[-1]) < 0.7 * float(traj.loss[0])  # the run crossed at least one drop
        drifts.append(_drift(model, traj))
    assert drifts[-1] < 1e-3, drifts
    for a, b in itertools.pairwise(drifts):
        assert 1.6 < a / b < 2.5, drifts  # first order in lr


def test_conserved_quantities_formulas() -> None:
    m, s = _model("merged"), _model("separate")
    bal = m.conserved_quantities()["balance"]
    assert_close(bal[0, 1], (m.v[0] * m.v[1] - (m.U[0] * m.U[1]).sum()).detach())
    c = s.conserved_quantities()
    assert_close(c["key_query"][2, 1], (s.k[2, 1].pow(2).sum() - s.q[2, 1].pow(2).sum()).detach())
    assert_close(c["key_value"][1], (s.k[1].pow(2).sum() - s.v[1] ** 2).detach())


def test_merged_converges_to_least_squares_loss() -> None:
    """ATTN_M from small init under population flow ends at L(M_D) = 0.13600 (eq. 19 with m = D)."""
    model = _model("merged", w_init=0.01, n_seeds=2, H=5)
    traj = population_flow(model, _lambda(), inv_n=1 / N, lr=2.0, steps=3000, record_every=100)
    assert_close(traj.loss[:, -1], PLATEAUS[-1].expand(2), atol=1e-4, rtol=0)
    assert_close(traj.loss[:, 0], PLATEAUS[0].expand(2), atol=1e-3, rtol=0)


@pytest.mark.slow
def test_separate_population_flow_visits_the_plateaus_of_eq19() -> None:
    """ATTN_S rank 1 (D = 4, H = 5, w_init = 0.05, 6 seeds batched, population GD): wherever the loss is
    flat it sits on an L(M_m) of eq. (19) to 1e-4; each seed ends at L(M_D). Two heads
    can drop almost together and merge two drops for a seed (here seeds 0 and 1 skip one level each),
    so each level must be dwelt on by at least 4 of the 6 seeds, and each seed must dwell on >= 4 levels."""
    model = _model("separate", w_init=0.05, n_seeds=6, H=5, R=1)
    traj = population_flow(model, _lambda(), inv_n=1 / N, lr=0.25, steps=60_000, record_every=20)
    slope = (traj.loss[:, 1:] - traj.loss[:, :-1]).abs()  # per 10 τ
    dwelt = torch.zeros(6, 5, dtype=torch.bool)
    for s in range(6):
        flat = traj.loss[s, 1:][slope[s] < 1e-7]
        dist = (flat[:, None] - PLATEAUS[None]).abs()  # (flat points, levels)
        assert float(dist.min(1).values.max()) < 1e-4, s
        near = (traj.loss[s][:, None] - PLATEAUS[None]).abs()  # (T, levels)
        dwell_time = (near < 2e-3).sum(0) * float(traj.time[1])  # τ spent within 2e-3 of each level
        dwelt[s] = (near.min(0).values < 1e-4) & (dwell_time >= 30.0)
        assert abs(float(traj.loss[s, -1] - PLATEAUS[-1])) < 1e-4
    assert (dwelt.sum(0) >= 4).all() and (dwelt.sum(1) >= 4).all(), dwelt


# --- full-batch GD ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_full_batch_moments_equal_samples_and_autograd(kind: str) -> None:
    """Sufficient statistics (moments of z), per-sample β/x_q, and autograd GD on model.predict agree."""
    Lam = _lambda()
    ep = _task(Lam).sample(300, 10, generator=iclab.generator(0), dtype=F64)
    lr, steps = 0.2, 25
    a = full_batch_gd(_model(kind), ep, lr=lr, steps=steps, record_every=5)
    b = full_batch_gd(_model(kind), ep, lr=lr, steps=steps, record_every=5, method="samples")
    ref = _model(kind)
    params = [getattr(ref, k) for k in ref.names]
    for step in range(steps + 1):
        loss = (ref.predict(ep) - ep.y_query).pow(2).mean()
        if step % 5 == 0:
            i = step // 5
            assert_close(a.train_loss[i], loss.detach())
            for k in ref.names:
                assert_close(a.params[k][i], getattr(ref, k).detach())
                assert_close(b.params[k][i], getattr(ref, k).detach())
        if step < steps:
            with torch.no_grad():
                for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
                    p.sub_(g, alpha=lr)
    assert_close(a.train_loss, b.train_loss)
    assert torch.equal(a.loss, a.train_loss)  # no Λ given: loss is the training loss


def test_full_batch_with_population_loss_and_per_seed_datasets() -> None:
    """Λ given: loss = population L(W) of the iterates; one dataset per seed = separate runs."""
    Lam = _lambda()
    task = _task(Lam)
    sets = [task.sample(200, N, generator=iclab.generator(10 + s), dtype=F64) for s in range(2)]
    batched = _model("separate", n_seeds=2)
    singles = [batched.select(s) for s in range(2)]
    traj = full_batch_gd(batched, sets, lr=0.1, steps=20, record_every=4, Lambda=Lam)
    assert traj.meta["inv_n"] == pytest.approx(1 / N)
    W = batched.effective_matrix(traj.params)  # (S, T, d, d)
    assert_close(traj.loss, population_loss(W, Lam, 1 / N))
    for s in range(2):
        one = full_batch_gd(singles[s], sets[s], lr=0.1, steps=20, record_every=4)
        assert_close(traj.train_loss[s], one.train_loss)


def test_full_batch_next_token_loss() -> None:
    """next_token: the training loss is eq. (23) (mean over prefixes), the population inv_n is E(1/N)."""
    Lam = _lambda()
    ep = _task(Lam).sample(100, 6, generator=iclab.generator(1), dtype=F64)
    model = _model("merged")
    traj = full_batch_gd(model, ep, lr=0.05, steps=0, Lambda=Lam, next_token=True)
    fresh = _model("merged")
    loop = []
    for m in range(1, ep.n + 1):
        sub = iclab.Episode(
            x=ep.x[:, :m],
            y=ep.y[:, :m],
            x_query=ep.x[:, m] if m < ep.n else ep.x_query,
            y_query=ep.y[:, m] if m < ep.n else ep.y_query,
        )
        loop.append((fresh.predict(sub) - sub.y_query).pow(2).mean().detach())
    assert_close(traj.train_loss[0], torch.stack(loop).mean())
    assert traj.meta["inv_n"] == pytest.approx(expected_inv_n(6))


def test_full_batch_token_level_module_by_autograd() -> None:
    """A softmax token-level model (Fig. 5) trains by plain full-batch GD = torch.optim.SGD."""
    ep = _task(_lambda()).sample(64, 8, generator=iclab.generator(2), dtype=F64)
    cfg = models.LinearTransformerConfig(
        d=D, n_layers=1, n_heads=2, activation="softmax", key_query="separate", rank=1, init_std=0.3,
        sources="all", residual=False, zero_blocks=True, readout="positive",
    )  # fmt: skip
    model = models.LinearTransformer(cfg, generator=iclab.generator(0)).to(F64)
    ref = models.LinearTransformer(cfg, generator=iclab.generator(0)).to(F64)
    traj = full_batch_gd(model, ep, lr=0.3, steps=15, record_every=5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    for _ in range(15):
        opt.zero_grad()
        (ref.predict(ep) - ep.y_query).pow(2).mean().backward()
        opt.step()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert_close(p.detach(), q.detach())
        assert_close(traj.params[name][-1], q.detach())
    assert traj.train_loss.shape == (4,) and float(traj.train_loss[-1]) < float(traj.train_loss[0])


# --- online SGD ------------------------------------------------------------------------------------


def test_online_sgd_through_the_trainer() -> None:
    Lam = _lambda()
    task = _task(Lam)

    def run(seed: int) -> Trajectory:
        model = _model("separate", n_seeds=2, w_init=1.0)
        return online_sgd(
            model, task, batch=256, lr=0.1, steps=60, n=N, generator=iclab.generator(seed), record_every=20
        )

    a, b, c = run(0), run(0), run(1)
    assert a.steps.tolist() == [0, 20, 40, 60] and a.loss.shape == (2, 4) and a.params["k"].shape == (2, 4, 3, 2, D)
    assert torch.equal(a.loss, b.loss) and not torch.equal(a.loss, c.loss)
    assert (a.loss[:, -1] < a.loss[:, 0]).all()
    model = _model("separate", n_seeds=2, w_init=1.0)
    W = model.effective_matrix(a.params)
    assert_close(a.loss, population_loss(W, Lam, 1 / N))
    # next-token online SGD uses E(1/N)
    nt = online_sgd(
        _model("merged"), task, batch=64, lr=0.05, steps=3, n=8, generator=iclab.generator(0), next_token=True
    )
    assert nt.meta["inv_n"] == pytest.approx(expected_inv_n(8))


# --- Trajectory and validation ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_trajectory_round_trip(tmp_path, suffix: str) -> None:
    ep = _task(_lambda()).sample(50, 5, generator=iclab.generator(0), dtype=F64)
    traj = full_batch_gd(_model("merged", n_seeds=2), ep, lr=0.1, steps=4, Lambda=_lambda())
    back = Trajectory.load(traj.save(tmp_path / f"t{suffix}"))
    for f in dataclasses.fields(Trajectory):
        x, y = getattr(traj, f.name), getattr(back, f.name)
        if isinstance(x, dict) and f.name == "params":
            assert all(torch.equal(x[k], y[k]) for k in x)
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x.to(y.dtype), y)
        else:
            assert x == y


def test_bad_arguments() -> None:
    Lam, m = _lambda(), _model("merged")
    ep = _task(Lam).sample(10, 5, generator=iclab.generator(0), dtype=F64)
    with pytest.raises(iclab.ConfigError, match=r"population_flow\.lr must be a float > 0; got 0"):
        population_flow(m, Lam, inv_n=0.1, lr=0.0, steps=3)
    with pytest.raises(iclab.ConfigError, match=r"population_flow\.model must be a reduced"):
        population_flow(models.CubicFeatureMLP(D, 2), Lam, inv_n=0.1, lr=0.1, steps=3)
    with pytest.raises(iclab.ConfigError, match=r"attention_dynamics\.inv_n"):
        population_flow(m, Lam, inv_n=2.0, lr=0.1, steps=3)
    with pytest.raises(iclab.ConfigError, match=r"full_batch_gd\.episodes must be one training set or one per seed"):
        full_batch_gd(_model("merged", n_seeds=3), [ep, ep], lr=0.1, steps=2)
    with pytest.raises(iclab.ConfigError, match=r"full_batch_gd\.method"):
        full_batch_gd(m, ep, lr=0.1, steps=2, method="fast")
    noisy = tasks.LinearRegression(d=D, covariance=Lam, noise_std=0.1)
    with pytest.raises(iclab.ConfigError, match=r"online_sgd\.Lambda must be given"):
        online_sgd(m, noisy, batch=4, lr=0.1, steps=2, n=5, generator=iclab.generator(0))
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        population_flow(_model("merged", w_init=5.0), Lam, inv_n=1 / N, lr=1e3, steps=200)
