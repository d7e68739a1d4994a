"""A theorem is a float64 equality between two learners (STYLE item 11).

Ahn, Cheng, Daneshmand, Sra 2023: Lemma 1 (eq. 8-9, with the Aᵀ of docs/errata.md), the
GD++ algorithm of Thm 4 (eq. 11, §5), the one-layer construction of Thm 1 (eq. 6), the classical
baselines, and the model's P/Q patterns and trace.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F64, assert_close, random_episode, random_spd, rel_diff
from iclab import algorithms, constructions, models
from iclab.models.linear_attention import ACTIVATIONS, PATTERNS

SEEDS = st.integers(0, 2**31 - 1)
FAST = settings(max_examples=20, deadline=None)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


def _nonsymmetric(L: int, d: int, seed: int) -> torch.Tensor:
    """(L, d, d) preconditioners 0.4·I + S + E: a skew part S of size O(1) makes Γ ≠ Γᵀ by O(1)."""
    g = _randn(2, L, d, d, seed=seed)
    skew = 0.3 * (g[0] - g[0].transpose(-1, -2))
    return 0.4 * torch.eye(d, dtype=F64) + skew + 0.1 * g[1]


def _episode(B: int, n: int, d: int, seed: int, **kw) -> iclab.Episode:
    return random_episode(B, n, d, seed=seed, covariance=random_spd(d, seed=seed + 1), **kw)


def _explicit_pgd(ep: iclab.Episode, gammas: torch.Tensor) -> torch.Tensor:
    """w ← w − Γ_ℓ (XᵀX w − Xᵀy)/n per prompt, a loop independent of algorithms.PGD; returns ⟨w_L, x_q⟩."""
    out = []
    for b in range(ep.batch_size):
        X, y = ep.x[b], ep.y[b]
        w = torch.zeros(ep.d, dtype=F64)
        for gam in gammas if gammas.dim() == 3 else gammas[:, b]:
            w = w - gam @ (X.T @ (X @ w - y)) / ep.n
        out.append(w @ ep.x_query[b])
    return torch.stack(out)


# --- Lemma 1: the eq.-(8) transformer is preconditioned GD -------------------------------------


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 12), L=st.integers(1, 4), B=st.integers(1, 5), seed=SEEDS)
def test_lemma1_sparse_transformer_is_pgd(d: int, n: int, L: int, B: int, seed: int) -> None:
    """Lemma 1: constructions.pgd(Γ) predicts exactly L steps of Γ_ℓ-preconditioned GD from w_0 = 0."""
    ep, gammas = _episode(B, n, d, seed), _nonsymmetric(L, d, seed)
    expected = algorithms.PGD(gammas).predict(ep)
    assert_close(constructions.pgd(gammas).predict(ep), expected)
    assert_close(expected, _explicit_pgd(ep, gammas))


@FAST
@given(d=st.integers(2, 6), L=st.integers(1, 4), seed=SEEDS)
def test_lemma1_transposed_preconditioner_fails_by_order_one(d: int, L: int, seed: int) -> None:
    """Pins the Aᵀ convention (docs/errata.md): A_ℓ = Γ_ℓ as printed in the paper is not PGD(Γ)."""
    ep, gammas = _episode(8, 10, d, seed), _nonsymmetric(L, d, seed)
    expected = algorithms.PGD(gammas).predict(ep)
    assert rel_diff(constructions.pgd(gammas.transpose(-1, -2)).predict(ep), expected) > 0.05
    # ... and the construction stores A_ℓ = Γ_ℓᵀ, i.e. Q_ℓ = −[[Γ_ℓᵀ, 0], [0, 0]].
    model = constructions.pgd(gammas)
    assert torch.equal(model.A[:, 0], gammas.transpose(-1, -2))
    assert torch.equal(model.Q[:, 0, :d, :d], -gammas.transpose(-1, -2))


@FAST
@given(d=st.integers(1, 5), n=st.integers(1, 10), L=st.integers(1, 4), seed=SEEDS)
def test_lemma1_holds_layer_by_layer(d: int, n: int, L: int, seed: int) -> None:
    """Pathwise form (App. C.1): after ℓ layers the query slot holds −⟨x_q, w_ℓ⟩ and context slot i holds
    the residual y_i − ⟨w_ℓ, x_i⟩, for every ℓ = 0..L, and the x rows never change."""
    ep, gammas = _episode(3, n, d, seed), _nonsymmetric(L, d, seed)
    y_hat, states = constructions.pgd(gammas).trace(ep)  # states (L+1, B, n+1, d+1)
    ws = algorithms.PGD(gammas).weights(ep)  # (L+1, B, d)
    assert_close(states[:, :, -1, -1], -torch.einsum("lbd,bd->lb", ws, ep.x_query))
    assert_close(states[:, :, :n, -1], ep.y - torch.einsum("lbd,bnd->lbn", ws, ep.x))
    assert torch.equal(states[:, :, :n, :d], ep.x.expand(L + 1, -1, -1, -1))
    assert_close(y_hat, algorithms.PGD(gammas).predict(ep))


# --- gradient-descent algorithms -------------------------------------------------------------


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 10), L=st.integers(1, 4), seed=SEEDS)
def test_gd_is_pgd_with_identity(d: int, n: int, L: int, seed: int) -> None:
    ep = _episode(4, n, d, seed)
    steps = 0.2 + 0.6 * torch.rand(L, generator=iclab.generator(seed), dtype=F64)
    y = algorithms.gd(steps, d=d).predict(ep)
    assert_close(y, algorithms.pgd(torch.eye(d, dtype=F64), steps).predict(ep))
    assert_close(y, algorithms.PGD(steps[:, None, None] * torch.eye(d, dtype=F64)).predict(ep))
    assert_close(y, _explicit_pgd(ep, steps[:, None, None] * torch.eye(d, dtype=F64)))


def test_pgd_per_prompt_preconditioners() -> None:
    """(L, B, d, d) preconditioners: prompt b uses Γ_{ℓ,b}."""
    ep = _episode(5, 7, 3, seed=0)
    gammas = _nonsymmetric(2 * 5, 3, seed=1).reshape(2, 5, 3, 3)
    y = algorithms.PGD(gammas).predict(ep)
    assert_close(y, _explicit_pgd(ep, gammas))
    assert_close(y[2:3], algorithms.PGD(gammas[:, 2]).predict(ep[2:3]))


def test_gd_with_python_float_steps_is_exact_in_float64(episode64: iclab.Episode) -> None:
    exact = algorithms.gd(torch.tensor([0.1, 0.3], dtype=F64), d=episode64.d).predict(episode64)
    assert_close(algorithms.gd([0.1, 0.3], d=episode64.d).predict(episode64), exact)


# --- GD++ (Thm 4, eq. 11) -------------------------------------------------------------------


def _gdpp_args(L: int, d: int, seed: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    u = torch.rand(2, L, generator=iclab.generator(seed), dtype=F64)
    eta = (0.2 + 0.5 * u[0]) * torch.where(u[1] > 0.2, 1.0, -1.0).to(F64)  # mostly positive, never 0
    gam = 0.4 * torch.rand(L, generator=iclab.generator(seed + 1), dtype=F64) - 0.2
    gamma = random_spd(d, seed=seed + 2) if symmetric else _nonsymmetric(1, d, seed + 2)[0]
    return eta, gam, gamma


@FAST
@given(d=st.integers(1, 5), n=st.integers(1, 10), L=st.integers(1, 4), symmetric=st.booleans(), seed=SEEDS)
def test_gd_plus_plus_construction_is_gd_plus_plus(d: int, n: int, L: int, symmetric: bool, seed: int) -> None:
    """Thm 4 / eq. (11): A_ℓ = −η_ℓΓ, B_ℓ = (γ_ℓ/η_ℓ)I runs GD++ (preconditioned step + feature transform)."""
    ep = _episode(3, n, d, seed)
    eta, gam, gamma = _gdpp_args(L, d, seed, symmetric)
    expected = algorithms.GDPlusPlus(eta, gam, gamma).predict(ep)
    assert_close(constructions.gd_plus_plus(eta, gam, gamma).predict(ep), expected)


@FAST
@given(d=st.integers(1, 5), n=st.integers(1, 10), L=st.integers(1, 4), symmetric=st.booleans(), seed=SEEDS)
def test_gd_plus_plus_without_transforms_is_pgd(d: int, n: int, L: int, symmetric: bool, seed: int) -> None:
    """γ ≡ 0: GD++ is PGD with preconditioners η_ℓΓᵀ (= η_ℓΓ for SPD Γ)."""
    ep = _episode(3, n, d, seed)
    eta, _, gamma = _gdpp_args(L, d, seed, symmetric)
    y = algorithms.GDPlusPlus(eta, torch.zeros_like(eta), gamma).predict(ep)
    assert_close(y, algorithms.pgd(gamma.T, eta).predict(ep))
    if symmetric:
        assert_close(y, algorithms.pgd(gamma, eta).predict(ep))


def test_gd_plus_plus_transform_matters(episode64: iclab.Episode) -> None:
    """The feature transform changes the answer (so the equalities above are not vacuous)."""
    eta, gam, gamma = _gdpp_args(3, episode64.d, 0, True)
    with_t = algorithms.GDPlusPlus(eta, gam.abs() + 0.1, gamma).predict(episode64)
    without = algorithms.GDPlusPlus(eta, torch.zeros_like(eta), gamma).predict(episode64)
    assert rel_diff(with_t, without) > 1e-2


def test_gd_plus_plus_construction_needs_nonzero_steps() -> None:
    with pytest.raises(iclab.ConfigError, match=r"constructions\.gd_plus_plus\.step_sizes .*got \[0\.5, 0\.0\]"):
        constructions.gd_plus_plus(torch.tensor([0.5, 0.0]), torch.tensor([0.1, 0.2]), torch.eye(3))


# --- one layer (Thm 1, Thm 5) ------------------------------------------------------------------


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 12), seed=SEEDS)
def test_one_layer_is_one_pgd_step_with_transposed_preconditioner(d: int, n: int, seed: int) -> None:
    """P = e_D e_Dᵀ, Q = −[[Γ,0],[0,0]] predicts ⟨x_q, Γᵀ Xᵀy/n⟩: one step of Γᵀ-preconditioned GD."""
    ep, gamma = _episode(4, n, d, seed), _nonsymmetric(1, d, seed)[0]
    y = constructions.one_layer(gamma).predict(ep)
    assert_close(y, algorithms.PGD(gamma.T[None]).predict(ep))
    xty = torch.einsum("bnd,bn->bd", ep.x, ep.y) / n
    assert_close(y, torch.einsum("bd,de,be->b", xty, gamma, ep.x_query))  # bᵀ Γ x_q, b = Xᵀy/n
    if d >= 2:
        assert rel_diff(y, algorithms.PGD(gamma[None]).predict(ep)) > 1e-2


def test_one_layer_isotropic_optimum_is_gd_step() -> None:
    """Eq. (7): Q_0 = −n/(n+d+1)[[I,0],[0,0]] is one GD step of size n/(n+d+1)."""
    d, n = 5, 20
    ep = _episode(6, n, d, seed=3)
    step = n / (n + d + 1)
    y = constructions.one_layer(step * torch.eye(d, dtype=F64)).predict(ep)
    assert_close(y, algorithms.gd(torch.tensor([step], dtype=F64), d=d).predict(ep))


@FAST
@given(d=st.integers(1, 5), n=st.integers(1, 10), seed=SEEDS)
def test_one_layer_relu_readout(d: int, n: int, seed: int) -> None:
    """ReLU attention (Sec. 6): ŷ = −(1/n) Σ_i y_i relu(−x_iᵀΓx_q); and since s = relu(s) − relu(−s), the
    ReLU models for Γ and −Γ differ by exactly the linear one."""
    ep, gamma = _episode(4, n, d, seed), _nonsymmetric(1, d, seed)[0]
    y = constructions.one_layer(gamma, activation="relu").predict(ep)
    scores = torch.einsum("bnd,de,be->bn", ep.x, gamma, ep.x_query)  # x_iᵀ Γ x_q
    assert_close(y, -(ep.y * torch.relu(-scores)).sum(-1) / n)
    y_neg = constructions.one_layer(-gamma, activation="relu").predict(ep)
    assert_close(y - y_neg, constructions.one_layer(gamma).predict(ep))


# --- classical baselines ------------------------------------------------------------------------


@FAST
@given(d=st.integers(1, 6), extra=st.integers(0, 8), seed=SEEDS)
def test_least_squares_and_bayes_recover_noiseless_target(d: int, extra: int, seed: int) -> None:
    """Noiseless y = ⟨w, x⟩ with n ≥ d: OLS and the posterior mean (σ² = 0) both find w and predict y_q."""
    ep = _episode(4, d + extra, d, seed)
    assert_close(algorithms.LeastSquares().predict(ep), ep.y_query, rtol=1e-9, atol=1e-9)
    assert_close(algorithms.BayesPosteriorMean().predict(ep), ep.y_query, rtol=1e-9, atol=1e-9)
    prior = algorithms.BayesPosteriorMean(prior_cov=random_spd(d, seed=seed + 7), noise_var=0.0)
    assert_close(prior.predict(ep), ep.y_query, rtol=1e-9, atol=1e-9)


@FAST
@given(d=st.integers(2, 7), seed=SEEDS, data=st.data())
def test_bayes_underdetermined_is_min_prior_norm_interpolant(d: int, seed: int, data: st.DataObject) -> None:
    """n < d, σ² = 0: w̄ = argmin ‖Σ_w^{-1/2} w‖ s.t. Xw = y = Σ_w^{1/2} (X Σ_w^{1/2})⁺ y."""
    n = data.draw(st.integers(1, d - 1), label="n")
    ep = _episode(3, n, d, seed)
    sw = random_spd(d, seed=seed + 3, cond=10.0)
    bayes = algorithms.BayesPosteriorMean(prior_cov=sw, noise_var=0.0)
    root = iclab.core.numerics.sym_sqrt(sw)
    w = root @ torch.linalg.pinv(ep.x @ root) @ ep.y.unsqueeze(-1)  # (B, d, 1)
    assert_close(bayes.predict(ep), (ep.x_query.unsqueeze(1) @ w).reshape(-1))
    # It interpolates: asking for a context point returns its label.
    assert_close(bayes.predict(dataclasses.replace(ep, x_query=ep.x[:, 0])), ep.y[:, 0])
    # Least squares is the Σ_w = I case.
    assert_close(
        algorithms.LeastSquares().predict(ep), algorithms.BayesPosteriorMean(torch.eye(d, dtype=F64), 0.0).predict(ep)
    )


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 12), noise=st.floats(0.05, 1.0), seed=SEEDS)
def test_bayes_with_noise_is_ridge(d: int, n: int, noise: float, seed: int) -> None:
    """Σ_w = I, σ² > 0: w̄ = (XᵀX + σ²I)⁻¹Xᵀy = Ridge with λ = σ²/n (both the n ≤ d and n > d branches)."""
    ep = _episode(4, n, d, seed, noise_std=noise)  # task carries w_cov = I and noise_var = σ²
    ridge = algorithms.Ridge(noise**2 / n).predict(ep)
    assert_close(algorithms.BayesPosteriorMean().predict(ep), ridge)
    assert_close(algorithms.BayesPosteriorMean(torch.eye(d, dtype=F64), noise**2).predict(ep), ridge)


@FAST
@given(d=st.integers(1, 6), n=st.integers(1, 12), seed=SEEDS)
def test_bayes_kernel_and_primal_forms_agree(d: int, n: int, seed: int) -> None:
    """General Σ_w and σ²: the posterior mean is (XᵀX + σ²Σ_w⁻¹)⁻¹Xᵀy whichever branch (n ≤ d or n > d) runs."""
    ep = _episode(3, n, d, seed, noise_std=0.3)
    sw, s2 = random_spd(d, seed=seed + 5), 0.09
    a = ep.x.transpose(1, 2) @ ep.x + s2 * torch.linalg.inv(sw)
    w = torch.linalg.solve(a, ep.x.transpose(1, 2) @ ep.y.unsqueeze(-1))
    expected = (ep.x_query.unsqueeze(1) @ w).reshape(-1)
    assert_close(algorithms.BayesPosteriorMean(prior_cov=sw, noise_var=s2).predict(ep), expected)


# --- the model: P/Q patterns, an independent forward pass, trace -----------------------------


def _model(pattern: str, activation: str = "linear", *, L: int = 2, d: int = 3, H: int = 1, seed: int = 0):
    cfg = models.LinearTransformerConfig(
        d=d, n_layers=L, n_heads=H, pattern=pattern, activation=activation, init_std=0.5
    )
    return models.LinearTransformer(cfg, generator=iclab.generator(seed)).to(F64)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_matrices(pattern: str) -> None:
    """Eq. (8): P = e_D e_Dᵀ, Q = −[[A,0],[0,0]]; eq. (11): P = [[B,0],[0,1]], Q = [[A,0],[0,0]]; full: free."""
    L, H, d = 3, 2, 4
    model = _model(pattern, L=L, d=d, H=H)
    P, Q = model.P, model.Q
    assert P.shape == Q.shape == (L, H, d + 1, d + 1)
    if pattern == "full":
        assert (P[..., -1, :-1] != 0).all() and (Q[..., :-1, -1] != 0).all()  # nothing pinned
        with pytest.raises(AttributeError):
            model.A
        return
    A = model.A
    assert A.shape == (L, H, d, d)
    e_D = torch.zeros(d + 1, d + 1, dtype=F64)
    e_D[-1, -1] = 1.0
    Q_expected = torch.zeros_like(Q)
    P_expected = e_D.expand(L, H, -1, -1).clone()
    Q_expected[..., :d, :d] = A if pattern == "pattern11" else -A
    if pattern == "pattern11":
        assert model.B.shape == (L, H, d, d)
        P_expected[..., :d, :d] = model.B
    else:
        with pytest.raises(AttributeError):
            model.B
    assert torch.equal(P, P_expected) and torch.equal(Q, Q_expected)
    if pattern == "sparse_symmetric":
        assert torch.equal(A, A.transpose(-1, -2))
    else:
        assert not torch.equal(A, A.transpose(-1, -2))


def test_construction_matrices() -> None:
    """The constructions' weights are the ones their docstrings state."""
    d = 3
    gamma = _nonsymmetric(1, d, 0)[0]
    e_D = torch.zeros(1, d + 1, d + 1, dtype=F64)
    e_D[0, -1, -1] = 1.0
    one = constructions.one_layer(gamma)
    assert torch.equal(one.P[0], e_D)
    assert torch.equal(one.Q[0, 0, :d, :d], -gamma) and not one.Q[0, 0, -1].any() and not one.Q[0, 0, :, -1].any()
    eta, gam = torch.tensor([0.5, -0.25], dtype=F64), torch.tensor([0.1, 0.2], dtype=F64)
    pp = constructions.gd_plus_plus(eta, gam, gamma)
    assert_close(pp.A[:, 0], -eta[:, None, None] * gamma)
    assert_close(pp.B[:, 0], (gam / eta)[:, None, None] * torch.eye(d, dtype=F64))
    assert torch.equal(pp.P[:, 0, -1], e_D[0, -1].expand(2, -1))


def _reference_forward(model: models.LinearTransformer, ep: iclab.Episode) -> torch.Tensor:
    """Eq. (3)-(4) in the paper's own layout: Z (D, n+1) tokens as columns, the dense (n+1)×(n+1) score
    matrix, M = diag(1, …, 1, 0), Z ← Z + (1/n) Σ_h P_h Z M σ(Zᵀ Q_h Z); read out −[Z_L]_{D, n+1}."""
    n, relu = ep.n, model.config.activation == "relu"
    Z = models.embed(ep).transpose(1, 2)  # (B, D, n+1)
    M = torch.diag(torch.tensor([1.0] * n + [0.0], dtype=F64))
    for P_l, Q_l in zip(model.P, model.Q, strict=True):  # (H, D, D) each
        upd = torch.zeros_like(Z)
        for P, Q in zip(P_l, Q_l, strict=True):
            S = Z.transpose(1, 2) @ Q @ Z  # (B, n+1, n+1)
            upd = upd + P @ Z @ M @ (torch.relu(S) if relu else S) / n
        Z = Z + upd
    return -Z[:, -1, -1]


@FAST
@given(
    pattern=st.sampled_from(PATTERNS),
    activation=st.sampled_from(ACTIVATIONS),
    d=st.integers(1, 4),
    n=st.integers(1, 8),
    L=st.integers(1, 3),
    H=st.integers(1, 2),
    seed=SEEDS,
)
def test_forward_matches_dense_reference(pattern: str, activation: str, d: int, n: int, L: int, H: int, seed: int):
    """The O(n·D²) associative forward (and the ReLU one) equals eq. (3)-(4) evaluated literally."""
    model = _model(pattern, activation, L=L, d=d, H=H, seed=seed % 1000)
    ep = _episode(3, n, d, seed)
    with torch.no_grad():
        assert_close(model.predict(ep), _reference_forward(model, ep))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_trace(pattern: str, activation: str, episode64: iclab.Episode) -> None:
    """states (L+1, B, n+1, D) = Z_0ᵀ … Z_Lᵀ; Z_0 is the prompt; the read-out is −[Z_L]_{D, n+1}."""
    ep, L = episode64, 3
    model = _model(pattern, activation, L=L, d=ep.d)
    with torch.no_grad():
        y_hat, states = model.trace(ep)
        y = model.predict(ep)
    assert states.shape == (L + 1, ep.batch_size, ep.n + 1, ep.d + 1)
    assert torch.equal(states[0], models.embed(ep))
    assert torch.equal(states[0, :, -1, -1], torch.zeros(ep.batch_size, dtype=F64))
    assert_close(y_hat, y)
    assert torch.equal(y_hat, -states[-1, :, -1, -1])
    x_rows_fixed = torch.equal(states[..., : ep.d], states[:1, ..., : ep.d].expand(L + 1, -1, -1, -1))
    # Eq. (8) never touches the x rows (P's first d rows are 0); eq. (11) and full P move them.
    assert x_rows_fixed == (pattern in ("sparse", "sparse_symmetric"))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_query_label_is_never_read_by_the_context(pattern: str, activation: str, episode64: iclab.Episode) -> None:
    """Lemma 5/6: M removes the query as a source, so the context tokens never see the query's label slot;
    under eq. (8)/(11) (last column of Q = 0) the label enters the query slot additively: ŷ̄ = ŷ − y_q."""
    ep, n = episode64, episode64.n
    model = _model(pattern, activation, L=3, d=ep.d)
    with torch.no_grad():
        y0, s0 = model.trace(ep)
        y1, s1 = model.trace(ep, query_label=ep.y_query)
    assert torch.equal(s0[:, :, :n], s1[:, :, :n])
    if pattern != "full":
        assert_close(y1, y0 - ep.y_query)
    else:
        assert rel_diff(y1, y0 - ep.y_query) > 1e-3  # a free last column of Q reads the label


def test_load_matrices_rejects_wrong_blocks() -> None:
    model = _model("sparse", L=2, d=3)
    with pytest.raises(iclab.ConfigError, match=r"LinearTransformer\.load_matrices\.blocks .*got \['P', 'Q'\]"):
        model.load_matrices(P=torch.zeros(2, 4, 4), Q=torch.zeros(2, 4, 4))
    with pytest.raises(iclab.ConfigError, match=r"LinearTransformer\.load_matrices\.A "):
        model.load_matrices(A=torch.zeros(2, 4, 4, dtype=F64))
