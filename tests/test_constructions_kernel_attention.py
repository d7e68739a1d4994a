"""Kernel-attention constructions are functional GD (Cheng, Chen, Sra 2024; Prop. 3.1, 3.4, D.1).

Each test compares a construction with :mod:`iclab.algorithms.functional_gd` in float64 to 1e-10, at
the query (``trajectory``: every layer ℓ) and on the demonstrations' label row (eq. 22:
Y_ℓ^{(i)} = y_i − f_ℓ(x_i), ``residuals``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F32, F64, assert_close, random_episode, random_spd
from iclab import algorithms, constructions, tasks
from iclab.core.errors import ConfigError
from iclab.core.kernels import CompositeKernel, Kernel, gram
from iclab.core.numerics import sym_inv_sqrt

SEEDS = st.integers(0, 2**31 - 1)
FAST = settings(max_examples=15, deadline=None)


def _steps(L: int, seed: int, scale: float = 0.1) -> torch.Tensor:
    """(L,) step sizes of either sign around ``scale``."""
    g = iclab.generator(seed)
    return (
        scale
        * (0.5 + torch.rand(L, generator=g, dtype=F64))
        * torch.where(torch.rand(L, generator=g, dtype=F64) < 0.2, -1.0, 1.0)
    )


def _gp_episode(B: int, n: int, d: int, seed: int, kernel: str = "exp") -> iclab.Episode:
    """K-GP episode with the paper's covariates x = Σ^{1/2}ξ, ξ on the sphere, and a random Σ."""
    task = tasks.GaussianProcess(d=d, kernel=kernel, covariance=random_spd(d, seed=seed + 7))
    return task.sample(B, n, generator=iclab.generator(seed), dtype=F64)


def _assert_is_fgd(model, algo, ep: iclab.Episode) -> None:
    """The model equals the algorithm at the query and on the label row after every layer (eq. 8, 22)."""
    with torch.no_grad():
        _, zs = model.trace(ep)  # (L+1, B, n+1, D)
    traj, res = algo.trajectory(ep), algo.residuals(ep)  # (L+1, B), (L+1, B, n)
    assert traj[1:].abs().max() > 1e-3, "predictions too small for the check to mean anything (vs atol 1e-10)"
    assert_close(-zs[:, :, -1, -1], traj)  # TF_ℓ(x) = −f_ℓ(x), eq. (8)
    assert_close(zs[:, :, :-1, -1], res)  # Y_ℓ^{(i)} = y_i − f_ℓ(x_i), eq. (22)
    assert_close(model.predict(ep).detach(), algo.predict(ep))


# --- Prop. 3.1 and eq. (10) ------------------------------------------------------------------


@FAST
@given(
    kernel=st.sampled_from(["linear", "relu", "exp"]),
    d=st.integers(1, 6),
    n=st.integers(1, 12),
    L=st.integers(1, 5),
    sigma=st.floats(0.7, 2.0),
    seed=SEEDS,
)
def test_prop_3_1_is_functional_gd(kernel: str, d: int, n: int, L: int, sigma: float, seed: int) -> None:
    """Prop. 3.1: V_ℓ = [[0,0],[0,−r_ℓ]], B = C = I (1/σ for exp), h̃ = K is L steps of FGD (9), any steps."""
    ep = _gp_episode(4, n, d, seed)
    steps = _steps(L, seed)
    model = constructions.functional_gd(kernel, steps, d=d, sigma=sigma)
    _assert_is_fgd(model, algorithms.FunctionalGD(kernel, steps, sigma=sigma), ep)


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 12), L=st.integers(1, 5), sigma=st.floats(0.7, 2.0), seed=SEEDS)
def test_eq_10_softmax_is_normalised_fgd(d: int, n: int, L: int, sigma: float, seed: int) -> None:
    """Eq. (10): the same V with softmax attention and Q = K = [[I/σ, 0], [0, 0]] is the τ-normalised update."""
    ep = _gp_episode(3, n, d, seed)
    steps = _steps(L, seed, scale=0.5)
    model = constructions.functional_gd("exp", steps, d=d, sigma=sigma, normalized=True)
    assert model.config.activations == ("softmax",)
    _assert_is_fgd(model, algorithms.FunctionalGD("exp", steps, sigma=sigma, normalized=True), ep)


def test_eq_10_tau_by_hand() -> None:
    """One softmax layer by hand: f_1(x) = r τ(x) Σ_i y_i K(x, x_i), τ(x) = 1/Σ_j K(x, x_j)."""
    ep = _gp_episode(4, 7, 3, seed=1)
    K = torch.exp(ep.x @ ep.x_query.unsqueeze(-1)).squeeze(-1)  # (B, n)
    expected = 0.7 * (K * ep.y).sum(-1) / K.sum(-1)
    assert_close(constructions.functional_gd("exp", [0.7], d=3, normalized=True).predict(ep).detach(), expected)


def test_prop_3_1_float32() -> None:
    """Prop. 3.1 in float32: the construction follows float64 FGD to 1e-5 (relative to the prediction)."""
    ep = _gp_episode(64, 14, 5, seed=2)
    steps = torch.full((4,), 0.05, dtype=F64)
    ref = algorithms.FunctionalGD("exp", steps).predict(ep)
    y32 = constructions.functional_gd("exp", steps, d=5).to(F32).predict(ep.to(dtype=F32)).detach()
    assert float((y32.double() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_linear_kernel_is_euclidean_gd() -> None:
    """App. I.2: FGD with the linear kernel is GD on the weights: r_ℓ = γ_ℓ/n for algorithms.gd (which uses ∇R/n)."""
    n, d = 9, 4
    ep = random_episode(5, n, d, seed=3, covariance=random_spd(d, seed=4))
    steps = torch.tensor([0.05, 0.08, 0.03], dtype=F64)
    model = constructions.functional_gd("linear", steps, d=d)
    assert_close(model.predict(ep).detach(), algorithms.gd(n * steps, d=d).predict(ep))


# --- Σ ≠ I: Thm 4.5 / 4.6 points --------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp"])
def test_whitened_construction(kernel: str) -> None:
    """B = C = Σ^{-1/2}: FGD in the RKHS of K(Σ^{-1/2}·, Σ^{-1/2}·), the kernel the labels were drawn with."""
    d = 5
    ep = _gp_episode(4, 10, d, seed=5, kernel=kernel)
    W = ep.task["Sigma_inv_sqrt"]
    steps = _steps(3, seed=6)
    model = constructions.functional_gd(kernel, steps, transform=W)
    _assert_is_fgd(model, algorithms.FunctionalGD(kernel, steps, transform=W), ep)


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "softmax"])
def test_thm_4_5_stationary_point_is_fgd(kernel: str) -> None:
    """Thm 4.5's S: A = 0, B_ℓ = b_ℓΣ^{-1/2}, C_ℓ = c_ℓΣ^{-1/2} (per-layer b, c) is FGD with
    h̃(b_ℓΣ^{-1/2}·, c_ℓΣ^{-1/2}·) (eq. 17); softmax is the normalised update."""
    d = 4
    ep = _gp_episode(5, 8, d, seed=7)
    Sigma = ep.task["Sigma"]
    b, c = torch.tensor([0.8, 1.2, 1.0], dtype=F64), torch.tensor([1.1, 0.7, 1.3], dtype=F64)
    model, algo = constructions.stationary_point(kernel, _steps(3, seed=8, scale=0.2), Sigma, b, c)
    _assert_is_fgd(model, algo, ep)
    assert model.A.abs().max() == 0


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "softmax"])
def test_thm_4_6_stationary_point_is_fgd_plus_plus(kernel: str) -> None:
    """Thm 4.6's S: A_ℓ = a_ℓI as well: the covariate-moving algorithm of eq. (58) (FunctionalGDPlusPlus)."""
    d = 4
    ep = _gp_episode(5, 8, d, seed=9)
    a = torch.tensor([0.05, -0.1, 0.08], dtype=F64)
    model, algo = constructions.stationary_point(
        kernel, _steps(3, seed=10, scale=0.2), ep.task["Sigma"], 0.9, 1.1, covariate_steps=a
    )
    with torch.no_grad():
        _, zs = model.trace(ep)
    assert_close(-zs[:, :, -1, -1], algo.trajectory(ep))
    # A matters: the same point with a = 0 predicts differently
    no_a, _ = constructions.stationary_point(kernel, _steps(3, seed=10, scale=0.2), ep.task["Sigma"], 0.9, 1.1)
    assert (no_a.predict(ep) - model.predict(ep)).abs().max() > 1e-4


@pytest.mark.parametrize("kernel", ["linear", "relu", "exp", "softmax"])
def test_loss_at_S_points_does_not_see_sigma(kernel: str) -> None:
    """At B = bΣ^{-1/2}, C = cΣ^{-1/2} the predictions equal the Σ = I model with
    B = bI, C = cI on the whitened covariates ξ = Σ^{-1/2}x (same draws)."""
    d = 5
    ep = _gp_episode(6, 10, d, seed=11)
    W = ep.task["Sigma_inv_sqrt"]
    white = dataclasses.replace(ep, x=ep.x @ W.T, x_query=ep.x_query @ W.T)
    steps = _steps(3, seed=12, scale=0.2)
    model, _ = constructions.stationary_point(kernel, steps, ep.task["Sigma"], 1.3, 0.9, covariate_steps=[0.1] * 3)
    iso, _ = constructions.stationary_point(kernel, steps, torch.eye(d, dtype=F64), 1.3, 0.9, covariate_steps=[0.1] * 3)
    assert_close(model.predict(ep).detach(), iso.predict(white).detach())


# --- Prop. D.1: several heads, composite kernels --------------------------------------------


@FAST
@given(
    names=st.lists(st.sampled_from(["linear", "relu", "exp"]), min_size=2, max_size=3),
    L=st.integers(1, 4),
    seed=SEEDS,
)
def test_prop_d1_multihead_is_fgd_on_composite_kernel(names: list[str], L: int, seed: int) -> None:
    """Prop. D.1(A): head s with h̃^s = K^s, B^s = C^s = G^s and one step r_ℓ is FGD with K◇ = Σ_s α_s K^s(G^s·, G^s·)."""
    d = 4
    g = iclab.generator(seed)
    terms = tuple(
        Kernel(
            name,
            sigma=float(1 + torch.rand(1, generator=g)),
            weight=float(0.3 + torch.rand(1, generator=g)),
            transform=torch.randn(d, d, generator=g, dtype=F64) / 2,
        )
        for name in names
    )
    ep = _gp_episode(3, 9, d, seed)
    steps = _steps(L, seed)
    model = constructions.functional_gd_multihead(terms, steps)
    assert model.config.activations == tuple(names)
    _assert_is_fgd(model, algorithms.FunctionalGD(CompositeKernel(terms), steps), ep)


def test_fig4c_kernel_construction() -> None:
    """Fig. 4(c): K◇ = ½ linear(G₁·) + ½ exp(G₂·), G₁ = diag(1,1,0,0,0), G₂ = diag(0,0,1,1,1), on K◇-GP data."""
    G1 = torch.diag(torch.tensor([1.0, 1, 0, 0, 0], dtype=F64))
    G2 = torch.diag(torch.tensor([0.0, 0, 1, 1, 1], dtype=F64))
    kern = CompositeKernel((Kernel("linear", weight=0.5, transform=G1), Kernel("exp", weight=0.5, transform=G2)))
    ep = tasks.GaussianProcess(d=5, kernel=kern).sample(8, 14, generator=iclab.generator(13), dtype=F64)
    steps = torch.full((3,), 0.1, dtype=F64)
    _assert_is_fgd(constructions.functional_gd_multihead(kern, steps), algorithms.FunctionalGD(kern, steps), ep)


# --- Prop. 3.4: Bayes optimality with depth ---------------------------------------------------


def test_prop_3_4_remainder_is_exact() -> None:
    """Prop. 3.4's proof, exactly: with constant δ, f_L(x_q) = νᵀK̂⁻¹(I − (I − δK̂)^L)Ŷ, so
    f_L − f_bayes = −νᵀK̂⁻¹(I − δK̂)^L Ŷ at every depth (K̂ = K(ξ_i, ξ_j), ν = K(ξ_i, ξ_q))."""
    n, d, L = 10, 5, 40
    ep = _gp_episode(3, n, d, seed=15)
    W = ep.task["Sigma_inv_sqrt"]
    xi = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1) @ W.T  # (B, n+1, d)
    K = gram("exp", xi, xi)
    Khat, nu = K[:, :n, :n], K[:, :n, n]
    delta = 1.0 / float(torch.linalg.eigvalsh(Khat)[:, -1].max())
    model = constructions.functional_gd("exp", torch.full((L,), delta, dtype=F64), transform=W)
    P = torch.linalg.matrix_power(torch.eye(n, dtype=F64) - delta * Khat, L)  # (B, n, n)
    Kinv_nu = torch.linalg.solve(Khat, nu.unsqueeze(-1))  # (B, n, 1)
    bayes = (Kinv_nu.transpose(1, 2) @ ep.y.unsqueeze(-1)).reshape(-1)
    remainder = (Kinv_nu.transpose(1, 2) @ P @ ep.y.unsqueeze(-1)).reshape(-1)
    assert remainder.abs().max() > 1e-3
    assert_close(model.predict(ep).detach(), bayes - remainder, rtol=1e-9, atol=1e-9)
    assert_close(bayes, algorithms.GaussianProcessPosterior().predict(ep), rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_prop_3_4_deep_construction_reaches_bayes() -> None:
    """Prop. 3.4: h̃ = K, constant δ ∈ (0, 2/λ_max(K̂)): TF_L → −νᵀK̂⁻¹Ŷ, error ≤ C max|1 − δλ_i|^L."""
    n, d = 14, 5
    ep = _gp_episode(1, n, d, seed=14)
    W = ep.task["Sigma_inv_sqrt"]
    xi = ep.x @ W.T
    lam = torch.linalg.eigvalsh(gram("exp", xi, xi))[0]  # (n,)
    delta = 1.0 / float(lam[-1])
    rate = 1 - delta * float(lam[0])
    L = math.ceil(math.log(1e-12) / math.log(rate))
    assert L < 20_000, f"K̂ too ill-conditioned for a fast test (rate {rate})"
    model = constructions.functional_gd("exp", torch.full((L,), delta, dtype=F64), transform=W)
    bayes = algorithms.GaussianProcessPosterior().predict(ep)
    with torch.no_grad():
        y = model.predict(ep)
    assert_close(y, bayes, rtol=1e-8, atol=1e-8)
    short = constructions.functional_gd("exp", torch.full((10,), delta, dtype=F64), transform=W)
    assert (short.predict(ep).detach() - bayes).abs().max() > 1e-4  # depth is what gets it there


# --- validation --------------------------------------------------------------------------------


def test_constructions_reject_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="functional_gd.kernel must be one of"):
        constructions.functional_gd("rbf", [0.1], d=3)
    with pytest.raises(ConfigError, match="functional_gd.normalized must be False unless"):
        constructions.functional_gd("linear", [0.1], d=3, normalized=True)
    with pytest.raises(ConfigError, match="functional_gd.d must be given"):
        constructions.functional_gd("exp", [0.1])
    with pytest.raises(ConfigError, match="functional_gd.d must be consistent"):
        constructions.functional_gd("exp", [0.1], d=3, transform=torch.eye(4, dtype=F64))
    with pytest.raises(ConfigError, match="functional_gd.step_sizes must be a non-empty 1-D"):
        constructions.functional_gd("exp", torch.zeros(2, 2), d=3)
    with pytest.raises(ConfigError, match="stationary_point.kernel must be one of"):
        constructions.stationary_point("rbf", [0.1], torch.eye(3, dtype=F64), 1.0, 1.0)
    with pytest.raises(ConfigError, match="stationary_point.b must be a scalar or 2 values"):
        constructions.stationary_point("exp", [0.1, 0.2], torch.eye(3, dtype=F64), [1.0, 1.0, 1.0], 1.0)


def test_steps_keep_float64() -> None:
    """Python step sizes become float64 exactly (no float32 rounding of 0.1)."""
    model = constructions.functional_gd("exp", [0.1, 0.2], d=3)
    assert model.r.dtype == F64 and model.r[0, 0].item() == -0.1
    assert torch.equal(sym_inv_sqrt(torch.eye(2, dtype=F64)), torch.eye(2, dtype=F64))
