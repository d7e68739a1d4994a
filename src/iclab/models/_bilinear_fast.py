"""The fast path of :class:`~iclab.models.BilinearTransformer`: the whole stack as one autograd node.

A step of the bilinear transformer (Sun, Jadbabaie, Azizan 2025, eq. (2)-(3)) is products with one 13-wide side
over B·T tokens, so it runs at the rate the BLAS reaches on those shapes (docs/performance.md, seed 003). Layer by
layer, every (B, T, D) activation also goes to memory and back; here chunks of ``CHUNK`` prompts go through all
sub-layers while they are in cache, and the backward is written by hand:

* **Tokens batch-last.** A chunk is kept as z (D, c, T): the token entries are contiguous planes, so the FFN is one
  (2d̄, k)·(k, c·T) GEMM, the label row and the FFN's halves a, b are row slices (no strided elementwise work, no
  concatenation), and a prompt's tokens are the (D, T) view z.permute(1, 0, 2)[b] that ``torch.bmm`` takes as is.
* **Attention in the transposed moment form.** With G = Σ_{i≤n} z_i z_iᵀ (the context's Gram matrix), eq. (2) is
  z_j ← R z_j for every token, R = I + Σ_h P_h G Q_h / n (the transpose of :func:`~iclab.models.attention_core.
  moment_layer`'s T; G is symmetric). Backward, with g the output gradient: dR = Σ_j g_j z_jᵀ, dG = Σ_h P_hᵀ dR Q_hᵀ / n,
  dz_j = Rᵀ g_j + (dG + dGᵀ) z_j for the context (Rᵀ g_j for the query).
* **FFN** u = z + [a ⊙ b; 0], [b; a] = [W_1; W_0] z[:d̄] (eq. 3; the label row passes): the forward keeps [b; a], the
  backward forms [g⊙b; g⊙a] = [∂a; ∂b], dz[:d̄] = g[:d̄] + [W_0ᵀ W_1ᵀ][∂a; ∂b], d[W_0; W_1] = [∂a; ∂b] z[:d̄]ᵀ.
* **What is kept.** The input of every FFN and its [b; a]; the input of an attention layer that follows an FFN is
  rebuilt from them (one ``addcmul``). Per attention layer, G, R and dR for every prompt ((B, D, D), small): the P, Q
  gradients, Σ_b dR_b (Q_hᵀ G_b) / n and Σ_b (G_b P_hᵀ) dR_b / n, are two products over the whole batch at the end.
* **What is skipped.** The read-out is the query's label entry, so the last attention layer updates the query row
  alone (dR has one non-zero row), an FFN after it changes nothing that is read (zero gradient), and the prompt is data
  (no input gradient). ``live`` entries: the prompt's scratch rows are zero, so the first FFN reads (1, x) only.

Chunks run on torch's threads (:func:`~iclab.core.threads.map_on_threads`); the chunk sums are added in chunk order,
so the result does not depend on the thread count. The backward is not itself differentiable (``once_differentiable``):
:meth:`BilinearTransformer.forward_tokens` is the path for higher derivatives and ``torch.func`` transforms.
Exactness: tests/test_bilinear_fast.py checks values and every parameter gradient against the token-level layers in
float64 to 1e-10, for both orders, dense, sparse and no FFN, several heads, label scaling and ragged chunks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from iclab.core.threads import map_on_threads

CHUNK = 64  # prompts per chunk: a (13, 64, 201) float32 chunk is 669 KB, its [b; a] 1.2 MB (32-96 within 10%)


def _transfer(G: Tensor, P: Tensor, Q: Tensor, n: int) -> Tensor:
    """R = I + Σ_h P_h G Q_h / n for every prompt: G (c, D, D), P, Q (H, D, D) -> (c, D, D)."""
    R = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device).expand_as(G).clone()
    for h in range(P.shape[0]):
        R.add_(torch.matmul(P[h], G).matmul(Q[h]), alpha=1.0 / n)  # (P_h G) Q_h: one bmm, one GEMM
    return R


class _Plan:
    """The sub-layers, their weights in the forms the passes use, and the tensors a step keeps (batch-last)."""

    def __init__(self, z0: Tensor, kinds: tuple[str, ...], flat: tuple[Tensor, ...], n: int, live: int, save: bool):
        B, T, D = z0.shape
        self.n, self.T = n, T
        self.kinds = kinds[: max(i for i, k in enumerate(kinds) if k == "attn") + 1] if "attn" in kinds else ()
        self.weights = [flat[2 * i : 2 * i + 2] for i in range(len(kinds))]  # (W_0, W_1) or (P, Q)
        # d̄: the FFN acts on z[:d̄], the label entry z[d̄] passes
        self.db = db = self.weights[kinds.index("ffn")][0].shape[0] if "ffn" in kinds else D - 1
        # the FFN's live inputs: the prompt's scratch rows are zero (k = d + 1 for a first FFN), else all d̄
        self.k = [live if i == 0 else db for i in range(len(kinds))]
        self.Wc: list[Tensor | None] = []  # [W_1; W_0] on the live inputs: the forward's GEMM
        self.Wd: list[Tensor | None] = []  # [W_0ᵀ W_1ᵀ]: the backward's
        for i, (kind, (a, b)) in enumerate(zip(kinds, self.weights, strict=True)):
            self.Wc.append(torch.cat([b, a])[:, : self.k[i]] if kind == "ffn" else None)
            self.Wd.append(torch.cat([a, b]).T.contiguous() if kind == "ffn" else None)
        L = len(self.kinds)
        new = z0.new_empty
        self.z = [new(D, B, T) if save and 0 < i < L and self._keeps_input(i) else None for i in range(L)]
        self.ba = [new(2 * db, B, T) if save and kind == "ffn" else None for kind in self.kinds]
        self.G = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]
        self.R = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]
        self.dR = [new(B, D, D) if save and kind == "attn" else None for kind in self.kinds]

    def _keeps_input(self, i: int) -> bool:
        """Whether sub-layer i's input is kept (an attention layer after an FFN rebuilds it from the FFN's)."""
        return not (self.kinds[i] == "attn" and self.kinds[i - 1] == "ffn")


def _ffn_out(z: Tensor, ba: Tensor, db: int) -> Tensor:
    """u = z + [a ⊙ b; 0] for z (D, c, T) and [b; a] (2d̄, c, T)."""
    u = torch.empty_like(z)
    torch.addcmul(z[:db], ba[db:], ba[:db], out=u[:db])
    u[db:] = z[db:]
    return u


def _forward_chunk(plan: _Plan, z0: Tensor, s: int, save: bool) -> Tensor:
    """The query's label entry after the last attention layer, (c,), for prompts s … s + c − 1 (z0 (c, T, D))."""
    n, db, L = plan.n, plan.db, len(plan.kinds)
    z = z0.permute(2, 0, 1).contiguous()  # (D, c, T)
    c = z.shape[1]
    for i, kind in enumerate(plan.kinds):
        if kind == "ffn":
            k, out = plan.k[i], plan.ba[i]
            ba = out[:, s : s + c] if save else z.new_empty(2 * db, c, plan.T)
            torch.mm(plan.Wc[i], z[:k].reshape(k, -1), out=ba.reshape(2 * db, -1))  # [b; a]
            z = _ffn_out(z, ba, db)
            continue
        P, Q = plan.weights[i]
        zp = z.permute(1, 0, 2)  # (c, D, T): prompt b's tokens as columns
        G = torch.bmm(zp[:, :, :n], zp[:, :, :n].transpose(1, 2))  # (c, D, D)
        R = _transfer(G, P, Q, n)
        if save:
            plan.G[i][s : s + c] = G
            plan.R[i][s : s + c] = R
        if i == L - 1:
            return (R[:, -1] * zp[:, :, -1]).sum(-1)  # (R z_query)[label]
        zn = torch.bmm(R, zp).permute(1, 0, 2)  # (D, c, T)
        if save and plan.z[i + 1] is not None:
            z = plan.z[i + 1][:, s : s + c]
            z.copy_(zn)
        else:
            z = zn.contiguous()
    raise AssertionError("a plan ends with an attention layer")


def _input(plan: _Plan, i: int, z0: Tensor, s: int, c: int) -> Tensor:
    """Sub-layer i's input (D, c, T) for the chunk: kept, or rebuilt (the prompt; an FFN's output from its input)."""
    if i == 0:
        return z0.permute(2, 0, 1).contiguous()
    if plan.z[i] is not None:
        return plan.z[i][:, s : s + c]
    return _ffn_out(_input(plan, i - 1, z0, s, c), plan.ba[i - 1][:, s : s + c], plan.db)


def _backward_chunk(plan: _Plan, z0: Tensor, grad: Tensor, s: int) -> list[Tensor | None]:
    """Writes the chunk's dR into ``plan.dR``; returns its d[W_0; W_1] (2d̄, k) per FFN (None for attention)."""
    n, db, L = plan.n, plan.db, len(plan.kinds)
    c = grad.shape[0]
    out: list[Tensor | None] = [None] * len(plan.weights)
    g: Tensor | None = None  # (D, c, T) gradient of the current sub-layer's output
    for i in reversed(range(L)):
        P, Q = plan.weights[i]
        if plan.kinds[i] == "ffn":
            z = _input(plan, i, z0, s, c)
            ba, k = plan.ba[i][:, s : s + c], plan.k[i]
            assert g is not None
            d_ab = torch.empty_like(ba)  # [g⊙b; g⊙a] = [∂a; ∂b]
            torch.mul(g[:db], ba[:db], out=d_ab[:db])
            torch.mul(g[:db], ba[db:], out=d_ab[db:])
            flat = d_ab.reshape(2 * db, -1)
            out[i] = (z[:k].reshape(k, -1) @ flat.T).T  # (2d̄, k): [∂W_0; ∂W_1] on the live inputs (faster than NT)
            if i > 0:
                g[:db].reshape(db, -1).addmm_(plan.Wd[i], flat)  # dz[:d̄] += [W_0ᵀ W_1ᵀ][∂a; ∂b]; the label passes
            continue
        u = _input(plan, i, z0, s, c)
        up = u.permute(1, 0, 2)  # (c, D, T)
        R, dR = plan.R[i][s : s + c], plan.dR[i][s : s + c]
        if i == L - 1:  # only (R z_query)[label] is read
            dR.zero_()
            torch.mul(grad.unsqueeze(-1), up[:, :, -1], out=dR[:, -1])
        else:
            assert g is not None
            torch.bmm(g.permute(1, 0, 2), up.transpose(1, 2), out=dR)  # Σ_j g_j u_jᵀ
        if i == 0:
            break
        dG = torch.zeros_like(dR)
        for h in range(P.shape[0]):
            dG.add_(torch.matmul(P[h].T, dR).matmul(Q[h].T), alpha=1.0 / n)
        S = dG + dG.transpose(1, 2)
        du = torch.bmm(S, up)  # (c, D, T): the context tokens' Gram term
        if i == L - 1:
            du[:, :, -1] = grad.unsqueeze(-1) * R[:, -1]  # Rᵀ g_query, g_query = grad · e_label
        else:
            du[:, :, -1] = 0.0  # the query is not a source
            du.baddbmm_(R.transpose(1, 2), g.permute(1, 0, 2))  # + Rᵀ g_j
        g = du.permute(1, 0, 2).contiguous()
    return out


class _Stack(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z0: Tensor, meta: tuple[Any, ...], *flat: Tensor) -> Tensor:  # type: ignore[override]
        kinds, n, live, chunk, save = meta
        with torch.no_grad():
            plan = _Plan(z0, kinds, flat, n, live, save)
            starts = range(0, z0.shape[0], chunk)
            slots = map_on_threads(lambda s: _forward_chunk(plan, z0[s : s + chunk], s, save), starts, z0.is_cuda)
        ctx.plan, ctx.chunk = plan, chunk
        ctx.save_for_backward(z0)
        return torch.cat(slots)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        plan, chunk = ctx.plan, ctx.chunk
        (z0,) = ctx.saved_tensors
        starts = range(0, z0.shape[0], chunk)

        def run(s: int) -> list[Tensor | None]:
            return _backward_chunk(plan, z0[s : s + chunk], grad[s : s + chunk], s)

        parts = map_on_threads(run, starts, z0.is_cuda)
        grads: list[Tensor | None] = []
        db, n = plan.db, plan.n
        for i, (P, Q) in enumerate(plan.weights):
            if i >= len(plan.kinds):  # an FFN after the last attention layer: nothing it writes is read
                grads += [torch.zeros_like(P), torch.zeros_like(Q)]
            elif plan.kinds[i] == "ffn":
                dW = torch.zeros(2 * db, db, dtype=z0.dtype, device=z0.device)
                dW[:, : plan.k[i]] = torch.stack([p[i] for p in parts]).sum(0)  # type: ignore[misc]
                grads += [dW[:db], dW[db:]]
            else:  # R = I + Σ_h P_h G Q_h / n, G symmetric: dP_h = Σ_b dR_b (G_b Q_h)ᵀ / n, dQ_h = Σ_b (G_b P_hᵀ) dR_b / n
                G, dR = plan.G[i], plan.dR[i]
                grads.append(torch.stack([torch.einsum("bik,bjk->ij", dR, G @ q) for q in Q]) / n)
                grads.append(torch.stack([torch.einsum("bli,bik->lk", G @ p.T, dR) for p in P]) / n)
        ctx.plan = None
        return (None, None, *grads)


def bilinear_stack(
    z0: Tensor, sublayers: list[tuple[str, Tensor, Tensor]], *, n: int, live: int, chunk: int | None = None
) -> Tensor:
    """The query's label entry after the sub-layers, (B,), from the prompt z0 (B, n+1, D); differentiable in the weights.

    ``sublayers``: ``("ffn", W_0, W_1)`` with (d̄, d̄) maps on z[:d̄] (eq. 3; the label entry D − 1 = d̄ passes) or
    ``("attn", P, Q)`` with (H, D, D) heads (eq. 2, the n context tokens are the sources). ``live``: z0's entries
    live … d̄ − 1 are zero (the scratch rows of eq. 1), so a first FFN reads z0[:live] alone. ``chunk``: prompts per
    chunk, :data:`CHUNK` when None.
    """
    kinds = tuple(kind for kind, _, _ in sublayers)
    flat = [w for _, a, b in sublayers for w in (a, b)]
    save = torch.is_grad_enabled() and any(w.requires_grad for w in flat)  # no grad: nothing is kept
    return _Stack.apply(z0, (kinds, n, live, CHUNK if chunk is None else chunk, save), *flat)
