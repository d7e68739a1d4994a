"""Closed-form theory of linear attention as preconditioned GD (Ahn, Cheng, Daneshmand, Sra 2023).

Conventions:

* Data: x ~ N(0, Σ), w⋆ ~ N(0, Σ_w), y = ⟨w⋆, x⟩ + ε with ε ~ N(0, σ²); loss E(ŷ − y_q)².
* A preconditioner Γ acts as in :class:`iclab.algorithms.PGD`: one step from w_0 = 0 gives
  w_1 = Γ Xᵀy/n and ŷ = x_qᵀ Γ Xᵀy/n. The eq.-(8) transformer with A = Γᵀ, and
  :func:`iclab.constructions.one_layer` called with Γᵀ, predict exactly this (Lemma 1, with the
  transpose of eq. (9); docs/errata.md).
* Thm 3/4 sets: S = {A_i = a_i Σ⁻¹} (eq. 8, paper sign) and S = {A_i = a_i Σ⁻¹, B_i = b_i I}
  (eq. 11, no minus sign). In whitened coordinates (Σ = I, Σ_w = I) they are scalar problems.

Everything is float64. Scalars come back as Python floats, vectors and matrices as tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from scipy import optimize
from torch import Tensor

from iclab.constructions.linear_attention import gd_plus_plus
from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.learner import Learner
from iclab.core.numerics import as_vector, dist_to_identity, is_psd, sym_inv_sqrt
from iclab.core.private_torch import standard_gamma
from iclab.models.linear_attention import LinearTransformer
from iclab.tasks.base import Task
from iclab.tasks.linear_regression import LinearRegression
from iclab.theory.wishart import KMAX as WISHART_KMAX
from iclab.theory.wishart import wishart_moments_exact

F64 = torch.float64


# --- argument checks ----------------------------------------------------------------------------
def _psd(owner: str, field: str, m: Tensor | Sequence[Sequence[float]], d: int | None = None) -> Tensor:
    """``m`` as a float64 (d, d) symmetric PSD matrix with a positive trace, or a ``ConfigError``."""
    m = torch.as_tensor(m).to(F64)
    square = m.dim() == 2 and m.shape[0] == m.shape[1] and m.shape[0] >= 1
    want = "a square (d, d) matrix" if d is None else f"a ({d}, {d}) matrix"
    require(owner, field, square and (d is None or m.shape[0] == d), want, tuple(m.shape))
    if not (is_psd(m.detach()) and float(torch.trace(m.detach())) > 0):
        got = f"eigenvalues {torch.linalg.eigvalsh((m + m.T).detach() / 2).tolist()} of its symmetric part"
        require(owner, field, False, "symmetric PSD and non-zero", got)
    return m


def _noise(owner: str, noise_var: float) -> float:
    require(owner, "noise_var", float(noise_var) >= 0, "a float >= 0", noise_var)
    return float(noise_var)


# --- Theorem 1: one layer, x ~ N(0, Σ) ----------------------------------------------------------
def one_layer_loss_tensor(
    Gamma: Tensor, Sigma: Tensor, n: int, *, w_cov: Tensor | None = None, noise_var: float = 0.0
) -> Tensor:
    """Exact population loss of ŷ = x_qᵀ Γ Xᵀy/n, differentiable and batched over Γ's leading axes.

    Ahn et al. 2023, Thm 1 (App. A.1-A.3), re-derived for the PGD orientation (w_1 = Γ Xᵀy/n) and extended to label
    noise.
    With E[Σ̂ M Σ̂] = (n+1)/n ΣMΣ + tr(MΣ)Σ/n (M symmetric) and E[XᵀX] = nΣ::

        f(Γ) = tr(ΣΣ_w) − 2 tr(ΣΓΣΣ_w) + (n+1)/n tr(ΣΓᵀΣΓΣΣ_w)
               + (1/n) tr(ΓᵀΣΓΣ) (tr(ΣΣ_w) + σ²) + σ²

    With ΓΣΓᵀ in the third term it is the loss of ``constructions.one_layer(Γ)``,
    which predicts with Γᵀ. Both orientations agree for symmetric Γ. ``Gamma`` (..., d, d) -> (...).
    """
    owner = "one_layer_loss"
    require_int(owner, "n", n)
    S = _psd(owner, "Sigma", Sigma)
    d = S.shape[0]
    Sw = torch.eye(d, dtype=F64, device=S.device) if w_cov is None else _psd(owner, "w_cov", w_cov, d)
    s2 = _noise(owner, noise_var)
    G = torch.as_tensor(Gamma).to(S)
    require(owner, "Gamma", G.dim() >= 2 and tuple(G.shape[-2:]) == (d, d), f"a (..., {d}, {d}) tensor", tuple(G.shape))
    S_Sw = S @ Sw  # (d, d)
    signal = torch.trace(S_Sw)
    cross = torch.einsum("ij,...jk,ki->...", S, G, S_Sw)  # tr(Σ Γ Σ Σ_w)
    K = G.transpose(-1, -2) @ S @ G  # (..., d, d)  Γᵀ Σ Γ
    quad = torch.einsum("ij,...jk,ki->...", S, K, S_Sw)  # tr(Σ ΓᵀΣΓ Σ Σ_w)
    spread = torch.einsum("...ij,ji->...", K, S)  # tr(ΓᵀΣΓ Σ)
    return signal - 2 * cross + (n + 1) / n * quad + spread * (signal + s2) / n + s2


def one_layer_loss(
    Gamma: Tensor, Sigma: Tensor, n: int, *, w_cov: Tensor | None = None, noise_var: float = 0.0
) -> float:
    """:func:`one_layer_loss_tensor` for one (d, d) preconditioner, as a float. ``w_cov`` defaults to I."""
    G = torch.as_tensor(Gamma)
    require("one_layer_loss", "Gamma", G.dim() == 2, "a (d, d) matrix", tuple(G.shape))
    return float(one_layer_loss_tensor(G, Sigma, n, w_cov=w_cov, noise_var=noise_var))


def theorem1_preconditioner(Sigma: Tensor, n: int, *, noise_var: float = 0.0) -> Tensor:
    """Γ⋆ = ((n+1)/n Σ + (tr Σ + σ²)/n I)⁻¹, the global minimiser of f for w⋆ ~ N(0, I).

    Ahn et al. 2023, Thm 1, eq. (6) in closed form (σ² = 0 is the paper's).
    The label noise only enlarges the ridge-like term. Isotropic: Γ⋆ = n/(n+d+1) I (eq. 7).
    """
    require_int("theorem1_preconditioner", "n", n)
    S = _psd("theorem1_preconditioner", "Sigma", Sigma)
    s2 = _noise("theorem1_preconditioner", noise_var)
    eye = torch.eye(S.shape[0], dtype=F64, device=S.device)
    return torch.linalg.inv((n + 1) / n * S + (torch.trace(S) + s2) / n * eye)


def theorem1_loss(Sigma: Tensor, n: int, *, noise_var: float = 0.0) -> float:
    """f⋆ = Σ_j λ_j (λ_j + c)/((n+1)λ_j + c) + σ² with c = tr Σ + σ² (Thm 1, eq. 6).

    λ_j are the eigenvalues of Σ; w⋆ ~ N(0, I). Isotropic, noiseless: d(d+1)/(n+d+1).
    """
    require_int("theorem1_loss", "n", n)
    S = _psd("theorem1_loss", "Sigma", Sigma)
    s2 = _noise("theorem1_loss", noise_var)
    lam = torch.linalg.eigvalsh((S + S.T) / 2).clamp_min(0)
    c = lam.sum() + s2
    return float((lam * (lam + c) / ((n + 1) * lam + c)).sum()) + s2


def theorem1_isotropic_scale(d: int, n: int) -> float:
    """n/(n+d+1): Γ⋆ = this · I for Σ = I (eq. 7), and the best 1-step a⋆ of Thm 3 for any Σ."""
    require_int("theorem1_isotropic_scale", "d", d)
    require_int("theorem1_isotropic_scale", "n", n)
    return n / (n + d + 1)


def theorem1_isotropic_loss(d: int, n: int) -> float:
    """d(d+1)/(n+d+1): the 1-layer optimum for Σ = I (eq. 7) and for Thm 3 data with L = 1."""
    require_int("theorem1_isotropic_loss", "d", d)
    require_int("theorem1_isotropic_loss", "n", n)
    return d * (d + 1) / (n + d + 1)


# --- Theorem 3: the reduced scalar problem on S = {A_ℓ = a_ℓ Σ⁻¹} ---------------------------------
def _wishart_chunks(d: int, n: int, samples: int, generator: torch.Generator, chunk: int) -> Iterator[Tensor]:
    """Independent W = GGᵀ/n, G ∈ R^{d×n} standard Gaussian, in (m, d, d) chunks, float64.

    For n >= d by Bartlett's decomposition GGᵀ =_d TTᵀ, T lower triangular with T_ii² ~ χ²_{n−i}
    (i = 0..d−1) and N(0, 1) entries below the diagonal: d(d+1)/2 draws instead of d·n.
    """
    dev = generator.device
    rows, cols = torch.tril_indices(d, d, -1, device=dev)
    dof = torch.arange(n, n - d, -1, dtype=F64, device=dev)  # (d,) n, n−1, …, n−d+1
    for start in range(0, samples, chunk):
        m = min(chunk, samples - start)
        if n < d:  # singular W: sample G directly
            g = torch.randn(m, d, n, generator=generator, dtype=F64, device=dev)  # (m, d, n)
            yield g @ g.transpose(1, 2) / n
            continue
        chi2 = 2 * standard_gamma((dof / 2).expand(m, d).contiguous(), generator=generator)  # (m, d)
        t = torch.zeros(m, d, d, dtype=F64, device=dev)
        t[:, rows, cols] = torch.randn(m, rows.numel(), generator=generator, dtype=F64, device=dev)
        t.diagonal(dim1=1, dim2=2).copy_(chi2.sqrt())
        yield t @ t.transpose(1, 2) / n  # (m, d, d)


def _check_wishart(owner: str, d: int, n: int, samples: int, chunk: int) -> None:
    for field, value in (("d", d), ("n", n), ("samples", samples), ("chunk", chunk)):
        require_int(owner, field, value)


def wishart_eigenvalues(d: int, n: int, samples: int, *, generator: torch.Generator, chunk: int = 100_000) -> Tensor:
    """Eigenvalues of ``samples`` independent W = GGᵀ/n, G ∈ R^{d×n} standard Gaussian: (samples, d).

    W is the whitened Σ̂ of Thm 3 (Ahn et al. 2023, §4.2). float64 on ``generator.device``, ascending per row.
    The same seed gives the same draws as :func:`wishart_trace_moments`.
    """
    _check_wishart("wishart_eigenvalues", d, n, samples, chunk)
    return torch.cat([torch.linalg.eigvalsh(w) for w in _wishart_chunks(d, n, samples, generator, chunk)])


def wishart_trace_moments(
    d: int, n: int, kmax: int, samples: int, *, generator: torch.Generator, chunk: int = 100_000
) -> Tensor:
    """Monte-Carlo m_k = E tr W^k, k = 0..kmax, (kmax+1,), from matrix powers (no eigensolver).

    Exact values for reference: m_0 = d, m_1 = d, m_2 = d(n+d+1)/n.
    """
    _check_wishart("wishart_trace_moments", d, n, samples, chunk)
    require_int("wishart_trace_moments", "kmax", kmax, low=0)
    total = torch.zeros(kmax + 1, dtype=F64, device=generator.device)
    total[0] = d * samples
    for w in _wishart_chunks(d, n, samples, generator, chunk):
        powers = [w]  # W^1 … W^{⌈kmax/2⌉}
        while len(powers) < (kmax + 1) // 2:
            powers.append(powers[-1] @ w)
        for k in range(1, kmax + 1):  # tr W^k = ⟨W^i, W^{k−i}⟩_F for symmetric powers
            i = k // 2
            total[k] += w.diagonal(dim1=1, dim2=2).sum() if k == 1 else (powers[i - 1] * powers[k - i - 1]).sum()
    return total / samples


def sparse_scalar_loss(a: Tensor | Sequence[float], eigs: Tensor) -> float:
    """φ(a) = E Σ_j Π_ℓ (1 − a_ℓ λ_j)², the Thm-3 loss at A_ℓ = a_ℓ Σ⁻¹ (§4.2, derived).

    By Lemma 1 the error of L steps of Σ⁻¹-PGD is −p(W) w̃ in whitened coordinates, with
    p(λ) = Π_ℓ (1 − a_ℓ λ); the expectation is the mean over ``eigs`` (S, d) from
    :func:`wishart_eigenvalues`. It does not depend on Σ; the order of the a_ℓ is irrelevant (Lemma 4).
    """
    a = as_vector("sparse_scalar_loss", "a", a).to(F64).to(eigs.device)
    require("sparse_scalar_loss", "eigs", eigs.dim() == 2, "a (samples, d) tensor", tuple(eigs.shape))
    p = torch.prod(1 - a[:, None, None] * eigs.to(F64), dim=0)  # (S, d)
    return float((p**2).sum(-1).mean())


def one_step_scalar_loss(a: float, d: int, n: int) -> float:
    """Exact φ for L = 1: d − 2ad + a² d(n+d+1)/n, from E tr W = d, E tr W² = d(n+d+1)/n.

    Minimised at a⋆ = n/(n+d+1) with φ⋆ = d(d+1)/(n+d+1) (L = 1; eq. 7's Γ⋆ for Σ = I).
    """
    require_int("one_step_scalar_loss", "d", d)
    require_int("one_step_scalar_loss", "n", n)
    return d - 2 * a * d + a * a * d * (n + d + 1) / n


def trace_moments(eigs: Tensor, kmax: int) -> Tensor:
    """m_k = E tr W^k = mean over samples of Σ_j λ_j^k for k = 0..kmax, (kmax+1,)."""
    require_int("trace_moments", "kmax", kmax, low=0)
    require("trace_moments", "eigs", eigs.dim() == 2, "a (samples, d) tensor", tuple(eigs.shape))
    k = torch.arange(kmax + 1, dtype=F64, device=eigs.device)
    return (eigs.to(F64)[..., None] ** k).sum(1).mean(0)


def _poly_loss_and_grad(a: np.ndarray, moments: np.ndarray) -> tuple[float, np.ndarray]:
    """φ(a) = Σ_k [p²]_k m_k with p(λ) = Π_ℓ (1 − a_ℓλ), and its gradient; O(L²) per call."""
    factors = [np.array([1.0, -float(al)]) for al in a]  # ascending coefficients of 1 − a_ℓ λ
    p = np.array([1.0])
    for f in factors:
        p = np.convolve(p, f)
    value = float(np.convolve(p, p) @ moments[: 2 * len(a) + 1])
    grad = np.empty(len(a))
    for ell in range(len(a)):
        q = np.array([0.0, -1.0])  # ∂(1 − a_ℓ λ)/∂a_ℓ = −λ
        for j, f in enumerate(factors):
            if j != ell:
                q = np.convolve(q, f)
        pq = np.convolve(p, q)
        grad[ell] = 2 * float(pq @ moments[: len(pq)])
    return value, grad


def theorem3_optimum(
    d: int,
    n: int,
    L: int,
    *,
    samples: int = 200_000,
    generator: torch.Generator,
    starts: int = 8,
    moments: Tensor | None = None,
) -> tuple[Tensor, float]:
    """The best point of S = {A_ℓ = a_ℓ Σ⁻¹} for L layers: (a sorted ascending (L,), φ(a)).

    Thm 3 (a stationary point of φ is a critical point of f, derived from eq. (30) of App. B.2).
    φ is a polynomial in a whose coefficients are the Wishart moments m_k = E tr W^k, k ≤ 2L; for
    L ≤ 4 they are exact (:func:`iclab.theory.wishart.wishart_moments_exact`), beyond that they are
    estimated once from ``samples`` draws of W (common random numbers for every a), then
    φ is minimised exactly by BFGS from ``starts`` starting points: the reciprocals of Chebyshev
    nodes on the Marchenko–Pastur support, then random reciprocals of points of that support.
    n = 20, d = 5 gives exactly 1.15385 (L = 1), 0.36124, 0.13361, 0.05495 (L = 2, 3, 4); a table minimised on its own
    Monte-Carlo draws (0.3607, 0.1331, 0.0545) is biased low. ``moments``
    (m_0..m_{≥2L}, e.g. exact ones) replaces the sampling; ``generator`` then only draws the starts.
    """
    owner = "theorem3_optimum"
    for field, value in (("d", d), ("n", n), ("L", L), ("samples", samples), ("starts", starts)):
        require_int(owner, field, value)
    if moments is None:
        exact = 2 * L <= WISHART_KMAX
        moments = (
            wishart_moments_exact(d, n, 2 * L)
            if exact
            else wishart_trace_moments(d, n, 2 * L, samples, generator=generator)
        )
    m = torch.as_tensor(moments).to(F64).reshape(-1).cpu().numpy()
    require(owner, "moments", m.size >= 2 * L + 1, f"a vector m_0..m_k with k >= 2L = {2 * L}", tuple(m.shape))
    r = math.sqrt(d / n)
    lo, hi = max((1 - r) ** 2, 1e-2), (1 + r) ** 2  # support of the limiting spectrum (n >= d)
    k = np.arange(L)
    cheb = (lo + hi) / 2 + (hi - lo) / 2 * np.cos((2 * k + 1) * np.pi / (2 * L))
    inits = [1 / cheb]
    u = torch.rand(starts - 1, L, generator=generator, dtype=F64, device=generator.device).cpu().numpy()
    inits += list(1 / (lo + (hi - lo) * u))
    best: tuple[float, np.ndarray] | None = None
    for x0 in inits:
        res = optimize.minimize(_poly_loss_and_grad, x0, args=(m,), jac=True, method="BFGS", options={"gtol": 1e-12})
        if best is None or res.fun < best[0]:
            best = (float(res.fun), res.x)
    assert best is not None
    return torch.as_tensor(np.sort(best[1]), dtype=F64), best[0]


# --- Monte Carlo and step-size search --------------------------------------------------------------
def episode_loss(learner: Learner, episode: Episode) -> float:
    """mean over the batch of (ŷ − y_q)² on one fixed episode (common random numbers)."""
    y_query = episode.y_query
    require("episode_loss", "episode", y_query is not None, "a regression episode with y_query", None)
    assert y_query is not None
    with torch.no_grad():
        return float(((learner.predict(episode) - y_query) ** 2).mean())


def mc_loss(
    learner: Learner,
    task: Task,
    n: int,
    batch: int,
    *,
    generator: torch.Generator,
    dtype: torch.dtype = F64,
    chunks: int = 1,
) -> tuple[float, float]:
    """Monte-Carlo in-context loss E(ŷ − y_q)² of any learner: (mean, standard error).

    ``batch`` prompts from ``task.sample`` in ``chunks`` consecutive draws (to bound memory); the
    same generator state and chunking give the same prompts, so two learners can be compared on
    common random numbers. The per-chunk means and spreads are merged exactly (Chan et al.). A learner whose error
    is inf on some prompt gives (inf, inf), nan on some prompt (nan, nan): reported, not raised.
    """
    require_int("mc_loss", "n", n)
    require_int("mc_loss", "batch", batch, low=2)
    require_int("mc_loss", "chunks", chunks)
    require("mc_loss", "chunks", chunks <= batch, f"at most batch = {batch}", chunks)
    count, mean, m2, diverged, nan_seen = 0, 0.0, 0.0, False, False
    with torch.no_grad():
        for size in (batch // chunks + (i < batch % chunks) for i in range(chunks)):
            ep = task.sample(size, n, generator=generator, dtype=dtype)
            assert ep.y_query is not None  # a regression task
            err = ((learner.predict(ep) - ep.y_query) ** 2).to(F64)  # (size,)
            if not bool(torch.isfinite(err).all()):  # a learner that diverges on some prompt: (inf, inf), or nan
                diverged, nan_seen = True, nan_seen or bool(err.isnan().any())
                continue
            c_mean, c_m2 = float(err.mean()), float(((err - err.mean()) ** 2).sum())
            delta, total = c_mean - mean, count + size
            # products, not ``delta**2``: errors near the float64 limit make the spread inf, not an OverflowError
            mean, m2 = mean + delta * size / total, m2 + c_m2 + delta * delta * count * size / total
            count = total
    if diverged:
        bad = math.nan if nan_seen else math.inf
        return bad, bad
    return mean, math.sqrt(m2 / (count - 1) / count) if math.isfinite(m2) else math.inf


def best_constant_step(
    loss: Callable[[float], float], bounds: tuple[float, float], *, xatol: float = 1e-5
) -> tuple[float, float]:
    """argmin and min of a scalar loss over ``bounds`` by bounded Brent search: (step, loss).

    For the Fig-6/7 baselines, ``loss`` maps one step size to a loss on fixed prompts, e.g.
    ``lambda s: episode_loss(algorithms.gd([s] * L, d), ep)`` for GD with a constant step, or
    ``lambda s: sparse_scalar_loss([s] * L, eigs)`` for constant-step Σ⁻¹-PGD. The loss should be
    unimodal on ``bounds`` (it is for these baselines; check the bracket otherwise).
    """
    lo, hi = (float(b) for b in bounds)
    require(
        "best_constant_step",
        "bounds",
        math.isfinite(lo) and math.isfinite(hi) and lo < hi,
        "(low, high) with low < high",
        bounds,
    )
    require("best_constant_step", "xatol", xatol > 0, "a float > 0", xatol)
    res = optimize.minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": xatol})
    return float(res.x), float(res.fun)


# --- gradients of the in-context loss (Thm 3/4 structure) -----------------------------------------
def loss_gradients(model: LinearTransformer, episode: Episode) -> dict[str, Tensor]:
    """The empirical loss mean (ŷ − y_q)² on ``episode`` and its gradients, by autograd.

    Keys: ``loss`` (0-dim) and one (L, H, ·, ·) tensor per block of the pattern: ``A`` (sparse
    patterns), ``A`` and ``B`` (pattern11), ``P`` and ``Q`` (full). Gradients are with respect to
    the free parameters, which for ``sparse`` and ``pattern11`` are the paper's A_ℓ and B_ℓ.
    """
    y_query = episode.y_query
    require("loss_gradients", "episode", y_query is not None, "a regression episode with y_query", None)
    assert y_query is not None
    pattern = model.config.pattern
    names = {"full": ("P", "Q"), "pattern11": ("A", "B")}.get(pattern, ("A",))
    params = [getattr(layer, f"{name}_free") for name in names for layer in model.layers]
    with torch.enable_grad():
        loss = ((model.predict(episode) - y_query) ** 2).mean()
        grads = torch.autograd.grad(loss, params)
    L = len(model.layers)
    out = {"loss": loss.detach()}
    for i, name in enumerate(names):
        out[name] = torch.stack(grads[i * L : (i + 1) * L])
    return out


def gradient_structure(grads: dict[str, Tensor], Sigma: Tensor) -> dict[str, Tensor]:
    """Distances of the gradients from the Thm 3/4 structure, ∇_{A_ℓ} f ∝ Σ and ∇_{B_ℓ} f ∝ I.

    ``A``: Dist(Σ^{-1/2} ∇_{A_ℓ} f Σ^{-1/2}, I), (L, H); ``B`` (if present): Dist(∇_{B_ℓ} f, I) for
    ℓ < L−1, (L−1, H), since B_{L−1} does not reach the read-out (its gradient is 0). Both are 0 at
    every point of S up to Monte-Carlo error (derived from the proofs of Thm 3 and 4, App. B.2-B.3).
    """
    S = _psd("gradient_structure", "Sigma", Sigma)
    require("gradient_structure", "grads", "A" in grads, "a dict from loss_gradients with key 'A'", sorted(grads))
    gA = grads["A"].to(F64)
    require(
        "gradient_structure", "Sigma", gA.shape[-1] == S.shape[0], f"({gA.shape[-1]}, {gA.shape[-1]})", tuple(S.shape)
    )
    root = sym_inv_sqrt(S)
    out = {"A": dist_to_identity(root @ gA @ root)}
    if "B" in grads:
        out["B"] = dist_to_identity(grads["B"][:-1].to(F64))
    return out


# --- Theorem 4: pattern (11) on S = {A_ℓ = a_ℓ Σ⁻¹, B_ℓ = b_ℓ I} -----------------------------------
def pattern11_model(a: Tensor | Sequence[float], b: Tensor | Sequence[float], Sigma: Tensor) -> LinearTransformer:
    """The eq.-(11) transformer at the point (A_ℓ = a_ℓ Σ⁻¹, B_ℓ = b_ℓ I) of the Thm-4 set S, float64.

    ``b`` has L−1 entries (B_{L−1} never reaches the read-out; it is set to 0) or L. Built with
    :func:`iclab.constructions.gd_plus_plus` (η_ℓ = −a_ℓ, γ_ℓ = −a_ℓ b_ℓ, Γ = Σ⁻¹). Pass Σ = I
    for whitened coordinates.
    """
    a = as_vector("pattern11_model", "a", a).to(F64)
    L = a.numel()
    bt = torch.as_tensor(b).to(F64).reshape(-1)  # may be empty when L = 1
    ok = bt.numel() in (L - 1, L) and bool(torch.isfinite(bt).all())
    require("pattern11_model", "b", ok, f"a finite vector of length {L - 1} or {L}", tuple(bt.shape))
    bt = torch.cat([bt, torch.zeros(L - bt.numel(), dtype=F64)])
    prec = torch.linalg.inv(_psd("pattern11_model", "Sigma", Sigma))
    return gd_plus_plus(-a, -a * bt, prec)


def pattern11_scalar_loss(
    a: Tensor | Sequence[float], b: Tensor | Sequence[float], episode: Episode, *, Sigma: Tensor | None = None
) -> float:
    """Empirical loss of :func:`pattern11_model` (a, b, Σ) on a fixed episode (Thm 4 reference).

    ``Sigma`` defaults to I (whitened coordinates, w⋆ ~ N(0, I)). The S point
    for Σ on data x ~ N(0, Σ), w⋆ ~ N(0, Σ⁻¹) makes the same predictions as the whitened one on the
    whitened prompts, pathwise, so one scalar problem serves every Σ.
    """
    S = torch.eye(episode.d, dtype=F64) if Sigma is None else Sigma
    return episode_loss(pattern11_model(a, b, S).to(episode.device), episode)


def _pattern11_objective(episode: Episode, L: int) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """θ = (a_0..a_{L−1}, b_0..b_{L−2}) -> (loss, ∂loss/∂θ) on a whitened episode, by autograd."""
    eye = torch.eye(episode.d, dtype=F64)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a, b = torch.as_tensor(theta[:L]), torch.as_tensor(theta[L:])
        grads = loss_gradients(pattern11_model(a, b, eye).to(episode.device), episode)
        loss = float(grads["loss"])
        if not math.isfinite(loss):  # diverging iterates: a wall the line search backs off from
            return 1e12, np.zeros_like(theta)
        da = grads["A"][:, 0].diagonal(dim1=-2, dim2=-1).sum(-1)  # ⟨∇_{A_ℓ} f, I⟩ (L,)
        db = grads["B"][: L - 1, 0].diagonal(dim1=-2, dim2=-1).sum(-1)  # ⟨∇_{B_ℓ} f, I⟩ (L−1,)
        return loss, torch.cat([da, db]).cpu().numpy()

    return objective


def theorem4_optimum(
    d: int,
    n: int,
    L: int,
    *,
    samples: int = 20_000,
    starts: int = 10,
    generator: torch.Generator,
    search_samples: int = 2_000,
    refine: int = 3,
    a_bound: float = 30.0,
    b_bound: float = 5.0,
) -> tuple[Tensor, Tensor, float]:
    """The best point found of the Thm-4 set S in whitened coordinates: (a (L,), b (L−1,), loss).

    Ahn et al. 2023, Thm 4 (§5, App. B.3): A_ℓ = a_ℓ I, B_ℓ = b_ℓ I in eq. (11)
    (no minus sign); map back with A_ℓ = a_ℓ Σ⁻¹. No closed form is known and the landscape is
    rugged, so: one episode of ``samples`` whitened prompts (common random numbers); ``starts``
    local L-BFGS-B searches with exact autograd gradients on its first ``search_samples`` prompts,
    from random starts a_ℓ = −(sorted log-uniform magnitudes in [0.2, 10]), b_ℓ ~ U(0, 1) (the
    App-D pattern |a_0| < |a_1| < … and a_ℓ b_ℓ < 0); then the ``refine`` best are polished on
    all prompts. ``loss`` is in-sample: re-evaluate on fresh prompts (:func:`pattern11_scalar_loss`).
    n = 20, L = 3: ≈ 6.6–7.2e-4 (e.g. a ≈ (−0.38, −3.22, −8.56), b ≈ (0.90, 0.35)); L = 2: ≈ 0.06.
    """
    owner = "theorem4_optimum"
    for field, value in (("d", d), ("n", n), ("L", L), ("samples", samples), ("starts", starts)):
        require_int(owner, field, value)
    require_int(owner, "search_samples", search_samples)
    require_int(owner, "refine", refine)
    require(owner, "a_bound", a_bound > 0 and b_bound > 0, "positive bounds", (a_bound, b_bound))
    episode = LinearRegression(d=d).sample(samples, n, generator=generator, dtype=F64)
    bounds = [(-a_bound, a_bound)] * L + [(-b_bound, b_bound)] * (L - 1)
    search = _pattern11_objective(episode[: min(search_samples, samples)], L)
    u = torch.rand(starts, 2 * L - 1, generator=generator, dtype=F64, device=generator.device).cpu().numpy()
    mags = np.sort(0.2 * 50.0 ** u[:, :L], axis=1)  # log-uniform in [0.2, 10], ascending
    found = []
    for x0 in np.concatenate([-mags, u[:, L:]], axis=1):
        res = optimize.minimize(search, x0, jac=True, method="L-BFGS-B", bounds=bounds)
        found.append((float(res.fun), res.x))
    found.sort(key=lambda item: item[0])
    full = _pattern11_objective(episode, L)
    best: tuple[float, np.ndarray] | None = None
    for _, x0 in found[:refine]:
        res = optimize.minimize(full, x0, jac=True, method="L-BFGS-B", bounds=bounds)
        if best is None or res.fun < best[0]:
            best = (float(res.fun), res.x)
    assert best is not None
    theta = torch.as_tensor(best[1], dtype=F64)
    return theta[:L], theta[L:], best[0]


# --- Theorem 5: one layer of ReLU attention, isotropic ----------------------------------------------
def theorem5_scale(d: int, n: int) -> float:
    """c⋆ = 2n/(n+2d+3): the global minimiser Q_0 = −c⋆ [[I, 0], [0, 0]] of Thm 5 (Sec. 6; A.4)."""
    require_int("theorem5_scale", "d", d)
    require_int("theorem5_scale", "n", n)
    return 2 * n / (n + 2 * d + 3)


def relu_one_layer_loss(scale: float, d: int, n: int) -> float:
    """Exact loss of ``constructions.one_layer(scale · I, activation='relu')``, x, w⋆ ~ N(0, I).

    For c ≥ 0, ŷ = (c/n) Σ_i y_i min(x_iᵀx_q, 0) (max for c < 0). Stein's lemma (E σ' = ½) and the
    fourth Gaussian moments give, for either sign, f(c) = d − c d + c² d (n+2d+3)/(4n) [derived
    here; Thm 5 (§6, App. A.4) gives its minimum], minimised at c⋆ = :func:`theorem5_scale` with
    f(c⋆) = :func:`theorem5_loss`.
    """
    require_int("relu_one_layer_loss", "d", d)
    require_int("relu_one_layer_loss", "n", n)
    return d - scale * d + scale * scale * d * (n + 2 * d + 3) / (4 * n)


def theorem5_loss(d: int, n: int) -> float:
    """f⋆ = d(2d+3)/(n+2d+3), the Thm-5 optimum (65/33 ≈ 1.9697 at d = 5, n = 20; §6)."""
    require_int("theorem5_loss", "d", d)
    require_int("theorem5_loss", "n", n)
    return d * (2 * d + 3) / (n + 2 * d + 3)
