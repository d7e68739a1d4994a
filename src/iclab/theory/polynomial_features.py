"""Closed forms for one bilinear-transformer block on Gaussian polynomial regression.

Sun, Jadbabaie, Azizan 2025, Lemma 3, Lemma 8, Thm 2, Prop. 1, Prop. 4, Thm 5, with the corrections
of docs/errata.md. Everything is exact: polynomials are dicts {exponents: coefficient}
and every expectation is a Gaussian moment, E Π_j x_j^{a_j} = Π_j (a_j − 1)!! for even a_j, else 0
(Isserlis / Wick). float64 tensors on CPU.

One block = features φ(x) written by the FFN, then a (5)-sparse LSA (P = e_D e_Dᵀ, Q = [[Γ, 0], [0, 0]]),
whose read-out is v̂ = φ_qᵀ Γᵀ h, h = (1/n) Σ_i φ_i y_i, trained towards −y_q (eq. 4). For
y = Σ_m w_m x^{a_m}, w ~ N(0, I):

    Λ = E[φφᵀ],  R = E[φ x^{a}ᵀ] (p × M),  ξ = R w,  S = E_w ξξᵀ = R Rᵀ,
    M4 = E[(E_w y² | x) φφᵀ] = E[(Σ_m x^{2a_m}) φφᵀ],  Φ̄ = M4 − S,
    floor = E_w min_β E_x (y + βᵀφ)² = tr G − tr(Rᵀ Λ⁺ R),   G = E[x^a x^aᵀ]
    L(Γ, n) = floor + (1/n) tr(Γ Λ Γᵀ Φ̄) + tr((Γᵀ + Λ⁻¹)ᵀ Λ (Γᵀ + Λ⁻¹) S)       (Lemma 8, averaged over w)
    Γ* = −(S + Φ̄/n)⁻¹ S Λ⁻¹                                                            [derived]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from iclab.core.errors import is_int, require, require_int
from iclab.tasks.polynomial import monomial_set

Poly = dict[tuple[int, ...], float]
F64 = torch.float64


def gaussian_moment(a: Sequence[int]) -> float:
    """E Π_j x_j^{a_j} for x ~ N(0, I): Π_j (a_j − 1)!! when every a_j is even, else 0 (Isserlis)."""
    out = 1
    for p in a:
        if p % 2:
            return 0.0
        out *= math.prod(range(p - 1, 0, -2))
    return float(out)


def poly_mul(p: Poly, q: Poly) -> Poly:
    out: Poly = {}
    for a, c in p.items():
        for b, e in q.items():
            k = tuple(i + j for i, j in zip(a, b, strict=True))
            out[k] = out.get(k, 0.0) + c * e
    return out


def expect(p: Poly) -> float:
    """E[p(x)], x ~ N(0, I_d)."""
    return sum(c * gaussian_moment(a) for a, c in p.items())


def _unit(d: int, *idx: int) -> tuple[int, ...]:
    a = [0] * d
    for i in idx:
        a[i] += 1
    return tuple(a)


# --- feature maps as polynomials -------------------------------------------------------------


def quadratic_feature_polys(d: int) -> list[Poly]:
    """x̄ of eq. (7): 1, x_1..x_d, then x_j² − 1 (j = k) and x_j x_k (j < k) in pair order."""
    out: list[Poly] = [{_unit(d): 1.0}] + [{_unit(d, j): 1.0} for j in range(d)]
    for j, k in itertools.combinations_with_replacement(range(d), 2):
        out.append({_unit(d, j, k): 1.0, _unit(d): -1.0} if j == k else {_unit(d, j, k): 1.0})
    return out


def orthonormal_quadratic_polys(d: int) -> list[Poly]:
    """Lemma 3 (eq. 8): v_00 = 1, v_0j = x_j, v_jj = (x_j² − 1)/√2, v_jk = x_j x_k; orthonormal in L²(N(0, I))."""
    s = 1 / math.sqrt(2)
    out = linear_feature_polys(d)
    for j, k in itertools.combinations_with_replacement(range(d), 2):
        out.append({_unit(d, j, k): s, _unit(d): -s} if j == k else {_unit(d, j, k): 1.0})
    return out


def linear_feature_polys(d: int) -> list[Poly]:
    """(1, x): what a linear transformer's query token carries (Prop. 1)."""
    return [{_unit(d): 1.0}] + [{_unit(d, j): 1.0} for j in range(d)]


def block_feature_polys(d: int, ell: int) -> list[Poly]:
    """(1, x, x[ℓ%d]·x) of Thm 6 / eq. (10), ℓ >= 1."""
    j = (ell - 1) % d
    return linear_feature_polys(d) + [{_unit(d, j, k): 1.0} for k in range(d)]


def monomial_polys(exponents: Tensor) -> list[Poly]:
    return [{tuple(int(v) for v in row): 1.0} for row in exponents]


def evaluate(polys: list[Poly], x: Tensor) -> Tensor:
    """(..., d) -> (..., p): the feature map given as polynomials, evaluated (for Monte Carlo checks)."""
    cols = []
    for p in polys:
        v = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for a, c in p.items():
            v = v + c * torch.prod(x ** torch.tensor(a, device=x.device), dim=-1)
        cols.append(v)
    return torch.stack(cols, dim=-1)


def gram(polys: list[Poly], others: list[Poly] | None = None, weight: Poly | None = None) -> Tensor:
    """E[w(x) φ(x) ψ(x)ᵀ] (p × q) exactly; ψ = φ and w = 1 by default."""
    others = polys if others is None else others
    out = torch.zeros(len(polys), len(others), dtype=F64)
    for i, p in enumerate(polys):
        pw = poly_mul(p, weight) if weight is not None else p
        for j, q in enumerate(others):
            out[i, j] = expect(poly_mul(pw, q))
    return out


# --- the statistics of Lemma 8 --------------------------------------------------------------


@dataclass(frozen=True)
class FeatureStats:
    """Λ, R, G, M4, S, Φ̄ and the floor for features φ on the task with monomials ``exponents``."""

    Lambda: Tensor  # (p, p) E[φφᵀ]
    R: Tensor  # (p, M) E[φ x^aᵀ]; ξ = R w
    G: Tensor  # (M, M) E[x^a x^aᵀ]
    M4: Tensor  # (p, p) E[(Σ_m x^{2a_m}) φφᵀ]
    S: Tensor  # (p, p) E_w ξξᵀ = R Rᵀ
    Phi_bar: Tensor  # (p, p) E_w Cov_x(φ y | w) = M4 − S
    floor: float  # E_w min_β E_x (y + βᵀφ)²

    @property
    def zero_loss(self) -> float:
        """E[y²] = tr G: the loss of predicting 0 (16 / 23 for quadratics in d = 3 / 4)."""
        return float(torch.trace(self.G))


def feature_statistics(features: list[Poly], d: int, monomials: str | int | Tensor = "quadratic") -> FeatureStats:
    """Exact Gaussian moments of §3.8 for features φ (as polynomials in d variables) and the task's monomials."""
    a = monomial_set(d, monomials)
    mons = monomial_polys(a)
    lam = gram(features)
    R = gram(features, mons)
    G = gram(mons)
    y2: Poly = {}
    for row in a.tolist():
        k = tuple(2 * v for v in row)
        y2[k] = y2.get(k, 0.0) + 1.0
    M4 = gram(features, weight=y2)
    S = R @ R.T
    floor = float(torch.trace(G) - torch.trace(R.T @ torch.linalg.pinv(lam) @ R))
    return FeatureStats(Lambda=lam, R=R, G=G, M4=M4, S=S, Phi_bar=M4 - S, floor=max(floor, 0.0))


def quadratic_stats(d: int) -> FeatureStats:
    """Statistics of x̄ (eq. 7) on random quadratics: floor 0, Λ = diag(1, 1, 2, 1) (Lemma 3)."""
    return feature_statistics(quadratic_feature_polys(d), d, "quadratic")


def one_block_loss(gamma: Tensor, n: int, stats: FeatureStats) -> float:
    """Exact E(v̂ + y_q)² of one (5)-sparse block with preconditioner Γ on n context pairs (Lemma 8)."""
    require_int("one_block_loss", "n", n, 1)
    g = torch.as_tensor(gamma, dtype=F64)
    lam, S, Phi = stats.Lambda, stats.S, stats.Phi_bar
    require("one_block_loss", "gamma", tuple(g.shape) == tuple(lam.shape), f"a {tuple(lam.shape)} matrix", tuple(g.shape))  # fmt: skip
    E = g.T + torch.linalg.inv(lam)
    return float(stats.floor + torch.trace(g @ lam @ g.T @ Phi) / n + torch.trace(E.T @ lam @ E @ S))


def optimal_gamma(n: int, stats: FeatureStats) -> Tensor:
    """Γ* = −(S + Φ̄/n)⁻¹ S Λ⁻¹: the exact minimiser of :func:`one_block_loss` (Thm 5 made explicit)."""
    require_int("optimal_gamma", "n", n, 1)
    return -torch.linalg.solve(stats.S + stats.Phi_bar / n, stats.S @ torch.linalg.inv(stats.Lambda))


def optimal_loss(n: int, stats: FeatureStats) -> float:
    return one_block_loss(optimal_gamma(n, stats), n, stats)


# --- the numbers the paper states, and their corrections -------------------------------------


def affine_floor(d: int) -> float:
    """Prop. 1 for random quadratics: the best affine predictor leaves d(d+3)/2 (9, 14 for d = 3, 4)."""
    require_int("affine_floor", "d", d, 1)
    return d * (d + 3) / 2


def construction_constant(d: int) -> float:
    """K(d) = d(d³ + 18d² + 95d + 142)/4: the Thm-2 construction (Γ = −Λ⁻¹) has loss exactly K(d)/n [derived]."""
    require_int("construction_constant", "d", d, 1)
    return d * (d**3 + 18 * d**2 + 95 * d + 142) / 4


def paper_theorem2_loss(d: int, n: int) -> float:
    """What Thm 2 prints, ((d+2)(d+1) + d)/(2n); wrong (it drops the y²-weighted fourth moments)."""
    return ((d + 2) * (d + 1) + d) / (2 * n)


def coefficient_covariance(d: int) -> Tensor:
    """Σ = Cov of y's coefficients in the orthonormal basis (8): (w̄_00, w_0j, √2 w_jj, w_jk) (App. E, corrected)."""
    T = gram(orthonormal_quadratic_polys(d), monomial_polys(monomial_set(d, "quadratic")))  # c = T w
    return T @ T.T


def prop4_bound(d: int, d_tilde: int) -> float:
    """Corrected Prop. 4: one block whose features span d̃ < C(d+2,2) dimensions of span(8) has loss >=
    the sum of the C(d+2,2) − d̃ smallest eigenvalues of Σ (Ky Fan); 2.298 for d = 4, d̃ = 12."""
    q = math.comb(d + 2, 2)
    require("prop4_bound", "d_tilde", is_int(d_tilde, 0) and d_tilde <= q, f"an int in [0, {q}]", d_tilde)
    ev = torch.linalg.eigvalsh(coefficient_covariance(d))
    return float(ev[: q - d_tilde].sum())


def paper_prop4_bound(d: int, d_tilde: int) -> float:
    """Prop. 4 / Remark 1 as printed: C(d+2, 2) − d̃ (uses λ_min(Σ) = 1; the true λ_min is < 1)."""
    return float(math.comb(d + 2, 2) - d_tilde)


def _lambda_min_c(d: int) -> float:
    return (d + 2 - math.sqrt(d * d + 4 * d)) / 2


def paper_theorem5_bound(d: int, n: int) -> float:
    """‖Γ* + Λ⁻¹‖_F <= n^{-1/2} √(((d+2)(d+1)+d)/(d+2−√(d²+4d))) as printed (violated at moderate n)."""
    return math.sqrt(2 * paper_theorem2_loss(d, n) / (2 * _lambda_min_c(d)))


def corrected_theorem5_bound(d: int, n: int) -> float:
    """The Thm-5 argument with the correct Thm-2 value K(d)/n: √(2K(d)/((d+2−√(d²+4d)) n))."""
    return math.sqrt(construction_constant(d) / n / _lambda_min_c(d))
