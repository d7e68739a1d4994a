"""The C kernel of the linear transformer's moment form (models._moment_fast) against the token-level computation.

The reference is :meth:`LinearTransformer.forward_tokens`: every layer on the (B, n+1, D) prompt, eq. (3)-(4) of
Ahn et al. 2023, with plain autograd; for Sun et al.'s linear transformer (``BilinearTransformer(ffn="none")``, the
same layers on [1; x; 0; y]) its own ``forward_tokens``. Float64, the prediction and every parameter gradient to 1e-10 relative
(max-norm), for each parameter pattern, L ∈ {1, 3, 4} and batches that are not a multiple of the vector width.
"""

from __future__ import annotations

import pytest
import torch

from iclab.core import native as native_kernels
from iclab.models import _moment_fast, bilinear
from iclab.models.attention_core import context_moments, embed
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig, embed_scratch, prompt_moments
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.tasks import quadratic
from iclab.tasks.linear_regression import LinearRegression

RTOL = 1e-10


@pytest.fixture(params=["native", "native-avx2", "torch"])
def path(request, monkeypatch) -> str:
    """Run a test by the C kernel ``_moment_attn.c`` (skipped where it cannot be built), built for AVX2 lanes where
    the CPU has AVX-512 (``native-avx2``), or by the torch code of the moment form."""
    if request.param != "torch" and (not native_kernels.ENABLED or native_kernels.compiler() is None):
        pytest.skip("the C kernel cannot be built here (no compiler, no AVX2 or ICLAB_NATIVE=0): the torch code runs")
    monkeypatch.setattr(_moment_fast, "NATIVE", request.param != "torch")
    if request.param == "native-avx2":
        monkeypatch.setattr(_moment_fast, "WIDE", False)
    return request.param


def _episode(batch: int, n: int = 20, d: int = 5, dtype: torch.dtype = torch.float64, seed: int = 1):
    return LinearRegression(d=d).sample(batch, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _model(dtype: torch.dtype = torch.float64, **config) -> LinearTransformer:
    cfg = LinearTransformerConfig(**{"d": 5, "init_std": 0.3, **config})
    return LinearTransformer(cfg, generator=torch.Generator().manual_seed(2)).to(dtype)


def _value_and_grads(model: LinearTransformer, predict, ep, g: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = predict(ep)
    (out * g).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _check_against_tokens(model: LinearTransformer, ep) -> None:
    g = torch.randn(ep.batch_size, dtype=ep.dtype, generator=torch.Generator().manual_seed(3))
    out, grads = _value_and_grads(model, model, ep, g)
    ref, ref_grads = _value_and_grads(model, model.forward_tokens, ep, g)
    assert _rel(out, ref) < RTOL
    for (name, _), a, b in zip(model.named_parameters(), grads, ref_grads, strict=True):
        assert _rel(a, b) < RTOL, name


@pytest.mark.parametrize("pattern", ["full", "pattern11", "sparse"])
@pytest.mark.parametrize("n_layers", [1, 3, 4])
@pytest.mark.parametrize("batch", [1, 67])
def test_values_and_gradients_match_the_token_pass(path: str, pattern: str, n_layers: int, batch: int) -> None:
    """67 prompts split into three C calls (32, 32, 3 with 16 lanes; 36, 31 with 4): whole lane groups, then ragged ones."""
    model = _model(pattern=pattern, n_layers=n_layers)
    ep = _episode(batch)
    if path != "torch" and pattern != "sparse":  # eq. (8) runs its label-only form, not the moment form
        assert _moment_fast.applies(*context_moments(ep), model.P, model.Q)
    _check_against_tokens(model, ep)


@pytest.mark.parametrize(
    "config",
    [
        dict(n_heads=2, pattern="full"),
        dict(n_heads=3, pattern="pattern11"),
        dict(key_query="separate", rank=2),
        dict(sources="all"),
        dict(residual=False, n_layers=2),
        dict(sources="all", residual=False, n_heads=2, readout="positive"),
    ],
    ids=["heads2", "heads3-p11", "separate", "sources-all", "no-residual", "all-nores-heads2"],
)
def test_heads_sources_residual_and_separate_key_query(path: str, config: dict) -> None:
    _check_against_tokens(_model(**config), _episode(37, n=9, seed=4))


def test_float32_agrees_with_float64(path: str) -> None:
    ep64 = _episode(101)
    model = _model(pattern="pattern11")
    ref = model(ep64)
    out = _model(torch.float32, pattern="pattern11")(ep64.to(dtype=torch.float32))
    assert _rel(out.detach().double(), ref.detach()) < 1e-4


def test_the_same_numbers_on_any_thread_count(path: str) -> None:
    """The kernel's parts and the order of their sums do not depend on the thread count (torch's GEMMs may)."""
    if path == "torch":
        pytest.skip("the torch code's GEMMs may round differently on another thread count")
    ep = _episode(200, dtype=torch.float32)
    model = _model(torch.float32, pattern="full")
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(_value_and_grads(model, model, ep, torch.ones(200)))
    finally:
        torch.set_num_threads(before)
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("include_query", [False, True])
def test_moments_match_the_prompt(path: str, dtype: torch.dtype, include_query: bool) -> None:
    """context_moments by the C kernel (no (B, n+1, D) prompt formed) against Σ_i z_i z_iᵀ on the prompt."""
    ep = _episode(45, n=7, dtype=dtype)
    gram, q = context_moments(ep, include_query=include_query)
    z = embed(ep)
    src = z if include_query else z[:, : ep.n]
    ref = torch.einsum("bni,bnj->ijb", src, src)
    assert _rel(gram, ref) < (RTOL if dtype == torch.float64 else 1e-6)
    assert torch.equal(q, z[:, -1].T)


def test_gradient_wrt_the_prompt_runs_the_torch_code() -> None:
    """A prompt that needs a gradient (Lemma 5's Z̄_0 studies) is not the kernel's: applies() says no."""
    ep = _episode(5)
    model = _model()
    gram, q = context_moments(ep)
    assert not _moment_fast.applies(gram.requires_grad_(), q, model.P, model.Q)


# --- Sun et al.'s linear transformer (BilinearTransformer, ffn="none"): the same moment form on [1; x; 0; y/s] ---


def _sun(blocks: int, heads: int = 1, label_scale: float = 1.0) -> BilinearTransformer:
    cfg = BilinearTransformerConfig(
        d=2, d_bar=6, n_blocks=blocks, init_std=0.4, n_heads=heads, label_scale=label_scale, ffn="none"
    )
    return BilinearTransformer(cfg, generator=torch.Generator().manual_seed(9)).to(torch.float64)


@pytest.mark.parametrize("blocks, heads, label_scale", [(1, 1, 1.0), (5, 2, 2.5), (2, 3, 0.7)])
def test_sun_linear_transformer_matches_the_token_pass(path: str, blocks: int, heads: int, label_scale: float) -> None:
    """``BilinearTransformer(ffn="none")`` carries the Gram matrix and query row of its own prompt [1; x; 0; y/s]
    through the layers (prompt_moments, then the C kernel or moment_labels): values, every gradient and the ℓ-block
    read-outs equal the token pass (``forward_tokens``, ``trace``) in float64, over ragged lane groups."""
    model = _sun(blocks, heads, label_scale)
    ep = quadratic(2).sample(70, 6, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    gram, q = model._moments(ep)
    P, Q = torch.stack([a.P for a in model.attn]), torch.stack([a.Q for a in model.attn])
    assert _moment_fast.applies(gram, q, P, Q) == (path != "torch")
    _check_against_tokens(model, ep)
    _, states = model.trace(ep)
    assert _rel(model.block_predictions(ep, fused=True), -states[:, :, -1, -1]) < RTOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("label_scale", [1.0, 1.7])
def test_sun_prompt_moments_match_the_prompt(path: str, dtype: torch.dtype, label_scale: float) -> None:
    """prompt_moments (by the C kernel: no prompt formed) against Σ_{t<n} z_t z_tᵀ and z_n of embed_scratch's z."""
    ep = quadratic(3).sample(21, 9, generator=torch.Generator().manual_seed(11), dtype=dtype)
    gram, q = prompt_moments(ep, 7, label_scale)
    z = embed_scratch(ep, 7, label_scale)
    assert gram.shape == (8, 8, 21) and q.shape == (8, 21)
    assert _rel(gram, torch.einsum("bni,bnj->ijb", z[:, :-1], z[:, :-1])) < (1e-14 if dtype == torch.float64 else 1e-6)
    assert torch.equal(q, z[:, -1].T)


def test_sun_linear_transformer_never_makes_its_prompt(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel applies, forward, backward and the read-outs after each layer go through the moments."""
    if path == "torch":
        pytest.skip("the torch code forms the moments from the prompt")
    model = BilinearTransformer(BilinearTransformerConfig(d=3, d_bar=8, n_blocks=3, ffn="none"))
    ep = quadratic(3).sample(40, 12, generator=torch.Generator().manual_seed(12))

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the prompt was made")

    monkeypatch.setattr(bilinear, "embed_scratch", refuse)
    monkeypatch.setattr(BilinearTransformer, "forward_tokens", refuse)
    model(ep).square().sum().backward()
    model.block_predictions(ep, fused=True)


def test_sun_linear_transformer_is_differentiable_twice_and_under_transforms() -> None:
    """A prompt that needs a gradient or a ``torch.func`` transform takes the torch moment form, which autograd
    differentiates to any order: a Hessian-vector product and ``torch.func.grad`` equal the token pass's."""
    model = _sun(3, heads=2, label_scale=1.3)
    ep = quadratic(2).sample(9, 5, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ep,)).square().sum())(params)
    want = torch.autograd.grad(model.forward_tokens(ep).square().sum(), list(params.values()))
    for g, w in zip(grads.values(), want, strict=True):
        assert _rel(g, w) < RTOL
    w0 = next(iter(params.values()))
    (g,) = torch.autograd.grad(model(ep).square().sum(), [w0], create_graph=True)
    (gt,) = torch.autograd.grad(model.forward_tokens(ep).square().sum(), [w0], create_graph=True)
    hv, hv_ref = (torch.autograd.grad(x.sum(), [w0])[0] for x in (g, gt))
    assert _rel(hv, hv_ref) < RTOL


def test_linear_transformer_under_torch_func_grad() -> None:
    """Inside ``torch.func.grad`` the moments come from the torch code (a tensor made there has no data pointer for
    the C kernel): the gradient equals the token pass's."""
    model, ep = _model(pattern="full", n_layers=2), _episode(11)
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ep,)).square().sum())(params)
    want = torch.autograd.grad(model.forward_tokens(ep).square().sum(), list(params.values()))
    for g, w in zip(grads.values(), want, strict=True):
        assert _rel(g, w) < RTOL
