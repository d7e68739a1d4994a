"""Constructions of Sun, Jadbabaie, Azizan 2025: Thm 2 (kernel GD), Thm 6/9 (BCD), the Prop-4 counterexample.

Each theorem is a float64 equality between a constructed bilinear transformer and an algorithm (1e-10).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F64, assert_close
from iclab import ConfigError, algorithms, constructions, tasks
from iclab.constructions.bilinear import bcd_block_gram, quadratic_lambda
from iclab.tasks.polynomial import block_features, quadratic_features, smat


def _ep(d: int, B: int = 6, n: int = 11, seed: int = 0) -> iclab.Episode:
    return tasks.quadratic(d).sample(B, n, generator=iclab.generator(seed), dtype=F64)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_thm2_ffn_writes_every_quadratic_monomial(d: int) -> None:
    """Claim 1: the App.-C FFN output is x̄ of eq. (7) in its rows 1..C(d+2,2); the label is untouched."""
    q = math.comb(d + 2, 2)
    model = constructions.kernel_gd_block(d, d_bar=q + 2)
    ep = _ep(d)
    _, states = model.trace(ep)
    after_ffn = states[1]  # (B, n+1, d̄+1)
    xs = torch.cat([ep.x, ep.x_query.unsqueeze(1)], 1)
    assert_close(after_ffn[..., :q], quadratic_features(xs), rtol=1e-12, atol=1e-12)
    assert torch.equal(after_ffn[..., q : q + 2], torch.zeros_like(after_ffn[..., q : q + 2]))
    assert torch.equal(after_ffn[..., -1], states[0][..., -1])


@settings(max_examples=12, deadline=None)
@given(d=st.integers(1, 4), extra=st.integers(0, 3), n=st.integers(1, 30), seed=st.integers(0, 10_000))
def test_thm2_block_is_one_kernel_gd_step(d: int, extra: int, n: int, seed: int) -> None:
    """Claim 2: BTFB(Γ) = KernelGD(A = −Γᵀ) for any (non-symmetric) Γ and any d̄ >= C(d+2, 2)."""
    q = math.comb(d + 2, 2)
    gamma = _randn(q, q, seed=seed)
    ep = _ep(d, n=n, seed=seed + 1)
    model = constructions.kernel_gd_block(d, gamma, d_bar=q + extra)
    with torch.no_grad():
        assert_close(model.predict(ep), algorithms.KernelGD(-gamma.T).predict(ep))


def test_thm2_block_is_a_gd_step_in_the_svec_parametrisation() -> None:
    """Claim 2 (second form): ŷ = f(x_q; w⁺) with w⁺ the kernel-GD step written as quadratic coefficients."""
    d, ep = 3, _ep(3)
    lam = quadratic_lambda(d)
    model = constructions.kernel_gd_block(d)  # Γ = −Λ⁻¹
    phi = quadratic_features(ep.x)
    v = torch.einsum("bnp,bn->bp", phi, ep.y) / ep.n @ torch.linalg.inv(lam)  # coefficients on x̄
    # x̄ coefficients -> raw monomial coefficients: x_j² − 1 moves −v_jj into the constant.
    w = v.clone()
    for m, (j, k) in enumerate([(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]):
        if j == k:
            w[:, 0] -= v[:, d + 1 + m]
    xb = torch.cat([torch.ones(ep.batch_size, 1, dtype=F64), ep.x_query], -1)
    f = torch.einsum("bi,bij,bj->b", xb, smat(w, d), xb)
    with torch.no_grad():
        assert_close(model.predict(ep), f)


@settings(max_examples=10, deadline=None)
@given(d=st.integers(1, 4), L=st.integers(1, 7), n=st.integers(1, 25), seed=st.integers(0, 10_000))
def test_thm9_construction_is_block_coordinate_descent(d: int, L: int, n: int, seed: int) -> None:
    """Claim 14: every read-out Z^{(2ℓ)}[-1, -1] equals the ℓ-th BCD iterate, for random Γ^{(ℓ)}."""
    gammas = 0.3 * _randn(L, 2 * d + 1, 2 * d + 1, seed=seed)
    ep = _ep(d, n=n, seed=seed + 1)
    model = constructions.bcd(d, gammas)
    assert model.config.d_bar == 2 * d + 1
    with torch.no_grad():
        got = model.block_predictions(ep)
    want = algorithms.BlockCoordinateDescent(-gammas.transpose(-1, -2)).iterates(ep)
    assert_close(got, want, rtol=1e-10, atol=1e-10 * float(want.abs().max()))


def test_thm9_scratch_rows_hold_the_block_features() -> None:
    d, L = 3, 5
    model = constructions.bcd(d, 0.1 * _randn(L, 7, 7, seed=0))
    ep = _ep(d)
    _, states = model.trace(ep)
    xs = torch.cat([ep.x, ep.x_query.unsqueeze(1)], 1)
    for ell in range(1, L + 1):
        assert_close(states[2 * ell - 1][..., : 2 * d + 1], block_features(xs, ell), rtol=1e-12, atol=1e-12)


def test_bcd_with_exact_block_solves_reduces_the_loss() -> None:
    """Γ^{(ℓ)} = −Gram⁻¹: the training residual is non-increasing for exact (sample) block solves."""
    d, n = 2, 60
    ep = _ep(d, B=40, n=n)
    xs = ep.x
    res = []
    f = torch.zeros(40, n, dtype=F64)
    for ell in range(1, 9):
        phi = block_features(xs, ell)
        gram = phi.transpose(1, 2) @ phi / n
        v = torch.linalg.solve(gram, torch.einsum("bnp,bn->bp", phi, ep.y - f) / n)
        f = f + torch.einsum("bnp,bp->bn", phi, v)
        res.append(((ep.y - f) ** 2).mean().item())
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(res))
    assert res[-1] < 1e-3 * res[0]


def test_block_gram_is_the_population_gram() -> None:
    d = 3
    x = torch.randn(400_000, d, generator=iclab.generator(0), dtype=F64)
    for ell in (1, 2):
        phi = block_features(x, ell)
        emp = phi.T @ phi / x.shape[0]
        assert (emp - bcd_block_gram(d, ell)).abs().max() < 0.06  # E x⁴ = 3 has std ~ √96/√N ≈ 0.016


def test_prop4_counterexample_features() -> None:
    model = constructions.prop4_counterexample()
    ep = tasks.quadratic(1).sample(4, 6, generator=iclab.generator(0), dtype=F64)
    _, states = model.trace(ep)
    x = torch.cat([ep.x, ep.x_query.unsqueeze(1)], 1)[..., 0]
    assert_close(states[1][..., 0], 1 + (x**2 - 1) / math.sqrt(2))
    assert_close(states[1][..., 1], x)
    phi = torch.stack([1 + (ep.x[..., 0] ** 2 - 1) / math.sqrt(2), ep.x[..., 0]], -1)
    phq = torch.stack([1 + (ep.x_query[:, 0] ** 2 - 1) / math.sqrt(2), ep.x_query[:, 0]], -1)
    want = torch.einsum(
        "bp,bp->b", phq, torch.einsum("bnp,bn->bp", phi, ep.y) / 6 * torch.tensor([0.5, 1.0], dtype=F64)
    )
    with torch.no_grad():
        assert_close(model.predict(ep), want)


def test_bad_input_names_the_minimum() -> None:
    with pytest.raises(ConfigError, match=r"d_bar must be an int >= C\(d\+2, 2\) = 15 for d = 4.*got 12"):
        constructions.kernel_gd_block(4, d_bar=12)
    with pytest.raises(ConfigError, match=r"kernel_gd_block.d must be an int >= 1; got 0"):
        constructions.kernel_gd_block(0)
    with pytest.raises(ConfigError, match=r"gamma must be a matrix over the C\(d\+2, 2\) features.*\(10, 10\)"):
        constructions.kernel_gd_block(3, torch.zeros(6, 6, dtype=F64))
    with pytest.raises(ConfigError, match=r"\(L, 2d\+1, 2d\+1\) stack, per-block \(7, 7\)"):
        constructions.bcd(3, torch.zeros(2, 9, 9, dtype=F64))
    with pytest.raises(ConfigError, match=r"KernelGD.preconditioner must be \(10, 10\) for d = 3"):
        algorithms.KernelGD(torch.eye(6, dtype=F64)).predict(_ep(3))


def test_reference_gammas_shape_and_dtype() -> None:
    g = constructions.bcd_reference_gammas(3, 4)
    assert g.shape == (4, 7, 7) and g.dtype == F64
    assert_close(g[0] @ bcd_block_gram(3, 1), -torch.eye(7, dtype=F64))
    ep = _ep(3)
    ep32 = dataclasses.replace(ep).to(dtype=torch.float32)
    assert constructions.bcd(3, g.float()).predict(ep32).dtype == torch.float32
