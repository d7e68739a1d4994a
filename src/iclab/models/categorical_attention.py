"""Attention models for in-context classification with class embeddings (Wang, Convertino, Cheng, Henao, Carin 2025).

Observation model (eq. 1): p(y = c | x) = softmax_c(W_eᵀ f(x)); W_e = [w_{e,1} … w_{e,C}] ∈ R^{d'×C} is both
the input embedding of the labels and the output head. Two models, each in two parameterisations:

:class:`CategoricalTransformer` — the multi-step model of §3.2-3.3 / App. D. The paper's tokens are
columns e_{i,k} = (x_i; w_{e,y_i}; E(w_e)|_{f_{i,k}}; f_{i,k}) ∈ R^{d+3d'} (eq. 4); here rows
``(B, T, D)`` with blocks [X | U | E | F] of widths [d | d' | d' | d'], the query last (U = 0 there)
and, for :meth:`predict_points`, m queries after the n context tokens. Initially E = w̄_e, F = 0
(eq. 23). Each block (eq. 5, 36-44) is

* self-attention with 2 heads, the query tokens masked as keys (the paper's M):
  head 1 (eq. 26-30) Δf_j = P₁ Σ_{i≤n} κ(W_K e_i, W_Q e_j) W_V e_i (÷ n for unnormalised κ);
  head 2, the *erasure* head (eq. 31-35), whose weights are ≈ δ_ij so that it writes −E_j;
* softmax cross-attention (eq. 38-44) whose keys and values are the C columns of W_e:
  out_j = P_c Σ_c softmax_c((K_c w_{e,c})ᵀ Q_c ẽ_j) V_c w_{e,c}, which for the GD weights writes
  E(w_e)|_{f_{j,k+1}} into the emptied E slot;
* residual connections. Readout (eq. 7): f̂ = F slot of the query, logits W_eᵀ f̂.

``mode='gd'`` is the paper's "GD" transformer: the construction's form with learned α_k ∈ R^{d'} (a
diagonal step per block, or one for all blocks when ``shared``), a kernel scale a (W_Q = W_K = a[I_d 0];
not learned for the linear kernel, where it only rescales α) and W_e. It is computed on the blocks
directly (no zero blocks multiplied; with the softmax kernel head 1 runs in the fused kernel of
:mod:`iclab.models._categorical_fast`, keys a x_i and values packed as its sources; with the others its weights are
the data's Gram matrix with a applied after it, :func:`~iclab.models._categorical_heads.scaled_head_weights`), and K
blocks equal K steps of :class:`iclab.algorithms.CategoricalFunctionalGD` at every token
(:func:`iclab.constructions.gd_algorithm`).
``mode='free'`` is the "Trained TF": the same skeleton with every W_Q, W_K, W_V, P of both heads and
W_Q, W_K, W_V, P of the cross-attention free (full D×D matrices, d'×D for the cross query, …), plus W_e.
:func:`iclab.constructions.categorical_gd` loads the GD form into a free model. With ``erasure='kernel'`` (the authors'
Trained TF) and the softmax, linear, exp or rbf kernel ``predict`` takes the fast path of
:mod:`iclab.models._categorical_fast`: block 1 on the structured tokens of eq. (4)/(23) with (d + d')-wide keys, the
last block at the queries only; the same function to float rounding (``model.fast = False``: the general block pass
below).

Erasure head (``erasure``):

* ``rbf``: κ = exp(−‖W_K e_i − W_Q e_j‖²/2) with W_Q = W_K = λ[I_d 0] (eq. 33); exact
  for distinct x once λ is large (λ = 1e5: off-diagonal weights underflow to 0). The self-score is
  computed from the difference W_K e_j − W_Q e_j directly (the Gram expansion ‖s‖² + ‖t‖² − 2sᵀt would
  lose ~λ²·eps at i = j).
* ``softmax``: the paper's dot-product softmax, softmax_i((W_Q e_j)ᵀ W_K e_i). It concentrates on
  argmax_i x_jᵀx_i, which is j only when ‖x_i‖ is constant (docs/errata.md); kept to measure
  that caveat (:func:`erasure_failure_rate`).
* ``identity`` (default for GD): δ_ij exactly (the hard mask). On distinct x it gives bit-for-bit what
  ``rbf`` with λ = 1e5 gives, without computing the (n, T) scores of a second head (half the cost).
* ``kernel`` (default for the free model, as in the authors' Trained TF): head 2 is a second ordinary
  head with the model kernel, queries masked as keys.

For ``rbf``/``softmax``/``identity`` a query token is the one extra key of its own erasure head (so its
E slot is erased too and all N+1 tokens follow GD); it never sees another query, so a multi-query pass
equals separate single-query passes.

:class:`SingleStepCategorical` — §3.5 / App. C: one self-attention head on (x; w_{e,y} − w̄_e; 0) ∈
R^{d+2d'} (eq. 8, 17-19) is one GD step from f_0 = 0, no erasure or cross-attention needed (eq. 14,
20-22). ``mode='gd'`` learns (a, α, W_e); ``mode='free'`` has full W_Q, W_K, W_V, P ∈ R^{D₁×D₁} (App. F).

Kernels κ (``iclab.core.kernels.gram`` with σ = 1): linear sᵀt, exp exp(sᵀt), rbf exp(−‖s−t‖²/2),
laplacian exp(−‖s−t‖₁), softmax (normalised over the n context keys). The 1/n of the authors' value
matrices (``divide_by_n``) is applied to the unnormalised kernels only, as in their PyTorch port (the
JAX code also divides softmax; only the scale of α changes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

from iclab.core.config import added_setting
from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, require, require_int
from iclab.models import _categorical_fast as fast
from iclab.models._categorical_heads import erasure_failure_rate as erasure_failure_rate
from iclab.models._categorical_heads import erasure_weights, head_weights, kernel_head, scaled_head_weights
from iclab.models._categorical_heads import softmax_cross_attention as softmax_cross_attention
from iclab.models._categorical_heads import weigh as weigh

KERNELS = ("linear", "rbf", "exp", "laplacian", "softmax")
ERASURES = ("rbf", "softmax", "identity", "kernel")
MODES = ("gd", "free")
Mode = Literal["gd", "free"]
KernelName = Literal["linear", "rbf", "exp", "laplacian", "softmax"]
Erasure = Literal["rbf", "softmax", "identity", "kernel"]


@dataclass(frozen=True, kw_only=True)
class CategoricalTransformerConfig:
    """Settings of :class:`CategoricalTransformer` and :class:`SingleStepCategorical` (defaults: §6.1)."""

    d: int = 10
    d_embed: int = 5  # d'
    num_classes: int = 25  # C
    n_blocks: int = 2  # K (ignored by SingleStepCategorical)
    kernel: KernelName = "softmax"
    mode: Mode = "gd"
    shared: bool = False  # one set of block weights for all blocks (the authors' deq=True)
    erasure: Erasure | None = None  # None: 'identity' for mode='gd', 'kernel' for mode='free'
    erasure_scale: float = 1e5  # λ of the rbf / softmax erasure head (the authors' code)
    divide_by_n: bool = True  # 1/n on unnormalised kernels (absorbed in α)
    zero_last_class: bool = True  # W_e's last column fixed to 0 (App. C; (1) is shift invariant)
    step_init: float = 1.0  # GD: α_k initialised to this in every coordinate
    scale_init: float = 1.0  # GD: kernel scale a
    #: GD: how the learned scale c enters head 1. 'a': κ(c x_i, c x_j) (W_Q = W_K = c[I_d 0]); 'logit': the
    #: authors' PyTorch ``kernel_param``, softmax_i(c · attn_logit_scale · x_jᵀx_i), linear c x_jᵀx_i (learned), rbf
    #: exp(−‖x_i − x_j‖²/(2c²)). The same functions (a = √(c·attn_logit_scale), √c, 1/c); Adam steps c, not a.
    scale_param: Literal["a", "logit"] = added_setting("a")
    embed_init_std: float = 1.0  # W_e ~ N(0, std²)
    init_std: float = 0.01  # free: every matrix entry ~ N(0, std²)
    #: free, softmax, erasure='kernel': both self-attention heads' logits (W_K e_i)ᵀ(W_Q e_j) × this (the authors'
    #: PyTorch Trained TF divides them by √D, a scaled dot product; the paper's eq. 26-35 has no factor)
    attn_logit_scale: float = added_setting(1.0)
    #: free: rows of the cross-attention W_Q^c (k, D) and W_K^c (k, d'); None: k = d' (the authors' PyTorch Trained
    #: TF: k = D, W_Q^c (D, D), W_K^c (D, d'))
    cross_key_dim: int | None = added_setting(None)

    def __post_init__(self) -> None:
        for name in ("d", "d_embed", "n_blocks"):
            require_int(self, name, getattr(self, name), 1)
        require_int(self, "num_classes", self.num_classes, 2)
        require(self, "kernel", self.kernel in KERNELS, f"one of {KERNELS}")
        require(self, "mode", self.mode in MODES, f"one of {MODES}")
        require(self, "shared", isinstance(self.shared, bool), "a bool")
        if self.erasure is None:
            object.__setattr__(self, "erasure", "identity" if self.mode == "gd" else "kernel")
        require(self, "erasure", self.erasure in ERASURES, f"one of {ERASURES}")
        require(
            self,
            "erasure",
            not (self.mode == "gd" and self.erasure == "kernel"),
            "'rbf', 'softmax' or 'identity' for mode='gd' (the GD form needs an erasing head)",
        )
        require(self, "erasure_scale", float(self.erasure_scale) > 0, "a float > 0")
        require(self, "divide_by_n", isinstance(self.divide_by_n, bool), "a bool")
        require(self, "zero_last_class", isinstance(self.zero_last_class, bool), "a bool")
        for name in ("embed_init_std", "init_std"):
            require(self, name, float(getattr(self, name)) >= 0, "a float >= 0")
        require(self, "attn_logit_scale", float(self.attn_logit_scale) > 0, "a float > 0")
        require(self, "scale_param", self.scale_param in ("a", "logit"), "'a' or 'logit'")
        require(self, "scale_param", self.scale_param == "a" or (self.mode == "gd" and self.kernel in
                ("softmax", "linear", "rbf")), "'a' unless mode='gd' with kernel softmax, linear or rbf")  # fmt: skip
        logit_ok = self.erasure == "kernel" if self.mode == "free" else self.scale_param == "logit"
        require(self, "attn_logit_scale", self.attn_logit_scale == 1 or (self.kernel == "softmax" and logit_ok),
                "1 unless kernel='softmax' and (mode='free', erasure='kernel' or mode='gd', scale_param='logit')")  # fmt: skip
        if self.cross_key_dim is not None:
            require_int(self, "cross_key_dim", self.cross_key_dim, 1)

    @property
    def D(self) -> int:
        """Token width d + 3d' of the multi-step model."""
        return self.d + 3 * self.d_embed


class _EmbeddingModel(nn.Module):
    """W_e (d', C) as a parameter (its last column fixed to 0 with ``zero_last_class``) and input checks."""

    def __init__(self, config: CategoricalTransformerConfig, generator: torch.Generator | None) -> None:
        super().__init__()
        self.config = config
        cols = config.num_classes - 1 if config.zero_last_class else config.num_classes
        self.W_free = nn.Parameter(torch.randn(config.d_embed, cols, generator=generator) * config.embed_init_std)

    @property
    def W_e(self) -> Tensor:
        """(d', C) class embeddings."""
        if not self.config.zero_last_class:
            return self.W_free
        return torch.cat([self.W_free, self.W_free.new_zeros(self.W_free.shape[0], 1)], dim=1)

    @torch.no_grad()
    def set_embeddings(self, W_e: Tensor) -> None:
        """Load W_e (d', C) (its last column must be 0 with ``zero_last_class``)."""
        cfg = self.config
        shape = (cfg.d_embed, cfg.num_classes)
        require(type(self).__name__, "W_e", tuple(W_e.shape) == shape, f"shape {shape}", tuple(W_e.shape))
        if cfg.zero_last_class:
            require(type(self).__name__, "W_e", bool((W_e[:, -1] == 0).all()), "0 in its last column (zero_last_class)",
                    "a non-zero last column")  # fmt: skip
            self.W_free.copy_(W_e[:, :-1])
        else:
            self.W_free.copy_(W_e)

    def _check(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        name, cfg = type(self).__name__, self.config
        if episode.labels is None:
            raise ShapeError(f"{name} needs a classification episode (integer labels); got a regression episode")
        if episode.d != cfg.d:
            raise ShapeError(f"{name} was built for d={cfg.d}; got an episode with d={episode.d}")
        # the query label too: the loss and the metrics index the logits with it
        for field, labels in (("labels", episode.labels), ("label_query", episode.label_query)):
            if labels is not None:
                lo, hi = (int(v) for v in torch.aminmax(labels))  # one pass over the labels (every training batch)
                require(name, field, lo >= 0 and hi < cfg.num_classes, f"in [0, C = {cfg.num_classes})",
                        f"values in [{lo}, {hi}]")  # fmt: skip
        if episode.dtype != self.W_free.dtype:
            raise ShapeError(
                f"{name} has {self.W_free.dtype} parameters; got a {episode.dtype} episode (call model.to({episode.dtype}) or episode.to(dtype={self.W_free.dtype}))"
            )
        if points is None:
            return episode.x_query.unsqueeze(1)
        if points.dim() == 2:
            points = points.to(episode.x).expand(episode.batch_size, *points.shape)
        require(name, "points", points.dim() == 3 and tuple(points.shape[::2]) == (episode.batch_size, cfg.d),
                f"an (m, {cfg.d}) or ({episode.batch_size}, m, {cfg.d}) tensor", tuple(points.shape))  # fmt: skip
        return points.to(episode.x)

    def predict(self, episode: Episode) -> Tensor:
        """Class logits W_eᵀ f̂ of each prompt's query, (B, C)."""
        return self.predict_points(episode)[:, 0]

    def forward(self, episode: Episode) -> Tensor:
        return self.predict(episode)

    def predict_points(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """Logits (B, m, C) at m query points (m, d) or (B, m, d) in one pass (all masked as keys); None: the query."""
        raise NotImplementedError


# ---- the multi-step model ------------------------------------------------------------------------------


class _FreeBlock(nn.Module):
    """The free weights of one block: self-attention W_Q, W_K, W_V, P (2, D, D) for heads (kernel, erasure) and
    the cross-attention W_Q^c (d', D), W_K^c (d', d'), W_V^c (D, d'), P^c (D, D) (paper orientation: out = M·in)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    P: Tensor
    W_Qc: Tensor
    W_Kc: Tensor
    W_Vc: Tensor
    Pc: Tensor

    def __init__(self, D: int, dp: int, std: float, generator: torch.Generator | None, kc: int | None = None) -> None:
        super().__init__()
        kc = dp if kc is None else kc

        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=generator) * std)

        self.W_Q, self.W_K, self.W_V, self.P = p(2, D, D), p(2, D, D), p(2, D, D), p(2, D, D)
        self.W_Qc, self.W_Kc, self.W_Vc, self.Pc = p(kc, D), p(kc, dp), p(D, dp), p(D, D)


class CategoricalTransformer(_EmbeddingModel):
    """K attention blocks (2-head self-attention + softmax cross-attention to W_e) on (x; w_{e,y}; E; f) tokens.

    See the module docstring. ``predict(episode)`` -> (B, C) logits; :meth:`predict_points` evaluates many
    queries at once; :meth:`states` returns every block's tokens; :func:`iclab.constructions.gd_algorithm` (GD mode) the
    :class:`~iclab.algorithms.CategoricalFunctionalGD` it computes.
    """

    def __init__(
        self, config: CategoricalTransformerConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        config = config or CategoricalTransformerConfig()
        super().__init__(config, generator)
        cfg = config
        n_w = 1 if cfg.shared else cfg.n_blocks
        if cfg.mode == "gd":
            self.alpha = nn.Parameter(torch.full((n_w, cfg.d_embed), float(cfg.step_init)))
            learned = cfg.kernel != "linear" or cfg.scale_param == "logit"
            self.scale = nn.Parameter(torch.tensor(float(cfg.scale_init)), requires_grad=learned)
        else:
            self.blocks = nn.ModuleList(
                _FreeBlock(cfg.D, cfg.d_embed, cfg.init_std, generator, cfg.cross_key_dim) for _ in range(n_w)
            )

    # -- tokens -----------------------------------------------------------------------------------------
    def embed(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """e_{·,0} (B, n+m, D) = (x; w_{e,y} (0 at queries); w̄_e; 0) (eq. 4, 23)."""
        x, U = self._embed_xu(episode, points)
        E = self.W_e.mean(1).expand_as(U)
        return torch.cat([x, U, E, torch.zeros_like(U)], dim=-1)

    def _embed_xu(self, episode: Episode, points: Tensor | None) -> tuple[Tensor, Tensor]:
        """The X and U blocks of e_{·,0}: x (B, n+m, d), U (B, n+m, d') = w_{e,y}, 0 at the queries."""
        q = self._check(episode, points)
        W = self.W_e
        U = torch.cat([W.T[episode.labels], W.new_zeros(q.shape[0], q.shape[1], W.shape[0])], dim=1)
        return torch.cat([episode.x, q], dim=1), U

    @property
    def kernel_scale(self) -> Tensor:
        """GD: the input scale a of head 1, κ(a x_i, a x_j): ``scale`` itself, or its function for
        ``scale_param='logit'`` (see :class:`CategoricalTransformerConfig`)."""
        cfg, c = self.config, self.scale
        if cfg.scale_param == "a":
            return c
        if cfg.kernel == "rbf":
            return 1 / c
        return (c * cfg.attn_logit_scale).sqrt() if cfg.kernel == "softmax" else c.sqrt()

    def _block_index(self, k: int) -> int:
        return 0 if self.config.shared else k

    def _block(self, k: int) -> _FreeBlock:
        """The free weights of block k."""
        return cast(_FreeBlock, self.blocks[self._block_index(k)])

    def _gd_weights(self, z: Tensor, n: int) -> Tensor:
        """κ(a x_i, a x_j), (B, T, n) target-major: head 1's weights, the same in every block of the GD model."""
        x = self.kernel_scale * z[..., : self.config.d]
        return head_weights(self.config.kernel, x[:, :n], x)

    def _gd_block(self, z: Tensor, n: int, k: int, weights: Tensor | None = None) -> Tensor:
        cfg = self.config
        d, dp = cfg.d, cfg.d_embed
        x, U, E, F = z.split([d, dp, dp, dp], dim=-1)
        w = self._gd_weights(z, n) if weights is None else weights
        dF = kernel_head(cfg.kernel, x[:, :n], x, U[:, :n] - E[:, :n], divide_by_n=cfg.divide_by_n, weights=w)
        F = F + self.alpha[self._block_index(k)] * dF  # head 1, P = diag(α): f_{k+1}
        lam = cfg.erasure_scale
        if cfg.erasure == "identity":  # δ_ij: head 2 writes exactly −E, so the slot is empty
            E = softmax_cross_attention(F, self.W_e.T, self.W_e.T)
            return torch.cat([x, U, E, F], dim=-1)
        if cfg.erasure == "rbf":  # W_Q = W_K = λ[I_d 0] (eq. 31-33)
            keys, queries = lam * x, lam * x
        elif cfg.erasure == "softmax":  # logits λ² x_jᵀx_i
            keys, queries = x, lam**2 * x
        else:
            keys = queries = x
        w_ctx, w_self = erasure_weights(cfg.erasure, keys, queries, n)
        E = E - (w_ctx.transpose(1, 2) @ E[:, :n] + w_self.unsqueeze(-1) * E)  # head 2 writes −E
        E = E + softmax_cross_attention(F, self.W_e.T, self.W_e.T)  # cross-attention: E(w_e)|_{f_{k+1}}
        return torch.cat([x, U, E, F], dim=-1)

    def _free_block(self, z: Tensor, n: int, k: int, weights: Tensor | None = None, last: bool = False) -> Tensor:
        """One free block on (B, T, D) tokens. ``last``: return only the m = T − n query tokens (the readout needs
        nothing else; keys and values still come from the whole context), when head 2 is an ordinary head."""
        cfg, blk = self.config, self._block(k)
        ctx = z[:, :n]
        tgt = z[:, n:] if last and cfg.erasure == "kernel" else z  # the targets this block must produce
        D = cfg.D
        if cfg.erasure == "kernel":
            # both heads' keys and P·W_V values in one product over the context, both queries in one over the
            # targets: P_h (Σ_i κ(·) W_V,h e_i) = Σ_i κ(·) (P_h W_V,h) e_i, so no per-head (B, T, D) output product
            kv = ctx @ torch.cat([blk.W_K[0], blk.P[0] @ blk.W_V[0], blk.W_K[1], blk.P[1] @ blk.W_V[1]]).T
            qs = tgt @ torch.cat([blk.W_Q[0], blk.W_Q[1]]).T
            if cfg.attn_logit_scale != 1:
                qs = qs * cfg.attn_logit_scale
            k1, v1, k2, v2 = kv.split(D, dim=-1)
            q1, q2 = qs.split(D, dim=-1)
            zt = tgt + kernel_head(cfg.kernel, k1, q1, v1, divide_by_n=cfg.divide_by_n)
            zt = zt + kernel_head(cfg.kernel, k2, q2, v2, divide_by_n=cfg.divide_by_n)  # ẽ (eq. 37)
        else:
            out = kernel_head(cfg.kernel, ctx @ blk.W_K[0].T, tgt @ blk.W_Q[0].T, ctx @ blk.W_V[0].T,
                              divide_by_n=cfg.divide_by_n)  # fmt: skip
            keys2, queries2, vals2 = z @ blk.W_K[1].T, z @ blk.W_Q[1].T, z @ blk.W_V[1].T
            w_ctx, w_self = erasure_weights(cfg.erasure, keys2, queries2, n)
            head2 = w_ctx.transpose(1, 2) @ vals2[:, :n] + w_self.unsqueeze(-1) * vals2
            zt = tgt + out @ blk.P[0].T + head2 @ blk.P[1].T  # ẽ (eq. 37)
        W = self.W_e.T  # (C, d') the columns w_{e,c}
        cross = softmax_cross_attention(zt @ blk.W_Qc.T, W @ blk.W_Kc.T, W @ blk.W_Vc.T)  # (B, T, D)
        return zt + cross @ blk.Pc.T  # eq. (44)

    def states(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """Tokens before and after every block, (K+1, B, n+m, D)."""
        z = self.embed(episode, points)
        n, out = episode.n, [z]
        gd = self.config.mode == "gd"
        block = self._gd_block if gd else self._free_block
        weights = self._gd_weights(z, n) if gd else None
        for k in range(self.config.n_blocks):
            z = block(z, n, k, weights)
            out.append(z)
        return torch.stack(out)

    def predict_points(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        cfg = self.config
        n, K = episode.n, cfg.n_blocks
        if self.uses_fast_path:
            return self._free_fast(episode, points)
        if cfg.mode == "gd" and cfg.erasure == "identity":
            return self._gd_identity_erasure(episode, points)
        z = self.embed(episode, points)
        if cfg.mode == "free":
            for k in range(K):
                z = self._free_block(z, n, k, last=k == K - 1)
            q = z if cfg.erasure == "kernel" else z[:, n:]  # with an ordinary head 2 the last block kept only queries
            return q[..., -cfg.d_embed :] @ self.W_e  # (B, m, C) readout (eq. 7)
        # GD with a computed erasure head: every block on all tokens, the readout at the queries
        weights = self._gd_weights(z, n)
        for k in range(K):
            z = self._gd_block(z, n, k, weights)
        return z[:, n:, -cfg.d_embed :] @ self.W_e

    #: run the free model's fast path where it applies (:attr:`uses_fast_path`) and the GD model's softmax head 1 by
    #: :func:`~iclab.models._categorical_fast.shared_kv_softmax`; False: every free block by the general
    #: :meth:`_free_block`, the GD model with stored head weights (the references for tests and benchmarks)
    fast: bool = True

    @property
    def uses_fast_path(self) -> bool:
        """``mode='free'``, ``erasure='kernel'`` (the authors' Trained TF), kernel softmax, linear, exp or rbf, and
        :attr:`fast`: :meth:`predict_points` runs :mod:`iclab.models._categorical_fast` (block 1 on the structured
        tokens of eq. 4/23 with (d + d')-wide keys, middle blocks by :meth:`_free_block`, the last block at the queries
        only); the same function as the general path to float rounding."""
        cfg = self.config
        kernels = ("softmax", *fast.STRUCTURED_KERNELS)
        return self.fast and cfg.mode == "free" and cfg.kernel in kernels and cfg.erasure == "kernel"

    def _free_fast(self, episode: Episode, points: Tensor | None) -> Tensor:
        cfg, n, W = self.config, episode.n, self.W_e
        K, s = cfg.n_blocks, cfg.attn_logit_scale
        x, U = self._embed_xu(episode, points)
        if cfg.kernel == "softmax":
            z = fast.first_block(self._block(0), W, x, U, n, last=K == 1, logit_scale=s)
        else:
            z = fast.first_block_kernel(self._block(0), W, x, U, n, kernel=cfg.kernel, last=K == 1,
                                        divide_by_n=cfg.divide_by_n)  # fmt: skip
        for k in range(1, K - 1):
            z = self._free_block(z, n, k)
        if K > 1 and cfg.kernel == "softmax":  # the last block at the queries only
            z = fast.query_block(self._block(K - 1), W, z, n, logit_scale=s)
        elif K > 1:
            z = self._free_block(z, n, K - 1, last=True)
        return z[..., -cfg.d_embed :] @ W  # (B, m, C) readout (eq. 7)

    def _gd_identity_erasure(self, episode: Episode, points: Tensor | None) -> Tensor:
        """GD with the exact erasure δ_ij: the same numbers as K :meth:`_gd_block` passes, with less work.

        Queries are never keys, so the context tokens evolve on their own; a query needs only its F slot
        (U = 0 there and its E slot is never read), and the last block needs only the queries. Head 1's
        weights are split into context→context (B, n, n), needed for K ≥ 2, and context→query (B, m, n),
        so no (B, n+m, n) tensor is sliced or its gradient scattered. The slots start as what :meth:`embed` would
        write (U = w_{e,y}, E = w̄_e, F = 0), built apart: no (B, n+m, D) prompt is concatenated and sliced again,
        whose backward would scatter every slot's gradient into a zero prompt (a third of a Fig.-4 GD step).
        """
        cfg = self.config
        K, n = cfg.n_blocks, episode.n
        q = self._check(episode, points)
        a = self.kernel_scale
        if self.fast and cfg.kernel == "softmax":
            return self._gd_softmax_fast(episode, a * episode.x, a * q)
        U, E = self.W_e.T[episode.labels], self.W_e.mean(1)  # (B, n, d'), (d',): every context token's E at first
        F_ctx, F_q = U.new_zeros(U.shape), U.new_zeros(*q.shape[:2], U.shape[-1])  # (B, n, d'), (B, m, d')
        if self.fast:  # the data's Gram matrix without autograd, then a (see scaled_head_weights)
            w_q = scaled_head_weights(cfg.kernel, a, episode.x, q)  # (B, m, n)
            w_c = scaled_head_weights(cfg.kernel, a, episode.x, episode.x) if K > 1 else None  # (B, n, n)
        else:
            w_q = head_weights(cfg.kernel, a * episode.x, a * q)
            w_c = head_weights(cfg.kernel, a * episode.x, a * episode.x) if K > 1 else None
        scale = 1.0 / n if cfg.divide_by_n and cfg.kernel != "softmax" else 1.0
        W = self.W_e.T  # (C, d')
        for k in range(K):
            V = (U - E) * scale if scale != 1.0 else U - E  # (B, n, d') the values of head 1
            alpha = self.alpha[self._block_index(k)]
            F_q = F_q + alpha * weigh(w_q, V)
            if k < K - 1:
                assert w_c is not None  # K > 1
                F_ctx = F_ctx + alpha * weigh(w_c, V)
                E = softmax_cross_attention(F_ctx, W, W)  # erasure then cross-attention: E(w_e)|_{f_{k+1}}
        return F_q @ self.W_e

    def _gd_softmax_fast(self, episode: Episode, x_ctx: Tensor, x_q: Tensor) -> Tensor:
        """:meth:`_gd_identity_erasure` for the softmax kernel, head 1 by :func:`~iclab.models._categorical_fast.
        shared_kv_softmax`: the keys (a x_i) and the values V_i = u_i − E_i of a block packed as the sources
        s_i = (a x_i; V_i; 0), each target's query (a x_j; 0; 0), so the V columns of Σ_i softmax_i(a² x_jᵀ x_i) s_i are
        head 1's output (eq. 26-30). The (B, n+m, n) weights are computed and used block by block in cache (the fused
        C kernel in float32 at d + d' ≤ 16, else chunks of batched products) instead of being stored with their
        softmax backward; the scores are recomputed in each block (d-wide products, cheap). The same numbers to float
        rounding."""
        cfg = self.config
        K, n, d, dp = cfg.n_blocks, episode.n, cfg.d, cfg.d_embed
        R = -(-(d + dp) // fast.ALIGN) * fast.ALIGN  # source width, zero-padded
        targets = nn.functional.pad(torch.cat([x_ctx, x_q], dim=1), (0, R - d))  # (B, n+m, R) queries (a x_j; 0)
        U, E = self.W_e.T[episode.labels], self.W_e.mean(1)  # (B, n, d'), (d',): every context token's E at first
        W = self.W_e.T  # (C, d')
        F_ctx: Tensor | None = None
        F_q: Tensor | None = None
        for k in range(K):
            V = U - E  # (B, n, d') the values of head 1
            alpha = self.alpha[self._block_index(k)]
            last = k == K - 1
            o = fast.shared_kv_softmax(targets[:, n:] if last else targets, x_ctx, V)[..., d : d + dp]
            dq = alpha * (o if last else o[:, n:])
            F_q = dq if F_q is None else F_q + dq
            if not last:
                dc = alpha * o[:, :n]
                F_ctx = dc if F_ctx is None else F_ctx + dc
                E = fast.cross_softmax(F_ctx, W, W)  # erasure then cross-attention: E(w_e)|_{f_{k+1}}, fused
        assert F_q is not None  # K ≥ 1
        return F_q @ self.W_e


# ---- the single-step model --------------------------------------------------------------------------------


class SingleStepCategorical(_EmbeddingModel):
    """One self-attention head on (x; w_{e,y} − w̄_e; 0) ∈ R^{d+2d'}: one GD step from f_0 = 0 (§3.5, eq. 14).

    ``mode='gd'``: W_Q = W_K = a[I_d 0 0], W_V = the U block, P = diag(α) from U to F (eq. 20-22); learned a, α, W_e.
    ``mode='free'``: W_Q, W_K, W_V, P ∈ R^{D₁×D₁} free (App. F, Figs. 8-9). Readout: F slot of the query.
    """

    def __init__(
        self, config: CategoricalTransformerConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        config = config or CategoricalTransformerConfig(d=2, num_classes=20, n_blocks=1)
        super().__init__(config, generator)
        cfg = config
        if cfg.mode == "gd":
            self.alpha = nn.Parameter(torch.full((cfg.d_embed,), float(cfg.step_init)))
            self.scale = nn.Parameter(torch.tensor(float(cfg.scale_init)), requires_grad=cfg.kernel != "linear")
        else:
            D1 = cfg.d + 2 * cfg.d_embed

            def p() -> nn.Parameter:
                return nn.Parameter(torch.randn(D1, D1, generator=generator) * cfg.init_std)

            self.W_Q, self.W_K, self.W_V, self.P = p(), p(), p(), p()

    @torch.no_grad()
    def change_embedding_basis(self, M: Tensor) -> None:
        """Apply the free model's exact symmetry in place: W_e → M W_e, the U columns of W_Q, W_K, W_V → · M⁻¹ and
        the F rows of P → M⁻ᵀ · (M ∈ R^{d'×d'} invertible). Every prediction is unchanged (the tokens' U slots
        become M(w_{e,y} − w̄_e), the F readout M⁻ᵀf meets M W_e) while E·D → M⁻ᵀ (E·D) M⁻¹: E·D is identified
        only up to congruence (docs/errata.md, wang2025 App. F). ``mode='free'`` only."""
        cfg = self.config
        require(type(self).__name__, "mode", cfg.mode == "free", "'free' (the GD model has no W_Q, W_K, W_V, P)",
                cfg.mode)  # fmt: skip
        dp = cfg.d_embed
        require(type(self).__name__, "M", tuple(M.shape) == (dp, dp), f"shape {(dp, dp)}", tuple(M.shape))
        M = M.to(self.W_free)
        inv = torch.linalg.inv(M)
        u = slice(cfg.d, cfg.d + dp)
        self.W_free.copy_(M @ self.W_free)
        for W in (self.W_Q, self.W_K, self.W_V):
            W[:, u] = W[:, u] @ inv
        self.P[-dp:] = inv.T @ self.P[-dp:]

    @property
    def D(self) -> int:
        """Token width: d + 2·d_embed."""
        return self.config.d + 2 * self.config.d_embed

    def embed(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """(B, n+m, d+2d') tokens (x_i; w_{e,y_i} − w̄_e; 0), queries (x; −w̄_e; 0) (eq. 17-19)."""
        q = self._check(episode, points)
        W = self.W_e
        centred = W - W.mean(1, keepdim=True)
        x = torch.cat([episode.x, q], dim=1)
        U = torch.cat([centred.T[episode.labels], (-W.mean(1)).expand(q.shape[0], q.shape[1], -1)], dim=1)
        return torch.cat([x, U, torch.zeros_like(U)], dim=-1)

    def predict_points(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        cfg, n = self.config, episode.n
        z = self.embed(episode, points)
        ctx, q = z[:, :n], z[:, n:]  # only the query tokens are read out, so only they are computed
        if cfg.mode == "gd":
            x, U = z[..., : cfg.d], ctx[..., cfg.d : cfg.d + cfg.d_embed]
            a = self.scale
            f = self.alpha * kernel_head(cfg.kernel, a * x[:, :n], a * x[:, n:], U, divide_by_n=cfg.divide_by_n)
            return f @ self.W_e
        out = kernel_head(cfg.kernel, ctx @ self.W_K.T, q @ self.W_Q.T, ctx @ self.W_V.T,
                          divide_by_n=cfg.divide_by_n)  # fmt: skip
        q = q + out @ self.P.T
        return q[..., -cfg.d_embed :] @ self.W_e
