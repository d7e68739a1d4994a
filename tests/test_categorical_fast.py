"""The free CategoricalTransformer's fast path (models._categorical_fast) computes the paper's function.

Reference: the token-level block of Wang et al. 2025, eq. (36)-(44), written out plainly below (both heads project every
token with their full D×D matrices, softmax over the n context keys; cross-attention to W_e's columns; residuals;
readout eq. 7). In float64 the fast path's logits and every parameter's gradient equal it, and the model's general
path (``model.fast = False``), to 1e-10 relative, for K = 1, 2, 3 blocks (K = 3 runs a middle block by the general
code), shared and separate block weights, one or several queries, padded and unpadded source widths, and batches
split into several chunks with a ragged last one. The fused C kernel (``_kv_softmax.c``, float32) equals the float64
head to float32 rounding wherever it can be built; where it cannot, the torch code runs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F32, F64, rel_diff
from iclab.core import native as native_kernels
from iclab.core.episode import Episode
from iclab.models import CategoricalTransformer, CategoricalTransformerConfig
from iclab.models import _categorical_fast as fast
from iclab.models import _quad_form as quad_form
from iclab.models._categorical_heads import head_weights, scaled_head_weights, softmax_cross_attention


def _episode(B: int, n: int, d: int, C: int, seed: int, dtype: torch.dtype = F64) -> Episode:
    g = iclab.generator(seed)
    return Episode(
        x=torch.rand(B, n, d, generator=g, dtype=dtype) * 2 - 1,
        x_query=torch.rand(B, d, generator=g, dtype=dtype) * 2 - 1,
        labels=torch.randint(C, (B, n), generator=g),
        label_query=torch.randint(C, (B,), generator=g),
    )


def reference_logits(model: CategoricalTransformer, ep: Episode, points: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, m, C) by eq. (4), (23), (36)-(44), (7) token by token, every head with its full matrices."""
    cfg, W, n = model.config, model.W_e, ep.n
    q = ep.x_query.unsqueeze(1) if points is None else points.expand(ep.batch_size, *points.shape)
    x = torch.cat([ep.x, q], dim=1)  # (B, T, d)
    U = torch.cat([W.T[ep.labels], x.new_zeros(*q.shape[:2], cfg.d_embed)], dim=1)  # w_{e,y_i}; 0 at queries
    z = torch.cat([x, U, W.mean(1).expand_as(U), torch.zeros_like(U)], dim=-1)  # (x; u; w̄_e; 0)
    for k in range(cfg.n_blocks):
        blk = model.blocks[0 if cfg.shared else k]
        heads = torch.zeros_like(z)
        for h in range(2):  # SA_1 + SA_2 (eq. 36): over the context keys only (queries masked as keys)
            keys, values = z[:, :n] @ blk.W_K[h].T, z[:, :n] @ blk.W_V[h].T
            queries = z @ blk.W_Q[h].T * cfg.attn_logit_scale
            heads = heads + _scores(cfg.kernel, keys, queries) @ values @ blk.P[h].T
        zt = z + heads  # ẽ (eq. 37)
        qc, kc, vc = zt @ blk.W_Qc.T, W.T @ blk.W_Kc.T, W.T @ blk.W_Vc.T  # cross-attention (eq. 38-43)
        z = zt + torch.softmax(qc @ kc.T, dim=-1) @ vc @ blk.Pc.T  # eq. (44)
    return z[:, n:, -cfg.d_embed :] @ W  # eq. (7)


def _scores(kernel: str, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """(B, T, n) head weights, written out: softmax over the keys, or an unnormalised kernel ÷ n (the authors'
    value matrices' 1/n)."""
    if kernel == "softmax":
        return torch.softmax(queries @ keys.mT, dim=-1)
    n = keys.shape[1]
    if kernel == "rbf":
        return torch.exp(-0.5 * (queries.unsqueeze(2) - keys.unsqueeze(1)).square().sum(-1)) / n
    inner = queries @ keys.mT
    return (torch.exp(inner) if kernel == "exp" else inner) / n


def _value_and_grads(model: CategoricalTransformer, fn, weights: torch.Tensor):
    model.zero_grad(set_to_none=True)
    out = fn()
    (out * weights).sum().backward()  # a random linear functional: every logit reaches every gradient
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _check(cfg: CategoricalTransformerConfig, *, B: int, n: int, m: int, seed: int, nonzero: bool = True) -> None:
    """Fast path vs :func:`reference_logits` and vs the general path: logits and every gradient to 1e-10 relative.
    ``nonzero``: also require non-trivial logits and a non-zero gradient for every parameter (the checks bite);
    otherwise a gradient that is 0 in exact arithmetic (n = 1: W_Q, W_K) is compared at 1e-10 of the largest one."""
    model = CategoricalTransformer(cfg, generator=iclab.generator(seed)).to(F64)
    assert model.uses_fast_path
    ep = _episode(B, n, cfg.d, cfg.num_classes, seed + 1)
    points = None if m == 1 else torch.rand(m, cfg.d, generator=iclab.generator(seed + 2), dtype=F64) * 2 - 1
    weights = torch.randn(B, m, cfg.num_classes, generator=iclab.generator(seed + 3), dtype=F64)
    fast_out, fast_g = _value_and_grads(model, lambda: model.predict_points(ep, points), weights)
    ref_out, ref_g = _value_and_grads(model, lambda: reference_logits(model, ep, points), weights)
    model.fast = False
    gen_out, gen_g = _value_and_grads(model, lambda: model.predict_points(ep, points), weights)
    assert set(fast_g) == set(ref_g) == set(gen_g) == {k for k, _ in model.named_parameters()}
    if nonzero:
        assert ref_out.abs().max() > 1e-2 and all(g.abs().max() > 0 for g in ref_g.values())
    floor = 0.0 if nonzero else max(float(g.abs().max()) for g in ref_g.values())
    for other_out, other_g in ((ref_out, ref_g), (gen_out, gen_g)):
        assert rel_diff(fast_out, other_out) < 1e-10
        for name, g in other_g.items():
            assert float((fast_g[name] - g).abs().max()) < 1e-10 * max(float(g.abs().max()), floor), name


@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_fast_path_equals_the_token_level_blocks(K: int, shared: bool) -> None:
    """§6.1 widths (d = 10, d' = 5, C = 25: 15-wide sources padded to 16), logits and all gradients, float64."""
    cfg = CategoricalTransformerConfig(n_blocks=K, mode="free", kernel="softmax", shared=shared, init_std=0.3)
    _check(cfg, B=3, n=20, m=1, seed=10 * K + shared)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    K=st.integers(1, 3),
    d=st.integers(1, 6),
    dp=st.integers(1, 4),
    C=st.integers(2, 7),
    n=st.integers(1, 12),  # n = 1: one key, so W_Q and W_K get zero gradients
    m=st.integers(1, 3),
    zero_last=st.booleans(),
)
def test_fast_path_equals_the_token_level_blocks_at_any_size(
    seed: int, K: int, d: int, dp: int, C: int, n: int, m: int, zero_last: bool
) -> None:
    """Any widths (padded to a multiple of 8 or exactly 8 wide), any n, several queries, both W_e conventions."""
    cfg = CategoricalTransformerConfig(d=d, d_embed=dp, num_classes=C, n_blocks=K, mode="free", kernel="softmax",
                                       zero_last_class=zero_last, init_std=0.3)  # fmt: skip
    _check(cfg, B=2, n=n, m=m, seed=seed, nonzero=False)


@pytest.mark.parametrize("kernel", ["rbf", "exp", "linear"])
@pytest.mark.parametrize(("K", "m"), [(1, 1), (1, 3), (2, 1), (3, 2)])
@pytest.mark.parametrize("c_kernel", [True, False])
def test_fast_path_of_the_unnormalised_kernels(
    kernel: str, K: int, m: int, c_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first block on the r-wide sources (first_block_kernel) for rbf, exp and linear heads: logits and all
    gradients against the written-out blocks (rbf by the direct difference ‖k − t‖², not the Gram expansion) and the
    general path, float64, 1e-10; one and several queries, later blocks by the general code; rbf's per-key term by
    ``_quad_form.c`` (where it builds) and by the torch code."""
    monkeypatch.setattr(quad_form, "NATIVE", c_kernel and quad_form.NATIVE)
    std = 0.3 if kernel == "rbf" else 0.1  # at 0.3 kᵀt of a deeper block grows to overflow (exp) or saturation
    cfg = CategoricalTransformerConfig(n_blocks=K, mode="free", kernel=kernel, init_std=std)
    _check(cfg, B=3, n=20, m=m, seed=5 * K + m)


def _quad_inputs(N: int, r: int, H: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = iclab.generator(seed)
    s = torch.randn(N, r, generator=g, dtype=dtype)
    K = torch.randn(H, r + 3, r, generator=g, dtype=dtype)
    return s, K.mT @ K  # symmetric M, as the rbf head's K_hᵀK_h


@pytest.mark.skipif(quad_form.native() is None, reason="no C compiler: the torch code runs (tested below)")
@pytest.mark.parametrize(("N", "r", "H"), [(64_000, 15, 2), (37, 15, 2), (5, 1, 1), (19, 7, 3), (0, 4, 2)])
def test_quad_form_kernel_equals_the_torch_code(N: int, r: int, H: int) -> None:
    """``_quad_form.c`` (float64: every lane-tail N, any r and H, no rows) against the torch code: values and both
    gradients to 1e-12; in float32 to float32 rounding; the same bits on 1 and 3 threads."""
    for dtype, tol in ((F64, 1e-12), (F32, 1e-5)):
        s, M = _quad_inputs(N, r, H, dtype, seed=N + r)
        w = torch.randn(N, H, generator=iclab.generator(1), dtype=dtype)
        outs = []
        for c_kernel in (True, False):
            quad_form.NATIVE = c_kernel
            try:
                ss, MM = s.clone().requires_grad_(), M.clone().requires_grad_()
                a = quad_form.quad_forms(ss, MM)
                (a * w).sum().backward()
                outs.append((a.detach(), ss.grad, MM.grad))
            finally:
                quad_form.NATIVE = native_kernels.ENABLED
        for c, t in zip(*outs, strict=True):
            assert c.shape == t.shape and (N == 0 or rel_diff(c, t) < tol)
    s, M = _quad_inputs(N, r, H, F64, seed=3)
    M.requires_grad_()
    bits = []
    for threads in (1, 3):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            a = quad_form.quad_forms(s, M)
            bits.append((a.detach(), *torch.autograd.grad(a.sum(), M)))
        finally:
            torch.set_num_threads(old)
    assert all(torch.equal(x, y) for x, y in zip(*bits, strict=True))


@pytest.mark.skipif(quad_form.native() is None, reason="no C compiler: the torch code runs")
def test_quad_form_kernel_gradcheck_and_first_order_only() -> None:
    """gradcheck of the C kernel's backward in float64; a backward with create_graph raises (it is first-order)."""
    s, M = _quad_inputs(21, 5, 2, F64, seed=8)
    s.requires_grad_()
    M.requires_grad_()
    assert quad_form.applies(s, M)
    assert torch.autograd.gradcheck(quad_form.quad_forms, (s, M))
    with pytest.raises(RuntimeError, match="model.fast = False"):
        torch.autograd.grad(quad_form.quad_forms(s, M).sum(), s, create_graph=True)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    kernel=st.sampled_from(["rbf", "exp", "linear"]),
    K=st.integers(1, 2),
    d=st.integers(1, 6),
    dp=st.integers(1, 4),
    n=st.integers(2, 12),
    m=st.integers(1, 3),
)
def test_fast_path_of_the_unnormalised_kernels_at_any_size(
    seed: int, kernel: str, K: int, d: int, dp: int, n: int, m: int
) -> None:
    cfg = CategoricalTransformerConfig(d=d, d_embed=dp, num_classes=4, n_blocks=K, mode="free", kernel=kernel,
                                       init_std=0.3 if kernel == "rbf" else 0.1)  # fmt: skip
    _check(cfg, B=2, n=n, m=m, seed=seed, nonzero=False)


def test_fast_path_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch split into chunks of 2 contexts (the last one ragged) gives the same numbers."""
    monkeypatch.setattr(fast, "CHUNK", 2)
    cfg = CategoricalTransformerConfig(n_blocks=2, mode="free", kernel="softmax", init_std=0.3)
    _check(cfg, B=5, n=9, m=2, seed=7)


def test_shared_kv_softmax_gradcheck() -> None:
    """The hand-written backward of the shared keys = values head: gradcheck in float64, with and without a gradient
    for the x columns, chunked (CHUNK forced to 1); no-grad inference keeps no probabilities, same output."""
    g = iclab.generator(4)
    x = torch.randn(3, 5, 2, generator=g, dtype=F64)
    u = torch.randn(3, 5, 3, generator=g, dtype=F64, requires_grad=True)
    q = torch.cat([torch.randn(3, 4, 5, generator=g, dtype=F64), torch.zeros(3, 4, 3, dtype=F64)], -1)
    q.requires_grad_()
    s = torch.cat([x, u.detach(), torch.zeros(3, 5, 3, dtype=F64)], -1)
    expected = torch.softmax(q.detach() @ s.mT, -1) @ s
    with torch.no_grad():
        assert rel_diff(fast.shared_kv_softmax(q, x, u), expected) < 1e-14
    old = fast.CHUNK
    try:
        fast.CHUNK = 1
        assert torch.autograd.gradcheck(fast.shared_kv_softmax, (q, x, u))
        assert torch.autograd.gradcheck(fast.shared_kv_softmax, (q, x.clone().requires_grad_(), u))
    finally:
        fast.CHUNK = old


@pytest.mark.parametrize("kernel", ["softmax", "rbf"])
def test_fast_path_in_float32_and_without_gradients(kernel: str) -> None:
    """float32 at the §6.1 sizes: fast and general paths agree to float rounding; so does a no-grad pass."""
    cfg = CategoricalTransformerConfig(n_blocks=2, mode="free", kernel=kernel, init_std=0.3)
    model = CategoricalTransformer(cfg, generator=iclab.generator(0))
    ep = _episode(4, 125, 10, 25, seed=1, dtype=F32)
    logits = model.predict(ep)
    with torch.no_grad():
        assert rel_diff(model.predict(ep), logits) < 1e-5  # no probabilities kept; MKL may round differently
        model.fast = False
        general = model.predict(ep)
    assert rel_diff(logits, general) < 1e-5


def test_which_configurations_take_the_fast_path() -> None:
    """Only the free model with the softmax, rbf, exp or linear kernel and an ordinary second head; ``fast = False``
    turns it off."""
    base = {"mode": "free", "kernel": "softmax"}
    for kernel in ("softmax", "rbf", "exp", "linear"):
        assert CategoricalTransformer(CategoricalTransformerConfig(**{**base, "kernel": kernel})).uses_fast_path
    for change in ({"kernel": "laplacian"}, {"erasure": "rbf"}, {"mode": "gd", "erasure": None}):
        assert not CategoricalTransformer(CategoricalTransformerConfig(**{**base, **change})).uses_fast_path
    model = CategoricalTransformer(CategoricalTransformerConfig(**base))
    model.fast = False
    assert not model.uses_fast_path


def _head64(q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, need_x: bool):
    q, x, u = (t.double().requires_grad_(r) for t, r in ((q, True), (x, need_x), (u, True)))
    s = torch.cat([x, u, torch.zeros(*x.shape[:2], 16 - x.shape[-1] - u.shape[-1], dtype=F64)], -1)
    o = torch.softmax(q @ s.mT, -1) @ s
    o.backward(g.double())
    return o.detach(), q.grad, u.grad, x.grad


@pytest.mark.parametrize(("B", "M", "n"), [(3, 252, 125), (5, 13, 7), (2, 1, 1), (4, 6, 16), (7, 20, 9)])
def test_native_kernel_matches_the_float64_head(B: int, M: int, n: int) -> None:
    """``_kv_softmax.c`` (16-wide rows, any M and n, tails of the 6-row and 8-lane blocks): outputs and the q, u and x
    gradients within float32 rounding of the float64 head; split over 1 or 3 threads, the same numbers."""
    if fast.native() is None:
        pytest.skip("the C kernel cannot be built here (no compiler or no AVX2); the torch code runs instead")
    g = iclab.generator(B * 1000 + M + n)
    q = torch.cat([torch.randn(B, M, 15, generator=g), torch.zeros(B, M, 1)], -1) * 0.7
    x, u = torch.rand(B, n, 10, generator=g) * 2 - 1, torch.randn(B, n, 5, generator=g)
    grad = torch.randn(B, M, 16, generator=g)
    for need_x in (False, True):
        qq, xx, uu = q.clone().requires_grad_(), x.clone().requires_grad_(need_x), u.clone().requires_grad_()
        o = fast.shared_kv_softmax(qq, xx, uu)
        o.backward(grad)
        for got, ref in zip((o.detach(), qq.grad, uu.grad, xx.grad), _head64(q, x, u, grad, need_x), strict=True):
            if ref is None:
                assert got is None
            elif ref.abs().max() > 0:
                assert rel_diff(got.double(), ref) < 5e-6
    s = torch.cat([x, u, torch.zeros(B, n, 1)], -1)
    outs = []
    for threads in (1, 3):
        o, e, inv = torch.empty(B, M, 16), torch.empty(B, M, -(-n // 16) * 16), torch.empty(B, M)
        fast._split(fast.native().kv_softmax_forward, B, M, n, q, s, e, inv, o, threads=threads)
        outs.append((o, e, inv))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    assert (outs[0][1][..., n:] == 0).all()  # the rows' padding


def test_without_the_c_kernel_the_torch_code_runs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No compiler: ``native()`` is None and the model computes the same logits by the torch code."""
    monkeypatch.setattr(native_kernels, "_loaded", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path))
    assert fast.native() is None
    cfg = CategoricalTransformerConfig(n_blocks=2, mode="free", kernel="softmax", init_std=0.3)
    model = CategoricalTransformer(cfg, generator=iclab.generator(0))
    ep = _episode(3, 30, 10, 25, seed=2, dtype=F32)
    logits = model.predict(ep)
    model.fast = False
    assert rel_diff(logits, model.predict(ep)) < 1e-5


def _gd_pass(model: CategoricalTransformer, ep: Episode, points: torch.Tensor | None, fast_on: bool):
    """Logits at ``points`` (or the query) and every learned parameter's gradient, by the GD model's fast path or the
    general identity-erasure pass (``model.fast``)."""
    model.fast = fast_on
    model.zero_grad()
    logits = model.predict_points(ep, points)
    w = torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view(logits.shape)
    (logits * w).sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize(("K", "shared", "scale_param"), [(1, False, "a"), (2, False, "a"), (3, True, "a"),
                                                          (2, False, "logit"), (3, False, "logit")])  # fmt: skip
@pytest.mark.parametrize("native", [True, False])
def test_gd_softmax_fast_path_equals_the_general_pass(
    K: int, shared: bool, scale_param: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GD model (softmax kernel, exact erasure): head 1 by ``shared_kv_softmax`` = the general pass that stores
    the (B, T, n) weights, float64 to 1e-10 relative, values and the gradients of α, the scale and W_e; one query
    and several (``predict_points``), a batch over several chunks with a ragged last one; with and without the C
    kernel (float64 always runs the torch code: the same numbers)."""
    monkeypatch.setattr(fast, "NATIVE", native)
    monkeypatch.setattr(fast, "CHUNK", 1)
    kw = {"attn_logit_scale": 0.3} if scale_param == "logit" else {}
    cfg = CategoricalTransformerConfig(n_blocks=K, shared=shared, scale_param=scale_param, scale_init=0.8, **kw)
    model = CategoricalTransformer(cfg, generator=iclab.generator(K)).double()
    with torch.no_grad():
        model.alpha.copy_(0.5 + torch.rand(model.alpha.shape, generator=iclab.generator(7), dtype=F64))
    ep = _episode(2 * torch.get_num_threads() + 1, 40, 10, 25, seed=K)
    points = torch.rand(3, 10, generator=iclab.generator(9), dtype=F64) * 2 - 1
    for pts in (None, points):
        got, ref = _gd_pass(model, ep, pts, True), _gd_pass(model, ep, pts, False)
        assert rel_diff(got[0], ref[0]) < 1e-10
        for g_fast, g_ref in zip(got[1], ref[1], strict=True):
            assert rel_diff(g_fast, g_ref) < 1e-10


@pytest.mark.parametrize("kernel", ["rbf", "exp", "linear", "laplacian"])
@pytest.mark.parametrize("K", [1, 2])
def test_gd_scaled_weights_equal_the_general_pass(kernel: str, K: int) -> None:
    """The GD model with an unnormalised kernel: head 1's weights from the data's Gram matrix, then the scale
    (scaled_head_weights) = the general pass on the scaled inputs, float64 to 1e-10 relative, values and the gradients
    of α, the scale and W_e, one query and several."""
    cfg = CategoricalTransformerConfig(n_blocks=K, kernel=kernel, scale_init=0.8)
    model = CategoricalTransformer(cfg, generator=iclab.generator(K)).double()
    with torch.no_grad():
        model.alpha.copy_(0.5 + torch.rand(model.alpha.shape, generator=iclab.generator(7), dtype=F64))
    ep = _episode(3, 30, 10, 25, seed=K)
    points = torch.rand(3, 10, generator=iclab.generator(9), dtype=F64) * 2 - 1
    for pts in (None, points):
        got, ref = _gd_pass(model, ep, pts, True), _gd_pass(model, ep, pts, False)
        assert rel_diff(got[0], ref[0]) < 1e-10 and got[0].abs().max() > 1e-3
        assert len(got[1]) == len(ref[1]) >= 2
        for g_fast, g_ref in zip(got[1], ref[1], strict=True):
            assert rel_diff(g_fast, g_ref) < 1e-10


@pytest.mark.parametrize("kernel", ["rbf", "exp", "linear", "laplacian", "softmax"])
def test_scaled_head_weights_keep_the_data_gradient_where_asked(kernel: str) -> None:
    """Data that needs a gradient (an attribution) gets it: those inputs take head_weights on the scaled inputs; the
    weights and the scale's gradient are the same either way."""
    g = iclab.generator(3)
    keys, queries = torch.randn(2, 7, 4, generator=g, dtype=F64), torch.randn(2, 3, 4, generator=g, dtype=F64)
    scale = torch.tensor(0.7, dtype=F64, requires_grad=True)
    w = scaled_head_weights(kernel, scale, keys, queries)
    ref = head_weights(kernel, scale * keys, scale * queries)
    assert rel_diff(w, ref) < 1e-12
    assert rel_diff(*(torch.autograd.grad(t.sum(), scale)[0] for t in (w, ref))) < 1e-12
    keys.requires_grad_()
    (gk,) = torch.autograd.grad(scaled_head_weights(kernel, scale, keys, queries).sum(), keys)
    assert gk.abs().max() > 0


@pytest.mark.parametrize("native", [True, False])
def test_gd_softmax_fast_path_in_float32(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 at the §6.1 sizes (d + d' = 15: the C kernel's 16-wide rows where it is built, else the torch code):
    the fast and general GD passes agree to float32 rounding, values and gradients."""
    monkeypatch.setattr(fast, "NATIVE", native)
    model = CategoricalTransformer(CategoricalTransformerConfig(n_blocks=2), generator=iclab.generator(0))
    ep = _episode(3, 125, 10, 25, seed=4, dtype=F32)
    got, ref = _gd_pass(model, ep, None, True), _gd_pass(model, ep, None, False)
    assert rel_diff(got[0], ref[0]) < 1e-5
    for g_fast, g_ref in zip(got[1], ref[1], strict=True):
        assert rel_diff(g_fast, g_ref) < 1e-4


def _cross64(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, grad: torch.Tensor, fn=None):
    """Output of Σ_c softmax_c(k_cᵀ q_j) v_c and the q, keys and values gradients, in float64 by the torch code (or
    by ``fn`` in the inputs' dtype)."""
    dt = F64 if fn is None else q.dtype
    a = [t.detach().to(dt).requires_grad_() for t in (q, keys, values)]
    o = (fn or softmax_cross_attention)(*a)
    o.backward(grad.to(dt))
    return [o.detach().double()] + [t.grad.double() for t in a]


@pytest.mark.parametrize(("N", "C", "dk", "dm"), [(640, 25, 5, 5), (37, 7, 3, 9), (5, 64, 16, 16), (1, 1, 1, 1)])
@pytest.mark.parametrize("native", [True, False])
def test_cross_softmax_matches_the_float64_head(
    N: int, C: int, dk: int, dm: int, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cross_softmax`` (the GD model's cross-attention, eq. 38-43; the C kernel for float32 where it is built, any
    number of keys up to 64 and widths up to 16, tails of the 8-lane blocks): the output and the q, keys and values
    gradients within float32 rounding of the float64 head; in float64 (torch code) equal to it to 1e-10."""
    monkeypatch.setattr(fast, "NATIVE", native)
    g = iclab.generator(N + 100 * C + dk)
    q, keys = torch.randn(N, dk, generator=g, dtype=F64) * 2, torch.randn(C, dk, generator=g, dtype=F64)
    values, grad = torch.randn(C, dm, generator=g, dtype=F64), torch.randn(N, dm, generator=g, dtype=F64)
    ref = _cross64(q, keys, values, grad)
    for dt, tol in ((F64, 1e-10), (F32, 5e-6)):
        got = _cross64(q.to(dt), keys.to(dt), values.to(dt), grad, fast.cross_softmax)
        for a, b in zip(got, ref, strict=True):
            assert rel_diff(a, b) < tol


def test_cross_softmax_threads_and_shared_keys_and_values() -> None:
    """The C kernel: batched (B, T, d') queries, keys = values the same tensor (the GD model's W_e columns: both
    gradients summed), split over 1 or 3 threads with the same numbers; more than 64 keys: the torch code."""
    if fast.native() is None:
        pytest.skip("the C kernel cannot be built here (no compiler or no AVX2); the torch code runs instead")
    gen = iclab.generator(3)
    F, W = torch.randn(4, 33, 5, generator=gen), torch.randn(25, 5, generator=gen)
    grad = torch.randn(4, 33, 5, generator=gen)
    outs = []
    for threads in (1, 3):
        torch_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            f, w = F.clone().requires_grad_(), W.clone().requires_grad_()
            o = fast.cross_softmax(f, w, w)
            o.backward(grad)
        finally:
            torch.set_num_threads(torch_threads)
        outs.append((o.detach(), f.grad, w.grad))
        f64, w64 = F.double().requires_grad_(), W.double().requires_grad_()
        softmax_cross_attention(f64, w64, w64).backward(grad.double())
        for a, b in zip(outs[-1], (softmax_cross_attention(F.double(), W.double(), W.double()), f64.grad, w64.grad)):
            assert rel_diff(a.double(), b) < 5e-6
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert rel_diff(outs[0][2], outs[1][2]) < 1e-6  # the threads' shares of dW are summed in another order
    assert not fast._uses_native_cross(F, torch.randn(65, 5), torch.randn(65, 5))
