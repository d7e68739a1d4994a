"""Kernel-attention weights that implement functional gradient descent (Cheng, Chen, Sra 2024).

Each function returns a :class:`~iclab.models.KernelTransformer` (float64 unless the inputs say
otherwise) whose ``predict`` equals :class:`iclab.algorithms.FunctionalGD` on every episode, and
whose label row holds the residuals y_i − f_ℓ(x_i) after every layer (eq. 22). The tests check both
in float64 to 1e-10.

* :func:`functional_gd` — Prop. 3.1 (eq. 8-9): V_ℓ = [[0, 0], [0, −r_ℓ]], B_ℓ = C_ℓ = I, h̃ = K;
  with ``normalized=True`` the softmax construction of eq. (10); with ``transform`` T the
  Thm-4.5 form B_ℓ = C_ℓ = T (T = Σ^{-1/2}: FGD in the RKHS of K(Σ^{-1/2}·, Σ^{-1/2}·)).
* :func:`stationary_point` — the sets S of Thm 4.5 (A_ℓ = 0) and Thm 4.6 (A_ℓ = a_ℓI) with
  B_ℓ = b_ℓΣ^{-1/2}, C_ℓ = c_ℓΣ^{-1/2}, returned with the algorithm they compute (FGD with
  h̃(bΣ^{-1/2}·, cΣ^{-1/2}·), eq. 17; its covariate-moving form, eq. 58).
* :func:`functional_gd_multihead` — Prop. D.1: head s has h̃^s = K^s and B^s = C^s = G^s, one
  step r_ℓ for all heads: FGD in the RKHS of K◇ = Σ_s K^s(G^s·, G^s·).

Bandwidths σ and weights α of :class:`~iclab.core.kernels.Kernel` terms are folded into the
weights: exp(uᵀw/σ²) = exp((u/σ)ᵀ(w/σ)) gives B = C = G/σ, and α scales the head's step, so every
model runs with the config's σ = 1 and heads may carry different bandwidths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

import torch
from torch import Tensor

from iclab.algorithms.functional_gd import FunctionalGD, FunctionalGDPlusPlus
from iclab.core.errors import require
from iclab.core.kernels import CompositeKernel, Kernel, KernelName
from iclab.core.numerics import as_vector, sym_inv_sqrt
from iclab.models.kernel_attention import KernelTransformer, KernelTransformerConfig

#: Kernels a head can realise exactly: h̃ ∈ {linear, relu, exp} (softmax via ``normalized``).
HEAD_KERNELS = ("linear", "relu", "exp")


def _terms(owner: str, kernel: str | Kernel | CompositeKernel | Sequence[Kernel], sigma: float) -> tuple[Kernel, ...]:
    if isinstance(kernel, str):
        require(
            owner, "kernel", kernel in HEAD_KERNELS, f"one of {HEAD_KERNELS}, a Kernel or a CompositeKernel", kernel
        )
        return (Kernel(cast(KernelName, kernel), sigma=float(sigma)),)  # a head kernel: checked above
    if isinstance(kernel, Kernel):
        terms: tuple[Kernel, ...] = (kernel,)
    elif isinstance(kernel, CompositeKernel):
        terms = kernel.terms
    else:
        terms = tuple(kernel)
    bad = [t.name for t in terms if not isinstance(t, Kernel) or t.name not in HEAD_KERNELS]
    require(owner, "kernel", bool(terms) and not bad, f"kernels from {HEAD_KERNELS} (one head each)", bad or kernel)
    return terms


def _build(
    terms: tuple[Kernel, ...], steps: Tensor, d: int, *, normalized: bool, pre: Tensor | None = None
) -> KernelTransformer:
    """Heads h̃^s = K^s, V^s_ℓ = [[0,0],[0,−α_s r_ℓ]], B^s = C^s = G^s P/σ_s with P = ``pre`` (or I)."""
    dtype = steps.dtype if steps.is_floating_point() else torch.float64
    L = steps.numel()
    acts = tuple("softmax" if normalized else t.name for t in terms)
    cfg = KernelTransformerConfig(d=d, n_layers=L, activations=acts, value="label", init_std=0.0)
    eye = torch.eye(d, dtype=dtype)
    Bs, rs = [], []
    for t in terms:
        G = eye if t.transform is None else t.transform.to(dtype)
        require(
            "constructions.functional_gd", "transform", tuple(G.shape) == (d, d), f"a ({d}, {d}) matrix", tuple(G.shape)
        )
        if pre is not None:
            G = G @ pre.to(dtype)
        Bs.append(G / t.sigma if t.name == "exp" else G)
        rs.append(-(1.0 if normalized else float(t.weight)) * steps.to(dtype))  # α cancels in eq. (10)
    B = torch.stack(Bs).unsqueeze(0).expand(L, -1, -1, -1)  # (L, H, d, d)
    r = torch.stack(rs, dim=1)  # (L, H)
    model = KernelTransformer(cfg).to(dtype)
    return model.load_matrices(r=r, B=B, C=B.clone())


def functional_gd(
    kernel: str | Kernel | CompositeKernel | Sequence[Kernel],
    step_sizes: Tensor | Sequence[float],
    *,
    d: int | None = None,
    sigma: float = 1.0,
    normalized: bool = False,
    transform: Tensor | None = None,
) -> KernelTransformer:
    """Prop. 3.1: the L-layer model with V_ℓ = [[0,0],[0,−r_ℓ]], B_ℓ = C_ℓ = T (I by default), h̃ = K.

    Its prediction after ℓ layers is f_ℓ(x_q) of f_{ℓ+1} = f_ℓ + r_ℓ Σ_i (y_i − f_ℓ(x_i)) K(T x_i, T ·)
    (eq. 9), and the demonstrations' label slots hold y_i − f_ℓ(x_i) (eq. 22). ``normalized=True``
    (exp only) uses softmax attention: the τ-normalised update of eq. (10). ``kernel`` is a name
    from {linear, relu, exp} (with ``sigma``), a :class:`Kernel` (its σ, weight α and map G are used:
    B = C = G T/σ, r scaled by α) or several (Prop. D.1, see :func:`functional_gd_multihead`).
    ``d`` is needed only when neither ``transform`` nor a kernel's map fixes it.
    """
    owner = "constructions.functional_gd"
    steps = as_vector(owner, "step_sizes", step_sizes)
    terms = _terms(owner, kernel, sigma)
    require(
        owner,
        "normalized",
        not normalized or (len(terms) == 1 and terms[0].name == "exp"),
        "False unless the kernel is a single exp (eq. 10 is one softmax head on the exp kernel)",
        normalized,
    )
    if transform is not None:
        transform = torch.as_tensor(transform)
        require(
            owner,
            "transform",
            transform.dim() == 2 and transform.shape[0] == transform.shape[1],
            "a (d, d) matrix",
            tuple(transform.shape),
        )
    dims = {int(t.transform.shape[-1]) for t in terms if t.transform is not None}
    if transform is not None:
        dims.add(int(transform.shape[-1]))
    if d is not None:
        dims.add(int(d))
    require(owner, "d", len(dims) <= 1, "consistent with every transform", sorted(dims))
    return _build(terms, steps, dims.pop() if dims else _default_d(owner), normalized=normalized, pre=transform)


def _default_d(owner: str) -> int:
    require(owner, "d", False, "given when no transform fixes the input dimension", None)
    raise AssertionError  # unreachable


def functional_gd_multihead(
    kernels: CompositeKernel | Sequence[Kernel], step_sizes: Tensor | Sequence[float], *, d: int | None = None
) -> KernelTransformer:
    """Prop. D.1(A): one head per term K^s(G^s·, G^s·) of K◇, common steps r_ℓ: FGD in the RKHS of K◇."""
    return functional_gd(kernels, step_sizes, d=d)


def stationary_point(
    kernel: str,
    step_sizes: Tensor | Sequence[float],
    Sigma: Tensor,
    b: Tensor | Sequence[float] | float,
    c: Tensor | Sequence[float] | float,
    *,
    covariate_steps: Tensor | Sequence[float] | None = None,
    sigma: float = 1.0,
) -> tuple[KernelTransformer, FunctionalGD | FunctionalGDPlusPlus]:
    """A point of Thm 4.5's / Thm 4.6's set S and the algorithm it computes.

    B_ℓ = b_ℓΣ^{-1/2}, C_ℓ = c_ℓΣ^{-1/2}, V_ℓ = [[a_ℓI, 0], [0, −r'_ℓ]] with h̃ = ``kernel`` (linear,
    relu, exp or softmax, bandwidth ``sigma``); a_ℓ = 0 (``covariate_steps=None``, Thm 4.5) gives
    functional GD with h̃_i(x) = h̃(b_ℓΣ^{-1/2}x_i, c_ℓΣ^{-1/2}x) (eq. 17; for exp, b_ℓc_ℓ is an inverse
    bandwidth of the whitened kernel), and a_ℓ ≠ 0 (Thm 4.6) the covariate-moving algorithm of eq. (58).
    Returns ``(model, algorithm)`` with equal predictions; softmax is the normalised exp update (10).
    """
    owner = "constructions.stationary_point"
    acts = ("linear", "relu", "exp", "softmax")
    require(owner, "kernel", kernel in acts, f"one of {acts}", kernel)
    r = as_vector(owner, "step_sizes", step_sizes)
    dtype = Sigma.dtype
    L, d = r.numel(), Sigma.shape[-1]

    def per_layer(field: str, v: object) -> Tensor:
        t = torch.as_tensor(v, dtype=dtype).reshape(-1)
        require(owner, field, t.numel() in (1, L), f"a scalar or {L} values (one per layer)", tuple(t.shape))
        return t.expand(L)

    bv, cv = per_layer("b", b), per_layer("c", c)
    W = sym_inv_sqrt(Sigma)
    B, C = bv[:, None, None] * W, cv[:, None, None] * W  # (L, d, d)
    value: Literal["label", "sparse"] = "label" if covariate_steps is None else "sparse"
    cfg = KernelTransformerConfig(d=d, n_layers=L, activations=(kernel,), value=value, sigma=sigma, init_std=0.0)
    model = KernelTransformer(cfg).to(dtype)
    blocks = dict(r=-r.to(dtype)[:, None], B=B, C=C)
    name = cast(KernelName, "exp" if kernel == "softmax" else kernel)  # checked against acts above
    common: dict[str, Any] = dict(sigma=sigma, normalized=kernel == "softmax", transform=B, target_transform=C)
    if covariate_steps is None:
        model.load_matrices(**blocks)
        return model, FunctionalGD(name, r.to(dtype), **common)
    a = per_layer("covariate_steps", covariate_steps)
    model.load_matrices(A=a[:, None, None] * torch.eye(d, dtype=dtype), **blocks)
    return model, FunctionalGDPlusPlus(name, r.to(dtype), a, **common)
