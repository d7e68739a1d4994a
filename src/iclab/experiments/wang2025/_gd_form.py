"""The GD form inside the Trained TF (Wang et al. 2025, §3.4, §5, App. F and I): the free skeleton holding the GD
construction, how far head 1 of a free model (or a single-step Trained TF, App. F) is from that form, and the Q/K
gradient there."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from iclab.constructions.categorical_attention import gd_form
from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.core.numerics import congruence_dist_to_identity, dist_to_identity
from iclab.core.seeding import generator
from iclab.experiments.wang2025._setup import ce_loss
from iclab.models.categorical_attention import CategoricalTransformer, Erasure, SingleStepCategorical, _FreeBlock


def gd_init_model(gd: CategoricalTransformer) -> CategoricalTransformer:
    """The Trained-TF skeleton (``mode='free'``) holding the GD construction of a GD-mode model (eq. 26-44).

    Head 1: W_Q = W_K = a[I_d 0], P·W_V = diag(α_k)(U − E) → F; head 2: W_Q = W_K = λ[I_d 0] (λ = 1e5), −E → E;
    cross-attention: f → E(w_e)|_f; W_e copied. With one block, head 2 is the Trained TF's ordinary kernel head
    (erasure 'kernel', the skeleton of Fig. 2): its output lands in E slots that the readout never reads, so the
    model equals GD whatever that head computes. With K >= 2 blocks the context E slots are read, so head 2 is
    the exact RBF erasure head (erasure 'rbf'; the dot-product softmax head is wrong on ~12% of cube rows,
    docs/errata.md), with W_Q, W_K still free parameters.
    """
    cfg = gd.config
    require("gd_init_model", "gd", cfg.mode == "gd", "a mode='gd' CategoricalTransformer", cfg.mode)
    dtype = gd.W_free.dtype
    exact = CategoricalTransformer(dataclasses.replace(cfg, erasure="rbf"), generator=generator(0)).to(dtype)
    exact.load_state_dict(gd.state_dict())
    form = gd_form(exact)
    erasure: Erasure = "kernel" if cfg.n_blocks == 1 else "rbf"
    tf = CategoricalTransformer(dataclasses.replace(form.config, erasure=erasure), generator=generator(0)).to(dtype)
    tf.load_state_dict(form.state_dict())
    return tf


@dataclass
class GdForm:
    """How far a single-step Trained TF is from the GD form (App. F, Fig. 9; §3.4): relative deviation from a multiple
    of I of AᵀB (Q/K x-blocks) and E·D (P·W_V U → f), Q/K leakage onto non-x inputs, ‖P outside f‖/‖P‖.

    E·D is identified only up to congruence (the learned W_e absorbs any change of basis M:
    ``SingleStepCategorical.change_embedding_basis``), so the claim reads ``ED_congruence``, the distance of its
    congruence class from a positive multiple of I (``core.numerics.congruence_dist_to_identity``); ``ED`` is the
    matrix as Figs 8-9 draw it, in the basis training happened to leave."""

    AtB: float
    ED: float
    ED_congruence: float
    qk_leakage: float
    P_outside_f: float


def gd_form_metrics(model: SingleStepCategorical) -> GdForm:
    """App. F, Fig. 9: rel. deviation from a multiple of I of AᵀB (Q/K x-blocks) and E·D (P·W_V U → F), leakage."""
    d, dp = model.config.d, model.config.d_embed
    WQ, WK, WV, P = (m.detach().double() for m in (model.W_Q, model.W_K, model.W_V, model.P))
    A, B = WQ[:, :d], WK[:, :d]
    gamma = P[-dp:, :] @ WV[:, d : d + dp]  # E · D
    leak = (torch.cat([WQ[:, d:], WK[:, d:]]).norm() / torch.cat([A, B]).norm()).item()
    p_out = (P[:-dp].norm() / P.norm()).item()
    return GdForm(
        AtB=dist_to_identity(A.T @ B).item(),
        ED=dist_to_identity(gamma).item(),
        ED_congruence=congruence_dist_to_identity(gamma).item(),
        qk_leakage=leak,
        P_outside_f=p_out,
    )


def _blocks(model: CategoricalTransformer) -> Sequence[_FreeBlock]:
    """A free model's blocks, typed (an ``nn.ModuleList``'s items are typed ``nn.Module``)."""
    return cast("Sequence[_FreeBlock]", model.blocks)


def _qk_x_blocks(model: CategoricalTransformer) -> tuple[Tensor, Tensor]:
    """Head 1's (kernel head's) x columns A = W_Q[:, x], B = W_K[:, x] of every block, (K, D, d) each, float64."""
    d = model.config.d
    A = torch.stack([blk.W_Q[0, :, :d] for blk in _blocks(model)]).detach().double()
    B = torch.stack([blk.W_K[0, :, :d] for blk in _blocks(model)]).detach().double()
    return A, B


def qk_form_metrics(model: CategoricalTransformer, init: CategoricalTransformer | None = None) -> dict[str, Tensor]:
    """How far head 1 of each block of a free model is from the GD form (§3.4, §5), (K,) tensors.

    ``qk_rel_dev``: dist_to_identity(AᵀB) = ‖AᵀB − (tr/d)I‖_F/‖AᵀB‖_F, A = W_Q[:, x], B = W_K[:, x] (0 at the
    GD form a²I); ``qk_leak``: ‖W_{Q,K}[:, non-x]‖_F / ‖W_{Q,K}[:, x]‖_F (0 at the GD form). With ``init``:
    ``qk_drift`` ‖AᵀB − A₀ᵀB₀‖_F/‖A₀ᵀB₀‖_F and ``value_drift`` the same for P·W_V's F ← U block (diag(α_k))."""
    d, dp = model.config.d, model.config.d_embed
    A, B = _qk_x_blocks(model)
    M = A.mT @ B  # (K, d, d)
    rest = torch.stack([torch.cat([blk.W_Q[0, :, d:], blk.W_K[0, :, d:]]) for blk in _blocks(model)]).detach().double()
    out = {
        "qk_rel_dev": dist_to_identity(M),
        "qk_leak": rest.flatten(1).norm(dim=1) / torch.cat([A, B], 1).flatten(1).norm(dim=1),
    }
    if init is not None:
        A0, B0 = _qk_x_blocks(init)
        M0 = A0.mT @ B0
        out["qk_drift"] = (M - M0).flatten(1).norm(dim=1) / M0.flatten(1).norm(dim=1)

        def value(m: CategoricalTransformer) -> Tensor:  # (K, d', d'): F ← U block of P₁ W_V,₁
            return torch.stack([(blk.P[0] @ blk.W_V[0])[-dp:, d : d + dp] for blk in _blocks(m)]).detach().double()

        V, V0 = value(model), value(init)
        out["value_drift"] = (V - V0).flatten(1).norm(dim=1) / V0.flatten(1).norm(dim=1)
    return out


def qk_gradient_metrics(model: CategoricalTransformer, episodes: Episode, groups: int, chunk: int = 256) -> dict:
    """The query-CE gradient w.r.t. head 1's x-blocks W_Q[x, x], W_K[x, x] of each block (§5, App. I eq. 57).

    The contexts are split into ``groups`` equal groups; G_g is the gradient of group g's mean loss and Ḡ their
    mean (the gradient on all contexts). Theorem 2 says the population gradient at W_Q = W_K = aI is t·I; a
    finite batch adds sampling noise, so besides ``rel_dev`` = dist_to_identity(Ḡ) this returns the split
    Ḡ = t̄ I + R̄ (t = tr/d) with standard errors across groups: ``off`` ‖R̄‖_F, ``off_se`` (Σ_g ‖R_g − R̄‖²_F
    / (g(g−1)))^½, ``id`` t̄, ``id_se``, ``norm`` ‖Ḡ‖_F, and ``grad`` Ḡ itself. Leading axes (K, 2) = (block,
    Q/K). Computed in float64 on a copy of the model.
    """
    require(
        "qk_gradient_metrics",
        "groups",
        groups >= 2 and episodes.batch_size % groups == 0,
        f"an int >= 2 dividing the batch ({episodes.batch_size})",
        groups,
    )
    m = copy_f64(model)
    d, per = m.config.d, episodes.batch_size // groups
    params = [blk.W_Q for blk in _blocks(m)] + [blk.W_K for blk in _blocks(m)]
    K = len(m.blocks)
    ep = episodes.to(dtype=torch.float64)
    G = torch.zeros(groups, 2, K, d, d, dtype=torch.float64)
    for g in range(groups):
        for start in range(g * per, (g + 1) * per, chunk):
            part = ep[start : min(start + chunk, (g + 1) * per)]
            loss = ce_loss(m, part) * (part.batch_size / per)
            grads = torch.autograd.grad(loss, params)
            G[g] += torch.stack([gr[0, :d, :d] for gr in grads]).reshape(2, K, d, d)
    G = G.transpose(1, 2)  # (groups, K, 2, d, d)
    eye = torch.eye(d, dtype=torch.float64)
    t = torch.diagonal(G, dim1=-2, dim2=-1).mean(-1)  # (groups, K, 2)
    R = G - t[..., None, None] * eye
    Gm, tm, Rm = G.mean(0), t.mean(0), R.mean(0)
    return {
        "rel_dev": dist_to_identity(Gm),
        "off": Rm.flatten(-2).norm(dim=-1),
        "off_se": ((R - Rm).flatten(-2).norm(dim=-1).square().sum(0) / (groups * (groups - 1))).sqrt(),
        "id": tm,
        "id_se": t.std(0) / math.sqrt(groups),
        "norm": Gm.flatten(-2).norm(dim=-1),
        "grad": Gm,
    }


def copy_f64(model: CategoricalTransformer) -> CategoricalTransformer:
    """A float64 copy of a categorical transformer."""
    m = CategoricalTransformer(model.config, generator=generator(0)).double()
    m.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return m


def rescaled(gd: CategoricalTransformer, c: float) -> CategoricalTransformer:
    """A copy of a GD-mode model with its kernel scale a multiplied by c (still W_Q = W_K ∝ I: in S of §5)."""
    m = CategoricalTransformer(gd.config, generator=generator(0)).to(gd.W_free.dtype)
    m.load_state_dict(gd.state_dict())
    with torch.no_grad():
        m.scale.mul_(c)
    return m
