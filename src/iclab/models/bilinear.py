"""Bilinear (GLU without activation) feed-forward layers and the bilinear transformer.

Sun, Jadbabaie, Azizan 2025, eq. (1)-(3) and (11). The paper's prompt has tokens as columns,

    Z = [1 … 1; x_1 … x_{n+1}; 0 … 0; y_1 … y_n 0] ∈ R^{(d̄+1)×(n+1)}          (eq. 1)

rows: constant, x (d rows), d̄ − d − 1 zero scratch rows, label. Here z = Zᵀ is (B, n+1, D) with
D = d̄ + 1 and the query last (:func:`embed_scratch`). The width d̄ counts everything but the label.

* Bilinear FFN (eq. 3), token-wise on the first d̄ entries u (the label is neither read nor written):
  u ← u + (W_0 u) ⊙ (W_1 u), W_0, W_1 ∈ R^{d̄×d̄} (the paper's R^{d×d̄} is a typo, docs/errata.md).
* Sparse FFN (eq. 11): W_i = [[0, 0], [W̃_i, 0]], W̃_i ∈ R^{(d̄−d−1)×(d+1)}: only the scratch entries
  are written, each from (1, x) alone. ``sparse_strict`` also holds the attention's P rows of the
  constant and x entries at 0, so no layer can overwrite (1, x) and no feature of degree > 2 in x
  can form (eq. 11 alone does not forbid them, docs/errata.md; the paper's sparse model does not do this).
* Attention is :class:`~iclab.models.LinearAttention` with pattern ``full`` on tokens of width
  D = d̄ + 1: z_i ← z_i + (1/n) Σ_j (P z_j)(z_jᵀ Q z_i) (eq. 2, M drops the query as a source).
* Block (Sec. 2.2): FFN then attention (``order="ffn_first"``, the paper's) or attention then FFN
  (``"attention_first"``, the usual transformer order). ``ffn="none"`` is the linear transformer on
  the same prompt (the baseline of Prop. 1): L attention layers and nothing else.

Two options for training deep stacks, both outside the paper (which is silent on initialisation and
on any normalisation; docs/papers/sun2025.md, "Stability"):

* ``label_scale`` s: the prompt's label entries are divided by s and the read-out multiplied by s. With
  S = diag(1, …, 1, 1/s) this is the exact reparameterisation P = S⁻¹P′S, Q = SQ′S of the paper's model (the
  FFN never touches the label), so the function class, the loss and every property below (``P``, ``Q``,
  ``trace``, ``load_weights``) are the paper's; only the stored parameters P′, Q′, and hence Adam's
  per-entry steps and the init, differ. s = √E[y²] gives every prompt row unit second moment.
* ``init="identity"``: W_1 = 0 and P = 0 at init (the other factor of each residual branch keeps its
  N(0, init_std²) draw), so every block is exactly the identity and the model starts as the zero predictor
  (SkipInit / Fixup-style zero-initialised residual branches).

Read-out (eq. 4): the paper trains the bottom-right entry towards −y_q; ``predict`` returns
ŷ = −Z_L[d̄+1, n+1] = −z[:, -1, -1] (+ŷ). ``block_predictions`` gives ŷ after each of ℓ = 0..L
blocks (the ℓ-block sub-networks of Fig. 5-9 and the BCD iterates of Thm 6).

Training path: on a CPU, ``forward`` runs the stack as one autograd node over chunks of prompts, batch-last, with a
hand-written backward (:mod:`iclab.models._bilinear_fast`, exact against :meth:`BilinearTransformer.forward_tokens`
to 1e-10 in float64; docs/performance.md, Sun et al. 2025); ``forward_tokens`` is the sub-layer-by-sub-layer reference.
The linear transformer (``ffn="none"``) is the stack of Ahn et al.'s moment form (:mod:`iclab.models.attention_core`):
every token moves by the same T_ℓ, so ``forward`` carries the prompt's Gram matrix and query row
(:func:`prompt_moments`) through the layers, by the C kernel of :mod:`iclab.models._moment_fast` where it applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, is_int, require, require_int
from iclab.core.private_torch import is_transformed
from iclab.core.threads import map_on_threads
from iclab.models import _moment_fast
from iclab.models._bilinear_fast import bilinear_stack, native_embed
from iclab.models.attention_core import moment_labels, moment_layer
from iclab.models.linear_attention import LinearAttention

FFN = Literal["dense", "sparse", "sparse_strict", "none"]
Order = Literal["ffn_first", "attention_first"]
INITS = ("gaussian", "identity")
FFNS = ("dense", "sparse", "sparse_strict", "none")
ORDERS = ("ffn_first", "attention_first")


#: bytes of one chunk of :func:`embed_scratch`'s prompt written at once (it stays in cache while its columns are filled)
EMBED_CHUNK_BYTES = 1 << 18


def embed_scratch(episode: Episode, d_bar: int, label_scale: float = 1.0) -> Tensor:
    """The prompt of eq. (1) as rows: [1, x_i, 0 (d̄−d−1), y_i/s] per context pair and [1, x_q, 0, 0]. (B, n+1, d̄+1).

    ``label_scale`` s: the label entries are y · (1/s) (1/s rounded to the prompt's dtype first, as
    :class:`BilinearTransformer`'s reparameterisation S multiplies them). Without autograd on the episode the prompt is
    written in place, chunk by chunk on torch's threads (:func:`~iclab.core.threads.map_on_threads`); the same numbers,
    bit for bit, as the concatenation :func:`_embed_reference` that a differentiable or transformed episode takes.
    """
    if episode.y is None:
        raise ValueError("embed_scratch needs a regression episode (float labels y); got a classification episode")
    d = episode.d
    require("embed_scratch", "d_bar", is_int(d_bar, d + 1), f"an int >= d + 1 = {d + 1}", d_bar)
    x, xq, y = episode.x, episode.x_query, episode.y
    # inside a torch.func transform even a slice of a plain tensor is wrapped (no data pointer): the reference runs
    if any(t.requires_grad for t in (x, xq, y)) or is_transformed(x, xq, y, x.view_as(x)):
        return _embed_reference(x, xq, y, d_bar, label_scale)
    fast = native_embed(x, xq, y, d_bar, float(torch.tensor(1.0 / label_scale, dtype=x.dtype)))
    if fast is not None:
        return fast
    B, n = episode.batch_size, episode.n
    z = x.new_empty(B, n + 1, d_bar + 1)
    inv = torch.tensor(1.0 / label_scale, dtype=x.dtype) if label_scale != 1.0 else None
    per = max(1, EMBED_CHUNK_BYTES // ((n + 1) * (d_bar + 1) * z.element_size()))

    def run(s: int) -> None:
        c = z[s : s + per]
        c[..., 0] = 1.0
        c[:, :n, 1 : d + 1] = x[s : s + per]
        c[:, n, 1 : d + 1] = xq[s : s + per]
        c[..., d + 1 : d_bar] = 0.0
        c[:, n, d_bar] = 0.0
        if inv is None:
            c[:, :n, d_bar] = y[s : s + per]
        else:
            torch.mul(y[s : s + per], inv, out=c[:, :n, d_bar])

    map_on_threads(run, range(0, B, per), x.device.type != "cpu")
    return z


def prompt_moments(episode: Episode, d_bar: int, label_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """(G_0 (D, D, B), q_0 (D, B)) of :func:`embed_scratch`'s prompt z, batch-last (D = d̄ + 1): G_0 = Σ_{t<n} z_t z_tᵀ
    over the context and q_0 = z_n, all that a stack of attention layers alone reads of the prompt.

    Where :func:`iclab.models._moment_fast.moments` applies (a CPU float episode without autograd), from its C
    kernel's moments of the [x; y] rows and the sums Σx, Σy, without the (B, n+1, D) prompt (the label entries'
    moments scaled by 1/s and 1/s² after the sums: the same numbers up to rounding); else from the prompt itself,
    differentiable in the episode.
    """
    if episode.y is None:
        raise ValueError("prompt_moments needs a regression episode (float labels y); got a classification episode")
    x, y, xq, n, d = episode.x, episode.y, episode.x_query, episode.n, episode.d
    require("prompt_moments", "d_bar", is_int(d_bar, d + 1), f"an int >= d + 1 = {d + 1}", d_bar)
    if not _moment_fast.moments_apply(x, y, xq):
        z = embed_scratch(episode, d_bar, label_scale)
        return torch.einsum("bni,bnj->ijb", z[:, :n], z[:, :n]).contiguous(), z[:, -1].transpose(0, 1).contiguous()
    g, _ = _moment_fast.moments(x, y, xq)  # Σ [x; y][x; y]ᵀ, (d+1, d+1, B)
    inv = torch.tensor(1.0 / label_scale, dtype=x.dtype)  # rounded to the dtype first, as embed_scratch
    G = x.new_zeros(d_bar + 1, d_bar + 1, x.shape[0])
    G[0, 0] = n
    G[0, 1 : d + 1] = G[1 : d + 1, 0] = x.sum(1).T  # Σ x_t
    G[0, -1] = G[-1, 0] = y.sum(1) * inv  # Σ y_t / s
    G[1 : d + 1, 1 : d + 1] = g[:d, :d]
    G[1 : d + 1, -1] = G[-1, 1 : d + 1] = g[:d, d] * inv
    G[-1, -1] = g[d, d] * inv * inv
    q = x.new_zeros(d_bar + 1, x.shape[0])
    q[0] = 1.0
    q[1 : d + 1] = xq.T
    return G, q


def _embed_reference(x: Tensor, xq: Tensor, y: Tensor, d_bar: int, label_scale: float) -> Tensor:
    """:func:`embed_scratch` by concatenation, differentiable in the episode (and under ``torch.func`` transforms)."""
    B, n, d = x.shape
    xs = torch.cat([x, xq.unsqueeze(1)], dim=1)  # (B, n+1, d)
    yp = torch.nn.functional.pad(y, (0, 1))  # (B, n+1): query label 0
    one = torch.ones(B, n + 1, 1, dtype=x.dtype, device=x.device)
    pad = torch.zeros(B, n + 1, d_bar - d - 1, dtype=x.dtype, device=x.device)
    z = torch.cat([one, xs, pad, yp.unsqueeze(-1)], dim=-1)
    if label_scale == 1.0:
        return z
    sc = torch.ones(d_bar + 1, dtype=z.dtype, device=z.device)
    sc[-1] = 1.0 / label_scale
    return z * sc


class _MaskRows(nn.Module):
    """Parametrisation P = mask ⊙ P_free: the rows of P named by ``mask`` stay exactly zero."""

    mask: Tensor

    def __init__(self, mask: Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, p: Tensor) -> Tensor:
        return p * self.mask


def _original(layer: nn.Module, name: str) -> Tensor:
    """The stored tensor behind the parametrised ``layer.<name>`` (:mod:`torch.nn.utils.parametrize`)."""
    return cast(Tensor, cast(nn.ModuleDict, layer.parametrizations)[name].original)


def _rebuild(config: BilinearTransformerConfig, state: dict[str, Tensor], training: bool) -> BilinearTransformer:
    """Unpickle a :class:`BilinearTransformer` (its ``__reduce__``)."""
    model = BilinearTransformer(config)
    ref = next(iter(state.values()))
    model.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
    model.load_state_dict(state)
    return model.train(training)


class BilinearFFN(nn.Module):
    """u ← u + (W_0 u) ⊙ (W_1 u) on the first d̄ entries of every token; eq. (3), or eq. (11) with ``sparse``.

    ``W0``, ``W1`` are (d̄, d̄) in the paper's orientation (acting on columns u); for the sparse layer only
    the (d̄−d−1, d+1) blocks ``W0_tilde``, ``W1_tilde`` are parameters.
    """

    def __init__(
        self,
        d: int,
        d_bar: int,
        *,
        sparse: bool = False,
        init_std: float = 0.05,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        require_int("BilinearFFN", "d", d, 1)
        low = d + 2 if sparse else d + 1
        require_int("BilinearFFN", "d_bar", d_bar, low, note=f"d = {d}{', at least one scratch row' if sparse else ''}")
        self.d, self.d_bar, self.sparse = d, d_bar, sparse
        shape = (d_bar - d - 1, d + 1) if sparse else (d_bar, d_bar)

        def param() -> nn.Parameter:
            if init_std == 0:
                return nn.Parameter(torch.zeros(*shape))
            return nn.Parameter(torch.randn(*shape, generator=generator) * init_std)

        self.W0_free, self.W1_free = param(), param()

    def _full(self, w: Tensor) -> Tensor:
        if not self.sparse:
            return w
        out = torch.zeros(self.d_bar, self.d_bar, dtype=w.dtype, device=w.device)
        out[self.d + 1 :, : self.d + 1] = w
        return out

    @property
    def W0(self) -> Tensor:
        """(d̄, d̄) in the paper's orientation."""
        return self._full(self.W0_free)

    @property
    def W1(self) -> Tensor:
        """(d̄, d̄) in the paper's orientation."""
        return self._full(self.W1_free)

    def forward(self, z: Tensor) -> Tensor:
        """(B, T, d̄+1) -> (B, T, d̄+1); the label entry passes through.

        Computed on the whole token with W_0, W_1 zero-padded to (d̄+1)²: the label's row and column are 0,
        so it passes through exactly and no slice/cat of the (B, T, d̄+1) activations (and no zero-filled
        slice gradient in the backward) is needed. The sparse layer's padded weights are zero outside
        its (d̄−d−1, d+1) block, which is eq. (11) exactly.
        """
        pad = (0, z.shape[-1] - self.d_bar, 0, z.shape[-1] - self.d_bar)
        W0, W1 = nn.functional.pad(self.W0, pad), nn.functional.pad(self.W1, pad)  # (d̄+1, d̄+1)
        return bilinear_residual(z, W0, W1)


class _BilinearResidual(torch.autograd.Function):
    """z + (z W_0ᵀ) ⊙ (z W_1ᵀ) with both maps in one product and a backward of three passes.

    Forward: [b | a] = z [W_1; W_0]ᵀ (one (N, D)·(D, 2D) GEMM), then addcmul. Backward, with g the output
    gradient: [g⊙b | g⊙a] = [∂a | ∂b] in one multiply, ∂z = g + [∂a | ∂b] [W_0; W_1] (one GEMM with the
    add fused), ∂[W_0; W_1] = [∂a | ∂b]ᵀ z. Plain autograd does two GEMMs forward, two multiplies, four GEMMs
    and three adds over the (B, T, D) activations backward. [b | a] is kept from the forward (a second,
    non-differentiable output); under ``create_graph`` it is recomputed from z, so that the backward is
    itself differentiable and the function is exact to any order.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z: Tensor, W0: Tensor, W1: Tensor) -> tuple[Tensor, Tensor]:
        D = W0.shape[0]
        ba = z @ torch.cat([W1, W0]).transpose(0, 1)  # (..., 2D): [z W_1ᵀ | z W_0ᵀ]
        return torch.addcmul(z, ba[..., D:], ba[..., :D]), ba

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
        z, W0, W1 = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zero-filled gradient for the second output
        ctx.save_for_backward(z, W0, W1, output[1])

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, _: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        if grad is None:  # y unused (only with set_materialize_grads(False))
            return None, None, None
        z, W0, W1, ba = ctx.saved_tensors
        D = W0.shape[0]
        if torch.is_grad_enabled():  # create_graph: [b | a] as a function of z, W for the next derivative
            ba = z @ torch.cat([W1, W0]).transpose(0, 1)
        d_ab = (grad.unsqueeze(-2) * ba.unflatten(-1, (2, D))).flatten(-2)  # [g⊙b | g⊙a] = [∂a | ∂b]
        flat = d_ab.reshape(-1, 2 * D)
        dz = torch.addmm(grad.reshape(-1, D), flat, torch.cat([W0, W1])).view_as(grad)
        dW = flat.transpose(0, 1) @ z.reshape(-1, D)  # (2D, D): [∂W_0; ∂W_1]
        return dz, dW[:D], dW[D:]


def bilinear_residual(z: Tensor, W0: Tensor, W1: Tensor) -> Tensor:
    """z + (z W_0ᵀ) ⊙ (z W_1ᵀ) for tokens z (..., D) and (D, D) maps: eq. (3) in rows (the label's row and
    column of W_0, W_1 zero). Differentiable to any order."""
    out: tuple[Tensor, Tensor] = _BilinearResidual.apply(z, W0, W1)  # Function.apply is unannotated
    return out[0]


@dataclass(frozen=True, kw_only=True)
class BilinearTransformerConfig:
    """Architecture of :class:`BilinearTransformer` (Sun et al. 2025, §3 and App. I): width, depth, feed-forward kind and block order."""

    d: int = 3  # input dimension
    d_bar: int = 12  # embedding width: constant + x + scratch rows (label excluded); tokens are d̄ + 1 wide
    n_blocks: int = 2  # L: 2L layers (the paper's "8-layer" model has L = 4)
    ffn: FFN = "dense"  # dense eq. (3) | sparse eq. (11) | sparse_strict (also P rows of (1, x) = 0) | none (linear TF)
    order: Order = "ffn_first"
    n_heads: int = 1
    init_std: float = 0.05  # N(0, init_std²) for every free entry of P, Q, W_0, W_1 (the paper does not say)
    init: Literal["gaussian", "identity"] = "gaussian"  # identity: W_1 = P = 0, every block starts as the identity
    label_scale: float = 1.0  # s: label entries enter as y/s, the read-out is s·z (an exact reparameterisation)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        require(self, "ffn", self.ffn in FFNS, f"one of {FFNS}")
        low = self.d + 2 if self.ffn in ("sparse", "sparse_strict") else self.d + 1
        require(self, "d_bar", is_int(self.d_bar, low), f"an int >= {low} for d = {self.d} and ffn = {self.ffn!r}")  # fmt: skip
        require_int(self, "n_blocks", self.n_blocks, 1)
        require(self, "order", self.order in ORDERS, f"one of {ORDERS}")
        require_int(self, "n_heads", self.n_heads, 1)
        require(self, "init_std", self.init_std >= 0, "a float >= 0")
        require(self, "init", self.init in INITS, f"one of {INITS}")
        require(self, "label_scale", isinstance(self.label_scale, (int, float)) and math.isfinite(self.label_scale) and self.label_scale > 0, "a finite float > 0")  # fmt: skip


class BilinearTransformer(nn.Module):
    """L blocks [bilinear FFN → linear attention] on the [1; x; 0; y] prompt (Sec. 2.2, 3.2).

    ``predict`` returns +ŷ = −z_L[query, label]. ``trace`` returns every sub-layer's prompt and
    ``block_predictions`` the read-out after each block.
    """

    def __init__(
        self, config: BilinearTransformerConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.config = cfg = config or BilinearTransformerConfig()
        self.attn = nn.ModuleList(
            LinearAttention(cfg.d_bar, n_heads=cfg.n_heads, pattern="full", init_std=cfg.init_std, generator=generator)
            for _ in range(cfg.n_blocks)
        )
        self.ffn = nn.ModuleList(
            BilinearFFN(cfg.d, cfg.d_bar, sparse=cfg.ffn != "dense", init_std=cfg.init_std, generator=generator)
            for _ in range(cfg.n_blocks if cfg.ffn != "none" else 0)
        )
        if cfg.ffn == "sparse_strict":
            mask = torch.ones(cfg.n_heads, cfg.d_bar + 1, cfg.d_bar + 1)
            mask[:, : cfg.d + 1] = 0  # attention never writes the constant or x entries
            for layer in self._attn_layers:
                with torch.no_grad():
                    layer.P_free.mul_(mask)
                parametrize.register_parametrization(layer, "P_free", _MaskRows(mask))
        if cfg.init == "identity":
            with torch.no_grad():
                for ffn in self._ffn_layers:
                    ffn.W1_free.zero_()
                for layer in self._attn_layers:
                    self._P_store(layer).zero_()

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickle as (config, state): torch refuses to pickle a module with a parametrisation (``sparse_strict``'s
        row mask), which a worker process (``--workers``, Ray) must send back; rebuilt, it has the same
        parametrisation, dtype, device and train/eval mode."""
        return _rebuild, (self.config, self.state_dict(), self.training)

    def _P_store(self, layer: LinearAttention) -> Tensor:
        """The tensor that holds P′ (the parametrisation's original for ``sparse_strict``)."""
        return _original(layer, "P_free") if self.config.ffn == "sparse_strict" else layer.P_free

    @property
    def _attn_layers(self) -> Sequence[LinearAttention]:
        """``attn`` with its items' type (an ``nn.ModuleList``'s are typed ``nn.Module``)."""
        return cast("Sequence[LinearAttention]", self.attn)

    @property
    def _ffn_layers(self) -> Sequence[BilinearFFN]:
        """``ffn`` with its items' type."""
        return cast("Sequence[BilinearFFN]", self.ffn)

    def _label_scaling(self, like: Tensor) -> Tensor:
        """diag(S) = (1, …, 1, 1/s), (D,)."""
        out = torch.ones(self.config.d_bar + 1, dtype=like.dtype, device=like.device)
        out[-1] = 1.0 / self.config.label_scale
        return out

    @property
    def _dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _check(self, episode: Episode) -> None:
        if episode.y is None:
            raise ValueError("BilinearTransformer needs a regression episode (float labels y); got a classification episode")  # fmt: skip
        if episode.d != self.config.d:
            raise ShapeError(f"BilinearTransformer was built for d={self.config.d}; got an episode with d={episode.d}")
        if episode.dtype != self._dtype:
            raise ShapeError(
                f"BilinearTransformer has {self._dtype} parameters; got a {episode.dtype} episode (call model.to({episode.dtype}) or episode.to(dtype={self._dtype}))"
            )

    def sublayers(self) -> list[BilinearFFN | LinearAttention]:
        """The 2L (L for ffn='none') sub-layers in the order they run."""
        out: list[BilinearFFN | LinearAttention] = []
        for ell, attn in enumerate(self._attn_layers):
            ffn = [self._ffn_layers[ell]] if self.ffn else []
            out += [*ffn, attn] if self.config.order == "ffn_first" else [attn, *ffn]
        return out

    def _prompt(self, episode: Episode) -> Tensor:
        """Z′_0ᵀ = (SZ_0)ᵀ, (B, n+1, d̄+1): the prompt of eq. (1) with the label entries divided by ``label_scale``."""
        return embed_scratch(episode, self.config.d_bar, self.config.label_scale)  # (B, n+1, d̄+1)

    def _run(self, episode: Episode, keep: bool) -> tuple[Tensor, list[Tensor]]:
        self._check(episode)
        z = self._prompt(episode)
        s = self.config.label_scale
        states = [z]
        for layer in self.sublayers():
            z = moment_layer(layer, z, episode.n) if isinstance(layer, LinearAttention) else layer(z)
            if keep:
                states.append(z)
        if s != 1.0:  # back to the paper's Z = S⁻¹Z′
            z = z / self._label_scaling(z)
            states = [t / self._label_scaling(t) for t in states]
        return z, states

    def trace(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """(ŷ (B,), states (S+1, B, n+1, d̄+1)) with S the number of sub-layers, Z_0ᵀ first."""
        z, states = self._run(episode, keep=True)
        return -z[:, -1, -1], torch.stack(states)

    def block_predictions(self, episode: Episode, *, fused: bool = False) -> Tensor:
        """(L+1, B): +ŷ after ℓ = 0, …, L blocks, read from Z^{(2ℓ)} (App. H's sub-networks).

        ``fused``: on a CPU, each ℓ-block sub-network (ℓ ≥ 1) by :meth:`forward`'s fused pass on the first ℓ blocks
        (its C kernel where it can be built): the same numbers as the token layers to rounding (1e-10 in float64,
        tests/test_polynomial_fast.py), without keeping the (B, n+1, d̄+1) prompt after every sub-layer; the
        token layers run where the fused pass does not (another device, autograd on the prompt, ``torch.func``).
        The linear transformer (``ffn="none"``), fused or not: every ℓ from one pass of its moment form
        (:func:`~iclab.models.attention_core.moment_labels`)."""
        if fused or not self.ffn:
            self._check(episode)
        if not self.ffn:
            gram, q = self._moments(episode)
            labels = moment_labels(self._attn_layers, gram, q, episode.n)  # (L, B), z′ = SZ
            return -torch.cat([q[-1:], labels]) * self.config.label_scale
        z0 = self._prompt(episode) if fused else None
        if z0 is None or z0.device.type != "cpu" or z0.requires_grad or is_transformed(z0, *self.parameters()):
            _, states = self._run(episode, keep=True)
            return torch.stack([-s[:, -1, -1] for s in states[::2]])  # a block is 2 sub-layers
        layers, s = self._fused_layers(), self.config.label_scale
        first = -z0[:, -1, -1] * s  # ℓ = 0: the query's label entry, 0
        rest = [bilinear_stack(z0, layers[: 2 * ell], n=episode.n, live=self.config.d + 1) for ell in range(1, self.config.n_blocks + 1)]  # fmt: skip
        return torch.stack([first, *(-r * s for r in rest)])

    def forward(self, episode: Episode) -> Tensor:
        """+ŷ (B,). The linear transformer (``ffn="none"``) by its moment form (module docstring). Else, on a CPU, the
        whole stack is one autograd node over chunks of prompts with a hand-written backward
        (:mod:`iclab.models._bilinear_fast`; the same numbers as :meth:`forward_tokens`, not differentiable twice);
        under ``torch.func`` transforms, on other devices and for a prompt that needs a gradient, :meth:`forward_tokens`."""
        self._check(episode)
        if not self.ffn:
            return -self._linear_label(episode) * self.config.label_scale
        z0 = self._prompt(episode)
        if z0.device.type != "cpu" or z0.requires_grad or is_transformed(z0, *self.parameters()):
            return self.forward_tokens(episode)
        slot = bilinear_stack(
            z0, self._fused_layers(), n=episode.n, live=self.config.d + 1
        )  # z′_L[query, label], z′ = SZ
        return -slot * self.config.label_scale  # (B,) the paper trains Z[d̄+1, n+1] towards −y_q (eq. 4)

    def _fused_layers(self) -> list[tuple[str, Tensor, Tensor]]:
        """The sub-layers as :func:`~iclab.models._bilinear_fast.bilinear_stack` takes them: ("ffn", W_0, W_1) or
        ("attn", P, Q)."""
        return [
            ("ffn", layer.W0, layer.W1) if isinstance(layer, BilinearFFN) else ("attn", layer.P, layer.Q)
            for layer in self.sublayers()
        ]

    def _moments(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """:func:`prompt_moments` of the model's prompt Z′_0 = SZ_0, memoised on the episode."""
        d_bar, s = self.config.d_bar, self.config.label_scale
        return episode.memo(f"prompt_moments({d_bar}, {s!r})", lambda ep: prompt_moments(ep, d_bar, s))

    def _linear_label(self, episode: Episode) -> Tensor:
        """``ffn="none"``: z′_L[query, label], (B,), by the moment form: the C kernel of
        :mod:`iclab.models._moment_fast` where it applies, else :func:`~iclab.models.attention_core.moment_labels`."""
        gram, q = self._moments(episode)
        if _moment_fast.NATIVE:
            P = torch.stack([layer.P for layer in self._attn_layers])  # (L, H, D, D)
            Q = torch.stack([layer.Q for layer in self._attn_layers])
            if _moment_fast.applies(gram, q, P, Q):
                return _moment_fast.moment_stack(gram, q, P, Q, scale=1.0 / episode.n)
        return moment_labels(self._attn_layers, gram, q, episode.n)[-1]

    def forward_tokens(self, episode: Episode) -> Tensor:
        """+ŷ (B,) by the sub-layer modules on the (B, n+1, d̄+1) prompt, autograd through each: differentiable to any
        order and under ``torch.func`` transforms (the reference :meth:`forward` is tested against)."""
        z, _ = self._run(episode, keep=False)
        return -z[:, -1, -1]  # (B,) the paper trains Z[d̄+1, n+1] towards −y_q (eq. 4)

    def predict(self, episode: Episode) -> Tensor:
        """+ŷ for the query of every prompt, (B,)."""
        out: Tensor = self(episode)
        return out

    # --- the matrices theory talks about, stacked over blocks ---------------------------
    @property
    def P(self) -> Tensor:
        """(L, H, D, D), D = d̄ + 1, in the paper's parameterisation P = S⁻¹P′S."""
        P = torch.stack([a.P for a in self._attn_layers])
        sc = self._label_scaling(P)
        return P * sc[:, None] ** -1 * sc  # S⁻¹ P′ S

    @property
    def Q(self) -> Tensor:
        """(L, H, D, D), in the paper's parameterisation Q = SQ′S."""
        Q = torch.stack([a.Q for a in self._attn_layers])
        sc = self._label_scaling(Q)
        return Q * sc[:, None] * sc

    @property
    def W0(self) -> Tensor:
        """(L, d̄, d̄)."""
        return torch.stack([f.W0 for f in self._ffn_layers])

    @property
    def W1(self) -> Tensor:
        """(L, d̄, d̄)."""
        return torch.stack([f.W1 for f in self._ffn_layers])

    @torch.no_grad()
    def load_weights(self, **blocks: Tensor) -> BilinearTransformer:
        """Set ``P``, ``Q`` ((L, D, D) or (L, H, D, D)) and/or ``W0``, ``W1`` ((L, d̄, d̄); for a sparse FFN the
        (L, d̄−d−1, d+1) blocks ``W0_tilde``, ``W1_tilde`` or full matrices zero outside them). Returns self."""
        cfg = self.config
        allowed = {"P", "Q", "W0", "W1", "W0_tilde", "W1_tilde"}
        require("BilinearTransformer.load_weights", "blocks", set(blocks) <= allowed, f"a subset of {sorted(allowed)}", sorted(blocks))  # fmt: skip
        for name, value in blocks.items():
            value = torch.as_tensor(value)
            require("BilinearTransformer.load_weights", name, value.shape[0] == cfg.n_blocks, f"a stack over the {cfg.n_blocks} blocks", tuple(value.shape))  # fmt: skip
            if name in ("P", "Q"):
                if value.dim() == 3:
                    value = value.unsqueeze(1).expand(-1, cfg.n_heads, -1, -1)
                want = (cfg.n_blocks, cfg.n_heads, cfg.d_bar + 1, cfg.d_bar + 1)
                require("BilinearTransformer.load_weights", name, tuple(value.shape) == want, f"shape {want}", tuple(value.shape))  # fmt: skip
                sc = self._label_scaling(value)
                value = (
                    value * sc[:, None] * sc**-1 if name == "P" else value * sc[:, None] ** -1 * sc**-1
                )  # P′ = SPS⁻¹, Q′ = S⁻¹QS⁻¹
                for layer, v in zip(self._attn_layers, value, strict=True):
                    if name == "P" and cfg.ffn == "sparse_strict":
                        require("BilinearTransformer.load_weights", "P", bool((v[:, : cfg.d + 1] == 0).all()), "zero in the rows of (1, x) for ffn='sparse_strict'", "non-zero rows")  # fmt: skip
                        _original(layer, "P_free").copy_(v)
                    else:
                        getattr(layer, f"{name}_free").copy_(v)
                continue
            require("BilinearTransformer.load_weights", name, bool(self.ffn), "absent for ffn='none'", name)
            key = name[:2]
            for ffn, v in zip(self._ffn_layers, value, strict=True):
                target = getattr(ffn, f"{key}_free")
                if ffn.sparse and v.shape[-2:] == (cfg.d_bar, cfg.d_bar):
                    mask = torch.ones_like(v, dtype=torch.bool)
                    mask[cfg.d + 1 :, : cfg.d + 1] = False
                    require("BilinearTransformer.load_weights", name, bool((v[mask] == 0).all()), "zero outside the W̃ block for a sparse FFN (eq. 11)", "non-zero entries")  # fmt: skip
                    v = v[cfg.d + 1 :, : cfg.d + 1]
                require("BilinearTransformer.load_weights", name, v.shape == target.shape, f"per-block shape {tuple(target.shape)}", tuple(v.shape))  # fmt: skip
                target.copy_(v)
        return self
