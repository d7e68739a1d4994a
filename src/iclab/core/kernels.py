"""Kernels and attention score functions: the one kernel module of iclab.

One function, :func:`gram`, gives the (…, m, k) matrix of κ(s_i, t_j) between m *sources* (keys,
context tokens) and k *targets* (queries) — the layout of the paper's h̃(U, W)_{ij}: row i is the
source, column j the target (Cheng, Chen, Sra 2024, eq. (2)-(3), (12)). It serves as

* the attention scores h̃ of non-linear attention (models),
* the kernel of functional gradient descent (algorithms), and
* the covariance of Gaussian-process tasks (tasks).

Kernels (σ = ``sigma``; all are functions of the pair, none of the position):

============  ===========================================  ==========================================
name          κ(s, t)                                      notes
============  ===========================================  ==========================================
linear        sᵀt                                          Cheng et al. eq. (11); Ex. 1
relu          max(sᵀt, 0)                                  eq. (11); Ex. 2 (not PSD)
exp           exp(sᵀt / σ²)                                eq. (11) with σ (= 1 in the paper; the
                                                           authors' code uses σ² = 2)
rbf           exp(−‖s − t‖² / (2σ²))                       Wang et al. 2025, App. F
laplacian     exp(−‖s − t‖₁ / σ)                           Wang et al. 2025, App. F (ℓ₁ distance; not
                                                           rotation invariant)
arccos        ‖s‖‖t‖ (sin φ + (π − φ) cos φ) / (2π)        first-order arc-cosine kernel, φ = ∠(s, t):
                                                           E_w[relu(wᵀs) relu(wᵀt)], w ~ N(0, I)
                                                           (Cheng et al. Ex. 8 with m = 1; Cho & Saul
                                                           2009); σ is ignored
softmax       exp(sᵀt / σ²) / Σ_i' exp(s_i'ᵀt / σ²)         eq. (12): normalised over the sources, per
                                                           target (column); not a kernel
============  ===========================================  ==========================================

On top of :func:`gram`:

* :class:`Kernel` — a named kernel with a bandwidth σ, a weight and an optional linear map G,
  κ(s, t) = weight · gram(name, G s, G t); callable like ``gram`` without the name.
* :class:`CompositeKernel` — a sum of :class:`Kernel` terms, the K◇ of Cheng et al. Prop. D.1,
  K◇(u, v) = Σ_s K^s(G^s u, G^s v) (one head per term, App. D).
* :func:`positive_part` — K₊ = U|D|Uᵀ of a symmetric matrix K = UDUᵀ (Cheng et al. Def. 3.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from iclab.core.errors import require, require_shape

KernelName = Literal["linear", "relu", "exp", "rbf", "laplacian", "arccos", "softmax"]
KERNELS: tuple[str, ...] = ("linear", "relu", "exp", "rbf", "laplacian", "arccos", "softmax")
#: Kernels whose Gram matrix is positive semi-definite on any point set.
PSD_KERNELS: tuple[str, ...] = ("linear", "exp", "rbf", "laplacian", "arccos")
#: Score functions that depend on the points only through sᵀt, so h̃(Sᵀ·, S⁻¹·) = h̃ (Cheng et al. Asm. 4.3).
INNER_PRODUCT_KERNELS: tuple[str, ...] = ("linear", "relu", "exp", "softmax")


def gram(
    kernel: KernelName,
    sources: Tensor,
    targets: Tensor,
    *,
    sigma: float = 1.0,
    source_mask: Tensor | None = None,
    logit_cap: float | None = None,
) -> Tensor:
    """[κ(s_i, t_j)]_{ij}: (…, m, d) sources, (…, k, d) targets -> (…, m, k).

    ``source_mask`` (…, m) bool, optional: sources that are False get weight 0 (and, for softmax, are
    left out of the normalisation), e.g. the query token, which is never a source (the paper's M).
    ``logit_cap`` (exp only): exp(min(sᵀt/σ², cap)), an overflow guard that is exact below the cap.
    """
    require("gram", "kernel", kernel in KERNELS, f"one of {KERNELS}", kernel)
    require("gram", "sigma", float(sigma) > 0, "a float > 0", sigma)
    require("gram", "logit_cap", logit_cap is None or kernel == "exp", "None unless kernel is 'exp'", logit_cap)
    require_shape("gram", "targets", tuple(targets.shape), (*sources.shape[:-2], None, sources.shape[-1]))
    if kernel == "softmax":
        # computed as (…, k, m) and returned as its transposed view, so that the normalisation over the
        # sources runs along contiguous memory (a strided softmax over dim −2 costs ~3× more, forward and back)
        logits = targets @ sources.mT.contiguous()  # a contiguous right operand: ~1.5× faster batched GEMM on CPU
        if source_mask is not None:
            logits = logits.masked_fill(~source_mask.unsqueeze(-2), float("-inf"))
        return inner_product_scores("softmax", logits, sigma=sigma).transpose(-1, -2)
    if kernel in ("linear", "relu", "exp", "arccos"):
        inner = sources @ targets.transpose(-1, -2)  # (…, m, k)
        if kernel == "arccos":
            out = _arccos1(inner, sources.norm(dim=-1).unsqueeze(-1) * targets.norm(dim=-1).unsqueeze(-2))
        else:  # inner is fresh: without autograd its scores go in place
            out = inner_product_scores(
                kernel, inner, sigma=sigma, logit_cap=logit_cap, source_dim=-2, in_place=not inner.requires_grad
            )
    elif kernel == "rbf":
        # ‖s − t‖² = ‖s‖² + ‖t‖² − 2 sᵀt: one batched matmul, no (…, m, k, d) difference tensor
        sq = sources.pow(2).sum(-1).unsqueeze(-1) + targets.pow(2).sum(-1).unsqueeze(-2)
        sq = (sq - 2 * sources @ targets.transpose(-1, -2)).clamp_min(0)  # (…, m, k)
        out = torch.exp(-sq / (2 * sigma**2))
    else:  # laplacian
        l1 = (sources.unsqueeze(-2) - targets.unsqueeze(-3)).abs().sum(-1)
        out = torch.exp(-l1 / sigma)
    if source_mask is not None:
        out = out * source_mask.unsqueeze(-1).to(out.dtype)
    return out


def inner_product_scores(
    kernel: str,
    inner: Tensor,
    *,
    sigma: float = 1.0,
    logit_cap: float | None = None,
    source_dim: int = -1,
    in_place: bool = False,
) -> Tensor:
    """κ from the inner products sᵀt alone, for the kernels of :data:`INNER_PRODUCT_KERNELS`: sᵀt (linear),
    relu(sᵀt), exp(min(sᵀt/σ², cap)), and softmax(sᵀt/σ²) normalised over the sources, the axis ``source_dim``
    of ``inner``. :func:`gram` and the attention update (:func:`iclab.models.attention_core.attention_update`),
    which forms its inner products in its own layout, both score through this one function.

    ``in_place``: relu and exp write over ``inner`` (a fresh tensor that nothing else reads, no autograd): the same
    operations and bits without a new tensor per operation (115 MB each at Cheng et al.'s 30 000 prompts of n = 30 in
    float32, where most of an elementwise pass's time on a CPU is the first touch of fresh pages)."""
    if kernel == "linear":
        return inner
    if kernel == "relu":
        return inner.relu_() if in_place else torch.relu(inner)
    in_place = in_place and kernel == "exp"
    logits = inner if sigma == 1.0 else inner.div_(sigma**2) if in_place else inner / sigma**2
    if kernel == "exp":
        if logit_cap is not None:
            logits = logits.clamp_(max=logit_cap) if in_place else logits.clamp(max=logit_cap)
        return logits.exp_() if in_place else torch.exp(logits)
    require("inner_product_scores", "kernel", kernel == "softmax", f"one of {INNER_PRODUCT_KERNELS}", kernel)
    return torch.softmax(logits, dim=source_dim)


def _arccos1(inner: Tensor, norms: Tensor) -> Tensor:
    """‖s‖‖t‖ (sin φ + (π − φ) cos φ) / (2π) from sᵀt and ‖s‖‖t‖ (zero where either point is 0)."""
    safe = norms.clamp_min(torch.finfo(norms.dtype).tiny)
    cos = (inner / safe).clamp(-1.0, 1.0)
    phi = torch.arccos(cos)
    sin = torch.sqrt((1 - cos * cos).clamp_min(0))
    return torch.where(norms > 0, norms * (sin + (math.pi - phi) * cos) / (2 * math.pi), torch.zeros_like(inner))


def positive_part(K: Tensor) -> Tensor:
    """K₊ = U|D|Uᵀ for symmetric K = UDUᵀ, batched over leading axes (Cheng et al. Def. 3.3).

    The eigenvalues' absolute values, not their positive parts: a negative eigenvalue is flipped, not
    dropped. K₊ = K when K is PSD (up to rounding); K₊ is always PSD. ``K`` is symmetrised first.
    """
    require_shape("positive_part", "K", tuple(K.shape), (*K.shape[:-2], K.shape[-1], K.shape[-1]))
    evals: Tensor
    evecs: Tensor  # torch.linalg has no stubs: its functions return Any
    evals, evecs = torch.linalg.eigh((K + K.transpose(-1, -2)) / 2)
    return (evecs * evals.abs().unsqueeze(-2)) @ evecs.transpose(-1, -2)


@dataclass(frozen=True)
class Kernel:
    """κ(s, t) = weight · gram(name, G s, G t; σ): a named kernel, its bandwidth, weight and map G.

    ``transform`` G is a (d', d) matrix applied to both points (Cheng et al. Prop. D.1 G^s; Thm 4.5's
    Σ^{-1/2}); None means the identity. ``softmax`` stays normalised over the sources after G and
    before the weight. Call it like :func:`gram` without the name: ``Kernel("exp")(sources, targets)``.
    """

    name: KernelName = "exp"
    sigma: float = 1.0
    weight: float = 1.0
    transform: Tensor | None = None  # (d', d) G

    def __post_init__(self) -> None:
        require(self, "name", self.name in KERNELS, f"one of {KERNELS}")
        require(self, "sigma", float(self.sigma) > 0, "a float > 0")
        require(self, "weight", math.isfinite(float(self.weight)), "a finite float")
        if self.transform is not None:
            require(
                self, "transform", self.transform.dim() == 2, "a (d', d) matrix or None", tuple(self.transform.shape)
            )

    @property
    def is_psd(self) -> bool:
        """Whether every Gram matrix of this kernel is PSD (a non-negative weight on a PSD kernel)."""
        return self.name in PSD_KERNELS and float(self.weight) >= 0

    def map(self, points: Tensor) -> Tensor:
        """G applied to (…, m, d) points (rows): (…, m, d')."""
        if self.transform is None:
            return points
        G = self.transform.to(points)
        require(
            "Kernel",
            "transform",
            G.shape[-1] == points.shape[-1],
            f"(d', {points.shape[-1]}) to match the points",
            tuple(G.shape),
        )
        return points @ G.T

    def __call__(self, sources: Tensor, targets: Tensor, *, source_mask: Tensor | None = None) -> Tensor:
        out = gram(self.name, self.map(sources), self.map(targets), sigma=self.sigma, source_mask=source_mask)
        if float(self.weight) == 1.0:
            return out
        return out.mul_(float(self.weight)) if not out.requires_grad else float(self.weight) * out


@dataclass(frozen=True)
class CompositeKernel:
    """K◇(u, v) = Σ_s K^s(G^s u, G^s v): the multi-head kernel of Cheng et al. Prop. D.1 (eq. 28).

    Each term is a :class:`Kernel` (its weight α_s and map G^s included). Fig. 4(c) is
    ``CompositeKernel((Kernel("linear", weight=.5, transform=G1), Kernel("exp", weight=.5, transform=G2)))``.
    """

    terms: tuple[Kernel, ...]

    def __post_init__(self) -> None:
        terms = tuple(self.terms) if isinstance(self.terms, (tuple, list)) else ()
        require(
            self, "terms", len(terms) >= 1 and all(isinstance(t, Kernel) for t in terms), "a non-empty tuple of Kernel"
        )
        object.__setattr__(self, "terms", terms)

    @property
    def is_psd(self) -> bool:
        return all(t.is_psd for t in self.terms)

    def __call__(self, sources: Tensor, targets: Tensor, *, source_mask: Tensor | None = None) -> Tensor:
        out = self.terms[0](sources, targets, source_mask=source_mask)
        for term in self.terms[1:]:
            out = out + term(sources, targets, source_mask=source_mask)
        return out


KernelLike = KernelName | Kernel | CompositeKernel


def as_kernel(owner: str, kernel: KernelLike | Sequence[Kernel], sigma: float = 1.0) -> Kernel | CompositeKernel:
    """A kernel name (with ``sigma``), a :class:`Kernel`, a :class:`CompositeKernel` or a sequence of
    :class:`Kernel` terms, as a callable kernel; anything else is a ``ConfigError`` naming ``owner``."""
    if isinstance(kernel, (Kernel, CompositeKernel)):
        return kernel
    if isinstance(kernel, str):
        require(owner, "kernel", kernel in KERNELS, f"one of {KERNELS}, a Kernel or a CompositeKernel", kernel)
        require(owner, "sigma", float(sigma) > 0, "a float > 0", sigma)
        return Kernel(kernel, sigma=float(sigma))
    if isinstance(kernel, (tuple, list)) and kernel and all(isinstance(t, Kernel) for t in kernel):
        return CompositeKernel(tuple(kernel))
    require(owner, "kernel", False, f"one of {KERNELS}, a Kernel or a CompositeKernel", kernel)
    raise AssertionError  # unreachable: require raised


def uses_softmax(kernel: Kernel | CompositeKernel) -> bool:
    """Whether any term is the (non-kernel) softmax score."""
    terms = kernel.terms if isinstance(kernel, CompositeKernel) else (kernel,)
    return any(t.name == "softmax" for t in terms)
