"""Population statistics and losses of multi-head linear attention on in-context linear regression.

Zhang, Singh, Latham, Saxe 2025 ("Training dynamics of in-context learning in linear attention").
Data: x ~ N(0, Λ) in R^D, w ~ N(0, I_D), y = wᵀx, N context pairs, no label noise. After the
zero-block reduction every model of the paper predicts ŷ_q = βᵀ W x_q with β = (1/N) Σ_n y_n x_n
(eq. 4) and an effective D×D matrix W (W = Σ_i v_i U_i for ATTN_M, Σ_i Σ_r v_i k_ir q_irᵀ for ATTN_S).

``inv_n`` is the statistic 1/N that enters the theory: 1/N for a fixed context length, E(1/N) when the
length varies (next-token loss, eq. 23, 26; see :func:`expected_inv_n`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from iclab.core.errors import is_int, require, require_int


def _check_lambda(Lambda: Tensor) -> None:
    require(
        "attention_dynamics",
        "Lambda",
        Lambda.ndim == 2 and Lambda.shape[0] == Lambda.shape[1] and bool(torch.allclose(Lambda, Lambda.mT)),
        "a symmetric (D, D) covariance",
        tuple(Lambda.shape),
    )


def _check_inv_n(inv_n: float) -> None:
    require("attention_dynamics", "inv_n", 0.0 <= float(inv_n) <= 1.0, "1/N or E(1/N), in [0, 1]", inv_n)


def expected_inv_n(n_max: int) -> float:
    """E(1/N) for N ~ Uniform{1..n_max}: H_{n_max}/n_max (the next-token loss, eq. 23, 26).

    n_max = 31 gives 0.129911.
    """
    require_int("expected_inv_n", "n_max", n_max, 1)
    return sum(1.0 / k for k in range(1, n_max + 1)) / n_max


def second_moment_hat(Lambda: Tensor, inv_n: float) -> Tensor:
    """E(Λ̂²) = Λ² + E(1/N)(Λ + tr(Λ) I)Λ, eq. (30); with a fixed N, eq. (31) = (15).

    Λ̂ = (1/N) Σ_n x_n x_nᵀ is the in-context covariance (eq. 27); uses E[x xᵀ x xᵀ] = 2Λ² + tr(Λ)Λ.
    """
    _check_lambda(Lambda)
    _check_inv_n(inv_n)
    eye = torch.eye(Lambda.shape[0], dtype=Lambda.dtype, device=Lambda.device)
    return Lambda @ Lambda + inv_n * (Lambda + torch.trace(Lambda) * eye) @ Lambda


def population_loss(W: Tensor, Lambda: Tensor, inv_n: float) -> Tensor:
    """L(W) = E(y_q − βᵀ W x_q)² = tr Λ − 2 tr(Λ² W) + tr(Wᵀ E(Λ̂²) W Λ); (..., D, D) -> (...).

    Exact for Gaussian x, w ~ N(0, I) and no label noise (the loss of eq. 5, no ½; consistent with
    the fixed-point losses of eq. 19 and 63).
    """
    A = second_moment_hat(Lambda, inv_n)
    L2 = Lambda @ Lambda
    lin = torch.einsum("ij,...ji->...", L2, W)
    quad = torch.einsum("...ji,jk,...kl,li->...", W, A, W, Lambda)
    return torch.trace(Lambda) - 2 * lin + quad


def population_gradient(W: Tensor, Lambda: Tensor, inv_n: float) -> Tensor:
    """G(W) = −½ ∂L/∂W = Λ² − E(Λ̂²) W Λ, the "common term" of the gradient flow (eq. 57); (..., D, D)."""
    A = second_moment_hat(Lambda, inv_n)
    return Lambda @ Lambda - A @ W @ Lambda


# --------------------------------------------------------------------------------------------
# Spectrum and data statistics (App. C.1, D.4, D.6; eq. 30-33, 43-45, 53)


def spectrum(Lambda: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues λ_1 ≥ … ≥ λ_D of Λ and eigenvectors as columns e_d of a (D, D) matrix.

    Descending order, as the paper numbers them; each e_d is signed so that its largest-magnitude
    entry is positive (a deterministic choice; the theory is sign-blind).
    """
    _check_lambda(Lambda)
    lam, E = torch.linalg.eigh(Lambda)
    lam, E = lam.flip(0), E.flip(1)
    idx = E.abs().argmax(0)  # (D,)
    sign = torch.sign(E[idx, torch.arange(E.shape[1])])
    return lam, E * sign


def second_moment_eigenvalues(Lambda: Tensor, inv_n: float) -> Tensor:
    """a_d = λ_d² (1 + E(1/N)(1 + tr Λ/λ_d)), the eigenvalues of E(Λ̂²) in λ's order, eq. (32)-(33)."""
    _check_inv_n(inv_n)
    lam, _ = spectrum(Lambda)
    return lam**2 + inv_n * (lam + lam.sum()) * lam


def feature_moments(Lambda: Tensor, inv_n: float) -> tuple[Tensor, Tensor]:
    """E(y_q z) = vec(Λ²) (D²,) and E(z zᵀ) = Λ ⊗ E(Λ̂²) (D², D²) of the cubic feature, eq. (43)-(44).

    z = vec(β x_qᵀ) = x_q ⊗ β (:func:`iclab.models.reduced_attention.cubic_feature`; vec stacks columns).
    """
    L2 = Lambda @ Lambda
    return L2.mT.reshape(-1), torch.kron(Lambda, second_moment_hat(Lambda, inv_n))


def _gaussian_moment(Lambda: Tensor, order: int) -> Tensor:
    """E(x_{i1} ⋯ x_{ik}) for x ~ N(0, Λ), k even: the sum over the pairings of the indices (Isserlis)."""

    def pairings(idx: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        if not idx:
            return [[]]
        first, rest = idx[0], idx[1:]
        return [[(first, j), *p] for j in rest for p in pairings(tuple(i for i in rest if i != j))]

    letters = "abcdefghij"[:order]
    out = torch.zeros((Lambda.shape[0],) * order, dtype=Lambda.dtype, device=Lambda.device)
    for pairing in pairings(tuple(range(order))):
        spec = ",".join(letters[i] + letters[j] for i, j in pairing) + "->" + letters
        out = out + torch.einsum(spec, *([Lambda] * len(pairing)))
    return out


def all_blocks_population_moments(Lambda: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """E(f fᵀ) (D(D+1)², D(D+1)²), E(y_q f) (D(D+1)²,) and E(y_q²) = tr Λ for f = x_q ⊗ vec(s), the feature of
    the full one-layer linear attention with every block free (eq. 91 of App. G in one piece): s = (Σ_n z_n z_nᵀ
    + z_q z_qᵀ)/N over the N context tokens z_n = [x_n; y_n] and the query z_q = [x_q; 0]
    (:func:`iclab.models.reduced_attention.all_blocks_statistic`; f[a·(D+1)² + c·(D+1) + b] = x_q,a s_cb).

    Exact for x ~ N(0, Λ), w ~ N(0, I), no label noise, fixed N: given w the context tokens are N(0, Σ_w) with
    Σ_w = [[Λ, Λw], [wᵀΛ, wᵀΛw]], so Σ_n z_n z_nᵀ is Wishart(N, Σ_w) (E(C_ij C_kl) = N² Σ_ij Σ_kl + N(Σ_ik Σ_jl +
    Σ_il Σ_jk)) and independent of x_q, whose 4th and 6th moments are Isserlis sums; the remaining average over w
    is of a polynomial of degree ≤ 4, which the 3-point Gauss-Hermite rule per coordinate integrates exactly.
    The population loss of W̃ is then E(y_q²) − 2 E(y_q f)ᵀ vec(W̃) + vec(W̃)ᵀ E(f fᵀ) vec(W̃), vec as
    :func:`iclab.models.reduced_attention.cubic_feature`; on the reduced blocks it is :func:`population_loss`.
    """
    _check_lambda(Lambda)
    require_int("all_blocks_population_moments", "n", n, 1)
    L = Lambda
    d, dt = L.shape[0], L.dtype
    D = d + 1
    # the 3-point Gauss-Hermite rule for N(0, 1), as a product rule over the d coordinates of w
    x1 = torch.tensor([-(3.0**0.5), 0.0, 3.0**0.5], dtype=dt, device=L.device)
    w1 = torch.tensor([1 / 6, 2 / 3, 1 / 6], dtype=dt, device=L.device)
    nodes = torch.cartesian_prod(*[x1] * d).reshape(-1, d)  # (3^d, d)
    weights = torch.cartesian_prod(*[w1] * d).reshape(-1, d).prod(-1)  # (3^d,)
    A = torch.eye(D, d, dtype=dt, device=L.device).expand(nodes.shape[0], D, d).clone()
    A[:, d, :] = nodes  # z = A x: A = [I; wᵀ]
    Sig = A @ L @ A.mT  # (J, D, D): Σ_w
    E_S = torch.einsum("j,jcb->cb", weights, Sig)  # E_w Σ_w = diag-block(Λ, tr Λ)
    E_SS = torch.einsum("j,jcb,jef->cbef", weights, Sig, Sig)
    wish = E_SS + (E_SS.permute(0, 2, 1, 3) + E_SS.permute(0, 3, 2, 1)) / n  # E(C C)/N², C = Σ_n z_n z_nᵀ
    pad = (0, 1)
    m4 = torch.nn.functional.pad(_gaussian_moment(L, 4), pad * 2)  # (d, d, D, D): x_q,a x_q,a' z_q,c z_q,b
    m6 = torch.nn.functional.pad(_gaussian_moment(L, 6), pad * 4)
    M = (
        torch.einsum("ae,cbfg->acbefg", L, wish)
        + (torch.einsum("aecb,fg->acbefg", m4, E_S) + torch.einsum("aefg,cb->acbefg", m4, E_S)) / n
        + m6.permute(0, 2, 3, 1, 4, 5) / n**2
    ).reshape(d * D * D, d * D * D)
    c = torch.einsum("j,ja,jcb->acb", weights, nodes @ L, Sig).reshape(-1)  # E_w((Λw)_a Σ_w,cb)
    return M, c, torch.trace(L)


def vec(M: Tensor) -> Tensor:
    """Column-stacking vec of the last two axes: (..., D, D) -> (..., D²)."""
    return M.mT.reshape(*M.shape[:-2], -1)


def frobenius_gamma(Lambda: Tensor) -> float:
    """γ = ‖E(y_q z)‖ = ‖Λ²‖_F, eq. (53): the escape rate of ATTN_M from M_0."""
    _check_lambda(Lambda)
    return float(torch.linalg.matrix_norm(Lambda @ Lambda))


# --------------------------------------------------------------------------------------------
# Fixed points and the algorithms they implement (eq. 9, 11, 18-19, 22, 25-26, 59-63)


def _subset(owner: str, subset: Iterable[int], D: int) -> list[int]:
    s = sorted(int(d) for d in subset)
    require(
        owner,
        "subset",
        len(set(s)) == len(s) and all(0 <= d < D for d in s),
        f"distinct eigen-indices in [0, {D}) (0 = largest λ)",
        s,
    )
    return s


def fixed_point_matrix(Lambda: Tensor, inv_n: float, subset: Iterable[int]) -> Tensor:
    """W(S_m) = Σ_{d∈S_m} (λ_d/a_d) e_d e_dᵀ, the effective matrix on the fixed points M(S_m), eq. (18), (59).

    ``subset`` holds 0-based eigen-indices (0 = the largest eigenvalue). The ATTN_S fixed points are
    the 2^D subsets; ATTN_M has only ∅ (M_0) and the full set (M_*, eq. 9).
    """
    lam, E = spectrum(Lambda)
    s = _subset("fixed_point_matrix", subset, lam.numel())
    c = lam / second_moment_eigenvalues(Lambda, inv_n)  # (D,)
    mask = torch.zeros_like(lam)
    mask[s] = 1.0
    return (E * (mask * c)) @ E.mT


def fixed_point_loss(Lambda: Tensor, inv_n: float, subset: Iterable[int]) -> float:
    """L(M(S_m)) = tr Λ − Σ_{d∈S_m} λ_d³/a_d = tr Λ − Σ_{d∈S_m} λ_d (1 + E(1/N)(1 + tr Λ/λ_d))⁻¹, eq. (63)."""
    lam, _ = spectrum(Lambda)
    s = _subset("fixed_point_loss", subset, lam.numel())
    a = second_moment_eigenvalues(Lambda, inv_n)
    return float(lam.sum() - (lam**3 / a)[s].sum())


def plateau_losses(Lambda: Tensor, inv_n: float) -> Tensor:
    """L(M_m), m = 0..D, the plateau levels of ATTN_S, eq. (19) (fixed N) and (26) (E(1/N)); (D+1,).

    λ = (.4, .3, .2, .1), N = 31 gives 1, 0.64058, 0.37737, 0.20980, 0.13600.
    """
    lam, _ = spectrum(Lambda)
    gain = lam**3 / second_moment_eigenvalues(Lambda, inv_n)  # (D,)
    return lam.sum() - torch.cat([gain.new_zeros(1), gain.cumsum(0)])


def converged_matrix(Lambda: Tensor, inv_n: float) -> Tensor:
    """W* = E(Λ̂²)⁻¹ Λ = (Λ + E(1/N)(Λ + tr Λ I))⁻¹, the algorithm at the global minimum, eq. (11), (25), (46).

    ŷ_q = βᵀ W* x_q; N → ∞ gives βᵀ Λ⁻¹ x_q (least squares with the population covariance).
    """
    _check_lambda(Lambda)
    _check_inv_n(inv_n)
    eye = torch.eye(Lambda.shape[0], dtype=Lambda.dtype, device=Lambda.device)
    return torch.linalg.inv(Lambda + inv_n * (Lambda + torch.trace(Lambda) * eye))


def merged_fixed_point(
    Lambda: Tensor, inv_n: float, n_heads: int, *, direction: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Balanced ATTN_M weights on the global-minimum manifold M_*, eq. (9b): Σ_i v_i U_i = W*.

    Rank-one, as the conservation law (55) makes small-init solutions: v = √s u, U_i = u_i W*/√s with
    s = ‖W*‖_F and a unit ``direction`` u ∈ R^H (default all heads equal), so that w_2 w_2ᵀ = W_1 W_1ᵀ.
    Returns v (H,), U (H, D, D).
    """
    require_int("merged_fixed_point", "n_heads", n_heads, 1)
    W = converged_matrix(Lambda, inv_n)
    u = torch.ones(n_heads, dtype=W.dtype) if direction is None else direction.to(W.dtype)
    require(
        "merged_fixed_point",
        "direction",
        u.shape == (n_heads,) and float(u.norm()) > 0,
        f"a non-zero ({n_heads},) vector",
        tuple(u.shape),
    )
    u = u / u.norm()
    s = torch.linalg.matrix_norm(W).sqrt()
    return s * u, u[:, None, None] * W / s


def separate_fixed_point(
    Lambda: Tensor, inv_n: float, subset: Iterable[int], n_heads: int, rank: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """Balanced ATTN_S weights on M(S_m) (conditions C1-C3, eq. 18, 87), the min-norm ansatz of eq. (20a), (82).

    Eigen-directions of ``subset`` (descending λ) fill heads R at a time; head i carrying directions
    d with c_d = λ_d/a_d gets v_i = (Σ_d c_d)^{1/3} and k_{i,r} = q_{i,r} = (c_d/v_i)^{1/2} e_d, so that
    v_i k_{i,r} q_{i,r}ᵀ = c_d e_d e_dᵀ and Σ_r ‖k_{i,r}‖² = v_i² (balanced, eq. 89). For R = 1 this is
    exactly eq. (82): v_i = (λ_i/a_i)^{1/3}, k_i = q_i = v_i e_i. Unused heads and pairs are zero.
    Returns v (H,), k (H, R, D), q (H, R, D).
    """
    lam, E = spectrum(Lambda)
    D = lam.numel()
    s = _subset("separate_fixed_point", subset, D)
    require("separate_fixed_point", "rank", is_int(rank, 1) and rank <= D, f"an int in [1, {D}]", rank)
    need = -(-len(s) // rank)
    require_int("separate_fixed_point", "n_heads", n_heads, max(need, 1), note="|S_m|/R heads")
    c = lam / second_moment_eigenvalues(Lambda, inv_n)
    v = lam.new_zeros(n_heads)
    k = lam.new_zeros(n_heads, rank, D)
    for i in range(need):
        ds = s[i * rank : (i + 1) * rank]
        v[i] = c[ds].sum() ** (1 / 3)
        for r, d in enumerate(ds):
            k[i, r] = (c[d] / v[i]).sqrt() * E[:, d]
    return v, k, k.clone()


def merged_matrix(v: Tensor, U: Tensor) -> Tensor:
    """W = Σ_i v_i U_i for ATTN_M weights v (..., H), U (..., H, D, D) -> (..., D, D); eq. (M)."""
    return torch.einsum("...h,...hij->...ij", v, U)


def separate_matrix(v: Tensor, k: Tensor, q: Tensor) -> Tensor:
    """W = Σ_i Σ_r v_i k_{i,r} q_{i,r}ᵀ for v (..., H), k, q (..., H, R, D) or (..., H, D) -> (..., D, D); eq. (S)."""
    if k.dim() == v.dim() + 1:  # rank one, (..., H, D)
        k, q = k.unsqueeze(-2), q.unsqueeze(-2)
    return torch.einsum("...h,...hri,...hrj->...ij", v, k, q)


# --------------------------------------------------------------------------------------------
# ATTN_M: white-covariance time course and plateau length (App. D.5-D.6, eq. 10, 47-54)


def logistic_s(t: Tensor | float, gamma: float, alpha: float, s0: float) -> Tensor:
    """s(t) solving τ ds/dt = 2s(γ − α s), s(0) = s0, eq. (48)-(49); t in units of τ.

    Written as γ / (α(1 − e^{−2γt}) + (γ/s0) e^{−2γt}) so that large t does not overflow.
    """
    require("logistic_s", "s0", s0 > 0, "a float > 0", s0)
    t = torch.as_tensor(t, dtype=torch.float64)
    e = torch.exp(-2 * gamma * t)
    return gamma / (alpha * (1 - e) + (gamma / s0) * e)


def white_time_course(t: Tensor | float, D: int, inv_n: float, s0: float, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """σ(t) and L(t) of ATTN_M for Λ = c·I_D from aligned, balanced init of size s0 = ‖w_2(0)‖², eq. (10), (51).

    ŷ_q(t) = σ(t) βᵀx_q. With c = ``scale``: γ = c²√D, α = c³(1 + (1 + D)E(1/N)), σ = s/√D,
    L = cD − 2c²Dσ + c³D(1 + (1 + D)E(1/N))σ² (c = 1 is the paper's eq. 10/51; c = 1/D is the
    official code's trace-normalised white covariance). Returns (σ, L).
    """
    require_int("white_time_course", "D", D, 1)
    require("white_time_course", "scale", scale > 0, "a float > 0", scale)
    _check_inv_n(inv_n)
    g = scale**2 * math.sqrt(D)
    a = scale**3 * (1 + (1 + D) * inv_n)
    sigma = logistic_s(t, g, a, s0) / math.sqrt(D)
    return sigma, scale * D - 2 * scale**2 * D * sigma + a * D * sigma**2


def merged_plateau_time(Lambda: Tensor, w_init: float) -> float:
    """t_plateau ≈ (τ/‖Λ²‖_F) ln(1/w_init), eq. (54), in units of τ (s(0) = w_init², eq. 52-53)."""
    require("merged_plateau_time", "w_init", 0 < w_init < 1, "a float in (0, 1)", w_init)
    return math.log(1 / w_init) / frobenius_gamma(Lambda)


def logistic_midpoint_time(gamma: float, alpha: float, s0: float) -> float:
    """Time at which s(t) of eq. (49) reaches half its final value γ/α: ln(γ/(α s0) − 1)/(2γ)."""
    require(
        "logistic_midpoint_time",
        "s0",
        0 < s0 < gamma / (2 * alpha),
        f"a float in (0, γ/2α = {gamma / (2 * alpha):.4g})",
        s0,
    )
    return math.log(gamma / (alpha * s0) - 1) / (2 * gamma)


# --------------------------------------------------------------------------------------------
# ATTN_S: the reduced scalar ODE along the ansatz (App. E.5-E.6, eq. 20-21, 70-72, 76-77)


def value_ode_rhs(v: Tensor | float, lam: float, a: float) -> Tensor:
    """τ dv/dt = λ² v² − λ a v⁵, eq. (21) = (70) = (76), for the head learning the eigen-direction (λ, a)."""
    v = torch.as_tensor(v, dtype=torch.float64)
    return lam**2 * v**2 - lam * a * v**5


def value_fixed_point(lam: float, a: float) -> float:
    """v* = (λ/a)^{1/3}, the stable fixed point of eq. (21) (the value weight of eq. 20a)."""
    return (lam / a) ** (1 / 3)


def value_ode_F(v: Tensor | float, lam: float, a: float) -> Tensor:
    """F(v) = ∫ dv / (v² − (a/λ) v⁵) (eq. 71 with its integrand corrected), so λ² t/τ = F(v(t)) − F(v(0)).

    With c = (a/λ)^{1/3}, u = c v: F = (c/6)[ln((u² + u + 1)/(u − 1)²) − 2√3 arctan((2u + 1)/√3)] − 1/v,
    valid for v > 0 on either side of v* = 1/c.
    """
    v = torch.as_tensor(v, dtype=torch.float64)
    c = (a / lam) ** (1 / 3)
    u = c * v
    s3 = math.sqrt(3.0)
    return (c / 6) * (torch.log((u**2 + u + 1) / (u - 1) ** 2) - 2 * s3 * torch.atan((2 * u + 1) / s3)) - 1 / v


def value_ode_solve(t: Tensor | float, v0: float, lam: float, a: float, *, iters: int = 200) -> Tensor:
    """v(t) of eq. (21) with v(0) = v0 > 0, t in units of τ: F of eq. (71) inverted by bisection.

    F is monotone on each side of v*, so this is exact to float64 resolution (the paper solves eq. 21
    numerically for the dashed lines of Fig. 3b). Negative t (backwards from v0 < v*) is allowed, e.g.
    to draw a solution pinned at its midpoint; backwards from v0 > v* the solution blows up in finite
    time, so there t must be >= 0.
    """
    vs = value_fixed_point(lam, a)
    require("value_ode_solve", "v0", v0 > 0, "a float > 0 (the magnitude |v|; signs flip in pairs, eq. 20)", v0)
    t = torch.as_tensor(t, dtype=torch.float64)
    if abs(v0 - vs) < 1e-15 * vs:
        return torch.full_like(t, vs)
    require("value_ode_solve", "t", v0 < vs or bool((t >= 0).all()), "t >= 0 when v0 > v*", "negative times")
    target = value_ode_F(v0, lam, a) + lam**2 * t
    if v0 < vs:  # F' = 1/(v²(1 − u³)) > 0 on (0, v*): forward in t moves up to v*, backward down to 0
        lo = torch.where(t >= 0, torch.full_like(t, v0), torch.full_like(t, v0 * 1e-30))
        hi = torch.where(t >= 0, torch.full_like(t, vs), torch.full_like(t, v0))
        up = True
    else:  # F' < 0 on (v*, ∞): forward in t moves down to v*
        lo, hi, up = torch.full_like(t, vs), torch.full_like(t, v0), False
    for _ in range(iters):
        mid = (lo + hi) / 2
        f = value_ode_F(mid, lam, a)
        go_up = (f < target) if up else (f > target)
        lo = torch.where(go_up, mid, lo)
        hi = torch.where(go_up, hi, mid)
    return (lo + hi) / 2


def value_rise_time(lam: float, a: float, lo: float = 0.1, hi: float = 0.9) -> float:
    """Time for eq. (21) to take v from lo·v* to hi·v*: (F(hi v*) − F(lo v*))/λ² (the 10→90 % rise time)."""
    vs = value_fixed_point(lam, a)
    return float(value_ode_F(hi * vs, lam, a) - value_ode_F(lo * vs, lam, a)) / lam**2


def separate_plateau_time(lam: float, v0: float) -> float:
    """t_{m+1} − t_m ≈ τ/(λ_{m+1}² v_{m+1}(t_m)), eq. (72), (77), in units of τ."""
    require("separate_plateau_time", "v0", v0 > 0, "a float > 0", v0)
    return 1.0 / (lam**2 * v0)


def ansatz_weights(Lambda: Tensor, inv_n: float, m: int, v: float, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """ATTN_S rank-1 weights of the ansatz (20) during the (m+1)-th plateau and drop.

    Heads 0..m−1 sit at v* = (λ_i/a_i)^{1/3} with k_i = q_i = v_i e_i (20a), head m has k = q = v e_{m+1}
    (20b), the rest are zero (20c). Returns v (H,), k (H, D), q (H, D).
    """
    lam, E = spectrum(Lambda)
    D = lam.numel()
    require("ansatz_weights", "m", is_int(m, 0) and m < D, f"an int in [0, {D})", m)
    require_int("ansatz_weights", "n_heads", n_heads, m + 1)
    vs, ks, _ = separate_fixed_point(Lambda, inv_n, range(m), n_heads)
    vs[m] = v
    ks[m, 0] = v * E[:, m]
    return vs, ks[:, 0], ks[:, 0].clone()


def ansatz_loss(v: Tensor | float, Lambda: Tensor, inv_n: float, m: int) -> Tensor:
    """L along the ansatz (20): L(M_m) − 2 λ_{m+1}² v³ + λ_{m+1} a_{m+1} v⁶ (→ L(M_{m+1}) at v*)."""
    lam, _ = spectrum(Lambda)
    require("ansatz_loss", "m", is_int(m, 0) and m < lam.numel(), f"an int in [0, {lam.numel()})", m)
    a = second_moment_eigenvalues(Lambda, inv_n)
    v = torch.as_tensor(v, dtype=torch.float64)
    return plateau_losses(Lambda, inv_n)[m] - 2 * lam[m] ** 2 * v**3 + lam[m] * a[m] * v**6


def early_alignment(
    k0: Tensor, q0: Tensor, Lambda: Tensor, m: int, integral_v: Tensor | float
) -> tuple[Tensor, Tensor]:
    """k_i(t), q_i(t) of a near-zero head during the (m+1)-th plateau, eq. (67) (m = 0) and (74).

    Solves τ d[k; q]/dt = v_i [[0, Ω], [Ω, 0]] [k; q] with Ω = Σ_{d>m} λ_d² e_d e_dᵀ given
    ``integral_v`` = (1/τ)∫_{t_m}^t v_i dt'. Components on e_1..e_m are frozen: the k and q
    components are each kept (eq. 74 prints their sum on [e_d; e_d], which is the same only when
    k and q agree there). k0, q0: (..., D).
    """
    lam, E = spectrum(Lambda)
    D = lam.numel()
    require("early_alignment", "m", is_int(m, 0) and m < D, f"an int in [0, {D})", m)
    I = torch.as_tensor(integral_v, dtype=torch.float64)
    live = torch.arange(D) >= m
    om = torch.where(live, lam**2, torch.zeros_like(lam))  # (D,) Ω eigenvalues
    kc, qc = k0 @ E, q0 @ E  # (..., D) eigen-coordinates
    grow = (kc + qc) / 2 * torch.exp(om * I[..., None] if I.dim() else om * I)
    decay = (kc - qc) / 2 * torch.exp(-om * I[..., None] if I.dim() else -om * I)
    return (grow + decay) @ E.mT, (grow - decay) @ E.mT


# --------------------------------------------------------------------------------------------
# Conservation laws (eq. 55, 83, 89)


def merged_conservation(v: Tensor, U: Tensor) -> Tensor:
    """w_2 w_2ᵀ − W_1 W_1ᵀ (..., H, H), constant under gradient flow, eq. (55); w_2 = v, rows of W_1 = vec(U_i)."""
    W1 = U.reshape(*U.shape[:-2], -1)  # (..., H, D²)
    return v[..., :, None] * v[..., None, :] - W1 @ W1.mT


def separate_conservation(v: Tensor, k: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """(‖k_{i,r}‖² − ‖q_{i,r}‖², Σ_r ‖k_{i,r}‖² − v_i²), constant under gradient flow, eq. (83), (89).

    k, q (..., H, R, D) or rank one (..., H, D); returns (..., H, R) and (..., H).
    """
    if k.dim() == v.dim() + 1:
        k, q = k.unsqueeze(-2), q.unsqueeze(-2)
    kk, qq = (k**2).sum(-1), (q**2).sum(-1)
    return kk - qq, kk.sum(-1) - v**2


def conservation_drift(values: Tensor, time_axis: int = 0) -> float:
    """max_t |Q(t) − Q(0)| / max(max|Q(0)|, max_t |Q(t)|, tiny): the relative drift of a conserved quantity."""
    Q = values.movedim(time_axis, 0)
    scale = float(Q.abs().max().clamp_min(1e-300))
    return float((Q - Q[:1]).abs().max()) / scale


# --------------------------------------------------------------------------------------------
# Metrics on weights and loss curves (Fig. 3c, 9)


def cosine(a: Tensor, b: Tensor, *, dims: int = 1) -> Tensor:
    """Cosine between a and b over their last ``dims`` axes (dims=2: matrices as vectors, Frobenius)."""
    require("cosine", "dims", dims in (1, 2), "1 (vectors) or 2 (matrices)", dims)
    if dims == 2:
        a, b = a.flatten(-2), b.flatten(-2)
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)


def key_alignment(k: Tensor, Lambda: Tensor) -> Tensor:
    """|⟨k/‖k‖, e_d⟩| for every key (..., D) against e_1..e_D -> (..., D) (Fig. 3c heat-maps)."""
    _, E = spectrum(Lambda)
    return ((k / k.norm(dim=-1, keepdim=True).clamp_min(1e-300)) @ E.to(k.dtype)).abs()


def head_cosines(U: Tensor) -> Tensor:
    """Pairwise cosines of vec U_i, (..., H, D, D) -> (..., H, H): ±1 when heads are parallel (D.7, Fig. 9)."""
    W1 = U.reshape(*U.shape[:-2], -1)
    Wn = W1 / W1.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return Wn @ Wn.mT


def merged_target_cosines(U: Tensor, Lambda: Tensor, inv_n: float) -> tuple[Tensor, Tensor]:
    """|cos(vec U_i, vec Λ²)| (plateau target E(y_q z)) and |cos(vec U_i, vec E(Λ̂²)⁻¹Λ)| (final target), (..., H) each (Fig. 9)."""
    t1 = (Lambda @ Lambda).to(U.dtype)
    t2 = converged_matrix(Lambda, inv_n).to(U.dtype)
    return cosine(U, t1, dims=2).abs(), cosine(U, t2, dims=2).abs()


def fixed_point_distances(W: Tensor, Lambda: Tensor, inv_n: float) -> Tensor:
    """‖W − W(M_m)‖_F / ‖W(M_D)‖_F for m = 0..D, (..., D, D) -> (..., D+1): which saddle M_m the model is at."""
    D = Lambda.shape[0]
    fps = torch.stack([fixed_point_matrix(Lambda, inv_n, range(m)) for m in range(D + 1)]).to(W.dtype)  # (D+1, D, D)
    return torch.linalg.matrix_norm(W[..., None, :, :] - fps) / torch.linalg.matrix_norm(fps[-1])


def crossing_times(time: Tensor, loss: Tensor, thresholds: Tensor) -> Tensor:
    """First time the loss curve falls below each threshold (linear interpolation); NaN if never. (T,), (T,), (K,) -> (K,)."""
    out = torch.full((thresholds.numel(),), float("nan"), dtype=torch.float64)
    t, L = time.double(), loss.double()
    for j, th in enumerate(thresholds.double().tolist()):
        below = torch.nonzero(th > L)
        if below.numel() == 0:
            continue
        i = int(below[0])
        if i == 0:
            out[j] = t[0]
            continue
        f = (L[i - 1] - th) / (L[i - 1] - L[i])
        out[j] = t[i - 1] + f * (t[i] - t[i - 1])
    return out


def drop_times(time: Tensor, loss: Tensor, levels: Tensor) -> Tensor:
    """t_m, m = 1..K: when the loss crosses the midpoint between consecutive plateau levels L(M_{m−1}), L(M_m); (K,)."""
    return crossing_times(time, loss, (levels[:-1] + levels[1:]) / 2)


def plateau_dwell(time: Tensor, loss: Tensor, levels: Tensor, tol: float) -> Tensor:
    """Time the curve spends within ``tol`` of each level, (K,): a plateau is 'conspicuous' if long (Sec. 5)."""
    t, L = time.double(), loss.double()
    dt = torch.diff(t)
    mid = (L[1:] + L[:-1]) / 2
    return torch.stack([(dt * ((mid - lv).abs() <= tol)).sum() for lv in levels.double()])


def plateau_values(time: Tensor, loss: Tensor, levels: Tensor) -> tuple[Tensor, Tensor]:
    """The loss where it changes slowest between successive drops, and |dL/dt| there; (K,) each.

    Segment m is [t_m, t_{m+1}] with t_m from :func:`drop_times` (t_0 = start, t_K = end). A plateau
    at L(M_m) shows as a tiny slope; a level the curve passed straight through has a large one. NaN
    for a segment the curve never reached.
    """
    t, L = time.double(), loss.double()
    bounds = torch.cat([t[:1], drop_times(t, L, levels), t[-1:]])
    values = torch.full((levels.numel(),), float("nan"), dtype=torch.float64)
    slopes = values.clone()
    rate = (torch.diff(L) / torch.diff(t)).abs()  # (T-1,)
    slope = torch.cat([rate[:1], torch.minimum(rate[1:], rate[:-1]), rate[-1:]])  # (T,) at each sample
    for m in range(levels.numel()):
        lo, hi = bounds[m], bounds[m + 1]
        if not (torch.isfinite(lo) and torch.isfinite(hi)):
            continue
        idx = torch.nonzero((t >= lo) & (t <= hi)).flatten()
        if idx.numel() == 0:
            continue
        j = idx[slope[idx].argmin()]
        values[m], slopes[m] = L[j], slope[j]
    return values, slopes


def count_drops(time: Tensor, loss: Tensor, *, rel: float = 0.1, valley: float = 0.3) -> int:
    """Number of abrupt drops of a loss curve without reference levels (used for softmax, Fig. 5).

    r = −dL/dt is the loss decrease per unit time; a drop is a peak of r above ``rel``·max r,
    and two peaks count as one unless r falls below ``valley``·(the smaller peak) between them.
    """
    t, L = time.double(), loss.double()
    r = (-torch.diff(L) / torch.diff(t)).clamp_min(0)  # (T-1,)
    if r.numel() < 3 or float(r.max()) <= 0:
        return 0
    peaks = [
        i
        for i in range(r.numel())
        if r[i] >= rel * r.max() and r[i] >= r[max(i - 1, 0)] and r[i] >= r[min(i + 1, r.numel() - 1)]
    ]
    count, last = 0, None
    for i in peaks:
        if last is None or float(r[last:i].min()) < valley * min(float(r[last]), float(r[i])):
            count, last = count + 1, i
        elif r[i] > r[last]:
            last = i
    return count
