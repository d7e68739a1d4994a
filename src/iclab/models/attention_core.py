"""The multi-head "scores × values" update shared by every attention layer.

Head h sends target token t_j the sum Σ_i h̃_h(k_{h,i}, q_{h,j}) v_{h,i} over the m sources s_i, with
key k_{h,i} = W_{K,h} s_i, query q_{h,j} = W_{Q,h} t_j and value v_{h,i} = W_{V,h} s_i (Ahn et al. 2023,
eq. (3); Cheng, Chen, Sra 2024, eq. (2) and, per head, eq. (26); Zhang et al. 2025, eq. M).
:func:`attention_update` returns ``scale`` · Σ_h of it. The layers differ only in how they build the
maps (:class:`~iclab.models.LinearAttention`: W_K = I, W_Q = Q_h, W_V = P_h on the full token;
:class:`~iclab.models.KernelAttention`: [B, 0], [C, 0] or Q, K, and V = [[A, 0], [0, r]]) and are thin
wrappers around this function.

Linear heads are evaluated by associativity, Δ_j = t_jᵀ Σ_h W_{Q,h}ᵀ W_{K,h} (Σ_i s_i s_iᵀ) W_{V,h}ᵀ (in
rows): one (B, D, D) Gram matrix, mixed over heads at (D, D) size, then one product with the targets.
No m×T score matrix and no per-head (m, ·) key or value tensor is formed: O(m·D²) per prompt. The
other scores come from :func:`iclab.core.kernels.inner_product_scores`, softmax normalised over the m
sources; the values are applied after the sources are weighed, W_{V,h} (Σ_i a_hji s_i).

**Moment form.** A layer whose update is linear in the targets with a mix built from the sources' Gram
matrix alone (linear scores, the sources = the context or every token) maps the prompt by one matrix
per prompt: z_{ℓ+1} = z_ℓ T_ℓ with T_ℓ = I + Mix_ℓ(G_ℓ) (Ahn et al. eq. 3: P Z M Zᵀ Q Z is a left
product with Z). Every row moves by the same T_ℓ, so G_{ℓ+1} = T_ℓᵀ G_ℓ T_ℓ and the query row is
q_{ℓ+1} = q_ℓ T_ℓ: the whole L-layer forward pass is a function of (G_0, q_0), (D, D) + (D,) per prompt,
and never touches the n tokens again (:meth:`AttentionStack.forward`; exact, the same numbers as the
token pass up to rounding). Those tensors are kept batch-last, (D, D, B): a product with a shared
(D, D) matrix is then one GEMM, and a per-prompt product D rank-1 updates over contiguous B-vectors
(:func:`batched_matmul`), ≈ 7× faster on a CPU than ``torch.bmm`` on (B, 6, 6) (docs/performance.md).
On a CPU with a C compiler, :class:`~iclab.models.LinearTransformer` runs the whole L-layer pass, forward and
backward, as one C call with the prompts in vector lanes (:mod:`iclab.models._moment_fast`), and
:func:`context_moments` builds (G_0, q_0) from the data by the same kernel, without the prompt; the code here is
that kernel's torch fallback and computes the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, require, require_shape
from iclab.core.kernels import INNER_PRODUCT_KERNELS, inner_product_scores
from iclab.core.private_torch import is_transformed
from iclab.models import _moment_fast


def linear_mix(
    gram: Tensor, query_maps: Tensor, value_maps: Tensor, *, key_maps: Tensor | None = None, scale: float = 1.0
) -> Tensor:
    """scale · Σ_h W_{Q,h}ᵀ W_{K,h} G W_{V,h}ᵀ for every prompt, (B, D_t, e), from the sources' Gram matrix
    G = Σ_i s_i s_iᵀ (B, D_s, D_s): the linear heads' map t_j ↦ t_j · mix (maps as in :func:`attention_update`).
    Batch-first; :func:`moment_mix` is the batch-last twin for the (D, D, B) moment form."""
    KQ = query_maps if key_maps is None else key_maps.transpose(-1, -2) @ query_maps  # (h, D_s, D_t): W_Kᵀ W_Q
    mix = torch.einsum("hst,bsu,heu->bte", KQ, gram, value_maps)
    return mix * scale if scale != 1.0 else mix  # on (B, D_t, e), not on a (B, T, e) output


def attention_update(
    sources: Tensor,
    targets: Tensor,
    query_maps: Tensor,
    value_maps: Tensor,
    activations: Sequence[str],
    *,
    key_maps: Tensor | None = None,
    sigma: float = 1.0,
    logit_cap: float | None = None,
    scale: float = 1.0,
) -> Tensor:
    """scale · Σ_h Σ_i h̃_h(W_{K,h} s_i, W_{Q,h} t_j) W_{V,h} s_i for every target t_j. (B, T, e).

    ``sources`` (B, m, D_s), ``targets`` (B, T, D_t); per-head maps ``query_maps`` (H, k, D_t),
    ``value_maps`` (H, e, D_s) and ``key_maps`` (H, k, D_s), where ``None`` means W_K = I (keys are the
    sources; then k = D_s). ``activations``: one name from ``("linear", "relu", "exp", "softmax")`` per
    head; softmax is normalised over the m sources of each target. ``sigma`` is the exp/softmax
    bandwidth, exp(kᵀq/σ²); ``logit_cap`` caps exp heads' logits (an overflow guard, exact below the
    cap; :func:`~iclab.core.kernels.gram`). Consecutive heads with the same activation are evaluated in
    one batched call (parameter slices only, so this also runs under ``torch.func.vmap``).
    """
    H = len(activations)
    owner = "attention_update"
    require(owner, "activations", H >= 1, "a non-empty sequence, one name per head", activations)
    for act in activations:
        require(owner, "activations", act in INNER_PRODUCT_KERNELS, f"names from {INNER_PRODUCT_KERNELS}", act)
    B, _, Ds = sources.shape
    k = Ds if key_maps is None else key_maps.shape[1]
    require_shape(owner, "targets", tuple(targets.shape), (B, None, None))
    require_shape(owner, "query_maps", tuple(query_maps.shape), (H, k, targets.shape[-1]))
    require_shape(owner, "value_maps", tuple(value_maps.shape), (H, None, Ds))
    if key_maps is not None:
        require_shape(owner, "key_maps", tuple(key_maps.shape), (H, None, Ds))

    def heads(t: Tensor, a: int, b: int) -> Tensor:
        return t if (a, b) == (0, H) else t[a:b]

    out: Tensor | None = None
    gram_matrix: Tensor | None = None  # Σ_i s_i s_iᵀ, shared by every linear head
    start = 0
    while start < H:  # one run [start, stop) of heads sharing an activation
        act, stop = activations[start], start + 1
        while stop < H and activations[stop] == act:
            stop += 1
        Wq, Wv = heads(query_maps, start, stop), heads(value_maps, start, stop)
        Wk = None if key_maps is None else heads(key_maps, start, stop)
        if act == "linear":
            if gram_matrix is None:
                gram_matrix = sources.transpose(1, 2) @ sources  # (B, D_s, D_s)
            mix = linear_mix(gram_matrix, Wq, Wv, key_maps=Wk, scale=scale)  # (B, D_t, e)
            # einsum rather than ``targets @ mix``: for (B, T, D)·(B, D, D) with D ~ 10 it picks a batched GEMM
            # layout ~2× faster on CPU (benchmarks/bench_bilinear.py)
            part = torch.einsum("btd,bde->bte", targets, mix)
        else:
            queries = torch.einsum("bjt,hkt->bhjk", targets, Wq)  # (B, h, T, k)
            h, T, m = queries.shape[1], queries.shape[2], sources.shape[1]
            if Wk is None:  # the keys are the sources: every head's queries against them in one product per prompt
                inner = (queries.reshape(B, h * T, k) @ sources.mT).reshape(B, h, T, m)
            else:
                inner = queries @ torch.einsum("bis,hks->bhki", sources, Wk)  # (B, h, T, m)
            cap = logit_cap if act == "exp" else None
            scores = inner_product_scores(act, inner, sigma=sigma, logit_cap=cap)  # (B, h, T, m), softmax over m
            # Σ_i a_hji W_{V,h} s_i = W_{V,h} (Σ_i a_hji s_i): the sources are weighed first, all heads in one product
            # per prompt, so no per-head (B, h, m, e) value tensor is formed (Zhang et al. Fig. 5 at P = 80 000: 7.6×)
            mixed = (scores.reshape(B, h * T, m) @ sources).reshape(B, h, T, Ds)
            part = torch.einsum("bhjs,hes->bje", mixed, Wv * scale if scale != 1.0 else Wv)
        out = part if out is None else out + part
        start = stop
    assert out is not None
    return out


class MomentLayer(Protocol):
    """A linear-score attention layer in the moment form (module docstring): z_{ℓ+1} = z_ℓ T_ℓ, T_ℓ a map of the
    sources' Gram matrix G. Such layers declare ``moment_sources`` (``'context'`` or ``'all'``)."""

    def transfer(self, gram: Tensor, n: int) -> Tensor:
        """T_ℓ for every prompt, batch-last: G (D, D, B) -> (D, D, B)."""
        ...

    def token_transfer(self, gram: Tensor, n: int) -> Tensor:
        """T_ℓ for every prompt, batch-first: G (B, D, D) -> (B, D, D); read by :func:`moment_layer` only."""
        ...


# --- batch-last (D, D, B) algebra for the moment form -------------------------------------------------
def shared_left(W: Tensor, X: Tensor) -> Tensor:
    """W X for every prompt: W (i, j) shared, X (j, k, B) batch-last -> (i, k, B). One GEMM."""
    return (W @ X.reshape(X.shape[0], -1)).reshape(W.shape[0], *X.shape[1:])


def shared_right(X: Tensor, W: Tensor) -> Tensor:
    """X W for every prompt: X (i, j, B) batch-last, W (j, k) shared -> (i, k, B). One GEMM."""
    return shared_left(W.transpose(0, 1), X.transpose(0, 1).contiguous()).transpose(0, 1)


def _bl_matmul(X: Tensor, Y: Tensor) -> Tensor:
    """Σ_j X[:, j] ⊗ Y[j] as j rank-1 updates over contiguous B-vectors: (i, j, B) × (j, k, B) -> (i, k, B).

    2.8× faster on a CPU than one broadcast multiply-reduce through an (i, j, k, B) temporary
    (0.63 vs 1.75 ms at 6×6, B = 20 000), and ≈ 7× faster than ``torch.bmm`` on (B, 6, 6) (4.4 ms).
    """
    if is_transformed(X, Y):  # vmap has no batched addcmul_
        return (X.unsqueeze(2) * Y.unsqueeze(0)).sum(1)
    out = X[:, 0].unsqueeze(1) * Y[0]
    for j in range(1, X.shape[1]):
        out.addcmul_(X[:, j].unsqueeze(1), Y[j])
    return out


class _BatchedMatmul(torch.autograd.Function):
    """X_b Y_b, batch-last, with the same kernel for the two backward products (dX = dC Yᵀ, dY = Xᵀ dC)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(X: Tensor, Y: Tensor) -> Tensor:
        return _bl_matmul(X, Y)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        X, Y = ctx.saved_tensors
        dX = batched_matmul(grad, Y.transpose(0, 1)) if ctx.needs_input_grad[0] else None
        dY = batched_matmul(X.transpose(0, 1), grad) if ctx.needs_input_grad[1] else None
        return dX, dY


def batched_matmul(X: Tensor, Y: Tensor) -> Tensor:
    """X_b Y_b for every prompt b: (i, j, B) × (j, k, B) -> (i, k, B), batch-last. Differentiable
    to any order (the backward is built from this function)."""
    return cast(Tensor, _BatchedMatmul.apply(X, Y))  # Function.apply is unannotated


class _PrefixGram(torch.autograd.Function):
    """G_b = Σ_{i<m} z_{b,i} z_{b,i}ᵀ, (B, T, D) -> (B, D, D); backward dz = z (dG + dGᵀ) in one product.

    Autograd through ``c.mT @ c`` with c = z[:, :m] does two products, adds them and scatters the sum into a
    zero-filled (B, T, D) tensor: four passes over the activations where one suffices.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z: Tensor, m: int) -> Tensor:
        c = z[:, :m]
        return c.transpose(1, 2) @ c

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, int], output: Tensor) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.m = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (z,) = ctx.saved_tensors
        # contiguous: a grad that arrives batch-last (strides (1, ·, ·)) sends bmm to a per-prompt loop (~100×)
        sym = (grad + grad.transpose(1, 2)).contiguous()
        dz = z @ sym  # every row; the m sources' are the gradient
        if ctx.m < z.shape[1]:
            dz[:, ctx.m :] = 0.0  # the targets that are not sources
        return dz, None


def prefix_gram(z: Tensor, m: int) -> Tensor:
    """Σ_{i<m} z_i z_iᵀ for every prompt: (B, T, D) -> (B, D, D), the sources' Gram matrix of a layer whose
    sources are the first ``m`` tokens. Differentiable to any order, vmap-safe."""
    return cast(Tensor, _PrefixGram.apply(z, m))


def moment_layer(layer: nn.Module, z: Tensor, n: int, *, query_only: bool = False) -> Tensor:
    """One linear-attention layer in the moment form on the tokens: z ↦ z T, T = ``layer.token_transfer(G, n)``.

    The same numbers as ``layer(z, n, query_only=...)`` (:class:`~iclab.models.LinearAttention` with linear
    scores), computed as one Gram product G = Σ_sources z_i z_iᵀ, a (D, D) map per prompt and one product with
    the targets, the residual folded into T: the backward has two products and one add over the (B, T, D)
    tokens, where autograd through the token pass has four products, three adds and a scatter. For models
    whose tokens go through non-linear maps between the attention layers (the bilinear FFNs of
    :class:`~iclab.models.BilinearTransformer`), where :meth:`AttentionStack.forward` cannot carry (G, q).
    (B, T, D) -> (B, T, D), or (B, 1, D) with ``query_only``.
    """
    sources = getattr(layer, "moment_sources", None)
    if sources is None or not hasattr(layer, "token_transfer"):
        raise ValueError(f"moment_layer needs a linear-score layer with token_transfer; got {type(layer).__name__}")
    gram_matrix = prefix_gram(z, n if sources == "context" else z.shape[1])  # (B, D, D)
    T = cast(MomentLayer, layer).token_transfer(gram_matrix, n)  # (B, D, D)
    return torch.bmm(z[:, -1:] if query_only else z, T)


def moment_mix(
    gram: Tensor, query_maps: Tensor, value_maps: Tensor, *, key_maps: Tensor | None = None, scale: float = 1.0
) -> Tensor:
    """scale · Σ_h W_{Q,h}ᵀ W_{K,h} G W_{V,h}ᵀ for every prompt: the linear heads' mix, batch-last (D_t, e, B).

    ``gram`` (D_s, D_s, B) is Σ_i s_i s_iᵀ; the maps are those of :func:`attention_update`. All heads in
    two GEMMs (heads concatenated along the contracted axis). The targets' update is t_j ↦ t_j · mix.
    """
    H, e, Ds = value_maps.shape
    KQ = query_maps if key_maps is None else key_maps.transpose(-1, -2) @ query_maps  # (H, D_s, D_t)
    Dt = KQ.shape[-1]
    values = value_maps * scale if scale != 1.0 else value_maps
    Y = shared_right(gram, values.permute(2, 0, 1).reshape(Ds, H * e))  # [G W_{V,h}ᵀ]_h: (D_s, H·e, B)
    if H > 1:
        Y = Y.reshape(Ds, H, e, -1).transpose(0, 1)
    return shared_left(KQ.permute(2, 0, 1).reshape(Dt, H * Ds), Y.reshape(H * Ds, e, -1))


def moment_labels(layers: Sequence[nn.Module] | nn.ModuleList, gram: Tensor, q: Tensor, n: int) -> Tensor:
    """(L, B): the query's label entry after each of the moment-form layers, from G_0 (D, D, B) and q_0 (D, B)
    batch-last (module docstring): layer ℓ maps every row by T_ℓ = ``layer.transfer(G_ℓ, n)``, so q_{ℓ+1} = q_ℓ T_ℓ
    and G_{ℓ+1} = T_ℓᵀ G_ℓ T_ℓ. Torch code, differentiable to any order and under ``torch.func`` transforms; the C
    kernel of :mod:`iclab.models._moment_fast` computes the last row."""
    last, labels = len(layers) - 1, []
    for i, layer in enumerate(layers):
        T = cast(MomentLayer, layer).transfer(gram, n)  # z_{ℓ+1} = z_ℓ T_ℓ for every row
        q = (q.unsqueeze(1) * T).sum(0)  # q_{ℓ+1} = q_ℓ T_ℓ
        labels.append(q[-1])
        if i < last:
            gram = batched_matmul(T.transpose(0, 1), batched_matmul(gram, T))  # G_{ℓ+1} = T_ℓᵀ G_ℓ T_ℓ
    return torch.stack(labels)


def context_moments(episode: Episode, *, include_query: bool = False) -> tuple[Tensor, Tensor]:
    """(G, q) of the prompt z = Z_0ᵀ (eq. 1), batch-last: G = Σ_{sources} z_i z_iᵀ (D, D, B), q (D, B).

    The sources are the n context tokens (Ahn et al.'s mask M), or every token with
    ``include_query``. By the C kernel where it applies (:func:`iclab.models._moment_fast.moments`), else from the
    prompt (:func:`embed`). Memoised on the episode (:meth:`Episode.memo`): a batch reused for k steps is
    read once, not k times.
    """

    def compute(ep: Episode) -> tuple[Tensor, Tensor]:
        if ep.y is not None and _moment_fast.moments_apply(ep.x, ep.y, ep.x_query):  # the C kernel: no prompt formed
            return _moment_fast.moments(ep.x, ep.y, ep.x_query, include_query=include_query)
        z = embed(ep)
        src = z if include_query else z[:, : ep.n]
        return torch.einsum("bni,bnj->ijb", src, src).contiguous(), z[:, -1].transpose(0, 1).contiguous()

    return episode.memo(f"context_moments(include_query={include_query})", compute)


def embed(episode: Episode, query_label: Tensor | None = None) -> Tensor:
    """The prompt Z_0ᵀ (Ahn et al. eq. 1): rows [x_i, y_i] for the context, then [x_q, 0]. (B, n+1, d+1).

    ``query_label`` fills the query's label slot instead of 0 (Lemma 5's Z̄_0).
    """
    if episode.y is None:
        raise ValueError("embed needs a regression episode (float labels y); got a classification episode")
    B = episode.batch_size
    yq = torch.zeros(B, dtype=episode.dtype, device=episode.device) if query_label is None else query_label
    ctx = torch.cat([episode.x, episode.y.unsqueeze(-1)], dim=-1)  # (B, n, d+1)
    qry = torch.cat([episode.x_query, yq.unsqueeze(-1)], dim=-1).unsqueeze(1)  # (B, 1, d+1)
    return torch.cat([ctx, qry], dim=1)


class AttentionStack(nn.Module):
    """L residual attention layers on the prompt of eq. (1), read out at the query's label slot.

    The shared skeleton of :class:`~iclab.models.LinearTransformer` (Ahn et al. eq. 4) and
    :class:`~iclab.models.KernelTransformer` (Cheng, Chen, Sra eq. 4-5): input checks, :meth:`trace`,
    :meth:`forward` (the last layer updates the query row only: nothing else is read), the read-out
    ŷ = ∓[Z_L]_{d+1, n+1}, per-layer matrices stacked over layers, and :meth:`_load_stacked`. A subclass
    sets ``config`` (with ``d``, ``n_layers``, ``n_heads``) and ``layers``, whose ``forward(z, n, *,
    query_only)`` is one residual layer; ``readout`` in the config is ``'negative'`` (the papers' −, the
    default) or ``'positive'`` (Zhang et al.).
    """

    config: Any
    layers: nn.ModuleList

    def _check(self, episode: Episode) -> None:
        name, d = type(self).__name__, self.config.d
        if episode.y is None:
            raise ValueError(f"{name} needs a regression episode (float labels y); got a classification episode")
        if episode.d != d:
            raise ShapeError(f"{name} was built for d={d}; got an episode with d={episode.d}")
        dtype = next(self.parameters()).dtype
        if episode.dtype != dtype:
            raise ShapeError(
                f"{name} has {dtype} parameters; got a {episode.dtype} episode (call model.to({episode.dtype}) or episode.to(dtype={dtype}))"
            )

    def _read(self, z: Tensor) -> Tensor:
        """(B,) +ŷ from the prompt z (B, T, D): see :meth:`_read_label`."""
        return self._read_label(z[:, -1, -1])

    def _read_label(self, label: Tensor) -> Tensor:
        """(B,) +ŷ from [Z_L]_{d+1,n+1}: Ahn et al. and Cheng et al. read out −[Z_L]_{d+1,n+1}, Zhang et al. +."""
        return label if getattr(self.config, "readout", "negative") == "positive" else -label

    def trace(self, episode: Episode, query_label: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(ŷ (B,), states (L+1, B, n+1, D) = Z_0ᵀ … Z_Lᵀ), every layer on every token."""
        self._check(episode)
        z = embed(episode, query_label)
        states = [z]
        for layer in self.layers:
            z = layer(z, episode.n)
            states.append(z)
        return self._read(z), torch.stack(states)

    @property
    def moment_sources(self) -> str | None:
        """'context' or 'all' when every layer has the moment form (module docstring) with those
        sources, else None. Layers declare it with a ``moment_sources`` attribute and give their
        T_ℓ with ``transfer(gram, n)``."""
        found = {getattr(layer, "moment_sources", None) for layer in self.layers}
        return found.pop() if len(found) == 1 else None

    def forward(self, episode: Episode) -> Tensor:
        """+ŷ (B,): by the moment form when every layer has one, else token by token (:meth:`forward_tokens`)."""
        sources = self.moment_sources
        if sources is None:
            return self.forward_tokens(episode)
        self._check(episode)
        gram, q = context_moments(episode, include_query=sources == "all")  # (D, D, B), (D, B)
        return self._read_label(moment_labels(self.layers, gram, q, episode.n)[-1])

    def forward_tokens(self, episode: Episode) -> Tensor:
        """+ŷ (B,) by running every layer on the (B, n+1, D) prompt, the last on the query row only."""
        self._check(episode)
        z = episode.memo("embed", embed)  # a full-batch run reuses its prompts every step (16 % of a Fig. 5 step)
        for i, layer in enumerate(self.layers):
            z = layer(z, episode.n, query_only=i == len(self.layers) - 1)  # (B, 1, D) after the last
        return self._read(z)

    def predict(self, episode: Episode) -> Tensor:
        """+ŷ for the query of every prompt, (B,)."""
        out: Tensor = self(episode)
        return out

    def _stack(self, name: str) -> Tensor:
        """A per-layer matrix stacked over layers, (L, ...)."""
        return torch.stack([getattr(layer, name) for layer in self.layers])

    @torch.no_grad()
    def _load_stacked(self, names: Sequence[str], blocks: dict[str, Tensor], what: str) -> None:
        """Copy (L, H, ...) tensors, or (L, ...) for every head alike, into each layer's ``<name>_free``.

        ``names``: exactly the blocks that must be given (``what`` says for which settings).
        """
        owner = f"{type(self).__name__}.load_matrices"
        require(owner, "blocks", set(blocks) == set(names), f"exactly {tuple(names)} for {what}", sorted(blocks))
        L, H = self.config.n_layers, self.config.n_heads
        for name, value in blocks.items():
            value = torch.as_tensor(value)
            target_shape = (L, *getattr(self.layers[0], f"{name}_free").shape)  # (L, H, ...)
            if value.dim() == len(target_shape) - 1:  # no head axis: every head alike
                value = value.unsqueeze(1).expand(-1, H, *value.shape[1:])
            require(owner, name, tuple(value.shape) == target_shape,
                    f"shape (L, H, ...) = {target_shape} or (L, ...) = {(L, *target_shape[2:])}",
                    tuple(value.shape))  # fmt: skip
            for layer, v in zip(self.layers, value, strict=True):
                getattr(layer, f"{name}_free").copy_(v)
