"""The data path of Sun et al. 2025's presets: the labels of random polynomials (tasks.polynomial.polynomial_values,
its C kernel _polynomial.c) and the prompt of eq. (1) (models.embed_scratch, _bilinear.c's bl_embed), bit for bit
against the reference computations: ``einsum`` over the materialised monomial features and the concatenated prompt.
"""

from __future__ import annotations

import pytest
import torch

import iclab
from iclab import models, tasks
from iclab.core import native as native_kernels
from iclab.models import _bilinear_fast
from iclab.models.bilinear import _embed_reference, embed_scratch
from iclab.tasks import polynomial

DTYPES = [torch.float32, torch.float64]


@pytest.fixture(params=["native", "torch"])
def path(request, monkeypatch) -> str:
    """Run a test by the C kernels (skipped where they cannot be built) or by the torch code."""
    if request.param == "native" and native_kernels.compiler() is None:
        pytest.skip("the C kernels cannot be built here (no compiler or no AVX2); the torch code runs instead")
    monkeypatch.setattr(polynomial, "NATIVE", request.param == "native")
    monkeypatch.setattr(_bilinear_fast, "NATIVE", request.param == "native")
    return request.param


def _points(batch: int, tokens: int, d: int, m: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = iclab.generator(0)
    return torch.randn(batch, tokens, d, generator=g, dtype=dtype), torch.randn(batch, m, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("monomials", ["quadratic", "sparse_cubic", 4, 0])
@pytest.mark.parametrize("threads", [1, 2])
def test_values_equal_the_feature_product_bit_for_bit(dtype, monomials, threads, path: str) -> None:
    a = polynomial.monomial_set(4, monomials)
    x, w = _points(37, 23, 4, a.shape[0], dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for xs in (x, x[:, :-1], x[:1, :1]):  # a batch, the context view of a prompt, one token
            want = torch.einsum("btm,bm->bt", polynomial.monomials(xs, a), w[: xs.shape[0]])
            assert torch.equal(polynomial.polynomial_values(xs, w[: xs.shape[0]], a), want)
    finally:
        torch.set_num_threads(before)


def test_the_c_kernel_takes_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    if native_kernels.compiler() is None:
        pytest.skip("no compiler")
    assert polynomial.native() is not None
    a = polynomial.monomial_set(4, "sparse_cubic")
    x, w = _points(8, 5, 4, a.shape[0], torch.float64)
    monkeypatch.setattr(polynomial, "monomials", lambda *_: pytest.fail("the torch code ran"))
    polynomial.polynomial_values(x, w, a)


def test_exponents_past_the_kernel_use_the_torch_code(path: str) -> None:
    a = torch.tensor([[17, 0], [0, 1]])
    x, w = _points(3, 4, 2, 2, torch.float64)
    want = torch.einsum("btm,bm->bt", polynomial.monomials(x, a), w)
    assert torch.equal(polynomial.polynomial_values(x, w, a), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_prompts_for_the_same_seed_on_every_path(dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    task = tasks.sparse_cubic()
    monkeypatch.setattr(polynomial, "NATIVE", True)
    a = task.sample(50, 30, generator=iclab.generator(3), dtype=dtype)
    monkeypatch.setattr(polynomial, "NATIVE", False)
    b = task.sample(50, 30, generator=iclab.generator(3), dtype=dtype)
    x_all = torch.cat([b.x, b.x_query.unsqueeze(1)], 1)
    y_all = torch.einsum("btm,bm->bt", polynomial.monomials(x_all, task.exponents), b.task["w"])
    assert torch.equal(a.x, b.x) and torch.equal(a.task["w"], b.task["w"])
    assert torch.equal(a.y, b.y) and torch.equal(a.y, y_all[:, :-1]) and torch.equal(a.y_query, y_all[:, -1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label_scale", [1.0, 4.0, 3.1622776601683795])
@pytest.mark.parametrize(("task", "d_bar"), [(tasks.sparse_cubic(), 15), (tasks.quadratic(3), 12), (tasks.quadratic(2), 3)])  # fmt: skip
def test_embedding_equals_the_concatenation_bit_for_bit(dtype, label_scale, task, d_bar, path: str) -> None:
    for batch, n in ((37, 20), (1, 1), (300, 3)):
        ep = task.sample(batch, n, generator=iclab.generator(1), dtype=dtype)
        z = embed_scratch(ep, d_bar, label_scale)
        assert z.is_contiguous() and z.dtype == dtype
        assert torch.equal(z, _embed_reference(ep.x, ep.x_query, ep.y, d_bar, label_scale))


def test_the_embedding_kernel_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    if native_kernels.compiler() is None:
        pytest.skip("no compiler")
    ep = tasks.sparse_cubic().sample(5, 7, generator=iclab.generator(1), dtype=torch.float64)
    assert _bilinear_fast.native_embed(ep.x, ep.x_query, ep.y, 15, 0.25) is not None


def test_a_differentiable_episode_is_embedded_with_autograd() -> None:
    ep = tasks.quadratic(2).sample(4, 5, generator=iclab.generator(0), dtype=torch.float64)
    x = ep.x.clone().requires_grad_(True)
    z = embed_scratch(iclab.Episode(x=x, y=ep.y, x_query=ep.x_query, y_query=ep.y_query), 6, 2.0)
    z.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.parametrize("ffn", ["dense", "sparse", "sparse_strict", "none"])
@pytest.mark.parametrize("order", ["ffn_first", "attention_first"])
@pytest.mark.parametrize("label_scale", [1.0, 3.3])
def test_fused_block_predictions_equal_the_token_layers(ffn, order, label_scale, path: str) -> None:
    """The ℓ-block sub-network read-outs (App. H) by the fused pass, float64, to 1e-10 relative per entry."""
    cfg = models.BilinearTransformerConfig(d=3, d_bar=8, n_blocks=3, ffn=ffn, order=order, label_scale=label_scale, init_std=0.3, n_heads=2)  # fmt: skip
    model = models.BilinearTransformer(cfg, generator=iclab.generator(0)).double()
    ep = tasks.quadratic(3).sample(37, 15, generator=iclab.generator(1), dtype=torch.float64)
    want = model.block_predictions(ep)
    with torch.no_grad():
        got = model.block_predictions(ep, fused=True)
    assert got.shape == want.shape == (4, 37)
    assert bool(((got - want).abs() <= 1e-10 * want.abs().clamp_min(1e-300)).all())
