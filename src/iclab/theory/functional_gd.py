"""Theory of transformers as functional gradient descent (Cheng, Chen, Sra 2024).

* Bayes risk of a K-GP task, E_X[μ − νᵀK̂⁻¹ν] (derived from eq. 13); for the linear GP on the sphere
  it is exactly max(0, 1 − n/d) (:func:`linear_gp_bayes_risk`).
* Lemma A.1: with the true label in the query slot, the label row evolves as Ȳ_{ℓ+1} = Ȳ_ℓ (I + r_ℓ M h̃_ℓ)
  (A ≡ 0, eq. 40), so the in-context loss is f = E_X[g_qᵀ K₊(X) g_q] with g_q = G e_{n+1},
  G = Π_ℓ (I + r_ℓ M h̃_ℓ): exact over the labels, Monte Carlo over X only (:func:`label_propagator`,
  :func:`conditional_icl_loss`). Here r_ℓ is the paper's value entry, V_ℓ = [[0, 0], [0, r_ℓ]]; functional
  GD's step is r'_ℓ = −r_ℓ.
* Prop. 3.4: FGD with h̃ = K and a constant step δ converges to the Bayes predictor νᵀK̂⁻¹Ŷ iff
  0 < δ < 2/λ_max(K̂) (K̂ ≻ 0); the gap after L steps is −νᵀK̂⁻¹(I − δK̂)^L Ŷ (:func:`fgd_bayes_gap`).
  The paper states "δ < ‖K̂‖₂", which is wrong (docs/errata.md).
* Thm 4.5 / 4.6 (E.1 / F.1): the stationary family A_ℓ = a_ℓ I, B_ℓ = b_ℓ Σ^{-1/2}, C_ℓ = c_ℓ Σ^{-1/2}
  (:func:`stationary_point`), the learner it computes (:func:`stationary_point_learner`, eq. 58) and the
  Fig. 3/5/6 metric dist(Σ^{1/2} B_ℓᵀ C_ℓ Σ^{1/2}, I) (:func:`stationary_distance`).

Everything is batched and dtype-following; use float64 for exactness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from iclab.algorithms.functional_gd import FunctionalGD, FunctionalGDPlusPlus, GaussianProcessPosterior
from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.kernels import KernelLike
from iclab.core.numerics import as_vector, dist_to_identity, sym_inv_sqrt, sym_sqrt
from iclab.tasks.gaussian_process import GaussianProcess

F64 = torch.float64


# --- Bayes risk ---------------------------------------------------------------------------------
def linear_gp_bayes_risk(n: int, d: int) -> float:
    """Bayes risk of the noiseless linear GP on the sphere (Ex. 6, whitened): E[ξ_qᵀ(I − P_n)ξ_q] = 1 − n/d
    for n < d (P_n projects on the span of n directions), 0 for n >= d (eq. 13)."""
    require_int("linear_gp_bayes_risk", "n", n, 0)
    require_int("linear_gp_bayes_risk", "d", d, 1)
    return max(0.0, 1.0 - n / d)


def bayes_risk(
    task: GaussianProcess,
    n: int,
    *,
    samples: int,
    generator: torch.Generator,
    chunk: int = 20_000,
    dtype: torch.dtype = F64,
) -> tuple[float, float]:
    """E_X[μ − νᵀK̂⁻¹ν] of ``task`` with ``n`` context pairs by Monte Carlo over ``samples`` prompts:
    (mean, standard error). The posterior variance uses the K₊ the labels are drawn from (eq. 13)."""
    require_int("bayes_risk", "samples", samples, 2)
    post = GaussianProcessPosterior()
    vals = []
    left = samples
    while left > 0:
        b = min(chunk, left)
        vals.append(post.posterior_variance(task.sample(b, n, generator=generator, dtype=dtype)).to(F64))
        left -= b
    v = torch.cat(vals)
    return float(v.mean()), float(v.std()) / math.sqrt(v.numel())


# --- Lemma A.1 -----------------------------------------------------------------------------------
def label_propagator(scores: Sequence[Tensor] | Tensor, value_steps: Tensor) -> Tensor:
    """G = Π_ℓ (I + r_ℓ M h̃_ℓ), (B, n+1, n+1), so that Ȳ_L = Ȳ_0 G for the label row (Lemma A.1, eq. 40).

    ``scores[ℓ]`` is h̃_ℓ as (B, n, n+1) (sources × targets: M removes the query as a source, so its row of
    M h̃ is 0) and ``value_steps`` r_ℓ (L,) the paper's value entries (FGD: r_ℓ = −r'_ℓ). The last row of G is
    e_{n+1}ᵀ: the query label never feeds anything, so a label in the query slot passes through unchanged.
    """
    r = as_vector("label_propagator", "value_steps", value_steps)
    require(
        "label_propagator", "scores", len(scores) == len(r), f"{len(r)} score matrices, one per value step", len(scores)
    )
    h0 = scores[0]
    B, n, m = h0.shape
    require(
        "label_propagator",
        "scores",
        m == n + 1,
        "(B, n, n+1) matrices (context sources × all targets)",
        tuple(h0.shape),
    )
    eye = torch.eye(m, dtype=h0.dtype, device=h0.device).expand(B, m, m)
    G = eye.clone()
    for h, rl in zip(scores, r.to(h0), strict=True):
        step = torch.cat([h, torch.zeros_like(h[:, :1])], dim=1)  # (B, n+1, n+1) M h̃
        G = G @ (eye + rl * step)
    return G


def conditional_icl_loss(K_plus: Tensor, propagator: Tensor) -> Tensor:
    """E[(TF + y_q)² | X] = g_qᵀ K₊ g_q with g_q = G e_{n+1} (Lemma A.1): the in-context loss (5) of an A ≡ 0
    transformer, averaged exactly over the labels Y | X ~ N(0, K₊). (B, n+1, n+1) each -> (B,)."""
    g = propagator[..., -1]  # (B, n+1)
    return torch.einsum("bi,bij,bj->b", g, K_plus.to(g), g)


def fgd_propagator(fgd: FunctionalGD, episode: Episode) -> Tensor:
    """G for :class:`FunctionalGD` on ``episode`` (value steps r_ℓ = −r'_ℓ, its per-layer scores)."""
    x = episode.x
    targets = torch.cat([x, episode.x_query.unsqueeze(1)], dim=1)
    scores = [fgd.scores(x, targets, ell) for ell in range(len(fgd.step_sizes))]  # type: ignore[arg-type]  # a (L,) Tensor after __post_init__
    return label_propagator(scores, -fgd.step_sizes.to(x))  # type: ignore[union-attr]  # set by __post_init__


def fgd_icl_loss(fgd: FunctionalGD, episode: Episode) -> Tensor:
    """E[(y_q − f_L(x_q))² | X] per prompt, (B,), from the episode's ``task['K_plus']`` (Lemma A.1)."""
    K = episode.task.get("K_plus")
    if K is None:
        raise ValueError("fgd_icl_loss needs a GP episode whose task has 'K_plus' (tasks.GaussianProcess)")
    require(
        "fgd_icl_loss",
        "episode",
        K.shape[-1] == episode.n + 1,
        "an episode with all its n context pairs",
        "a cut episode",
    )
    return conditional_icl_loss(K, fgd_propagator(fgd, episode))


# --- Prop. 3.4 ------------------------------------------------------------------------------------
def max_stable_step(K_hat: Tensor) -> Tensor:
    """2/λ_max(K̂), (B,): constant-step FGD converges for 0 < δ < this (K̂ ≻ 0)."""
    return 2.0 / torch.linalg.eigvalsh(K_hat)[..., -1]


def convergence_factor(K_hat: Tensor, delta: Tensor | float) -> Tensor:
    """ρ = max_i |1 − δ λ_i(K̂)|, (B,): the gap of Prop. 3.4 shrinks like ρ^L."""
    evals = torch.linalg.eigvalsh(K_hat)
    d = torch.as_tensor(delta, dtype=evals.dtype, device=evals.device)
    return (1 - d.reshape(-1, 1) * evals).abs().amax(-1) if d.dim() else (1 - d * evals).abs().amax(-1)


def fgd_bayes_gap(K_hat: Tensor, nu: Tensor, y: Tensor, delta: Tensor | float, depths: Sequence[int]) -> Tensor:
    """f_L(x_q) − νᵀK̂⁻¹Ŷ for constant-step FGD (step δ, h̃ = K), at each depth L: (len(depths), B).

    f_L = δ νᵀ Σ_{m<L} (I − δK̂)^m Ŷ = νᵀK̂⁻¹(I − (I − δK̂)^L)Ŷ, so the gap is −Σ_i (νᵀu_i)(u_iᵀŶ)(1 − δλ_i)^L/λ_i
    (Prop. 3.4 / App. C, with the δ the paper drops restored). Exact for any L via one eigendecomposition.
    """
    evals, evecs = torch.linalg.eigh(K_hat)  # (B, n), (B, n, n)
    a = torch.einsum("bi,bij->bj", nu, evecs)  # νᵀu_j
    c = torch.einsum("bi,bij->bj", y, evecs)  # u_jᵀŶ
    d = torch.as_tensor(delta, dtype=evals.dtype, device=evals.device).reshape(-1, 1)
    factor = 1 - d * evals  # (B, n)
    out = [-(a * c * factor.pow(L) / evals).sum(-1) for L in depths]
    return torch.stack(out)


def episode_bayes_gap(
    episode: Episode,
    kernel: KernelLike,
    depths: Sequence[int],
    *,
    delta: Tensor | float | None = None,
    sigma: float = 1.0,
    transform: Tensor | None = None,
) -> Tensor:
    """:func:`fgd_bayes_gap` on an episode with kernel K on (T x_i): δ defaults to 1/λ_max(K̂) per prompt."""
    post = GaussianProcessPosterior(kernel, sigma=sigma, transform=transform)
    K = post.covariance(episode)
    n = episode.n
    K_hat = K[:, :n, :n]
    if delta is None:
        delta = 1.0 / torch.linalg.eigvalsh(K_hat)[:, -1]
    assert episode.y is not None  # the posterior's covariance needs a regression episode
    return fgd_bayes_gap(K_hat, K[:, :n, n], episode.y, delta, depths)


# --- Thm 4.5 / 4.6 ----------------------------------------------------------------------------------
def stationary_point(
    Sigma: Tensor,
    value_steps: Tensor,
    *,
    a: Tensor | None = None,
    b: Tensor | float = 1.0,
    c: Tensor | float = 1.0,
) -> dict[str, Tensor]:
    """Parameters of the Thm 4.5 (a = None: A ≡ 0) / Thm 4.6 family: per layer ℓ,
    r_ℓ (the paper's value entry), A_ℓ = a_ℓ I, B_ℓ = b_ℓ Σ^{-1/2}, C_ℓ = c_ℓ Σ^{-1/2}; V_ℓ = [[A_ℓ, 0], [0, r_ℓ]].
    Returns {"r": (L,), "A", "B", "C": (L, d, d), "V": (L, d+1, d+1)} in ``Sigma``'s dtype.

    Which point of the family is stationary depends on the data (the theorems show the infimum of the gradient
    norm over the family is 0); this builds the family, :func:`stationary_point_learner` evaluates it.
    """
    r = as_vector("stationary_point", "value_steps", value_steps).to(Sigma)
    L, d = len(r), Sigma.shape[-1]
    require("stationary_point", "Sigma", Sigma.shape == (d, d), "a (d, d) SPD matrix", tuple(Sigma.shape))

    def per_layer(field: str, v: Tensor | float) -> Tensor:
        t = torch.as_tensor(v, dtype=Sigma.dtype, device=Sigma.device).reshape(-1)
        require("stationary_point", field, t.numel() in (1, L), f"a float or a ({L},) tensor", tuple(t.shape))
        return t.expand(L)

    eye = torch.eye(d, dtype=Sigma.dtype, device=Sigma.device)
    root = sym_inv_sqrt(Sigma)
    A = (
        torch.zeros(L, d, d, dtype=Sigma.dtype, device=Sigma.device)
        if a is None
        else per_layer("a", a)[:, None, None] * eye
    )
    B = per_layer("b", b)[:, None, None] * root
    C = per_layer("c", c)[:, None, None] * root
    V = torch.zeros(L, d + 1, d + 1, dtype=Sigma.dtype, device=Sigma.device)
    V[:, :d, :d] = A
    V[:, d, d] = r
    return {"r": r, "A": A, "B": B, "C": C, "V": V}


def stationary_point_learner(
    kernel: KernelLike, params: dict[str, Tensor], *, sigma: float = 1.0, normalized: bool = False
) -> FunctionalGDPlusPlus:
    """The algorithm the eq.-(20) transformer computes at A_ℓ = a_ℓ I, B_ℓ, C_ℓ (eq. 58; eq. 17 when A ≡ 0):
    FGD++ with steps r'_ℓ = −r_ℓ, covariate steps a_ℓ and score maps (B_ℓ, C_ℓ). Softmax scores: pass
    ``kernel="softmax"`` (``normalized`` is for exp made into eq. (10))."""
    A = params["A"]
    a = torch.diagonal(A, dim1=-2, dim2=-1).mean(-1)
    require(
        "stationary_point_learner",
        "params['A']",
        bool(torch.allclose(A, a[:, None, None] * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device))),
        "a_ℓ I per layer",
        "a non-scalar A",
    )
    return FunctionalGDPlusPlus(
        kernel, -params["r"], a, sigma=sigma, normalized=normalized, transform=params["B"], target_transform=params["C"]
    )


def stationary_distance(B: Tensor, C: Tensor, Sigma: Tensor) -> Tensor:
    """dist(Σ^{1/2} B_ℓᵀ C_ℓ Σ^{1/2}, I) per layer, (L,): the Fig. 3/5/6 metric (0 on the Thm 4.5/4.6 family)."""
    half = sym_sqrt(Sigma.to(B))
    return dist_to_identity(half @ B.transpose(-1, -2) @ C @ half)
