"""algorithms.functional_gd: FGD (eq. 9/10/17), FGD++ (eq. 58), kernel ridge, the GP posterior (eq. 13).

Every check is an equality between two independent computations in float64 (1e-10), except the
Monte Carlo check of the Bayes risk (3 standard errors).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import iclab
from conftest import F32, F64, assert_close, random_episode, random_spd
from iclab import algorithms, tasks
from iclab.core.errors import ConfigError
from iclab.core.kernels import CompositeKernel, Kernel, gram

STEPS = torch.tensor([0.05, 0.12, 0.08, 0.1], dtype=F64)
SCORES = ("linear", "relu", "exp", "rbf", "laplacian", "arccos", "softmax")


def _gp_episode(kernel: str = "exp", *, batch: int = 6, n: int = 9, seed: int = 0, **kw: object) -> iclab.Episode:
    task = tasks.GaussianProcess.random_rotation(generator=iclab.generator(100 + seed), kernel=kernel, **kw)
    return task.sample(batch, n, generator=iclab.generator(seed), dtype=F64)


def _closed_form(h: torch.Tensor, y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """f_L(x_q) = h_qᵀ α_L with α_{ℓ+1} = α_ℓ + r_ℓ (y − Hᵀα_ℓ) (eq. 9 in coefficients);
    h (B, n, n+1) sources × targets."""
    n = y.shape[1]
    alpha = torch.zeros_like(y)
    for r in steps:
        alpha = alpha + r * (y - torch.einsum("bi,bij->bj", alpha, h[:, :, :n]))
    return torch.einsum("bi,bi->b", alpha, h[:, :, n])


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "rbf", "laplacian", "arccos"])
def test_fgd_equals_the_coefficient_recursion(kernel: str) -> None:
    """Eq. (9)/(17) unnormalised: f_ℓ = Σ_i α_i h̃(x_i, ·), computed from the α recursion independently."""
    ep = _gp_episode("exp", seed=1)
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    h = gram(kernel, ep.x, pts, sigma=1.4)
    fgd = algorithms.FunctionalGD(kernel, STEPS, sigma=1.4)
    assert_close(fgd.predict(ep), _closed_form(h, ep.y, STEPS))
    traj = fgd.trajectory(ep)
    assert traj.shape == (len(STEPS) + 1, 6) and bool((traj[0] == 0).all())
    for ell in range(1, len(STEPS) + 1):
        assert_close(traj[ell], _closed_form(h, ep.y, STEPS[:ell]))


@pytest.mark.parametrize("kernel", SCORES)
@pytest.mark.parametrize("normalized", [False, True])
def test_label_row_holds_the_residuals(kernel: str, normalized: bool) -> None:
    """Invariant (22): the context label row after ℓ steps is y_i − f_ℓ(x_i), f_ℓ evaluated as a query."""
    ep = _gp_episode("relu", seed=2)
    fgd = algorithms.FunctionalGD(kernel, STEPS, normalized=normalized)
    res = fgd.residuals(ep)  # (L+1, B, n)
    assert_close(res, ep.y.unsqueeze(0) - fgd.values(ep, ep.x))
    assert_close(res[0], ep.y)
    assert_close(fgd.values(ep, ep.x_query.unsqueeze(1))[:, :, 0], fgd.trajectory(ep))


def test_linear_fgd_is_euclidean_gd() -> None:
    """App. I.2: FGD with the linear kernel = GD on ½Σ(⟨x_i, θ⟩ − y_i)² with the same steps; iclab's gd uses
    the 1/n-scaled loss, so its steps are n·r'."""
    ep = random_episode(5, 11, 4, seed=3, covariance=random_spd(4, seed=4))
    fgd = algorithms.FunctionalGD("linear", STEPS)
    gd = algorithms.gd(ep.n * STEPS, d=4)
    assert_close(fgd.predict(ep), gd.predict(ep))
    w = gd.weights(ep)  # (L+1, B, d)
    assert_close(fgd.trajectory(ep), torch.einsum("lbd,bd->lb", w, ep.x_query))


def test_normalized_update_is_eq_10() -> None:
    """Eq. (10): f_{ℓ+1}(x) = f_ℓ(x) + r τ(x) Σ_i (y_i − f_ℓ(x_i)) κ(x, x_i), τ(x) = 1/Σ_j κ(x, x_j), per point;
    exp normalised is softmax attention (Sec. 3.1.2)."""
    ep = _gp_episode("exp", seed=5)
    sigma = 0.9
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)  # (B, n+1, d)
    f = torch.zeros(ep.batch_size, ep.n + 1, dtype=F64)
    for r in STEPS:
        res = ep.y - f[:, : ep.n]
        for j in range(ep.n + 1):
            k = torch.exp(torch.einsum("bid,bd->bi", ep.x, pts[:, j]) / sigma**2)  # (B, n)
            f[:, j] = f[:, j] + r * (res * k).sum(-1) / k.sum(-1)
    fgd = algorithms.FunctionalGD("exp", STEPS, sigma=sigma, normalized=True)
    assert_close(fgd.predict(ep), f[:, ep.n])
    assert_close(algorithms.FunctionalGD("softmax", STEPS, sigma=sigma).predict(ep), f[:, ep.n])


def test_transform_is_the_sigma_inv_sqrt_form() -> None:
    """κ̃(u, w) = κ(T u, T w): FGD with ``transform`` T on x equals FGD on the mapped points; a separate target
    map gives h̃(B x_i, C x)."""
    ep = _gp_episode("exp", seed=6)
    T = ep.task["Sigma_inv_sqrt"]
    mapped = dataclasses.replace(ep, x=ep.x @ T.T, x_query=ep.x_query @ T.T)
    for kernel in ("exp", "softmax", "relu"):
        assert_close(
            algorithms.FunctionalGD(kernel, STEPS, transform=T).predict(ep),
            algorithms.FunctionalGD(kernel, STEPS).predict(mapped),
        )
    Bm, Cm = random_spd(5, seed=7), random_spd(5, seed=8)
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    h = gram("exp", ep.x @ Bm.T, pts @ Cm.T)
    got = algorithms.FunctionalGD("exp", STEPS, transform=Bm, target_transform=Cm).predict(ep)
    assert_close(got, _closed_form(h, ep.y, STEPS))


def test_composite_kernel_is_the_sum_of_heads() -> None:
    """Prop. D.1: FGD with K◇ = Σ_s K^s(G^s ·, G^s ·) uses the summed scores."""
    ep = _gp_episode("exp", seed=9)
    G1, G2 = random_spd(5, seed=10), random_spd(5, seed=11)
    comp = CompositeKernel((Kernel("linear", weight=0.5, transform=G1), Kernel("exp", weight=0.5, transform=G2)))
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    h = 0.5 * gram("linear", ep.x @ G1.T, pts @ G1.T) + 0.5 * gram("exp", ep.x @ G2.T, pts @ G2.T)
    assert_close(algorithms.FunctionalGD(comp, STEPS).predict(ep), _closed_form(h, ep.y, STEPS))


def test_fgd_plus_plus() -> None:
    """Eq. (58): a ≡ 0 is FGD; with the linear kernel it is GDPlusPlus (η = n r', γ = −n a, Γ = TᵀT); and its
    Σ-form on x = Σ^{1/2}u equals its identity form on u (the loss is Σ-free on the S family of Thm 4.5)."""
    ep = _gp_episode("exp", seed=12)
    a = torch.tensor([0.03, -0.02, 0.05, 0.01], dtype=F64)
    for kernel in ("exp", "softmax"):
        plain = algorithms.FunctionalGD(kernel, STEPS)
        pp0 = algorithms.FunctionalGDPlusPlus(kernel, STEPS, torch.zeros(4, dtype=F64))
        assert_close(pp0.predict(ep), plain.predict(ep))
        assert_close(pp0.trajectory(ep), plain.trajectory(ep))
    T = random_spd(5, seed=13)
    pp = algorithms.FunctionalGDPlusPlus("linear", STEPS, a, transform=T)
    gdpp = algorithms.GDPlusPlus(ep.n * STEPS, -ep.n * a, T.T @ T)
    assert_close(pp.predict(ep), gdpp.predict(ep))
    Tw = ep.task["Sigma_inv_sqrt"]
    u = dataclasses.replace(ep, x=ep.x @ Tw.T, x_query=ep.x_query @ Tw.T)
    s = math.sqrt(1.3)  # b c = 1.3
    for kernel in ("exp", "softmax", "relu", "linear"):
        sig = algorithms.FunctionalGDPlusPlus(kernel, STEPS, a, transform=s * Tw).trajectory(ep)
        iso = algorithms.FunctionalGDPlusPlus(kernel, STEPS, a, transform=s * torch.eye(5, dtype=F64)).trajectory(u)
        assert_close(sig, iso)
    assert not torch.allclose(
        algorithms.FunctionalGDPlusPlus("exp", STEPS, a).predict(ep), plain.predict(ep), atol=1e-6
    )


def test_kernel_ridge() -> None:
    """Linear kernel ridge = Ridge (same per-example λ); generic kernel: f = k_qᵀ(K̂ + nλI)⁻¹y solved directly."""
    ep = random_episode(5, 11, 4, seed=14, covariance=random_spd(4, seed=15), noise_std=0.1)
    assert_close(algorithms.KernelRidge("linear", 0.07).predict(ep), algorithms.Ridge(0.07).predict(ep))
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    K = gram("rbf", pts, pts, sigma=1.5)
    alpha = torch.linalg.solve(K[:, :11, :11] + 11 * 0.02 * torch.eye(11, dtype=F64), ep.y.unsqueeze(-1))
    expect = (K[:, 11, :11].unsqueeze(1) @ alpha).reshape(-1)
    assert_close(algorithms.KernelRidge("rbf", 0.02, sigma=1.5).predict(ep), expect)


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "arccos"])
def test_gp_posterior_oracle_equals_prior_mode(kernel: str) -> None:
    """Oracle (task K₊) and prior mode (K₊ rebuilt from x, T = Σ^{-1/2}) agree: eq. (13) from K₊ on n+1 points."""
    ep = _gp_episode(kernel, seed=16, n=12)
    oracle = algorithms.GaussianProcessPosterior()
    prior = algorithms.GaussianProcessPosterior(kernel, transform=ep.task["Sigma_inv_sqrt"])
    assert_close(oracle.predict(ep), prior.predict(ep), rtol=1e-8, atol=1e-8)
    assert_close(oracle.posterior_variance(ep), prior.posterior_variance(ep), rtol=1e-8, atol=1e-8)
    assert bool((oracle.posterior_variance(ep) >= -1e-10).all())


def test_gp_posterior_with_context_uses_the_sub_block() -> None:
    """A truncated episode's Bayes predictor uses the sub-block of the K₊ the labels were drawn from; for relu
    that differs from K₊ rebuilt on the subset (K₊ does not commute with taking sub-blocks)."""
    ep = _gp_episode("relu", seed=17, n=14)
    short = ep.with_context(6)
    K = ep.task["K_plus"]
    idx = torch.tensor([0, 1, 2, 3, 4, 5, 14])
    sub = K[:, idx][:, :, idx]
    expect = (sub[:, 6, :6].unsqueeze(1) @ torch.linalg.solve(sub[:, :6, :6], short.y.unsqueeze(-1))).reshape(-1)
    assert_close(algorithms.GaussianProcessPosterior().predict(short), expect, rtol=1e-8, atol=1e-8)
    rebuilt = algorithms.GaussianProcessPosterior("relu", transform=ep.task["Sigma_inv_sqrt"]).predict(short)
    assert not torch.allclose(rebuilt, expect, atol=1e-4)


def test_linear_gp_posterior_is_exact_once_n_reaches_d() -> None:
    """Noiseless linear GP (Ex. 6): K̂ has rank d, the pseudo-inverse gives y_q exactly for n >= d; posterior
    variance 0 (and 1 − n/d in expectation below d, tested in the theory tests)."""
    ep = _gp_episode("linear", seed=18, n=8, batch=20)
    post = algorithms.GaussianProcessPosterior()
    assert_close(post.predict(ep), ep.y_query, rtol=1e-9, atol=1e-9)
    assert float(post.posterior_variance(ep).abs().max()) < 1e-10
    assert_close(post.predict(ep), algorithms.LeastSquares().predict(ep), rtol=1e-9, atol=1e-9)


def test_bayes_mse_matches_posterior_variance() -> None:
    """E[(y_q − νᵀK̂⁻¹Ŷ)² | X] = μ − νᵀK̂⁻¹ν: the MC mean of squared errors agrees within 3 standard errors."""
    ep = _gp_episode("exp", seed=19, n=14, batch=4000)
    post = algorithms.GaussianProcessPosterior()
    err = (post.predict(ep) - ep.y_query) ** 2
    var = post.posterior_variance(ep)
    se = float((err - var).std()) / math.sqrt(err.numel())
    assert abs(float(err.mean() - var.mean())) < 3 * se
    assert 0.5 < float(var.mean()) < 0.7  # an independent numpy MC (20000 draws): 0.587 at n = 14


def test_jitter_solve_and_float32() -> None:
    ep = _gp_episode("exp", seed=20, n=10)
    exact = algorithms.GaussianProcessPosterior().predict(ep)
    assert_close(algorithms.GaussianProcessPosterior(jitter=1e-12).predict(ep), exact, rtol=1e-6, atol=1e-6)
    ep32 = ep.to(dtype=F32)
    for learner in (
        algorithms.GaussianProcessPosterior(),
        algorithms.FunctionalGD("exp", STEPS),
        algorithms.KernelRidge("exp", 0.01),
    ):
        y32 = learner.predict(ep32)
        assert y32.dtype == F32
        assert_close(y32.double(), learner.predict(ep), rtol=1e-3, atol=1e-3)


def test_bad_input_is_rejected() -> None:
    ep = _gp_episode("exp", seed=21)
    with pytest.raises(ConfigError, match="FunctionalGD.step_sizes"):
        algorithms.FunctionalGD("exp")
    with pytest.raises(ConfigError, match="FunctionalGD.kernel must be one of"):
        algorithms.FunctionalGD("gaussian", STEPS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="FunctionalGD.transform"):
        algorithms.FunctionalGD("exp", STEPS, transform=torch.eye(3, dtype=F64)).predict(ep)
    with pytest.raises(ConfigError, match="FunctionalGDPlusPlus.covariate_steps"):
        algorithms.FunctionalGDPlusPlus("exp", STEPS, torch.zeros(2, dtype=F64))
    with pytest.raises(ConfigError, match="KernelRidge.kernel must be a PSD kernel"):
        algorithms.KernelRidge("relu", 0.1)
    with pytest.raises(ConfigError, match="KernelRidge.lam"):
        algorithms.KernelRidge("exp", 0.0)
    with pytest.raises(ConfigError, match="GaussianProcessPosterior.kernel"):
        algorithms.GaussianProcessPosterior("softmax")
    with pytest.raises(ValueError, match="task has 'K_plus'"):
        algorithms.GaussianProcessPosterior().predict(random_episode(3, 5, 4, seed=0))
    cls = iclab.Episode(x=ep.x, x_query=ep.x_query, labels=torch.zeros(6, 9, dtype=torch.long))
    for learner in (
        algorithms.FunctionalGD("exp", STEPS),
        algorithms.FunctionalGDPlusPlus("exp", STEPS, STEPS),
        algorithms.KernelRidge("exp", 0.1),
        algorithms.GaussianProcessPosterior(),
    ):
        with pytest.raises(ValueError, match="regression episode"):
            learner.predict(cls)
