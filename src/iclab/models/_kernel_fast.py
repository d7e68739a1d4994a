"""The fast training path of :class:`~iclab.models.KernelTransformer` (Cheng, Chen, Sra 2024, eq. (2)-(5), (26)).

For V = [[A, 0], [0, r]] (Asm. 4.4; A ≡ 0 for Thm 4.5) and the B, C score blocks (Asm. 2.1), head h of
layer ℓ sends target token j

    Δz_j = s · Σ_{i≤n} h̃_h(S_ji) [A x_i; r y_i],     S_ji = (C x_j)ᵀ(B x_i)/σ² = g_jᵀ x_i,   g_j = Kᵀ x_j,

with K = CᵀB/σ² (d × d) and s = 1/n with ``divide_by_n``. Every contraction runs over d = 5, D = d + 1 or
n ≈ 14 entries, so as per-prompt matrix products they are batches of tiny GEMMs, which a CPU BLAS runs
at a few GFLOP/s. Here the prompt is kept batch-last, z (D, T, B), and each contraction is a handful of
multiply-adds over contiguous batch vectors ((T, n, b) score blocks, (D, T, b) token blocks), run over
chunks of ``CHUNK`` prompts so that a layer's blocks stay in cache between the operations that use them.

:class:`_Stack` is one autograd node for the whole L-layer pass with a hand-written backward:
it keeps each layer's tokens (D, T, B) and weights h̃(S) (T, n, B), and nothing else. What the
backward skips: the gradient of the input prompt (data) and, with A ≡ 0, every covariate gradient
(the covariate rows never change, so only the label row's adjoint is needed). The last layer updates
only the query (nothing else is read out), so its score block is (1, n, b).

Where a C compiler and AVX2 are there, the same pass runs as C (:class:`_NativeStack`, ``_kernel_attn.c``, float32
and float64): 8 (4) prompts in the lanes of a vector, 16 (8) with AVX-512 (:data:`WIDE`), each target row's scores,
weights and adjoints in registers, built on first use (:mod:`iclab.core.native`; ``ICLAB_NATIVE=0`` or
:data:`NATIVE` = False: the torch code).

Both backwards are hand-written, so the pass is differentiable once: a backward with ``create_graph`` raises and
names the pass with second derivatives (``model.fast = False``) instead of returning gradients without a graph.

Exactness: ``tests/test_kernel_fast.py`` checks values and every parameter gradient against the
token-level evaluation (:meth:`KernelTransformer.forward_tokens`) in float64 to 1e-10, for each h̃ and
value pattern; docs/performance.md has the timings beside the authors' code.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.threads import map_on_threads, split_evenly

CHUNK = 2048  # prompts per block: a (T, n, CHUNK) float32 score block is 1.7 MB at n = 14
MIN_SPLIT = 256  # batches under 4 × this many prompts keep the given chunk

#: run float32 and float64 CPU passes by the C kernel ``_kernel_attn.c`` (:class:`_NativeStack`) where it can be built
#: (:mod:`iclab.core.native`); environment ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
#: build with AVX-512 where the CPU has it (16 float32 lanes); False: AVX2 (8), as on a CPU without it
WIDE = True
#: ka_forward keeps every group's weights h̃(S) for the backward (4 bytes × (2 (n+1) n + n) per prompt and head at L = 3
#: in float32); False: the backward replays the whole forward per group instead (no memory, the exps twice)
KEEP = False
#: with gradients on, ka_jacobian runs the backward inside the forward for a unit output gradient and keeps every
#: prompt's d out / d(K, A, r) (4 bytes x (2 L H d² + L H) per prompt in float32), so the backward is one product with
#: the output gradient (ka_vjp), no replay; a batch whose Jacobian would pass this many bytes replays instead
JACOBIAN_BYTES = 1 << 28
ACT_CODES = {"linear": 0, "relu": 1, "exp": 2, "softmax": 3}
_SOURCE = Path(__file__).with_name("_kernel_attn.c")
#: what runs slower by the torch code (docs/performance.md: 102 against 24 ms a step at Cheng et al.'s batch)
COST = "a KernelTransformer training step about 4× slower"
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = native_kernels.per_real(
    lambda R: {
        "ka_lanes": ([], _I),
        "ka_kept": ([_I] * 5, ctypes.c_long),
        "ka_forward": ([_I] * 5 + [_P] * 4 + [R, _I, R] + [_P] * 6, _I),
        "ka_backward": ([_I] * 5 + [_P] * 4 + [R, _I, R] + [_P] * 9, _I),
        "ka_jacobian": ([_I] * 5 + [_P] * 4 + [R, _I, R] + [_P] * 6, _I),
        "ka_vjp": ([_I] * 5 + [R] + [_P] * 5, _I),
    }
)


def native() -> ctypes.CDLL | None:
    """The compiled ``_kernel_attn.c`` (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, wide=WIDE, cost=COST)


def _scores(g: Tensor, xs: Tensor) -> Tensor:
    """S (Tt, n, b) = Σ_a g[a, :, None] x_s[a, None, :] from g (d, Tt, b) and the sources x_s (d, n, b)."""
    gs, xv = g.unsqueeze(2).unbind(0), xs.unsqueeze(1).unbind(0)  # (Tt, 1, b), (1, n, b) views
    S = gs[0] * xv[0]
    for ga, xa in zip(gs[1:], xv[1:], strict=True):
        S.addcmul_(ga, xa)
    return S


def _weights(act: str, S: Tensor, cap: float | None) -> tuple[Tensor, Tensor | None]:
    """h̃(S) in place of S, and what its backward needs besides it (the cap's mask for exp)."""
    if act == "softmax":  # normalised over the n sources (dim 1)
        S.sub_(S.amax(1, keepdim=True)).exp_()
        return S.div_(S.sum(1, keepdim=True)), None
    if act == "exp":
        mask = None
        if cap is not None:
            mask = S.le(cap)
            S.clamp_(max=cap)
        return S.exp_(), mask
    if act == "relu":
        return S.relu_(), None
    return S, None  # linear


def _weights_backward(act: str, P: Tensor, gP: Tensor, mask: Tensor | None, rowdot: Tensor) -> Tensor:
    """dS from dh̃(S) = gP (in place of gP). ``rowdot`` (Tt, b) = Σ_i h̃_ji gP_ji (softmax only), which the
    caller has at mix size: Σ_c gu_cj u_cj."""
    if act == "softmax":
        return gP.sub_(rowdot.unsqueeze(1)).mul_(P)
    if act == "exp":
        gP.mul_(P)
        return gP if mask is None else gP.mul_(mask)
    if act == "relu":
        return gP.mul_(P.sign())  # P = relu(S) >= 0: sign is the 0/1 mask, as a float (no bool conversion)
    return gP


def _mix(P: Tensor, v: Tensor) -> Tensor:
    """u (c, Tt, b) = Σ_i P[:, i] v[:, i] from weights P (Tt, n, b) and source rows v (c, n, b)."""
    ps, vs = P.unsqueeze(0).unbind(2), v.unsqueeze(1).unbind(2)  # (1, Tt, b), (c, 1, b) views
    u = ps[0] * vs[0]
    for pi, vi in zip(ps[1:], vs[1:], strict=True):
        u.addcmul_(pi, vi)
    return u


def _mix_t(P: Tensor, gu: Tensor, acc: Tensor) -> None:
    """acc (c, n, b) += Σ_j P[j] gu[:, j]: the adjoint of :func:`_mix` in v, accumulated in place."""
    for pj, gj in zip(P.unsqueeze(0).unbind(1), gu.unsqueeze(2).unbind(1), strict=True):  # (1, n, b), (c, 1, b)
        acc.addcmul_(pj, gj)


def _left(M: Tensor, x: Tensor) -> Tensor:
    """(e, T, b) = M x for a shared (e, d) matrix M and x (d, T, b): one GEMM."""
    d, T, b = x.shape
    return (M @ x.reshape(d, T * b)).view(M.shape[0], T, b)


def _outer(u: Tensor, v: Tensor) -> Tensor:
    """(e, c) = Σ_{j, b} u[:, j, b] v[:, j, b]: one GEMM over the flattened (T, b) entries."""
    return u.reshape(u.shape[0], -1) @ v.reshape(v.shape[0], -1).T


class _Stack(torch.autograd.Function):
    """The autograd node: the forward of every chunk of prompts through all layers (:func:`_forward_chunk`),
    then the backward chunk by chunk (:func:`_backward_chunk`)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, y: Tensor, xq: Tensor, K: Tensor, A: Tensor, r: Tensor, meta: tuple[Any, ...]
    ) -> Tensor:
        n, acts, scale, cap, chunk, has_A, _grad = meta
        rs, A_ = r.tolist(), (A if has_A else None)
        d = x.shape[-1]

        def run(s: int) -> tuple[Tensor, list[Tensor], Any, Any]:
            e = min(s + chunk, x.shape[0])
            z = x.new_empty(d + 1, n + 1, e - s)  # (D, T, b): the prompt Z_0 (eq. 1), built batch-last
            z[:d, :n] = x[s:e].permute(2, 1, 0)
            z[d, :n] = y[s:e].T
            z[:d, n] = xq[s:e].T
            z[d, n] = 0.0  # the query's label slot
            return _forward_chunk(z, K, A_, rs, n, acts, scale, cap)

        done = map_on_threads(run, range(0, x.shape[0], chunk), x.is_cuda)
        ctx.meta, ctx.chunks = meta, [c[1:] for c in done]
        ctx.save_for_backward(K, A, r)
        return torch.cat([c[0] for c in done])

    @staticmethod
    @native_kernels.first_order("set model.fast = False (the token pass, or the moment form for all-linear heads)")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        K, A, r = ctx.saved_tensors
        n, acts, scale, _cap, chunk, has_A, _grad = ctx.meta
        A_ = A if has_A else None
        rs = r.tolist()

        def run(c: int) -> tuple[Tensor, Tensor | None, Tensor]:
            grads = torch.zeros_like(K), torch.zeros_like(A) if has_A else None, torch.zeros_like(r)
            states, weights, masks = ctx.chunks[c]
            g = grad[c * chunk : (c + 1) * chunk]
            _backward_chunk(g, states, weights, masks, K, A_, rs, n, acts, scale, grads)
            return grads

        parts = map_on_threads(run, range(len(ctx.chunks)), grad.is_cuda)
        ctx.chunks = None
        gK = torch.stack([p[0] for p in parts]).sum(0)
        gA = torch.stack([p[1] for p in parts]).sum(0) if has_A else None  # type: ignore[misc]  # p[1] is a Tensor when has_A
        gr = torch.stack([p[2] for p in parts]).sum(0)
        return None, None, None, gK, gA, gr, None


def _forward_chunk(
    z: Tensor,
    K: Tensor,
    A: Tensor | None,
    rs: list[list[float]],
    n: int,
    acts: tuple[str, ...],
    scale: float,
    cap: float | None,
) -> tuple[Tensor, list[Tensor], list[list[tuple[Tensor, Tensor, Tensor]]], list[list[Tensor | None]]]:
    """One chunk z_0 (D, T, b) through every layer: (query label of z_L (b,), states z_0 … z_{L−1}, per layer and
    head the weights h̃(S) (Tt, n, b), their mix u = Σ_i h̃_ji v_i and g = Kᵀx_j, exp-cap masks). The last layer updates the query only (Tt = 1)."""
    L = K.shape[0]
    D, T, _ = z.shape
    d = D - 1
    states, weights, masks = [], [], []
    for layer in range(L):
        Tt = 1 if layer == L - 1 else T
        src, tgt = z[:, :n], z[:, T - Tt :]
        znew = tgt.clone()
        Ps, Ms = [], []
        for h, act in enumerate(acts):
            g = _left(K[layer, h].T, tgt[:d])  # (d, Tt, b): g_j = Kᵀ x_j, kept for the backward
            P, mask = _weights(act, _scores(g, src[:d]), cap)
            if A is None:  # only the label row moves
                u = (P * src[d]).sum(1)  # (Tt, b): Σ_i h̃_ji y_i
                znew[d].add_(u, alpha=scale * rs[layer][h])
            else:
                u = _mix(P, src)  # (D, Tt, b): Σ_i h̃_ji [x_i; y_i]
                znew[:d].view(d, -1).addmm_(A[layer, h], u[:d].view(d, -1), alpha=scale)
                znew[d].add_(u[d], alpha=scale * rs[layer][h])
            Ps.append((P, u, g))
            Ms.append(mask)
        states.append(z)
        weights.append(Ps)
        masks.append(Ms)
        z = znew
    return z[d, 0], states, weights, masks


def _backward_chunk(
    grad: Tensor,
    states: list[Tensor],
    weights: list[list[tuple[Tensor, Tensor, Tensor]]],
    masks: list[list[Tensor | None]],
    K: Tensor,
    A: Tensor | None,
    rs: list[list[float]],
    n: int,
    acts: tuple[str, ...],
    scale: float,
    grads: tuple[Tensor, Tensor | None, Tensor],
) -> None:
    """Add one chunk's gradients of Σ_b grad_b · z_L[label, query, b] to ``grads`` = (dK, dA, dr) in place."""
    gK, gA, gr = grads
    L = K.shape[0]
    D, T, b = states[0].shape
    d = D - 1
    gz = grad.new_zeros(D, 1, b)  # adjoint of z_{ℓ+1}: only the query's label is read after the last layer
    gz[d, 0] = grad
    for layer in reversed(range(L)):
        z = states[layer]
        Tt = gz.shape[1]
        src, tgt = z[:, :n], z[:, T - Tt :]
        gin = None
        if layer > 0 and Tt == T and len(acts) == 1:  # z_0 is data: it needs no adjoint
            gin = gz  # the residual; one head reads gz before it adds to it, so gz accumulates in place
        elif layer > 0:
            gin = grad.new_zeros(D, T, b)
            gin[:, T - Tt :] = gz
        for h, act in enumerate(acts):
            (P, u, g), mask = weights[layer][h], masks[layer][h]
            k_lh, r_lh = K[layer, h], rs[layer][h]
            if A is None:  # Δy_j = s r Σ_i h̃_ji y_i
                gw = gz[d] * (scale * r_lh)  # (Tt, b)
                gr[layer, h] += scale * torch.dot(gz[d].flatten(), u.flatten())
                gP = gw.unsqueeze(1) * src[d]  # (Tt, n, b)
                rowdot = gw * u
                if gin is not None:
                    gin[d, :n] += (P * gw.unsqueeze(1)).sum(0)
            else:
                gA[layer, h] += scale * _outer(gz[:d], u[:d])  # type: ignore[index]  # gA exists when A does
                gr[layer, h] += scale * torch.dot(gz[d].flatten(), u[d].flatten())
                gu = torch.empty_like(u)
                torch.mm(A[layer, h].T * scale, gz[:d].reshape(d, -1), out=gu[:d].view(d, -1))
                torch.mul(gz[d], scale * r_lh, out=gu[d])
                gP = _scores(gu, src)  # (Tt, n, b) = Σ_c gu[c, j] v[c, i]: the adjoint of _mix in P
                rowdot = (gu * u).sum(0)
                if gin is not None:
                    _mix_t(P, gu, gin[:, :n])
            gS = _weights_backward(act, P, gP, mask, rowdot)
            gg = _mix(gS, src[:d])  # (d, Tt, b): Σ_i dS_ji x_i
            gK[layer, h] += _outer(tgt[:d], gg)
            if gin is not None and A is not None:  # covariate adjoints (A ≡ 0: covariates are data)
                _mix_t(gS, g, gin[:d, :n])
                gin[:d, T - Tt :].view(d, -1).addmm_(k_lh, gg.view(d, -1))  # the target side of g = Kᵀx
        if gin is not None:
            gz = gin


class _NativeStack(torch.autograd.Function):
    """:class:`_Stack` by the C kernel ``_kernel_attn.c`` (CPU, float32: 8 prompts per AVX2 vector, float64: 4),
    each target row's scores, weights and adjoints in registers. With gradients on, the forward also runs the backward
    for a unit output gradient and keeps every prompt's d out / d(K, A, r) (:data:`JACOBIAN_BYTES` at most), so the
    backward is one product with the output gradient. Past that budget nothing is kept but the inputs (the backward
    replays the forward per group), or with :data:`KEEP` the weights h̃(S). The batch is split into the parts
    :func:`kernel_stack` chooses, one C call per part with its own gradient sums, added in order: the same numbers on
    any thread count."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, y: Tensor, xq: Tensor, K: Tensor, A: Tensor, r: Tensor, meta: tuple[Any, ...]
    ) -> Tensor:
        n, acts, scale, cap, chunk, has_A, grad = meta
        lib = native()
        (x, y, xq), strides = _prompt_rows(x, y, xq)
        K, A, r = K.detach().contiguous(), A.detach().contiguous(), r.detach().contiguous()
        L, H, d = K.shape[:3]
        codes = torch.tensor([ACT_CODES[a] for a in acts], dtype=torch.int32)
        tag = "f32" if x.dtype == torch.float32 else "f64"
        forward: Callable[..., int] = getattr(lib, f"ka_forward_{tag}")
        kept = getattr(lib, f"ka_kept_{tag}")
        bounds = [(s, min(s + chunk, x.shape[0])) for s in range(0, x.shape[0], chunk)]
        out = x.new_empty(x.shape[0])
        lanes = getattr(lib, f"ka_lanes_{tag}")()
        nw = 2 * L * H * d * d + L * H
        groups = [-(-(e - s) // lanes) * lanes for s, e in bounds]
        jacobian = grad and sum(groups) * nw * x.element_size() <= JACOBIAN_BYTES
        states: list[Tensor | None]
        if jacobian:
            forward, states = getattr(lib, f"ka_jacobian_{tag}"), [x.new_empty(g * nw) for g in groups]
        else:
            states = [x.new_empty(kept(e - s, L, H, d, n)) if KEEP and grad else None for s, e in bounds]
        common = (L, H, d, n, codes.data_ptr(), K.data_ptr(), A.data_ptr() if has_A else None, r.data_ptr(),
                  scale, cap is not None, 0.0 if cap is None else cap)  # fmt: skip

        def run(p: int) -> int:
            s, e = bounds[p]
            data = (x[s:e].data_ptr(), y[s:e].data_ptr(), xq[s:e].data_ptr(), strides.data_ptr())
            return forward(e - s, *common, *data, out[s:e].data_ptr(), _ptr(states[p]))

        _check(map_on_threads(run, range(len(bounds))))
        ctx.meta, ctx.states, ctx.bounds, ctx.common, ctx.codes, ctx.tag = meta, states, bounds, common, codes, tag
        ctx.jacobian, ctx.strides = jacobian, strides
        ctx.save_for_backward(x, y, xq, K, A, r)
        return out

    @staticmethod
    @native_kernels.first_order("set model.fast = False (the token pass, or the moment form for all-linear heads)")
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, y, xq, K, A, r = ctx.saved_tensors
        has_A = ctx.meta[-2]
        backward, grad = getattr(native(), f"ka_backward_{ctx.tag}"), grad.contiguous()
        vjp = getattr(native(), f"ka_vjp_{ctx.tag}")
        bounds, common = ctx.bounds, ctx.common
        L, H, d, scale = common[0], common[1], common[2], common[8]

        def run(p: int) -> tuple[Tensor, Tensor, Tensor]:
            s, e = bounds[p]
            gK, gA, gr = torch.zeros_like(K), torch.zeros_like(A), torch.zeros_like(r)
            grads = (gK.data_ptr(), gA.data_ptr() if has_A else None, gr.data_ptr())
            if ctx.jacobian:
                code = vjp(e - s, L, H, d, has_A, scale, ctx.states[p].data_ptr(), grad[s:e].data_ptr(), *grads)
            else:
                data = (x[s:e].data_ptr(), y[s:e].data_ptr(), xq[s:e].data_ptr(), ctx.strides.data_ptr())
                code = backward(e - s, *common, *data, _ptr(ctx.states[p]), grad[s:e].data_ptr(), *grads)
            _check([code])
            return gK, gA, gr

        parts = map_on_threads(run, range(len(bounds)))
        ctx.states = None
        sums = [torch.stack(g).sum(0) for g in zip(*parts, strict=True)]
        return None, None, None, sums[0], sums[1] if has_A else None, sums[2], None


def _prompt_rows(x: Tensor, y: Tensor, xq: Tensor) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """x (B, n, d), y (B, n), xq (B, d) as the C kernel reads them, with their prompt strides (3,) as C longs: a view
    whose rows are contiguous within a prompt (an episode's x[:, :n] of a (B, n + 1, d) draw) is passed as it is, with
    its batch stride; anything else is copied contiguous. Saves a strided copy of the covariates every step."""
    d = x.shape[-1]

    def rows(t: Tensor, inner: tuple[int, ...]) -> Tensor:
        ok = all(size == 1 or stride == want for size, stride, want in zip(t.shape[1:], t.stride()[1:], inner))
        return t if ok else t.contiguous()

    x, y, xq = rows(x, (d, 1)), rows(y, (1,)), rows(xq, (1,))
    strides = torch.tensor([t.stride(0) if t.shape[0] > 1 else 0 for t in (x, y, xq)], dtype=torch.long)
    return (x, y, xq), strides


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(codes: list[int]) -> None:
    """The C calls' return codes: 1 out of memory, 2 d > 32 or n > 256 (which :func:`_uses_native` rules out)."""
    if 1 in codes:
        raise MemoryError("_kernel_attn.c could not allocate its scratch buffers")
    if any(codes):
        raise ValueError("_kernel_attn.c takes d <= 32 covariates and n <= 256 context tokens")


def uses_native(x: Tensor, n: int) -> bool:
    """Whether :func:`kernel_stack` runs these covariates (B, n, d) by the C kernel."""
    ok = x.dtype in (torch.float32, torch.float64) and x.device.type == "cpu" and x.shape[-1] <= 32 and n <= 256
    return NATIVE and ok and native() is not None


def kernel_stack(
    x: Tensor,
    y: Tensor,
    x_query: Tensor,
    K: Tensor,
    A: Tensor | None,
    r: Tensor,
    *,
    n: int,
    activations: tuple[str, ...],
    scale: float,
    logit_cap: float | None,
    chunk: int = CHUNK,
) -> Tensor:
    """The query's label slot of z_L, (B,), from the prompt Z_0 of covariates ``x`` (B, n, d), labels ``y`` (B, n) and
    the query ``x_query`` (B, d) (the label slot 0).

    ``K`` (L, H, d, d) = C_ℓ,hᵀ B_ℓ,h / σ², ``A`` (L, H, d, d) or None for A ≡ 0, ``r`` (L, H); ``scale`` the
    1/n factor (or 1); ``logit_cap`` the exp heads' cap (exp(min(S, cap))). Differentiable in K, A and r.
    """
    B = x.shape[0]
    if not x.is_cuda and B >= 4 * MIN_SPLIT:
        chunk = split_evenly(B, chunk)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (K, A, r))
    meta = (n, tuple(activations), float(scale), logit_cap, int(chunk), A is not None, grad)
    A_arg = A if A is not None else K.new_zeros(0)
    node: type[torch.autograd.Function] = _NativeStack if uses_native(x, n) else _Stack
    return cast(Tensor, node.apply(x, y, x_query, K, A_arg, r, meta))  # Function.apply is unannotated
