"""Exact real-Wishart moments (Wick pairings) and the exact Thm-3 S-optimum they give."""

from __future__ import annotations

import pytest
import torch

from iclab import ConfigError
from iclab.core.seeding import generator
from iclab.theory import preconditioned_gd as th
from iclab.theory.wishart import KMAX, WISHART_PAIRINGS, wishart_moments_exact


def test_pairing_counts_are_double_factorials() -> None:
    for k in range(1, KMAX + 1):
        total = sum(WISHART_PAIRINGS[k].values())
        dfact = 1
        for m in range(2 * k - 1, 0, -2):
            dfact *= m
        assert total == dfact  # every one of the (2k−1)!! pairings is counted once


@pytest.mark.parametrize(("d", "n"), [(5, 20), (3, 7), (1, 1), (8, 4)])
def test_low_moments_closed_form(d: int, n: int) -> None:
    m = wishart_moments_exact(d, n, 3)
    assert m[0] == d and m[1] == pytest.approx(d, abs=1e-12)
    assert m[2] == pytest.approx(d * (n + d + 1) / n, rel=1e-14)
    # E tr W³ = d(n² + d² + 3nd + 3n + 3d + 4)/n² (real Wishart)
    assert m[3] == pytest.approx(d * (n**2 + d**2 + 3 * n * d + 3 * n + 3 * d + 4) / n**2, rel=1e-14)


def test_d1_is_chi_square_moments() -> None:
    # d = 1: W = χ²_n / n, E W^k = n(n+2)…(n+2k−2) / n^k
    n = 6
    m = wishart_moments_exact(1, n, KMAX)
    for k in range(1, KMAX + 1):
        prod = 1.0
        for j in range(k):
            prod *= n + 2 * j
        assert m[k] == pytest.approx(prod / n**k, rel=1e-13)


def test_matches_monte_carlo() -> None:
    mc = th.wishart_trace_moments(5, 20, 6, 200_000, generator=generator(0))
    exact = wishart_moments_exact(5, 20, 6)
    # relative MC error grows with k (heavy tails); 1% is > 5 standard errors at 2e5 draws for k ≤ 6
    assert torch.allclose(mc, exact, rtol=1e-2)


def test_exact_theorem3_optimum() -> None:
    a1, f1 = th.theorem3_optimum(5, 20, 1, generator=generator(0))
    assert f1 == pytest.approx(5 * 6 / 26, rel=1e-10) and a1.item() == pytest.approx(20 / 26, rel=1e-8)
    _, f2 = th.theorem3_optimum(5, 20, 2, generator=generator(0))
    a3, f3 = th.theorem3_optimum(5, 20, 3, generator=generator(0))
    _, f4 = th.theorem3_optimum(5, 20, 4, generator=generator(0))
    assert (round(f2, 5), round(f3, 5), round(f4, 5)) == (0.36124, 0.13361, 0.05495)
    # deterministic: no sampling for L <= 4
    b3, g3 = th.theorem3_optimum(5, 20, 3, generator=generator(1))
    assert torch.allclose(a3, b3, rtol=1e-6) and g3 == pytest.approx(f3, rel=1e-10)


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="wishart_moments_exact.kmax must be an int in"):
        wishart_moments_exact(5, 20, KMAX + 1)
    with pytest.raises(ConfigError, match="wishart_moments_exact.n must be an int >= 1; got 0"):
        wishart_moments_exact(5, 0, 2)
