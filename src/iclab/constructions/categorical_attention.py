"""Weights that make the categorical attention models run functional GD on the cross-entropy (Wang et al. 2025).

* :func:`categorical_gd` — the K-block GD transformer (§3.2-3.3, App. D) with given W_e, steps α_k ∈ R^{d'}
  and kernel scale a, in its GD parameterisation (``free=False``) or written out as the full matrices of the
  free ("Trained TF") skeleton (``free=True``), eq. (26)-(44) in the paper's orientation (out = M · in,
  token blocks [X | U | E | F]):

      head 1:  W_Q = W_K = a [I_d 0 0 0],  W_V: F ← U is I, F ← E is −I,  P = diag(α_k) on F        (26)-(30)
      head 2:  W_Q = W_K = λ [I_d 0 0 0] (rbf; softmax: W_K = [I_d …], W_Q = λ²[I_d …]),
               W_V: E ← E is −I,  P = I                                                              (31)-(35)
      cross:   W_Q^c = [0 0 0 I_{d'}],  W_K^c = I_{d'},  W_V^c: E ← I_{d'},  P^c = I                  (38)-(43)

* :func:`gd_form` — the free model with the weights of a given GD-mode model (same W_e, α, a, λ).
* :func:`gd_algorithm` — the :class:`~iclab.algorithms.CategoricalFunctionalGD` a GD-mode model computes.
* :func:`single_step` — the one-head model of §3.5 (eq. 20-22): W_Q = W_K = a[I_d 0 0], W_V the U block,
  P = diag(α) from U to F; also as a free D₁×D₁ model.

Both parameterisations equal :class:`iclab.algorithms.CategoricalFunctionalGD` (:func:`gd_algorithm`) at
every token; the tests check it in float64 to 1e-12 for K = 1..6 and every kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from iclab.algorithms.functional_gd import CategoricalFunctionalGD
from iclab.core.errors import require
from iclab.models.categorical_attention import (
    CategoricalTransformer,
    CategoricalTransformerConfig,
    SingleStepCategorical,
    _FreeBlock,
)


def _steps(owner: str, step_sizes: Tensor | Sequence[float], n_blocks: int | None, dp: int) -> Tensor:
    a = torch.as_tensor(step_sizes, dtype=torch.float64) if not isinstance(step_sizes, Tensor) else step_sizes
    a = a.to(torch.float64) if not a.is_floating_point() else a
    if a.dim() == 1 and n_blocks is None:
        a = a.unsqueeze(-1).expand(-1, dp)  # (K,) scalar steps
    ok = a.dim() == 2 and a.shape[1] == dp
    require(owner, "step_sizes", ok, f"a (K,) or (K, d'={dp}) tensor of steps α_k", tuple(a.shape))
    return a


def categorical_gd(
    W_e: Tensor,
    step_sizes: Tensor | Sequence[float],
    *,
    d: int,
    kernel: str = "softmax",
    scale: float = 1.0,
    erasure: str = "rbf",
    erasure_scale: float = 1e5,
    divide_by_n: bool = True,
    free: bool = False,
) -> CategoricalTransformer:
    """The K-block model computing K steps of categorical functional GD (eq. 3) with steps α_k (K,) or (K, d').

    ``W_e`` (d', C) is used as given (all C columns free). ``free=True`` returns the same function as a free
    ("Trained TF") model holding the construction's full matrices. dtype: that of ``W_e``.
    """
    owner = "constructions.categorical_gd"
    require(owner, "W_e", W_e.dim() == 2 and W_e.shape[1] >= 2, "a (d', C) matrix with C >= 2", tuple(W_e.shape))
    dp, C = W_e.shape
    alpha = _steps(owner, step_sizes, None, dp).to(W_e.dtype)
    cfg = CategoricalTransformerConfig(
        d=d,
        d_embed=dp,
        num_classes=C,
        n_blocks=alpha.shape[0],
        kernel=kernel,  # type: ignore[arg-type]  # a str; CategoricalTransformerConfig checks the name
        mode="gd",
        erasure=erasure,  # type: ignore[arg-type]  # a str; CategoricalTransformerConfig checks the name
        erasure_scale=erasure_scale,
        divide_by_n=divide_by_n,
        zero_last_class=False,
        embed_init_std=0.0,
    )
    model = CategoricalTransformer(cfg).to(W_e.dtype)
    with torch.no_grad():
        model.set_embeddings(W_e)
        model.alpha.copy_(alpha)
        model.scale.fill_(float(scale))
    return gd_form(model) if free else model


def gd_algorithm(model: CategoricalTransformer) -> CategoricalFunctionalGD:
    """The :class:`~iclab.algorithms.CategoricalFunctionalGD` a GD-mode ``model`` computes (detached): K steps
    of functional GD with the model's W_e, per-block α_k ∈ R^{d'} as preconditioner and kernel scale a (§3.2-3.3)."""
    cfg = model.config
    require(
        "constructions.gd_algorithm",
        "model",
        cfg.mode == "gd",
        "a mode='gd' CategoricalTransformer (a free model computes no fixed algorithm)",
        cfg.mode,
    )
    alpha = model.alpha.detach().expand(cfg.n_blocks, -1)
    a = float(model.kernel_scale.detach())
    return CategoricalFunctionalGD(
        cfg.kernel,
        torch.ones(cfg.n_blocks, dtype=alpha.dtype),
        transform=a * torch.eye(cfg.d, dtype=alpha.dtype),
        embeddings=model.W_e.detach(),
        preconditioner=alpha.clone(),
        divide_by_n=cfg.divide_by_n and cfg.kernel != "softmax",
    )


@torch.no_grad()
def gd_form(model: CategoricalTransformer) -> CategoricalTransformer:
    """A free-mode model whose full matrices are the GD construction of a GD-mode ``model`` (eq. 26-44)."""
    cfg = model.config
    require("constructions.gd_form", "model", cfg.mode == "gd", "a mode='gd' CategoricalTransformer", cfg.mode)
    free = CategoricalTransformer(dataclasses.replace(cfg, mode="free", init_std=0.0, embed_init_std=0.0))
    dtype = model.W_free.dtype
    free = free.to(dtype)
    free.W_free.copy_(model.W_free)
    d, dp, D = cfg.d, cfg.d_embed, cfg.D
    X, U, E, F = (slice(0, d), slice(d, d + dp), slice(d + dp, d + 2 * dp), slice(d + 2 * dp, D))
    eye_d, eye_p = torch.eye(d, dtype=dtype), torch.eye(dp, dtype=dtype)
    a, lam = float(model.scale), float(cfg.erasure_scale)
    for k, blk in enumerate(cast("Sequence[_FreeBlock]", free.blocks)):
        for M in (blk.W_Q, blk.W_K, blk.W_V, blk.P, blk.W_Qc, blk.W_Kc, blk.W_Vc, blk.Pc):
            M.zero_()
        blk.W_Q[0, X, X] = a * eye_d  # head 1: κ(a x_i, a x_j)
        blk.W_K[0, X, X] = a * eye_d
        blk.W_V[0, F, U] = eye_p  # w_{e,y_i} − E(w_e)|_{f_i} into F
        blk.W_V[0, F, E] = -eye_p
        blk.P[0, F, F] = torch.diag(model.alpha[k])
        if cfg.erasure == "rbf":
            blk.W_Q[1, X, X] = lam * eye_d
            blk.W_K[1, X, X] = lam * eye_d
        elif cfg.erasure == "softmax":
            blk.W_Q[1, X, X] = lam**2 * eye_d
            blk.W_K[1, X, X] = eye_d
        blk.W_V[1, E, E] = -eye_p  # head 2: −E(w_e)|_{f_j}
        blk.P[1] = torch.eye(D, dtype=dtype)
        blk.W_Qc[:, F] = eye_p  # cross-attention query f_{j,k+1}
        blk.W_Kc.copy_(eye_p)
        blk.W_Vc[E, :] = eye_p
        blk.Pc.copy_(torch.eye(D, dtype=dtype))
    return free


def single_step(
    W_e: Tensor,
    step_size: Tensor | Sequence[float] | float,
    *,
    d: int,
    kernel: str = "rbf",
    scale: float = 1.0,
    divide_by_n: bool = True,
    free: bool = False,
) -> SingleStepCategorical:
    """The §3.5 one-head model: f_1(x_q) = α/N Σ_i κ(a x_i, a x_q)(w_{e,y_i} − w̄_e) (eq. 14), α scalar or (d',)."""
    owner = "constructions.single_step"
    require(owner, "W_e", W_e.dim() == 2 and W_e.shape[1] >= 2, "a (d', C) matrix with C >= 2", tuple(W_e.shape))
    dp, C = W_e.shape
    alpha = torch.as_tensor(step_size, dtype=W_e.dtype).reshape(-1).expand(dp).clone()
    base = CategoricalTransformerConfig(d=d, d_embed=dp, num_classes=C, n_blocks=1, kernel=kernel,  # type: ignore[arg-type]  # a str; the config checks it
                                        divide_by_n=divide_by_n, zero_last_class=False, embed_init_std=0.0)  # fmt: skip
    cfg = dataclasses.replace(base, mode="free", init_std=0.0) if free else base
    model = SingleStepCategorical(cfg).to(W_e.dtype)
    with torch.no_grad():
        model.set_embeddings(W_e)
        if not free:
            model.alpha.copy_(alpha)
            model.scale.fill_(float(scale))
            return model
        X, U, F = slice(0, d), slice(d, d + dp), slice(d + dp, d + 2 * dp)
        model.W_Q[X, X] = scale * torch.eye(d, dtype=W_e.dtype)
        model.W_K[X, X] = scale * torch.eye(d, dtype=W_e.dtype)
        model.W_V[U, U] = torch.eye(dp, dtype=W_e.dtype)
        model.P[F, U] = torch.diag(alpha)
    return model
