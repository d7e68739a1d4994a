"""Closed forms of Sun, Jadbabaie, Azizan 2025 (Lemma 3, Lemma 8, Thm 2, Prop. 1, Prop. 4, Thm 5), each checked
against exact values and seeded float64 Monte Carlo (>= 1e5 prompts, 3σ)."""

from __future__ import annotations

import math

import pytest
import torch

import iclab
from conftest import F64, assert_close
from iclab import algorithms, constructions, tasks
from iclab.constructions.bilinear import quadratic_lambda
from iclab.theory import mc_loss
from iclab.theory import polynomial_features as pf


def _within_3sigma(mean: float, se: float, expected: float) -> None:
    assert abs(mean - expected) <= 3 * se, f"MC {mean:.4f} ± {se:.4f} vs {expected:.4f}"


def test_isserlis_moments() -> None:
    assert [pf.gaussian_moment((2 * k,)) for k in range(5)] == [1, 1, 3, 15, 105]
    assert pf.gaussian_moment((1, 1)) == 0 and pf.gaussian_moment((2, 4)) == 3 and pf.gaussian_moment((3,)) == 0
    x = torch.randn(1_000_000, 2, generator=iclab.generator(0), dtype=F64)
    for a in [(4, 0), (2, 2), (4, 2), (1, 3)]:
        v = x[:, 0] ** a[0] * x[:, 1] ** a[1]
        _within_3sigma(v.mean().item(), v.std().item() / 1000, pf.gaussian_moment(a))


@pytest.mark.slow
def test_lemma3_orthonormal_basis_exact_and_monte_carlo() -> None:
    """Claim 5: the v_ij of eq. (8) are orthonormal; E[x̄x̄ᵀ] = diag(1, 1_d, 2 on squares, 1 on products)."""
    for d in (1, 2, 3, 4):
        assert_close(pf.gram(pf.orthonormal_quadratic_polys(d)), torch.eye(math.comb(d + 2, 2), dtype=F64))
        assert_close(pf.quadratic_stats(d).Lambda, quadratic_lambda(d))
    N = 1_000_000
    x = torch.randn(N, 2, generator=iclab.generator(1), dtype=F64)
    v = pf.evaluate(pf.orthonormal_quadratic_polys(2), x)  # (N, 6)
    prods = v.unsqueeze(-1) * v.unsqueeze(-2)
    err = (prods.mean(0) - torch.eye(6, dtype=F64)).abs()
    assert (err <= 5 * prods.std(0) / math.sqrt(N)).all()


def test_S_is_lambda_C_lambda() -> None:
    """§3.2: for x̄, ξ = Λ w̄ and S = ΛCΛ with C = [[d+1, 1ᵀ, 0], [1, I, 0], [0, 0, I]] over (w̄_00, w̄_jj, rest)."""
    d = 3
    st = pf.quadratic_stats(d)
    q = st.Lambda.shape[0]
    C = torch.eye(q, dtype=F64)
    squares = [d + 1 + m for m, (j, k) in enumerate([(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]) if j == k]
    C[0, 0] = d + 1
    for s in squares:
        C[0, s] = C[s, 0] = 1.0
    assert_close(st.S, st.Lambda @ C @ st.Lambda)
    assert st.floor == 0 and st.zero_loss == 16


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 6])
def test_construction_loss_is_K_over_n(d: int) -> None:
    """Claim 4 (exact): L(Γ = −Λ⁻¹) = K(d)/n = d(d³+18d²+95d+142)/(4n), not the paper's ((d+2)(d+1)+d)/(2n)."""
    st = pf.quadratic_stats(d)
    gamma = -torch.linalg.inv(st.Lambda)
    for n in (1, 7, 200):
        assert pf.one_block_loss(gamma, n, st) == pytest.approx(pf.construction_constant(d) / n, rel=1e-12)
    assert pf.construction_constant(d) > 10 * n * pf.paper_theorem2_loss(d, n)


@pytest.mark.slow
def test_construction_loss_monte_carlo() -> None:
    """Claim 4 (Monte Carlo): the Thm-2 construction's loss at d = 2, n = 50 is 206/50, 30× the paper's 7/50."""
    d, n = 2, 50
    model = constructions.kernel_gd_block(d)
    mean, se = mc_loss(model, tasks.quadratic(d), n, 100_000, generator=iclab.generator(2), chunks=5)
    _within_3sigma(mean, se, pf.construction_constant(d) / n)
    assert mean - 3 * se > 10 * pf.paper_theorem2_loss(d, n)


@pytest.mark.slow
def test_construction_loss_monte_carlo_d4() -> None:
    """At the paper's d = 4: the Thm-2 construction's loss at n = 100 is K(4)/n = 874/100 within 3σ
    (1e5 float64 prompts), 51× the paper's ((d+2)(d+1)+d)/(2n) = 17/100."""
    d, n = 4, 100
    assert pf.construction_constant(d) == 874
    model = constructions.kernel_gd_block(d)
    mean, se = mc_loss(model, tasks.quadratic(d), n, 100_000, generator=iclab.generator(8), chunks=10)
    assert se < 0.03 * mean  # 1e5 prompts: about 1.3 % standard error
    _within_3sigma(mean, se, pf.construction_constant(d) / n)
    assert mean - 3 * se > 10 * pf.paper_theorem2_loss(d, n)


def test_one_block_loss_monte_carlo_random_gamma() -> None:
    """Claim 6: Lemma 8's three-term formula for a random non-symmetric Γ and finite n."""
    d, n = 2, 10
    st = pf.quadratic_stats(d)
    gamma = -torch.linalg.inv(st.Lambda) + 0.1 * torch.randn(6, 6, generator=iclab.generator(3), dtype=F64)
    mean, se = mc_loss(algorithms.KernelGD(-gamma.T), tasks.quadratic(d), n, 200_000, generator=iclab.generator(4), chunks=4)  # fmt: skip
    _within_3sigma(mean, se, pf.one_block_loss(gamma, n, st))


def test_optimal_gamma_is_optimal_and_matches_references() -> None:
    """Γ* = −(S + Φ̄/n)⁻¹SΛ⁻¹: stationary, below every perturbation, 1.877 / 3.407 at n = 200."""
    assert pf.optimal_loss(200, pf.quadratic_stats(3)) == pytest.approx(1.877, abs=5e-4)
    assert pf.optimal_loss(200, pf.quadratic_stats(4)) == pytest.approx(3.407, abs=5e-4)
    st = pf.quadratic_stats(2)
    g = pf.optimal_gamma(30, st)
    best = pf.one_block_loss(g, 30, st)
    for seed in range(5):
        e = torch.randn(6, 6, generator=iclab.generator(seed), dtype=F64)
        up1, up2 = (pf.one_block_loss(g + t * e, 30, st) - best for t in (1e-2, 2e-2))
        assert up1 > 0 and up2 / up1 == pytest.approx(4.0, rel=1e-6)  # zero gradient: purely quadratic growth
    assert best < pf.one_block_loss(-torch.linalg.inv(st.Lambda), 30, st)


@pytest.mark.slow
def test_optimal_gamma_monte_carlo() -> None:
    d, n = 2, 20
    st = pf.quadratic_stats(d)
    g = pf.optimal_gamma(n, st)
    mean, se = mc_loss(constructions.kernel_gd_block(d, g), tasks.quadratic(d), n, 100_000, generator=iclab.generator(5), chunks=2)  # fmt: skip
    _within_3sigma(mean, se, pf.one_block_loss(g, n, st))


def test_affine_floor_and_best_linear_block() -> None:
    """Prop. 1: the best affine predictor leaves d(d+3)/2; the best (5)-sparse LSA at n = 200."""
    for d in range(1, 6):
        st = pf.feature_statistics(pf.linear_feature_polys(d), d)
        assert st.floor == pytest.approx(pf.affine_floor(d), rel=1e-12)
    ref = {3: (10.419, 9.861, 9.484, 9.258, 9.108), 4: (16.162, 15.357, 14.783, 14.425, 14.179)}
    for d, values in ref.items():
        st = pf.feature_statistics(pf.linear_feature_polys(d), d)
        got = [pf.optimal_loss(n, st) for n in (50, 100, 200, 400, 1000)]
        assert got == pytest.approx(values, abs=6e-4)
    assert pf.feature_statistics(pf.linear_feature_polys(4), 4, "sparse_cubic").floor == pytest.approx(5.0)
    assert pf.feature_statistics(pf.quadratic_feature_polys(4), 4, "sparse_cubic").floor == pytest.approx(2.0)


@pytest.mark.slow
def test_affine_block_monte_carlo_includes_the_floor() -> None:
    """Lemma 8 is exact for any features: linear features (1, x), d = 3, n = 40, Γ = −I."""
    d, n = 3, 40
    st = pf.feature_statistics(pf.linear_feature_polys(d), d)
    gamma = -torch.eye(d + 1, dtype=F64)
    mean, se = mc_loss(algorithms.KernelGD(-gamma.T, kind="linear"), tasks.quadratic(d), n, 100_000, generator=iclab.generator(6), chunks=2)  # fmt: skip
    _within_3sigma(mean, se, pf.one_block_loss(gamma, n, st))


def test_prop4_corrected_bound() -> None:
    """Claim 18 setting: Σ has eigenvalues λ± = ((d+3) ± √(d²+6d+1))/2, 2 (d−1 times), 1; the bound is a Ky-Fan sum."""
    for d in (1, 2, 3, 4, 5):
        ev = torch.linalg.eigvalsh(pf.coefficient_covariance(d))
        lo, hi = ((d + 3) - math.sqrt(d * d + 6 * d + 1)) / 2, ((d + 3) + math.sqrt(d * d + 6 * d + 1)) / 2
        want = sorted([lo, hi] + [2.0] * (d - 1) + [1.0] * (d + d * (d - 1) // 2))
        assert_close(ev, torch.tensor(want, dtype=F64))
    assert pf.prop4_bound(4, 12) == pytest.approx(2.298, abs=5e-4)
    assert pf.paper_prop4_bound(4, 12) == 3
    assert pf.prop4_bound(1, 2) == pytest.approx(2 - math.sqrt(2))


class _Prop4Learner:
    """ŷ = φ_qᵀ diag(½, 1) (1/n) Σ φ_i y_i with φ = (1 + (x² − 1)/√2, x): the Prop-4 counterexample's block."""

    def predict(self, ep: iclab.Episode) -> torch.Tensor:
        def phi(x: torch.Tensor) -> torch.Tensor:
            return torch.stack([1 + (x[..., 0] ** 2 - 1) / math.sqrt(2), x[..., 0]], -1)

        h = torch.einsum("bnp,bn->bp", phi(ep.x), ep.y) / ep.n * torch.tensor([0.5, 1.0], dtype=ep.dtype)
        return torch.einsum("bp,bp->b", phi(ep.x_query), h)


@pytest.mark.slow
def test_prop4_counterexample_beats_the_printed_bound() -> None:
    """Claim 18: d = 1, d̃ = 2 features (1 + (x²−1)/√2, x) reach < 1 (→ 2 − √2), against the printed bound 1."""
    feats = [{(0,): 1 - 1 / math.sqrt(2), (2,): 1 / math.sqrt(2)}, {(1,): 1.0}]
    st = pf.feature_statistics(feats, 1)
    gamma = -torch.diag(torch.tensor([0.5, 1.0], dtype=F64))
    assert_close(torch.linalg.inv(st.Lambda), -gamma)
    assert st.floor == pytest.approx(2 - math.sqrt(2), rel=1e-12)
    n = 200
    exact = pf.one_block_loss(gamma, n, st)
    # the construction equals this learner exactly (test_constructions_bilinear); it is 20x faster to evaluate
    mean, se = mc_loss(_Prop4Learner(), tasks.quadratic(1), n, 100_000, generator=iclab.generator(7), chunks=2)
    _within_3sigma(mean, se, exact)
    assert mean + 3 * se < pf.paper_prop4_bound(1, 2)
    assert pf.one_block_loss(gamma, 10**6, st) == pytest.approx(2 - math.sqrt(2), abs=1e-4)


def test_theorem5_bound_fails_at_moderate_n_and_corrected_bound_holds() -> None:
    """Thm 5: ‖Γ* + Λ⁻¹‖_F (exact) vs the printed bound and n‖Γ* + Λ⁻¹‖_F bounded."""
    table = {(3, 50): 1.268, (3, 100): 0.851, (3, 200): 0.518, (4, 50): 1.787, (4, 200): 0.776, (4, 10_000): 0.0211}
    for (d, n), ref in table.items():
        st = pf.quadratic_stats(d)
        dist = float(torch.linalg.matrix_norm(pf.optimal_gamma(n, st) + torch.linalg.inv(st.Lambda)))
        assert dist == pytest.approx(ref, abs=6e-4)  # the table is rounded (1.2675 -> 1.268)
        assert dist <= pf.corrected_theorem5_bound(d, n)
        if d == 4 and n <= 200:
            assert dist > pf.paper_theorem5_bound(d, n)
    st = pf.quadratic_stats(3)
    scaled = [n * float(torch.linalg.matrix_norm(pf.optimal_gamma(n, st) + torch.linalg.inv(st.Lambda))) for n in (10**3, 10**4, 10**5)]  # fmt: skip
    assert scaled[2] == pytest.approx(scaled[1], rel=0.02) and max(scaled) < 200


def test_bad_input() -> None:
    st = pf.quadratic_stats(2)
    with pytest.raises(iclab.ConfigError, match=r"one_block_loss.n must be an int >= 1; got 0"):
        pf.one_block_loss(-torch.eye(6, dtype=F64), 0, st)
    with pytest.raises(iclab.ConfigError, match=r"gamma must be a \(6, 6\) matrix"):
        pf.one_block_loss(-torch.eye(5, dtype=F64), 3, st)
    with pytest.raises(iclab.ConfigError, match=r"prop4_bound.d_tilde must be an int in \[0, 15\]"):
        pf.prop4_bound(4, 16)
    with pytest.raises(iclab.ConfigError, match=r"affine_floor.d must be an int >= 1"):
        pf.affine_floor(0)
