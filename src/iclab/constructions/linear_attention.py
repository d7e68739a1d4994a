"""Weights that make the linear transformer implement an algorithm exactly.

Each function returns a :class:`~iclab.models.LinearTransformer` (in the dtype of its inputs)
whose ``predict`` equals the named algorithm's on every episode; the tests check this in float64
to 1e-10.
"""

from __future__ import annotations

import torch
from torch import Tensor

from iclab.core.errors import require
from iclab.core.numerics import as_vector
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig


def _build(config: LinearTransformerConfig, dtype: torch.dtype, **blocks: Tensor) -> LinearTransformer:
    model = LinearTransformer(config).to(dtype)
    return model.load_matrices(**blocks)


def pgd(preconditioners: Tensor) -> LinearTransformer:
    """Lemma 1 (Ahn et al. 2023, eq. 8-9): the eq.-(8) transformer with A_ℓ = Γ_ℓᵀ is L steps of PGD.

    With Attn = P Z M Zᵀ Q Z the query slot receives Σ_i y_i x_iᵀ A x_q, so the exact recursion is
    w ← w − A_ℓᵀ ∇R(w) (the paper prints A_ℓ; see docs/errata.md). ``preconditioners`` (L, d, d).
    """
    g = torch.as_tensor(preconditioners)
    require(
        "constructions.pgd",
        "preconditioners",
        g.dim() == 3 and g.shape[-1] == g.shape[-2],
        "an (L, d, d) tensor",
        tuple(g.shape),
    )
    cfg = LinearTransformerConfig(d=g.shape[-1], n_layers=g.shape[0], pattern="sparse", init_std=0.0)
    return _build(cfg, g.dtype, A=g.transpose(-1, -2))


def gd_plus_plus(step_sizes: Tensor, transforms: Tensor, preconditioner: Tensor) -> LinearTransformer:
    """Thm 4 / eq. (11): A_ℓ = −η_ℓ Γ, B_ℓ = (γ_ℓ/η_ℓ) I implements :class:`~iclab.algorithms.GDPlusPlus`.

    Needs η_ℓ ≠ 0 wherever γ_ℓ ≠ 0 (B_ℓ multiplies A_ℓ in the feature update).
    """
    eta = as_vector("constructions.gd_plus_plus", "step_sizes", step_sizes)
    gam = as_vector("constructions.gd_plus_plus", "transforms", transforms)
    require(
        "constructions.gd_plus_plus",
        "step_sizes",
        bool(((eta != 0) | (gam == 0)).all()),
        "non-zero wherever the transform γ_ℓ is non-zero",
        eta.tolist(),
    )
    g = torch.as_tensor(preconditioner)
    require(
        "constructions.gd_plus_plus",
        "preconditioner",
        g.dim() == 2 and g.shape[0] == g.shape[1],
        "a (d, d) tensor (torch.eye(d) for GD++)",
        tuple(g.shape),
    )
    preconditioner, d = g, g.shape[0]
    eye = torch.eye(d, dtype=preconditioner.dtype)
    A = -eta.to(preconditioner)[:, None, None] * preconditioner
    ratio = torch.where(eta != 0, gam / torch.where(eta != 0, eta, torch.ones_like(eta)), torch.zeros_like(eta))
    B = ratio.to(preconditioner)[:, None, None] * eye
    cfg = LinearTransformerConfig(d=d, n_layers=eta.numel(), pattern="pattern11", init_std=0.0)
    return _build(cfg, preconditioner.dtype, A=A, B=B)


def one_layer(preconditioner: Tensor, *, activation: str = "linear") -> LinearTransformer:
    """A 1-layer full-P/Q model with P = e_D e_Dᵀ, Q = −[[Γ, 0], [0, 0]] (eq. 6 with Γ = Γ⋆; eq. 7).

    Its prediction is one step of Γᵀ-preconditioned GD from 0, ⟨x_q, Γᵀ Xᵀy/n⟩ (linear), or the
    ReLU-attention read-out of Thm 5 with ``activation='relu'``.
    """
    g = torch.as_tensor(preconditioner)
    require(
        "constructions.one_layer",
        "preconditioner",
        g.dim() == 2 and g.shape[0] == g.shape[1],
        "a (d, d) tensor",
        tuple(g.shape),
    )
    d = g.shape[0]
    P = torch.zeros(1, d + 1, d + 1, dtype=g.dtype)
    P[0, -1, -1] = 1.0
    Q = torch.zeros(1, d + 1, d + 1, dtype=g.dtype)
    Q[0, :d, :d] = -g
    cfg = LinearTransformerConfig(d=d, n_layers=1, pattern="full", activation=activation, init_std=0.0)  # type: ignore[arg-type]  # activation: a str, checked by the config
    return _build(cfg, g.dtype, P=P, Q=Q)
