"""Numerical helpers shared by every layer: random rotations, matrix functions, distances."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from iclab.core.errors import require


def as_vector(owner: str, field: str, value: Tensor | float | Sequence[float], *, length: int | None = None) -> Tensor:
    """A non-empty, finite 1-D tensor of per-step values; Python numbers become float64 exactly (no
    float32 rounding of 0.1), tensors keep their dtype, a scalar becomes shape (1,). With ``length``,
    exactly that many entries."""
    t = value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=torch.float64)
    if t.dim() == 0:
        t = t.reshape(1)
    want = "a non-empty 1-D tensor of per-step values" + ("" if length is None else f" of length {length}")
    ok = t.dim() == 1 and t.numel() >= 1 and (length is None or t.numel() == length)
    require(owner, field, ok, want, tuple(t.shape))
    require(owner, field, bool(torch.isfinite(t).all()), "finite values", t.tolist())
    return t


def haar_orthogonal(
    d: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> Tensor:
    """A Haar-distributed orthogonal ``(d, d)`` matrix: QR of a Gaussian matrix with the sign fix.

    (Mezzadri 2007.) Without the sign fix ``diag(R) > 0`` the QR factor is not Haar.
    """
    device = device if device is not None else generator.device
    g = torch.randn(d, d, generator=generator, dtype=dtype, device=device)
    q: Tensor
    r: Tensor  # torch.linalg has no stubs: its functions return Any
    q, r = torch.linalg.qr(g)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def sym_sqrt(m: Tensor) -> Tensor:
    """Symmetric square root of a symmetric PSD matrix (batched over leading axes)."""
    evals: Tensor
    evecs: Tensor
    evals, evecs = torch.linalg.eigh(m)
    return (evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)) @ evecs.transpose(-1, -2)


def sym_inv_sqrt(m: Tensor) -> Tensor:
    """Inverse symmetric square root of a symmetric positive-definite matrix."""
    evals: Tensor
    evecs: Tensor
    evals, evecs = torch.linalg.eigh(m)
    return (evecs * evals.rsqrt().unsqueeze(-2)) @ evecs.transpose(-1, -2)


def dist_to_identity(m: Tensor) -> Tensor:
    """Dist(M, I) = min_α ‖M − αI‖_F / ‖M‖_F (Ahn et al. 2023, Sec. 4.3); batched over leading axes.

    The minimising α is tr(M)/d, so Dist = ‖M − (tr M/d) I‖_F / ‖M‖_F ∈ [0, 1]. It is invariant to
    scaling M and to orthogonal conjugation M → UᵀMU. A zero matrix has distance 1 by convention
    (nothing of it lies along I).
    """
    d = m.shape[-1]
    alpha = torch.diagonal(m, dim1=-2, dim2=-1).sum(-1) / d
    eye = torch.eye(d, dtype=m.dtype, device=m.device)
    resid = torch.linalg.matrix_norm(m - alpha[..., None, None] * eye)
    norm = torch.linalg.matrix_norm(m)
    return torch.where(norm > 0, resid / norm.clamp_min(torch.finfo(m.dtype).tiny), torch.ones_like(norm))


def congruence_dist_to_identity(m: Tensor) -> Tensor:
    """How far the congruence class {Mᵀ m M : M invertible} of a square ``m`` lies from a positive multiple of I,
    read in the basis where m's symmetric part is I.

    ``m`` is congruent to αI (α > 0) iff it is symmetric positive definite. With S and A its symmetric and
    antisymmetric parts and S ≻ 0, take M = S^{-1/2}: Mᵀ m M = I + A′, A′ = S^{-1/2} A S^{-1/2}, and the result is
    :func:`dist_to_identity` there, ‖A′‖_F / √(d + ‖A′‖_F²) (A′ is orthogonal to every symmetric matrix). It is
    invariant to m → Mᵀ m M for every invertible M (A′ changes by an orthogonal similarity only) and 0 exactly on
    the symmetric positive-definite matrices; in [0, 1), and 1 where S is not positive definite (no positive
    multiple of I is in reach; :func:`dist_to_identity`'s value for a matrix with nothing along I). Used where a
    learned matrix is identified only up to such a change of basis (wang2025.appf's E·D, whose learned embedding
    W_e absorbs any M). Batched over leading axes.
    """
    sym, anti = (m + m.mT) / 2, (m - m.mT) / 2
    root = sym_inv_sqrt(sym)  # S^{-1/2}: finite exactly when every eigenvalue of S is > 0 (else nan or inf)
    pd = torch.isfinite(root).all(-1).all(-1)
    a = torch.linalg.matrix_norm(root @ anti @ root)
    d = m.shape[-1]
    dist = a / torch.sqrt(d + a**2)
    return torch.where(pd, dist, torch.ones_like(dist))


def is_psd(m: Tensor, *, strict: bool = False, rtol: float = 1e-10) -> bool:
    """True when the symmetric matrix ``m`` (or every one in a batch) is PSD (PD with ``strict``)."""
    if m.shape[-1] != m.shape[-2]:
        return False
    if not torch.allclose(m, m.transpose(-1, -2), atol=rtol * max(1.0, float(m.abs().max()))):
        return False
    evals = torch.linalg.eigvalsh(m.to(torch.float64))
    scale = max(float(evals.abs().max()), 1e-300)
    return bool((evals > rtol * scale).all()) if strict else bool((evals >= -rtol * scale).all())
