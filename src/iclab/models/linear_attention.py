"""Residual linear self-attention: the layer and the L-layer linear transformer.

Ahn, Cheng, Daneshmand, Sra 2023, eq. (3)-(4):

    Z_{ℓ+1} = Z_ℓ + (1/n) Σ_h P_h Z_ℓ M (Z_ℓᵀ Q_h Z_ℓ),      TF(Z_0) = −[Z_L]_{d+1, n+1}

The paper's tokens are columns, Z ∈ R^{D×(n+1)} with D = d + 1; here z = Zᵀ is (B, n+1, D) with
the query last, so the update reads z ← z + z Qᵀ (cᵀc / n) Pᵀ with c = z[:, :n] the context rows
(M removes the query as a source, there is no causal mask). This is O(n·D²) per prompt by
associativity; no (n+1)×(n+1) score matrix is formed. P and Q keep the paper's orientation.
The per-head update is :func:`iclab.models.attention_core.attention_update` (shared with
KernelAttention); this layer only builds its maps (key I, query Q_h, value P_h) and the 1/n.

The ReLU variant of Thm 5 (Sec. 6), Z ← Z + (1/n) P Z M σ(ZᵀQZ), must form the scores.

Options for the multi-head attention of Zhang, Singh, Latham, Saxe 2025 (eq. M, S, 3; Fig. 5):

* ``key_query='separate'``  Q_h = W_{K,h}ᵀ W_{Q,h} with W_K, W_Q ∈ R^{R×D} per head (rank R, eq. S);
                            ``'merged'`` (default) keeps one free Q_h = W_h^{KQ} (eq. M).
* ``activation='softmax'``  scores c_iᵀ Q_h z_j raw (ρ = 1, no 1/n), softmax over the sources for
                            every target (:func:`iclab.core.kernels.gram`), as in the authors' code.
* ``sources='all'``         the query is a source (key and value) too, as in the paper's X Xᵀ and the
                            authors' code; ``'context'`` (default) is Ahn et al.'s mask M.
* ``residual=False``        z ← attn(z) (Zhang et al.'s code has no residual; ŷ_q is the same for linear
                            scores because the query's label slot is 0).
* ``zero_blocks=True``      at init, zero the value row's vector part and u_h (merged) / the scalar key
                            entries (separate): the zero-block assumption of Zhang et al. Sec. 2.3-2.4.

Parameter patterns (the paper's names):

* ``full``              P, Q ∈ R^{D×D} free (Thm 1).
* ``sparse``            P = e_D e_Dᵀ, Q = −[[A, 0], [0, 0]] (eq. 8; Lemma 1, Thm 3).
* ``sparse_symmetric``  eq. (8) with A symmetric (Thm 2).
* ``pattern11``         P = [[B, 0], [0, 1]], Q = [[A, 0], [0, 0]] (eq. 11; Thm 4). No minus sign.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import is_int, require, require_int
from iclab.models import _moment_fast, _query_fast
from iclab.models.attention_core import AttentionStack, attention_update, context_moments, linear_mix, moment_mix
from iclab.models.attention_core import embed as embed  # re-exported: the prompt of eq. (1)

Pattern = Literal["full", "sparse", "sparse_symmetric", "pattern11"]
PATTERNS = ("full", "sparse", "sparse_symmetric", "pattern11")
Activation = Literal["linear", "relu", "softmax"]
ACTIVATIONS = ("linear", "relu")  # the scores of Ahn et al. (their tests sweep this tuple)
ALL_ACTIVATIONS = (*ACTIVATIONS, "softmax")  # + softmax scores (Zhang et al. 2025, Sec. 7)
KeyQuery = Literal["merged", "separate"]
KEY_QUERY = ("merged", "separate")
Sources = Literal["context", "all"]
SOURCES = ("context", "all")
Readout = Literal["negative", "positive"]
READOUTS = ("negative", "positive")


@dataclass(frozen=True, kw_only=True)
class LinearTransformerConfig:
    """Architecture of :class:`LinearTransformer`: Ahn et al. 2023's sparsity patterns (8) and (11), Zhang et al. 2025's merged/separate key-query heads, activation, init and read-out sign."""

    d: int = 5  # input dimension; tokens are D = d + 1 wide (label last)
    n_layers: int = 3
    n_heads: int = 1
    pattern: Pattern = "full"
    activation: Activation = "linear"
    init_std: float = 1e-4  # the authors' code: N(0, 1e-4²) for every free entry
    key_query: KeyQuery = "merged"  # 'separate': Q_h = W_Kᵀ W_Q of rank ``rank`` (pattern 'full' only)
    rank: int | None = None  # separate key/query rank R; None means d + 1
    sources: Sources = "context"  # 'all': the query is a source too (Zhang et al. 2025)
    residual: bool = True
    zero_blocks: bool = False  # Zhang et al. 2025 zero-block init (pattern 'full' only)
    readout: Readout = "negative"  # Ahn et al. read −[Z_L]_{d+1,n+1}; Zhang et al. read +

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        require_int(self, "n_layers", self.n_layers, 1)
        require_int(self, "n_heads", self.n_heads, 1)
        require(self, "pattern", self.pattern in PATTERNS, f"one of {PATTERNS}")
        require(self, "activation", self.activation in ALL_ACTIVATIONS, f"one of {ALL_ACTIVATIONS}")
        require(self, "init_std", self.init_std >= 0, "a float >= 0")
        require(self, "key_query", self.key_query in KEY_QUERY, f"one of {KEY_QUERY}")
        require(self, "rank", self.rank is None or is_int(self.rank, 1), "None or an int >= 1")
        require(self, "rank", self.rank is None or self.key_query == "separate", "None unless key_query='separate'")
        require(self, "sources", self.sources in SOURCES, f"one of {SOURCES}")
        require(self, "readout", self.readout in READOUTS, f"one of {READOUTS}")


class LinearAttention(nn.Module):
    """One residual attention layer z ← z + (1/n) Σ_h attn_h(z), H heads, paper eq. (3)-(4).

    ``P`` and ``Q`` are (H, D, D) in the paper's orientation, derived from the pattern's free
    parameters (``A``, ``B`` of shape (H, d, d) for the structured patterns; ``W_K``, ``W_Q`` of
    shape (H, R, D) for ``key_query='separate'``).
    """

    def __init__(
        self,
        d: int,
        *,
        n_heads: int = 1,
        pattern: Pattern = "full",
        activation: Activation = "linear",
        init_std: float = 1e-4,
        generator: torch.Generator | None = None,
        key_query: KeyQuery = "merged",
        rank: int | None = None,
        sources: Sources = "context",
        residual: bool = True,
        zero_blocks: bool = False,
    ) -> None:
        super().__init__()
        owner = "LinearAttention"
        require(owner, "pattern", pattern in PATTERNS, f"one of {PATTERNS}", pattern)
        require(owner, "activation", activation in ALL_ACTIVATIONS, f"one of {ALL_ACTIVATIONS}", activation)
        require(owner, "key_query", key_query in KEY_QUERY, f"one of {KEY_QUERY}", key_query)
        require(owner, "sources", sources in SOURCES, f"one of {SOURCES}", sources)
        require(owner, "rank", rank is None or is_int(rank, 1), "None or an int >= 1", rank)
        require(owner, "rank", rank is None or key_query == "separate", "None unless key_query='separate'", rank)
        for name, value in (("key_query", key_query != "merged"), ("zero_blocks", zero_blocks)):
            require(owner, name, not value or pattern == "full", "its default unless pattern='full'", pattern)
        self.d, self.D, self.n_heads = d, d + 1, n_heads
        self.pattern, self.activation = pattern, activation
        self.key_query, self.sources, self.residual = key_query, sources, residual
        kq_rank = d + 1 if rank is None else rank
        self.rank = kq_rank if key_query == "separate" else None

        def param(*shape: int) -> nn.Parameter:
            if init_std == 0:  # no draw from any random state
                return nn.Parameter(torch.zeros(n_heads, *shape))
            return nn.Parameter(torch.randn(n_heads, *shape, generator=generator) * init_std)

        if pattern == "full" and key_query == "separate":
            self.P_free = param(self.D, self.D)
            self.W_K_free, self.W_Q_free = param(kq_rank, self.D), param(kq_rank, self.D)
        elif pattern == "full":
            self.P_free, self.Q_free = param(self.D, self.D), param(self.D, self.D)
        else:
            self.A_free = param(d, d)
        if pattern == "pattern11":
            self.B_free = param(d, d)
        if zero_blocks:
            with torch.no_grad():
                self.P_free[:, -1, :d] = 0.0  # the vector part of the value row (v_i in App. D.1)
                if key_query == "separate":
                    self.W_K_free[:, :, -1] = 0.0  # the scalar key entries k_ir (App. F.1)
                else:
                    self.Q_free[:, -1, :d] = 0.0  # u_iᵀ, bottom-left of W^{KQ} (App. D.1)

    # --- the paper's matrices, derived from the free parameters -------------------------
    @property
    def A(self) -> Tensor:
        """(H, d, d): the A block of eq. (8) / (11) (top-left of −Q for eq. 8, of Q for eq. 11)."""
        if self.pattern == "full":
            raise AttributeError("pattern 'full' has no A block; use .Q")
        return (self.A_free + self.A_free.transpose(-1, -2)) / 2 if self.pattern == "sparse_symmetric" else self.A_free

    @property
    def B(self) -> Tensor:
        """(H, d, d): the B block of eq. (11)."""
        if self.pattern != "pattern11":
            raise AttributeError(f"pattern {self.pattern!r} has no B block")
        return self.B_free

    @property
    def P(self) -> Tensor:
        """(H, D, D) value/projection matrix in the paper's orientation."""
        if self.pattern == "full":
            return self.P_free
        ref = self.A_free
        corner = torch.zeros(self.D, self.D, dtype=ref.dtype, device=ref.device)
        corner[-1, -1] = 1.0  # e_D e_Dᵀ; out of place below, so the module also works under vmap
        if self.pattern == "pattern11":
            return torch.nn.functional.pad(self.B_free, (0, 1, 0, 1)) + corner
        return corner.expand(self.n_heads, self.D, self.D)

    @property
    def W_K(self) -> Tensor:
        """(H, R, D) key weights (``key_query='separate'``)."""
        if self.key_query != "separate":
            raise AttributeError("key_query 'merged' has no W_K; use .Q")
        return self.W_K_free

    @property
    def W_Q(self) -> Tensor:
        """(H, R, D) query weights (``key_query='separate'``)."""
        if self.key_query != "separate":
            raise AttributeError("key_query 'merged' has no W_Q; use .Q")
        return self.W_Q_free

    @property
    def Q(self) -> Tensor:
        """(H, D, D) key-query matrix (Q = W_kᵀ W_q) in the paper's orientation."""
        if self.key_query == "separate":
            return torch.einsum("hri,hrj->hij", self.W_K_free, self.W_Q_free)  # Σ_r k_r q_rᵀ
        if self.pattern == "full":
            return self.Q_free
        A = self.A
        return torch.nn.functional.pad(A if self.pattern == "pattern11" else -A, (0, 1, 0, 1))

    @property
    def label_only(self) -> bool:
        """True when only the label column moves (eq. 8: P = e_D e_Dᵀ, linear scores)."""
        return (
            self.activation == "linear"
            and self.pattern in ("sparse", "sparse_symmetric")
            and self.sources == "context"
            and self.residual
        )

    def label_update(self, x: Tensor, y: Tensor, n: int) -> Tensor:
        """The eq.-(8) layer on the label column alone: y_j ← y_j − x_jᵀ (Σ_h A_hᵀ) v, v = Xᵀy/n.

        (B, T, d), (B, T) -> (B, T). The x rows never change under eq. (8) (App. C.1), so this is
        the full layer in O(n·d) instead of O(n·D²), with the same numbers as :meth:`forward`.
        """
        if not self.label_only:
            raise ValueError(
                f"label_update needs pattern 'sparse' or 'sparse_symmetric' with linear scores; got {self.pattern!r}/{self.activation!r}"
            )
        v = torch.einsum("bnd,bn->bd", x[:, :n], y[:, :n]) / n  # (B, d)
        u = v @ self.A.sum(0)  # (B, d): Σ_h A_hᵀ v, as a row
        return y - torch.einsum("btd,bd->bt", x, u)

    @property
    def moment_sources(self) -> str | None:
        """The sources ('context' or 'all') when the layer has the moment form (linear scores), else None."""
        return self.sources if self.activation == "linear" else None

    def transfer(self, gram: Tensor, n: int) -> Tensor:
        """T (D, D, B) with z ← z T for every token: I + Σ_h Q_hᵀ G P_hᵀ / n (eq. 3-4 in rows).

        ``gram`` (D, D, B): Σ_i c_i c_iᵀ over the sources, batch-last. Without the residual, T is the mix.
        """
        if self.moment_sources is None:
            raise ValueError(f"transfer needs linear scores; this layer has {self.activation!r} scores")
        mix = moment_mix(gram, self.Q, self.P, scale=1.0 / n)
        if not self.residual:
            return mix
        return mix + torch.eye(self.D, dtype=mix.dtype, device=mix.device).unsqueeze(-1)

    def token_transfer(self, gram: Tensor, n: int) -> Tensor:
        """:meth:`transfer` batch-first: T (B, D, D) from G (B, D, D), for :func:`~iclab.models.attention_core.moment_layer`."""
        if self.moment_sources is None:
            raise ValueError(f"token_transfer needs linear scores; this layer has {self.activation!r} scores")
        mix = linear_mix(gram, self.Q, self.P, scale=1.0 / n)
        return mix + torch.eye(self.D, dtype=mix.dtype, device=mix.device) if self.residual else mix

    def forward(self, z: Tensor, n: int, *, query_only: bool = False) -> Tensor:
        """(B, T, D) -> (B, T, D). The first ``n`` tokens are the sources (all T with
        ``sources='all'``); all T are targets. Linear and ReLU scores carry the 1/n factor.

        ``query_only``: update only the last token (the query) and return it, (B, 1, D). A model's
        last layer needs nothing else, and for ReLU/softmax scores this is T times less work.
        """
        ctx = z[:, :n] if self.sources == "context" else z  # (B, m, D) sources
        if self.label_only:
            x = z[..., :-1]  # (B, T, d)
            out = torch.cat([x, self.label_update(x, z[..., -1], n).unsqueeze(-1)], dim=-1)
            return out[:, -1:] if query_only else out
        # Head h: key c_i (W_K = I), query Q_h z_j, value P_h c_i; the score is c_iᵀ Q_h z_j. Linear
        # scores reduce to z Σ_h Q_hᵀ (cᵀc) P_hᵀ / n: O(n·D²), no score matrix.
        # Linear and ReLU scores carry 1/n (eq. 3); softmax is raw (ρ = 1), Zhang et al. 2025 Sec. 7.
        scale = 1.0 if self.activation == "softmax" else 1.0 / n
        Q, P = self.Q, self.P
        if query_only:
            if _query_fast.applies(z, ctx.shape[1], self.activation, Q, P):  # the C kernel (a one-layer model)
                # a model reads the label coordinate of the query (the last column): its gradient comes from
                # factors kept by the forward pass (any other output gradient takes the kernel's full backward)
                D = z.shape[-1]
                upd = _query_fast.query_update(z, ctx.shape[1], Q, P, self.activation, scale, readout=D - 1)
                return z[:, -1:] + upd if self.residual else upd
            z = z[:, -1:]  # targets: the query row; the sources are unchanged
        upd = attention_update(ctx, z, Q, P, (self.activation,) * self.n_heads, scale=scale)
        return z + upd if self.residual else upd


def _label_moments(episode: Episode) -> tuple[Tensor, Tensor, Tensor]:
    """(XᵀX/n (d, d, B), Xᵀy/n (d, B), x_q (d, B)) over the context, batch-last."""
    assert episode.y is not None
    x = episode.x.permute(2, 0, 1)  # (d, B, n)
    n = episode.n
    S = torch.einsum("ibn,jbn->ijb", x, x).contiguous() / n
    v = torch.einsum("ibn,bn->ib", x, episode.y) / n
    return S, v, episode.x_query.transpose(0, 1).contiguous()


class LinearTransformer(AttentionStack):
    """L residual linear-attention layers with the paper's read-out ŷ = −[Z_L]_{d+1, n+1} (eq. 4).

    ``predict`` returns +ŷ. ``trace`` also returns every intermediate prompt.
    """

    def __init__(
        self, config: LinearTransformerConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.config = config = config or LinearTransformerConfig()
        self.layers = nn.ModuleList(
            LinearAttention(
                config.d,
                n_heads=config.n_heads,
                pattern=config.pattern,
                activation=config.activation,
                init_std=config.init_std,
                generator=generator,
                key_query=config.key_query,
                rank=config.rank,
                sources=config.sources,
                residual=config.residual,
                zero_blocks=config.zero_blocks,
            )
            for _ in range(config.n_layers)
        )

    def forward(self, episode: Episode) -> Tensor:
        """+ŷ (B,). Eq. (8) in every layer: the label-only moment form below; other linear
        patterns: the moment form of :class:`AttentionStack`; ReLU/softmax scores: token by token.

        Under eq. (8) the x rows never move, so with S = XᵀX/n, v_ℓ = Xᵀy_ℓ/n (context) and
        u_ℓ = Σ_h A_hᵀ v_ℓ, a layer is y_j ← y_j − x_jᵀu_ℓ, i.e. v_{ℓ+1} = v_ℓ − S u_ℓ and
        ŷ-slot ← ŷ-slot − x_qᵀ u_ℓ: O(d²) per prompt and layer, never the n tokens (S, v_0, x_q are
        memoised on the episode). This is Lemma 1's preconditioned GD, w_{ℓ+1} = w_ℓ − A_ℓ∇, read in
        the gradient's coordinates.
        """
        if not all(layer.label_only for layer in self.layers):
            fast = self._forward_native(episode)
            return super().forward(episode) if fast is None else fast
        self._check(episode)
        S, v, xq = episode.memo("label_moments", _label_moments)  # (d, d, B), (d, B), (d, B)
        last = len(self.layers) - 1
        slot = torch.zeros_like(xq[0])  # the query's label slot, (B,)
        for i, layer in enumerate(self.layers):
            u = cast(LinearAttention, layer).A.sum(0).transpose(0, 1) @ v  # (d, B)
            slot = slot - (xq * u).sum(0)
            if i < last:
                v = v - (S * u.unsqueeze(0)).sum(1)
        return self._read_label(slot)

    def _forward_native(self, episode: Episode) -> Tensor | None:
        """+ŷ (B,) by the C kernel of the moment form (:mod:`iclab.models._moment_fast`), or None where it does not
        apply (then :meth:`AttentionStack.forward` computes the same in torch)."""
        sources = self.moment_sources
        if sources is None or not _moment_fast.NATIVE:
            return None
        self._check(episode)
        gram, q = context_moments(episode, include_query=sources == "all")  # (D, D, B), (D, B)
        P, Q = self.P, self.Q  # (L, H, D, D)
        if not _moment_fast.applies(gram, q, P, Q):
            return None
        label = _moment_fast.moment_stack(gram, q, P, Q, scale=1.0 / episode.n, residual=self.config.residual)
        return self._read_label(label)

    # --- the matrices theory talks about, stacked over layers ---------------------------
    @property
    def P(self) -> Tensor:
        """(L, H, D, D)."""
        return self._stack("P")

    @property
    def Q(self) -> Tensor:
        """(L, H, D, D)."""
        return self._stack("Q")

    @property
    def A(self) -> Tensor:
        """(L, H, d, d): the A_ℓ of eq. (8) or (11)."""
        return self._stack("A")

    @property
    def B(self) -> Tensor:
        """(L, H, d, d): the B_ℓ of eq. (11)."""
        return self._stack("B")

    @torch.no_grad()
    def load_matrices(self, **blocks: Tensor) -> LinearTransformer:
        """Set the free parameters from stacked (L, H, ·, ·) or (L, ·, ·) tensors: ``P``/``Q`` for
        ``full``, ``A`` (and ``B`` for ``pattern11``) otherwise. Returns self."""
        names: tuple[str, ...] = {"full": ("P", "Q"), "pattern11": ("A", "B")}.get(self.config.pattern, ("A",))
        if self.config.key_query == "separate":
            names = ("P", "W_K", "W_Q")
        self._load_stacked(names, blocks, f"pattern {self.config.pattern!r}, key_query {self.config.key_query!r}")
        return self
