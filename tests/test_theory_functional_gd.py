"""theory.functional_gd: Bayes risk, Lemma A.1, Prop. 3.4, the Thm 4.5/4.6 family (Cheng, Chen, Sra 2024).

Exact identities in float64 (1e-10 relative unless stated); Monte Carlo checks with 3 standard errors.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import iclab
from conftest import F64, assert_close, random_spd
from iclab import algorithms, tasks, theory
from iclab.core.errors import ConfigError
from iclab.core.kernels import gram


def _gp(kernel: str = "exp", *, batch: int = 6, n: int = 14, seed: int = 0, **kw: object) -> iclab.Episode:
    task = tasks.GaussianProcess.random_rotation(generator=iclab.generator(50 + seed), kernel=kernel, **kw)
    return task.sample(batch, n, generator=iclab.generator(seed), dtype=F64)


# --- Bayes risk (eq. 13; independent numpy Monte Carlo) ---------------------------------------------
def test_linear_gp_bayes_risk_is_one_minus_n_over_d() -> None:
    assert [theory.linear_gp_bayes_risk(n, 5) for n in (0, 2, 4, 5, 14)] == pytest.approx(
        [1.0, 0.6, 0.2, 0.0, 0.0], abs=1e-15
    )
    task = tasks.GaussianProcess.random_rotation(generator=iclab.generator(1), kernel="linear")
    for n in (1, 2, 4):
        mean, se = theory.bayes_risk(task, n, samples=10_000, generator=iclab.generator(n))
        assert abs(mean - theory.linear_gp_bayes_risk(n, 5)) < 4 * se, (n, mean, se)  # 4σ: three draws
    for n in (5, 8):
        mean, _ = theory.bayes_risk(task, n, samples=500, generator=iclab.generator(n))
        assert abs(mean) < 1e-10


@pytest.mark.parametrize(("kernel", "n", "expect"), [("exp", 14, 0.587), ("relu", 14, 0.181), ("exp", 4, 1.444)])
def test_bayes_risk_matches_an_independent_table(kernel: str, n: int, expect: float) -> None:
    """An independent numpy MC (20000 draws, ±1%): agree within 3 standard errors plus that 1%."""
    task = tasks.GaussianProcess(kernel=kernel)
    mean, se = theory.bayes_risk(task, n, samples=4000, generator=iclab.generator(3))
    assert abs(mean - expect) < 3 * se + 0.01 * expect, (mean, se)
    code = tasks.GaussianProcess(kernel="exp", sigma=tasks.CODE_EXP_SIGMA)
    if kernel == "exp" and n == 14:  # the authors' code kernel exp(⟨u, w⟩/2): 0.118
        mean, se = theory.bayes_risk(code, n, samples=4000, generator=iclab.generator(4))
        assert abs(mean - 0.118) < 3 * se + 0.01 * 0.118, (mean, se)


def test_bayes_risk_is_invariant_to_sigma() -> None:
    """Whitened labels (Ex. 7): Σ changes x but not the risk — same draws, same numbers."""
    a = tasks.GaussianProcess(kernel="exp")
    b = tasks.GaussianProcess.random_rotation(generator=iclab.generator(5), kernel="exp")
    ra = theory.bayes_risk(a, 6, samples=300, generator=iclab.generator(6))
    rb = theory.bayes_risk(b, 6, samples=300, generator=iclab.generator(6))
    assert ra[0] == pytest.approx(rb[0], rel=1e-10)


# --- Lemma A.1 ------------------------------------------------------------------------------------
STEPS = torch.tensor([0.08, 0.05, 0.1], dtype=F64)


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "softmax"])
def test_lemma_a1_true_label_in_the_query_slot(kernel: str) -> None:
    """Ȳ_L = Ȳ_0 G: with y_q in the query slot the final query value is y_q − f_L(x_q) exactly, and G's
    last row is e_{n+1}ᵀ (the query label moves nothing)."""
    ep = _gp("relu", seed=7)
    fgd = algorithms.FunctionalGD(kernel, STEPS if kernel != "softmax" else 10 * STEPS)
    G = theory.fgd_propagator(fgd, ep)
    ybar = torch.cat([ep.y, ep.y_query.unsqueeze(1)], dim=1)  # (B, n+1)
    assert_close(torch.einsum("bi,bi->b", ybar, G[:, :, -1]), ep.y_query - fgd.predict(ep))
    e = torch.zeros(ep.n + 1, dtype=F64)
    e[-1] = 1
    assert_close(G[:, -1], e.expand(6, -1))
    assert_close(torch.einsum("bi,bij->bj", ybar, G)[:, :-1], fgd.residuals(ep)[-1])  # eq. (22) too


def test_lemma_a1_loss_matches_monte_carlo() -> None:
    """E_Y[(y_q − f_L)² | X] = g_qᵀK₊g_q: the label-free loss agrees with the sampled squared error (3σ)."""
    ep = _gp("exp", batch=6000, n=10, seed=8)
    fgd = algorithms.FunctionalGD("exp", STEPS)
    cond = theory.fgd_icl_loss(fgd, ep)
    sq = (ep.y_query - fgd.predict(ep)) ** 2
    diff = sq - cond
    assert abs(float(diff.mean())) < 3 * float(diff.std()) / math.sqrt(diff.numel())
    assert float(cond.std()) < float(sq.std())  # the point of Lemma A.1: less variance
    zero = algorithms.FunctionalGD("exp", torch.zeros(1, dtype=F64))
    assert_close(theory.fgd_icl_loss(zero, ep), ep.task["K_plus"][:, -1, -1])  # f = 0: loss = μ


def test_label_propagator_with_per_layer_scores() -> None:
    """Per-layer maps B_ℓ, C_ℓ (Thm 4.5 point with varying b_ℓ c_ℓ): FunctionalGD = −(Y_0 G)_q with G from
    scores built independently by gram()."""
    ep = _gp("exp", seed=9, n=8)
    Bs = torch.stack([random_spd(5, seed=s) for s in (1, 2, 3)])
    Cs = torch.stack([random_spd(5, seed=s) for s in (4, 5, 6)])
    fgd = algorithms.FunctionalGD("exp", STEPS, transform=Bs, target_transform=Cs)
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    scores = [gram("exp", ep.x @ Bs[ell].T, pts @ Cs[ell].T) for ell in range(3)]
    G = theory.label_propagator(scores, -STEPS)
    y0 = torch.cat([ep.y, torch.zeros_like(ep.y_query).unsqueeze(1)], dim=1)
    assert_close(fgd.predict(ep), -torch.einsum("bi,bi->b", y0, G[:, :, -1]))
    same = algorithms.FunctionalGD("exp", STEPS, transform=Bs[0].expand(3, 5, 5))
    assert_close(same.predict(ep), algorithms.FunctionalGD("exp", STEPS, transform=Bs[0]).predict(ep))


# --- Prop. 3.4 ------------------------------------------------------------------------------------
def test_gap_formula_matches_iterated_fgd() -> None:
    """f_L − νᵀK̂⁻¹Ŷ from the eigen formula equals running FGD with a constant step and subtracting Bayes."""
    ep = _gp("exp", seed=10, n=10)
    T = ep.task["Sigma_inv_sqrt"]
    bayes = algorithms.GaussianProcessPosterior().predict(ep)
    delta = 0.02
    gaps = theory.episode_bayes_gap(ep, "exp", [1, 5, 30], delta=delta, transform=T)
    for i, L in enumerate((1, 5, 30)):
        fgd = algorithms.FunctionalGD("exp", torch.full((L,), delta, dtype=F64), transform=T)
        assert_close(gaps[i], fgd.predict(ep) - bayes, rtol=1e-8, atol=1e-9)


def test_prop_3_4_converges_for_steps_below_two_over_lambda_max() -> None:
    """δ = 1/λ_max, n = 14, exp kernel: the gap is < 1e-8 after 20000 steps and bounded by
    ‖ν‖‖Ŷ‖ρ^L/λ_min (Prop. 3.4); at L = 100 it is still visible."""
    ep = _gp("exp", seed=11, n=14, batch=20)
    T = ep.task["Sigma_inv_sqrt"]
    K = algorithms.GaussianProcessPosterior("exp", transform=T).covariance(ep)
    K_hat, nu = K[:, :14, :14], K[:, :14, 14]
    delta = 1 / torch.linalg.eigvalsh(K_hat)[:, -1]
    gaps = theory.fgd_bayes_gap(K_hat, nu, ep.y, delta, [100, 20_000])
    assert float(gaps[1].abs().max()) < 1e-8
    assert float(gaps[0].abs().max()) > 1e-4
    rho = theory.convergence_factor(K_hat, delta)
    bound = nu.norm(dim=-1) * ep.y.norm(dim=-1) * rho.pow(100) / torch.linalg.eigvalsh(K_hat)[:, 0]
    assert bool((gaps[0].abs() <= bound * (1 + 1e-9)).all())
    assert_close(theory.max_stable_step(K_hat), 2 * delta)


def test_prop_3_4_diverges_above_two_over_lambda_max_and_the_paper_condition_is_wrong() -> None:
    """δ slightly above 2/λ_max diverges. The paper's condition "δ < ‖K̂‖₂" admits δ = 0.5 λ_max, which is
    above 2/λ_max whenever λ_max > 2 (here λ_max ≈ 15): that step diverges too (docs/errata.md)."""
    ep = _gp("exp", seed=12, n=14, batch=10)
    post = algorithms.GaussianProcessPosterior("exp", transform=ep.task["Sigma_inv_sqrt"])
    K = post.covariance(ep)
    K_hat, nu = K[:, :14, :14], K[:, :14, 14]
    lam_max = torch.linalg.eigvalsh(K_hat)[:, -1]
    assert bool((lam_max > 2).all())
    for delta, depths in ((2.05 / lam_max, [50, 100, 200, 2000]), (0.5 * lam_max, [5, 10, 20, 40])):
        gaps = theory.fgd_bayes_gap(K_hat, nu, ep.y, delta, depths).abs()
        assert bool((gaps[1:] > gaps[:-1]).all())
        assert float(gaps[-1].min()) > 1e6
        assert bool((theory.convergence_factor(K_hat, delta) > 1).all())


def test_linear_kernel_fgd_reaches_zero_loss_when_n_at_least_d() -> None:
    """Prop. 3.4 for the linear kernel: noiseless linear GP, n >= d: FGD with δ = 1/λ_max has loss → 0 with depth
    (K̂ singular: the null-space components of Ŷ and ν vanish, so the positive eigenvalues set the rate)."""
    ep = _gp("linear", seed=13, n=8, batch=50)
    lam = torch.linalg.eigvalsh(ep.x @ ep.task["Sigma_inv_sqrt"].T @ ep.task["Sigma_inv_sqrt"] @ ep.x.transpose(1, 2))
    delta = float(1 / lam[:, -1].max())
    losses = [
        float(
            theory.fgd_icl_loss(
                algorithms.FunctionalGD(
                    "linear", torch.full((L,), delta, dtype=F64), transform=ep.task["Sigma_inv_sqrt"]
                ),
                ep,
            ).mean()
        )
        for L in (1, 10, 100)
    ]
    assert losses[0] > losses[1] > losses[2] and losses[2] < 0.05 * losses[0]


# --- Thm 4.5 / 4.6 family -----------------------------------------------------------------------
def test_stationary_point_family() -> None:
    """A_ℓ = a_ℓI, B_ℓ = b_ℓΣ^{-1/2}, C_ℓ = c_ℓΣ^{-1/2}; dist(Σ^{1/2}BᵀCΣ^{1/2}, I) = 0 on it, > 0 off it."""
    Sigma = tasks.GaussianProcess.random_rotation(generator=iclab.generator(14)).Sigma
    p = theory.stationary_point(
        Sigma,
        torch.tensor([-0.1, -0.2, -0.1], dtype=F64),
        a=torch.tensor([0.1, -0.05, 0.0], dtype=F64),
        b=torch.tensor([1.0, 2.0, 0.5], dtype=F64),
        c=0.7,
    )
    assert p["A"].shape == p["B"].shape == p["C"].shape == (3, 5, 5) and p["V"].shape == (3, 6, 6)
    assert_close(p["V"][:, :5, :5], p["A"])
    assert_close(p["V"][:, 5, 5], p["r"])
    assert_close(p["B"][1] @ Sigma @ p["B"][1], 4 * torch.eye(5, dtype=F64))
    assert float(theory.stationary_distance(p["B"], p["C"], Sigma).abs().max()) < 1e-12
    assert float(iclab.dist_to_identity(p["A"][:2]).max()) < 1e-12
    assert bool((theory.stationary_distance(p["B"], p["C"], torch.eye(5, dtype=F64)) > 0.1).all())
    p0 = theory.stationary_point(Sigma, torch.tensor([-0.1], dtype=F64))
    assert float(p0["A"].abs().max()) == 0.0
    with pytest.raises(ConfigError, match="stationary_point.b"):
        theory.stationary_point(Sigma, torch.tensor([-0.1, -0.2], dtype=F64), b=torch.ones(3, dtype=F64))


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "softmax"])
def test_family_learner_is_sigma_free_and_remark_e2_invariant(kernel: str) -> None:
    """The Thm 4.5 family's learner on x = Σ^{1/2}u equals the Σ = I learner on u (same draws); Remark
    E.2: (B, C) → (ΛᵀB, Λ⁻¹C) changes nothing; for exp, b c acts as an inverse bandwidth."""
    ep = _gp("exp", seed=15, n=9)
    Sigma = ep.task["Sigma"]
    a = torch.tensor([0.05, -0.03, 0.0], dtype=F64)
    r = torch.tensor([-0.1, -0.05, -0.08], dtype=F64)
    p = theory.stationary_point(Sigma, r, a=a, b=torch.tensor([1.0, 1.5, 0.8], dtype=F64), c=0.9)
    pI = theory.stationary_point(torch.eye(5, dtype=F64), r, a=a, b=torch.tensor([1.0, 1.5, 0.8], dtype=F64), c=0.9)
    W = ep.task["Sigma_inv_sqrt"]
    u = dataclasses.replace(ep, x=ep.x @ W.T, x_query=ep.x_query @ W.T)
    got = theory.stationary_point_learner(kernel, p).trajectory(ep)
    assert_close(got, theory.stationary_point_learner(kernel, pI).trajectory(u))
    Lam = torch.eye(5, dtype=F64) + 0.3 * torch.randn(5, 5, generator=iclab.generator(16), dtype=F64)
    moved = {**p, "B": Lam.T @ p["B"], "C": torch.linalg.inv(Lam) @ p["C"]}
    assert_close(theory.stationary_point_learner(kernel, moved).trajectory(ep), got)
    if kernel == "exp":
        p1 = theory.stationary_point(Sigma, r, b=1.2, c=0.9)
        fgd = algorithms.FunctionalGD("exp", -r, sigma=1 / math.sqrt(1.08), transform=W)
        assert_close(theory.stationary_point_learner("exp", p1).predict(ep), fgd.predict(ep))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ConfigError, match="linear_gp_bayes_risk.n"):
        theory.linear_gp_bayes_risk(-1, 5)
    with pytest.raises(ConfigError, match="label_propagator.scores"):
        theory.label_propagator([torch.zeros(2, 3, 4, dtype=F64)], torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="K_plus"):
        theory.fgd_icl_loss(algorithms.FunctionalGD("exp", STEPS), dataclasses.replace(_gp(), task={}))
    with pytest.raises(ConfigError, match="stationary_point_learner"):
        p = theory.stationary_point(torch.eye(5, dtype=F64), STEPS)
        theory.stationary_point_learner(
            "exp", {**p, "A": torch.randn(3, 5, 5, generator=iclab.generator(0), dtype=F64)}
        )
