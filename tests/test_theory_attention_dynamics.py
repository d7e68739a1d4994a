"""Theory of Zhang, Singh, Latham, Saxe 2025 (iclab.theory.attention_dynamics), each formula against an
independent computation: Monte Carlo, autograd, scipy quadrature / ODE integration, matrix exponentials,
and reference numbers (the dashed lines of Fig. 3a, eq. 19, and independent numpy population GD)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad, solve_ivp

from conftest import F64, assert_close, random_episode
from iclab.core.errors import ConfigError
from iclab.core.seeding import generator
from iclab.models.reduced_attention import context_statistic, cubic_feature
from iclab.tasks.linear_regression import rotated_covariance
from iclab.theory import attention_dynamics as ad

PAPER_LAMBDA = (0.4, 0.3, 0.2, 0.1)


def rotated(spec: tuple[float, ...], seed: int = 0) -> torch.Tensor:
    return rotated_covariance(spec, generator=generator(seed))


def diag(spec: tuple[float, ...]) -> torch.Tensor:
    return torch.diag(torch.tensor(spec, dtype=F64))


# --- reference numbers (the dashed lines of Fig. 3a and independent numpy population GD) ---------


def test_plateau_levels_match_the_official_notebook() -> None:
    L = ad.plateau_losses(rotated(PAPER_LAMBDA), 1 / 31)
    assert_close(L, torch.tensor([1.0, 0.64057971, 0.37737216, 0.2098046, 0.13599507], dtype=F64), atol=5e-9)


def test_reference_statistics() -> None:
    Lam = diag(PAPER_LAMBDA)
    assert_close(
        ad.second_moment_eigenvalues(Lam, 1 / 31),
        torch.tensor([0.17806, 0.10258, 0.04774, 0.01355], dtype=F64),
        atol=6e-6,
    )
    v, _, _ = ad.separate_fixed_point(Lam, 1 / 31, range(4), 4)
    assert_close(v, torch.tensor([1.30967, 1.43005, 1.61204, 1.94702], dtype=F64), atol=6e-6)
    assert ad.expected_inv_n(31) == pytest.approx(0.129911, abs=5e-7)
    assert ad.frobenius_gamma(Lam) == pytest.approx(0.188149, abs=5e-7)
    assert ad.frobenius_gamma(torch.eye(4, dtype=F64)) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("spec", "inv_n", "expected"),
    [
        (
            tuple(1 / d for d in range(1, 9)),
            1 / 31,
            (1, 0.67146, 0.51912, 0.42444, 0.35792, 0.30788, 0.26853, 0.23660, 0.21007),
        ),
        (tuple(range(8, 0, -1)), 1 / 31, (1, 0.81126, 0.64898, 0.51301, 0.40318, 0.31917, 0.26045, 0.22601, 0.21335)),
        ((0.35, 0.35, 0.15, 0.15), 1 / 31, (1, 0.68873, 0.37746, 0.25720, 0.13694)),
        (PAPER_LAMBDA, "E31", (1, 0.72503, 0.53308, 0.42069, 0.37952)),
    ],
)
def test_plateau_levels_reference_numbers(spec, inv_n, expected) -> None:
    lam = torch.tensor(spec, dtype=F64)
    Lam = diag(tuple((lam / lam.sum()).tolist()))  # trace 1
    inv = ad.expected_inv_n(31) if inv_n == "E31" else inv_n
    assert_close(ad.plateau_losses(Lam, inv), torch.tensor(expected, dtype=F64), atol=6e-6)


def test_white_limits() -> None:
    D, N = 4, 31
    assert ad.plateau_losses(torch.eye(D, dtype=F64) / D, 1 / N)[-1].item() == pytest.approx(0.13889, abs=5e-6)
    _, L = ad.white_time_course(1e3, D, 1 / N, 1e-6)
    assert L.item() == pytest.approx(0.55556, abs=5e-6)
    assert ad.merged_plateau_time(torch.eye(4, dtype=F64), 1e-3) == pytest.approx(3.4539, abs=1e-4)


# --- data statistics against Monte Carlo ---------------------------------------------------------


def test_second_moment_hat_and_feature_moments_monte_carlo() -> None:
    """E(Λ̂²) (eq. 31), E(y_q z) = vec Λ² (eq. 43), E(zzᵀ) = Λ ⊗ E(Λ̂²) (eq. 44) vs 200k sampled prompts (5σ)."""
    Lam = rotated((0.5, 0.3, 0.2), seed=3)
    D, N, B = 3, 5, 200_000
    task_ep = random_episode(B, N, D, seed=1, covariance=Lam)
    lam_hat = task_ep.x.mT @ task_ep.x / N  # (B, D, D)
    samples = (lam_hat @ lam_hat).reshape(B, -1)
    mean, sem = samples.mean(0), samples.std(0) / math.sqrt(B)
    assert ((mean - ad.second_moment_hat(Lam, 1 / N).reshape(-1)).abs() <= 5 * sem).all()
    z = cubic_feature(context_statistic(task_ep), task_ep.x_query)
    Eyz, Ezz = ad.feature_moments(Lam, 1 / N)
    yz = task_ep.y_query[:, None] * z
    assert ((yz.mean(0) - Eyz).abs() <= 5 * yz.std(0) / math.sqrt(B)).all()
    zz = (z[:, :, None] * z[:, None, :]).reshape(B, -1)
    assert ((zz.mean(0) - Ezz.reshape(-1)).abs() <= 5 * zz.std(0) / math.sqrt(B)).all()


def test_population_loss_monte_carlo() -> None:
    """L(W) = E(y_q − βᵀWx_q)² for a random non-symmetric W, 200k prompts, 4σ."""
    Lam, D, N, B = rotated((0.6, 0.3, 0.1), seed=5), 3, 7, 200_000
    W = torch.randn(D, D, generator=generator(2), dtype=F64)
    ep = random_episode(B, N, D, seed=9, covariance=Lam)
    beta = torch.einsum("bnd,bn->bd", ep.x, ep.y) / N
    err = (ep.y_query - torch.einsum("bi,ij,bj->b", beta, W, ep.x_query)) ** 2
    assert abs(err.mean() - ad.population_loss(W, Lam, 1 / N)) <= 4 * err.std() / math.sqrt(B)


def test_population_gradient_is_minus_half_autograd() -> None:
    Lam = rotated((0.5, 0.3, 0.15, 0.05), seed=1)
    W = torch.randn(4, 4, generator=generator(0), dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(ad.population_loss(W, Lam, 0.1), W)
    assert_close(ad.population_gradient(W.detach(), Lam, 0.1), -g / 2)


def test_cubic_feature_gives_the_mlp_view_of_attn_m() -> None:
    """Σ_i v_i βᵀU_i x_q = w_2ᵀ W_1 z with w_2 = v, W_1 rows vec(U_i)ᵀ (eq. 6-7)."""
    ep = random_episode(6, 11, 4, seed=0)
    g = generator(1)
    v, U = torch.randn(3, generator=g, dtype=F64), torch.randn(3, 4, 4, generator=g, dtype=F64)
    beta = torch.einsum("bnd,bn->bd", ep.x, ep.y) / ep.n
    attn = torch.einsum("h,bi,hij,bj->b", v, beta, U, ep.x_query)
    mlp = cubic_feature(beta, ep.x_query) @ ad.vec(U).T @ v
    assert_close(mlp, attn)


def test_duality_of_the_global_minimum() -> None:
    """E(y_q zᵀ)E(zzᵀ)⁻¹ = vec(E(Λ̂²)⁻¹Λ) = vec((Λ + (Λ + trΛ I)/N)⁻¹) (eq. 11, 46)."""
    Lam = rotated((0.4, 0.3, 0.2, 0.1), seed=2)
    Eyz, Ezz = ad.feature_moments(Lam, 1 / 31)
    W = ad.converged_matrix(Lam, 1 / 31)
    assert_close(torch.linalg.solve(Ezz, Eyz), ad.vec(W))
    assert_close(W, torch.linalg.inv(ad.second_moment_hat(Lam, 1 / 31)) @ Lam)
    assert_close(W, ad.fixed_point_matrix(Lam, 1 / 31, range(4)))
    assert_close(ad.population_gradient(W, Lam, 1 / 31), torch.zeros(4, 4, dtype=F64), atol=1e-14)


# --- fixed points (eq. 18, 59-63, 82, 85-88) -----------------------------------------------------


def _grads(v: torch.Tensor, k: torch.Tensor, q: torch.Tensor, Lam: torch.Tensor, inv_n: float) -> torch.Tensor:
    v, k, q = (t.clone().requires_grad_(True) for t in (v, k, q))
    loss = ad.population_loss(ad.separate_matrix(v, k, q), Lam, inv_n)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, (v, k, q))])


@settings(max_examples=10, deadline=None)
@given(
    lam=st.lists(st.floats(0.05, 2.0), min_size=4, max_size=4, unique=True),
    seed=st.integers(0, 1000),
    inv_n=st.sampled_from([0.0, 1 / 31, 0.5]),
)
def test_every_one_of_the_2_to_the_D_fixed_points(lam: list[float], seed: int, inv_n: float) -> None:
    """For all 16 subsets: L at the constructed weights = eq. (63) (1e-12) and the gradient vanishes."""
    Lam = rotated(tuple(sorted(lam, reverse=True)), seed=seed)
    D = 4
    for m in range(D + 1):
        for S in itertools.combinations(range(D), m):
            for rank in (1, 2):
                v, k, q = ad.separate_fixed_point(Lam, inv_n, S, n_heads=D + 1, rank=rank)
                W = ad.separate_matrix(v, k, q)
                assert_close(W, ad.fixed_point_matrix(Lam, inv_n, S), atol=1e-12)
                L = ad.population_loss(W, Lam, inv_n).item()
                assert abs(L - ad.fixed_point_loss(Lam, inv_n, S)) <= 1e-12
                assert _grads(v, k, q, Lam, inv_n).abs().max() <= 1e-12


def test_condition_c3_inactive_heads() -> None:
    """A v = 0 head with k ∈ span{e_d}_{d∈S} keeps the gradient zero (C3); with k, q both outside it does not."""
    Lam, inv_n, S = rotated(PAPER_LAMBDA, seed=4), 1 / 31, (0, 2)
    _, E = ad.spectrum(Lam)
    v, k, q = ad.separate_fixed_point(Lam, inv_n, S, n_heads=3)
    k, q = k.clone(), q.clone()
    k[2, 0] = 0.3 * E[:, 0] - 0.2 * E[:, 2]  # in the span
    q[2, 0] = torch.randn(4, generator=generator(0), dtype=F64)  # anything
    assert _grads(v, k, q, Lam, inv_n).abs().max() <= 1e-12
    k[2, 0] = 0.3 * E[:, 1]  # outside the span, and q has an e_2 component: ∂L/∂v_3 = −2 k Ω q ≠ 0
    assert _grads(v, k, q, Lam, inv_n).abs().max() > 1e-3


def test_min_norm_ansatz_is_minimal() -> None:
    """Eq. (82): among configurations with Σ v k qᵀ = W(S_m), the balanced one has the smallest ℓ² norm."""
    Lam, inv_n = rotated(PAPER_LAMBDA, seed=6), 1 / 31
    v, k, q = ad.separate_fixed_point(Lam, inv_n, range(4), 4)
    base = float(v.square().sum() + k.square().sum() + q.square().sum())
    for scale in (0.8, 0.95, 1.05, 1.3):  # rescale v by s, k by 1/s (q fixed): same W, larger norm
        assert base < float((scale * v).square().sum() + (k / scale).square().sum() + q.square().sum())
    assert_close(ad.separate_conservation(v, k, q)[1], torch.zeros(4, dtype=F64), atol=1e-14)


def test_merged_fixed_point() -> None:
    Lam, inv_n = rotated(PAPER_LAMBDA, seed=7), 1 / 31
    direction = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    v, U = ad.merged_fixed_point(Lam, inv_n, 3, direction=direction)
    v, U = v.requires_grad_(True), U.requires_grad_(True)
    loss = ad.population_loss(ad.merged_matrix(v, U), Lam, inv_n)
    assert loss.item() == pytest.approx(ad.plateau_losses(Lam, inv_n)[-1].item(), abs=1e-12)
    gv, gU = torch.autograd.grad(loss, (v, U))
    assert max(gv.abs().max(), gU.abs().max()) <= 1e-12
    assert_close(ad.merged_conservation(v.detach(), U.detach()), torch.zeros(3, 3, dtype=F64), atol=1e-12)
    assert ad.head_cosines(U.detach()).abs().min() == pytest.approx(1.0)


def test_attn_m_intermediate_saddles_are_not_fixed_points() -> None:
    """ATTN_M has only M_0 and M_* (eq. 9): weights realising W(S_1) have a non-zero gradient."""
    Lam, inv_n = diag(PAPER_LAMBDA), 1 / 31
    v = torch.ones(1, dtype=F64, requires_grad=True)
    U = ad.fixed_point_matrix(Lam, inv_n, [0])[None].clone().requires_grad_(True)
    gU = torch.autograd.grad(ad.population_loss(ad.merged_matrix(v, U), Lam, inv_n), U)[0]
    assert gU.abs().max() > 1e-3


# --- gradient flow equations (eq. 14 / 84, with the (14c) transpose fixed) -----------------------


def _attn_s_rhs(Lam: torch.Tensor, A: torch.Tensor, H: int, R: int, D: int):
    """τ d/dt (v, k, q) of eq. (84), written out independently of the library."""
    L2 = Lam @ Lam

    def rhs(_t: float, y: np.ndarray) -> np.ndarray:
        y = torch.from_numpy(y)
        v, k, q = y[:H], y[H : H + H * R * D].reshape(H, R, D), y[H + H * R * D :].reshape(H, R, D)
        W = torch.einsum("h,hri,hrj->ij", v, k, q)
        G = L2 - A @ W @ Lam
        dv = torch.einsum("hri,ij,hrj->h", k, G, q)
        dk = v[:, None, None] * torch.einsum("ij,hrj->hri", G, q)
        dq = v[:, None, None] * torch.einsum("ji,hrj->hri", G, k)  # Gᵀ k: eq. (84c), not (14c)
        return torch.cat([dv, dk.reshape(-1), dq.reshape(-1)]).numpy()

    return rhs


def test_gradient_flow_equations_are_minus_half_gradient_and_14c_typo() -> None:
    Lam, inv_n, H, R, D = rotated((0.5, 0.3, 0.2), seed=8), 0.1, 2, 2, 3
    g = generator(3)
    v, k, q = (
        torch.randn(H, generator=g, dtype=F64),
        torch.randn(H, R, D, generator=g, dtype=F64),
        torch.randn(H, R, D, generator=g, dtype=F64),
    )
    rhs = _attn_s_rhs(Lam, ad.second_moment_hat(Lam, inv_n), H, R, D)
    flow = torch.from_numpy(rhs(0.0, torch.cat([v, k.reshape(-1), q.reshape(-1)]).numpy()))
    assert_close(flow, -_grads(v, k, q, Lam, inv_n) / 2)
    W = ad.separate_matrix(v, k, q)
    printed_14c = v[:, None, None] * torch.einsum(
        "ij,hrj->hri", Lam @ Lam - Lam @ W @ ad.second_moment_hat(Lam, inv_n), k
    )  # Σ v k qᵀ where Σ v q kᵀ belongs
    assert (printed_14c.reshape(-1) - flow[H + H * R * D :]).abs().max() > 1e-3


def test_conservation_laws_hold_along_the_flow() -> None:
    """(89): ‖k_ir‖² − ‖q_ir‖² and Σ_r‖k_ir‖² − v_i² constant along exact gradient flow (rank 2)."""
    Lam, inv_n, H, R, D = rotated((0.5, 0.3, 0.2), seed=9), 1 / 10, 2, 2, 3
    g = generator(4)
    y0 = 0.3 * torch.randn(H + 2 * H * R * D, generator=g, dtype=F64)
    sol = solve_ivp(
        _attn_s_rhs(Lam, ad.second_moment_hat(Lam, inv_n), H, R, D),
        (0, 30),
        y0.numpy(),
        rtol=1e-11,
        atol=1e-13,
        t_eval=np.linspace(0, 30, 50),
    )
    y = torch.from_numpy(sol.y.T)
    v, k, q = y[:, :H], y[:, H : H + H * R * D].reshape(-1, H, R, D), y[:, H + H * R * D :].reshape(-1, H, R, D)
    c1, c2 = ad.separate_conservation(v, k, q)
    assert ad.conservation_drift(c1) < 1e-8 and ad.conservation_drift(c2) < 1e-8
    assert (
        ad.population_loss(ad.separate_matrix(v, k, q), Lam, inv_n)[-1]
        < ad.population_loss(ad.separate_matrix(v, k, q), Lam, inv_n)[0] - 0.05
    )


def test_merged_conservation_along_the_flow() -> None:
    """(55): w_2w_2ᵀ − W_1W_1ᵀ constant under τdU_i = v_iG, τdv_i = ⟨U_i, G⟩."""
    Lam, inv_n, H, D = rotated((0.5, 0.3, 0.2), seed=10), 0.1, 3, 3
    A, L2 = ad.second_moment_hat(Lam, inv_n), Lam @ Lam

    def rhs(_t, y):
        y = torch.from_numpy(y)
        v, U = y[:H], y[H:].reshape(H, D, D)
        G = L2 - A @ ad.merged_matrix(v, U) @ Lam
        return torch.cat([(U * G).sum((-2, -1)), (v[:, None, None] * G).reshape(-1)]).numpy()

    y0 = 0.2 * torch.randn(H + H * D * D, generator=generator(5), dtype=F64)
    sol = solve_ivp(rhs, (0, 20), y0.numpy(), rtol=1e-11, atol=1e-13, t_eval=np.linspace(0, 20, 30))
    y = torch.from_numpy(sol.y.T)
    assert ad.conservation_drift(ad.merged_conservation(y[:, :H], y[:, H:].reshape(-1, H, D, D))) < 1e-8


# --- ATTN_M white time course (eq. 10, 48-51) ----------------------------------------------------


def test_logistic_s_solves_eq_48() -> None:
    gamma, alpha, s0 = 2.0, 1.16129, 1e-6
    t = np.linspace(0, 6, 61)
    sol = solve_ivp(lambda _t, s: 2 * s * (gamma - alpha * s), (0, 6), [s0], t_eval=t, rtol=1e-12, atol=1e-16)
    assert np.allclose(ad.logistic_s(torch.from_numpy(t), gamma, alpha, s0).numpy(), sol.y[0], rtol=1e-8, atol=1e-12)
    tm = ad.logistic_midpoint_time(gamma, alpha, s0)
    assert ad.logistic_s(tm, gamma, alpha, s0).item() == pytest.approx(gamma / alpha / 2, rel=1e-12)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_white_time_course_is_the_population_loss_of_sigma_I(scale: float) -> None:
    D, inv_n = 4, 1 / 31
    t = torch.linspace(0, 20, 41, dtype=F64)
    sigma, L = ad.white_time_course(t, D, inv_n, s0=1e-6, scale=scale)
    Lam = scale * torch.eye(D, dtype=F64)
    assert_close(L, ad.population_loss(sigma[:, None, None] * torch.eye(D, dtype=F64), Lam, inv_n))
    if scale == 1.0:  # eq. (10) as printed
        e = torch.exp(2 * math.sqrt(D) * t)
        assert_close(sigma, e / ((1 + (1 + D) * inv_n) * (e - 1) + math.sqrt(D) / 1e-6), rtol=1e-9)


def test_attn_m_flow_from_aligned_balanced_init_follows_eq_10() -> None:
    """Integrate the ATTN_M matrix flow (D.2) from w_2 = √s0 u, W_1 = √s0 u vec(I)ᵀ/√D: L(t) = eq. (51)."""
    D, H, inv_n, s0, c = 3, 2, 1 / 7, 1e-4, 0.5
    Lam = c * torch.eye(D, dtype=F64)
    A, L2 = ad.second_moment_hat(Lam, inv_n), Lam @ Lam
    u = torch.tensor([0.6, 0.8], dtype=F64)
    v0 = math.sqrt(s0) * u
    U0 = math.sqrt(s0) * u[:, None, None] * torch.eye(D, dtype=F64) / math.sqrt(D)

    def rhs(_t, y):
        y = torch.from_numpy(y)
        v, U = y[:H], y[H:].reshape(H, D, D)
        G = L2 - A @ ad.merged_matrix(v, U) @ Lam
        return torch.cat([(U * G).sum((-2, -1)), (v[:, None, None] * G).reshape(-1)]).numpy()

    t = np.linspace(0, 60, 121)
    sol = solve_ivp(rhs, (0, 60), torch.cat([v0, U0.reshape(-1)]).numpy(), t_eval=t, rtol=1e-11, atol=1e-14)
    y = torch.from_numpy(sol.y.T)
    L_sim = ad.population_loss(ad.merged_matrix(y[:, :H], y[:, H:].reshape(-1, H, D, D)), Lam, inv_n)
    _, L_th = ad.white_time_course(torch.from_numpy(t), D, inv_n, s0, scale=c)
    assert (L_sim - L_th).abs().max() < 1e-7


# --- ATTN_S scalar ODE (eq. 21, 70-72, 76-77) ----------------------------------------------------


@pytest.mark.parametrize(("lam", "a"), [(0.4, 0.17806), (0.1, 0.01355), (1.0, 1.3)])
def test_F_against_quadrature(lam: float, a: float) -> None:
    vs = ad.value_fixed_point(lam, a)
    for lo, hi in [(0.01 * vs, 0.5 * vs), (0.2 * vs, 0.99 * vs), (1.01 * vs, 3 * vs)]:
        num, _ = quad(lambda v: 1 / (v**2 - (a / lam) * v**5), lo, hi, epsabs=1e-13, epsrel=1e-13, limit=200)
        diff = (ad.value_ode_F(hi, lam, a) - ad.value_ode_F(lo, lam, a)).item()
        assert diff == pytest.approx(num, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("v0_frac", [1e-2, 0.3, 2.0])
def test_value_ode_solve_against_solve_ivp(v0_frac: float) -> None:
    lam, a = 0.3, 0.10258
    vs = ad.value_fixed_point(lam, a)
    v0 = v0_frac * vs
    t = np.linspace(0, 1.5 / (lam**2 * v0) + 50, 80)
    sol = solve_ivp(
        lambda _t, v: lam**2 * v**2 - lam * a * v**5,
        (0, t[-1]),
        [v0],
        t_eval=t,
        method="DOP853",
        rtol=1e-12,
        atol=1e-14,
    )
    v = ad.value_ode_solve(torch.from_numpy(t), v0, lam, a)
    assert np.abs(v.numpy() - sol.y[0]).max() < 1e-8 * vs
    assert_close(
        ad.value_ode_F(v[1:10], lam, a) - ad.value_ode_F(v0, lam, a), lam**2 * torch.from_numpy(t[1:10]), rtol=1e-8
    )


def test_value_ode_backwards_and_rise_time() -> None:
    lam, a = 0.2, 0.04774
    vs = ad.value_fixed_point(lam, a)
    t = torch.linspace(-300, 300, 13, dtype=F64)
    v = ad.value_ode_solve(t, vs / 2, lam, a)
    assert (v.diff() >= 0).all() and (v[:8].diff() > 0).all() and v[6].item() == pytest.approx(vs / 2, rel=1e-12)
    F = ad.value_ode_F(v[:9], lam, a) - ad.value_ode_F(vs / 2, lam, a)  # beyond, v = v* to float64 resolution
    assert_close(F, lam**2 * t[:9], rtol=1e-9, atol=1e-9)
    t10, t90 = (ad.value_ode_F(f * vs, lam, a).item() / lam**2 for f in (0.1, 0.9))
    assert ad.value_rise_time(lam, a) == pytest.approx(t90 - t10, rel=1e-12)
    v10 = ad.value_ode_solve(torch.tensor([0.0, t90 - t10], dtype=F64), 0.1 * vs, lam, a)
    assert v10[1].item() == pytest.approx(0.9 * vs, rel=1e-10)
    with pytest.raises(ConfigError, match="value_ode_solve.t"):
        ad.value_ode_solve(-1.0, 2 * vs, lam, a)


def test_scalar_ode_is_the_ansatz_restriction_of_the_flow() -> None:
    """On the ansatz (20), −½∂L/∂v_{m+1} = λ²v² − λav⁵ (eq. 21), other heads feel no force, and L = ansatz_loss."""
    Lam, inv_n, H = rotated(PAPER_LAMBDA, seed=11), 1 / 31, 5
    lam, _ = ad.spectrum(Lam)
    a = ad.second_moment_eigenvalues(Lam, inv_n)
    for m in range(4):
        for vm in (0.05, 0.7, 1.4):
            v, k, q = ad.ansatz_weights(Lam, inv_n, m, vm, H)
            vg, kg, qg = (t.clone().requires_grad_(True) for t in (v, k, q))
            loss = ad.population_loss(ad.separate_matrix(vg, kg, qg), Lam, inv_n)
            assert loss.item() == pytest.approx(ad.ansatz_loss(vm, Lam, inv_n, m).item(), abs=1e-12)
            gv, gk, _ = torch.autograd.grad(loss, (vg, kg, qg))
            assert -gv[m].item() / 2 == pytest.approx(
                ad.value_ode_rhs(vm, lam[m].item(), a[m].item()).item(), abs=1e-12
            )
            others = [i for i in range(H) if i != m]
            assert gv[others].abs().max() <= 1e-12 and gk[others].abs().max() <= 1e-12
    assert ad.ansatz_loss(ad.value_fixed_point(lam[2].item(), a[2].item()), Lam, inv_n, 2).item() == pytest.approx(
        ad.plateau_losses(Lam, inv_n)[3].item(), abs=1e-12
    )


def test_plateau_duration_eq_72() -> None:
    """For small v0 the time to reach v*/2 is 1/(λ²v0) up to O(1/(λ² v*)), eq. (72)."""
    lam, a = 0.4, 0.17806
    vs = ad.value_fixed_point(lam, a)
    for v0 in (1e-3, 1e-4):
        t_half = (ad.value_ode_F(vs / 2, lam, a) - ad.value_ode_F(v0, lam, a)).item() / lam**2
        assert t_half == pytest.approx(ad.separate_plateau_time(lam, v0), rel=5e-3 * (v0 / 1e-4))


def test_early_alignment_equals_matrix_exponential() -> None:
    """Eq. (74) with constant v_i against expm of v t [[0, Ω], [Ω, 0]] (eq. 73)."""
    Lam = rotated(PAPER_LAMBDA, seed=12)
    lam, E = ad.spectrum(Lam)
    g = generator(6)
    k0, q0 = torch.randn(4, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)
    for m in (0, 2):
        Om = (E[:, m:] * lam[m:] ** 2) @ E[:, m:].T
        M = torch.block_diag(Om, Om).roll(4, dims=1)  # [[0, Ω], [Ω, 0]]
        for vt in (0.5, -3.0, 40.0):
            x = torch.linalg.matrix_exp(vt * M) @ torch.cat([k0, q0])
            k, q = ad.early_alignment(k0, q0, Lam, m, vt)
            assert_close(torch.cat([k, q]), x, rtol=1e-10, atol=1e-10)
    k, _ = ad.early_alignment(k0, q0, Lam, 0, 400.0)
    assert ad.key_alignment(k, Lam).argmax().item() == 0  # dominated by e_1


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_on_known_configurations() -> None:
    Lam, inv_n = rotated(PAPER_LAMBDA, seed=13), 1 / 31
    _, E = ad.spectrum(Lam)
    assert_close(ad.key_alignment(E.T * 3.0, Lam), torch.eye(4, dtype=F64), atol=1e-12)
    for m in range(5):
        W = ad.fixed_point_matrix(Lam, inv_n, range(m))
        d = ad.fixed_point_distances(W, Lam, inv_n)
        assert d[m] <= 1e-14 and (torch.cat([d[:m], d[m + 1 :]]) > 0.1).all()
    U = torch.stack([Lam @ Lam, -2 * Lam @ Lam, ad.converged_matrix(Lam, inv_n)])
    c1, c2 = ad.merged_target_cosines(U, Lam, inv_n)
    assert_close(c1[:2], torch.ones(2, dtype=F64)) and c1[2] < 0.99
    assert c2[2].item() == pytest.approx(1.0)
    A, B = torch.eye(3, dtype=F64), torch.ones(3, 3, dtype=F64)
    assert ad.cosine(A, B, dims=2).item() == pytest.approx(1 / math.sqrt(3))  # Frobenius: 3 / (√3·3)
    assert_close(ad.cosine(A, B), torch.full((3,), 1 / math.sqrt(3), dtype=F64))  # row by row
    hc = ad.head_cosines(U)
    assert hc[0, 1].item() == pytest.approx(-1.0) and abs(hc[0, 2].item()) < 0.99


def test_curve_metrics_on_a_synthetic_staircase() -> None:
    """A curve with logistic drops between known levels: crossing times, plateau values and dwell are recovered."""
    levels = torch.tensor([1.0, 0.6, 0.35, 0.2], dtype=F64)
    t = torch.linspace(0, 400, 40_001, dtype=F64)
    centres = torch.tensor([50.0, 150.0, 300.0], dtype=F64)
    L = levels[0] - sum((levels[i] - levels[i + 1]) * torch.sigmoid(t - centres[i]) for i in range(3))
    assert_close(ad.drop_times(t, L, levels), centres, atol=1e-2)
    values, slopes = ad.plateau_values(t, L, levels)
    assert_close(values, levels, atol=1e-6)
    assert slopes.max() < 1e-6
    assert ad.count_drops(t, L) == 3
    assert ad.count_drops(t, 1 - 0.8 * torch.sigmoid(t - 50)) == 1
    assert ad.count_drops(t, torch.ones_like(t)) == 0
    fast = levels[0] - (levels[0] - levels[2]) * torch.sigmoid(t - 50) - (levels[2] - levels[3]) * torch.sigmoid(t - 54)
    assert ad.count_drops(t, fast) == 1  # two drops 4τ apart with no slow phase between them are one drop
    _, s_fast = ad.plateau_values(t, fast, levels)
    assert s_fast[1] > 1e-3  # L(M_1) was passed straight through: no plateau there
    dwell = ad.plateau_dwell(t, L, levels, tol=0.01)
    assert_close(dwell, torch.tensor([50.0, 100.0, 150.0, 100.0], dtype=F64), atol=10.0)
    assert torch.isnan(ad.crossing_times(t, L, torch.tensor([0.1], dtype=F64))).all()


def test_spectrum_is_descending_and_reconstructs() -> None:
    Lam = rotated((0.1, 0.4, 0.3, 0.2), seed=14)
    lam, E = ad.spectrum(Lam)
    assert (lam.diff() < 0).all()
    assert_close((E * lam) @ E.T, Lam)


def test_validation_errors() -> None:
    Lam = diag(PAPER_LAMBDA)
    with pytest.raises(ConfigError, match="attention_dynamics.Lambda"):
        ad.plateau_losses(torch.ones(3, 4, dtype=F64), 0.1)
    with pytest.raises(ConfigError, match="inv_n"):
        ad.second_moment_hat(Lam, 2.0)
    with pytest.raises(ConfigError, match="subset"):
        ad.fixed_point_matrix(Lam, 0.1, [0, 4])
    with pytest.raises(ConfigError, match="n_heads"):
        ad.separate_fixed_point(Lam, 0.1, range(4), n_heads=1, rank=2)
    with pytest.raises(ConfigError, match="v0"):
        ad.value_ode_solve(1.0, -0.1, 0.4, 0.2)
    with pytest.raises(ConfigError, match="expected_inv_n.n_max"):
        ad.expected_inv_n(0)
