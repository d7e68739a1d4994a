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
exp           exp(sᵀt / σ²)                                eq. (11) with σ (= 1 in the paper)
rbf           exp(−‖s − t‖² / (2σ²))                       Wang et al. 2025, App. F
laplacian     exp(−‖s − t‖₁ / σ)                           Wang et al. 2025, App. F (ℓ₁ distance)
softmax       exp(sᵀt / σ²) / Σ_i' exp(s_i'ᵀt / σ²)         eq. (12): normalised over the sources, per
                                                           target (column); not a kernel
============  ===========================================  ==========================================
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from iclab.core.errors import require, require_shape

KernelName = Literal["linear", "relu", "exp", "rbf", "laplacian", "softmax"]
KERNELS: tuple[str, ...] = ("linear", "relu", "exp", "rbf", "laplacian", "softmax")


def gram(
    kernel: KernelName,
    sources: Tensor,
    targets: Tensor,
    *,
    sigma: float = 1.0,
    source_mask: Tensor | None = None,
) -> Tensor:
    """[κ(s_i, t_j)]_{ij}: (…, m, d) sources, (…, k, d) targets -> (…, m, k).

    ``source_mask`` (…, m) bool, optional: sources that are False get weight 0 (and, for softmax, are
    left out of the normalisation), e.g. the query token, which is never a source (the paper's M).
    """
    require("gram", "kernel", kernel in KERNELS, f"one of {KERNELS}", kernel)
    require("gram", "sigma", float(sigma) > 0, "a float > 0", sigma)
    require_shape("gram", "targets", tuple(targets.shape), (*sources.shape[:-2], None, sources.shape[-1]))
    if kernel in ("linear", "relu", "exp", "softmax"):
        inner = sources @ targets.transpose(-1, -2)  # (…, m, k)
        if kernel == "linear":
            out = inner
        elif kernel == "relu":
            out = torch.relu(inner)
        elif kernel == "exp":
            out = torch.exp(inner / sigma**2)
        else:
            logits = inner / sigma**2
            if source_mask is not None:
                logits = logits.masked_fill(~source_mask.unsqueeze(-1), float("-inf"))
            return torch.softmax(logits, dim=-2)
    elif kernel == "rbf":
        sq = (sources.unsqueeze(-2) - targets.unsqueeze(-3)).pow(2).sum(-1)  # (…, m, k)
        out = torch.exp(-sq / (2 * sigma**2))
    else:  # laplacian
        l1 = (sources.unsqueeze(-2) - targets.unsqueeze(-3)).abs().sum(-1)
        out = torch.exp(-l1 / sigma)
    if source_mask is not None:
        out = out * source_mask.unsqueeze(-1).to(out.dtype)
    return out
