"""The fused CPU path of the bilinear transformer (models._bilinear_fast) against the token-level computation.

The reference is written out here with plain autograd: eq. (3) as z + [(z W_0ᵀ) ⊙ (z W_1ᵀ), 0] on the rows, eq. (2)
with the (T × n) score matrix z_jᵀ Q_h z_i formed (no associativity, no custom backward). Float64, the prediction
and every parameter gradient to 1e-10 relative (max-norm).
"""

from __future__ import annotations

import pytest
import torch

import iclab
from conftest import F64
from iclab import models, tasks
from iclab.core import native as native_kernels
from iclab.models import _bilinear_fast
from iclab.models.bilinear import BilinearFFN

RTOL = 1e-10


@pytest.fixture(params=["native", "native-replay", "native-avx2", "torch"])
def path(request, monkeypatch) -> str:
    """Run a test by the C kernel ``_bilinear.c`` (skipped where it cannot be built), keeping every prompt's
    d out / d(weights) from the forward or (``native-replay``, no memory for them) replaying the forward in the
    backward, built for AVX2 lanes where the CPU has AVX-512 (``native-avx2``), or by the torch code."""
    if request.param != "torch" and native_kernels.compiler() is None:
        pytest.skip("the C kernel cannot be built here (no compiler or no AVX2); the torch code runs instead")
    monkeypatch.setattr(_bilinear_fast, "NATIVE", request.param != "torch")
    if request.param == "native-replay":
        monkeypatch.setattr(_bilinear_fast, "JACOBIAN_BYTES", 0)
    if request.param == "native-avx2":
        monkeypatch.setattr(_bilinear_fast, "WIDE", False)
    return request.param


def _literal(model: models.BilinearTransformer, ep: iclab.Episode) -> torch.Tensor:
    """+ŷ by the paper's equations on the (B, n+1, D) prompt, token by token, with plain autograd."""
    cfg, n = model.config, ep.n
    z = model._prompt(ep)  # (B, T, D): [1, x, 0, y/s]
    for layer in model.sublayers():
        if isinstance(layer, BilinearFFN):
            u = z[..., : cfg.d_bar]
            z = torch.cat([u + (u @ layer.W0.T) * (u @ layer.W1.T), z[..., cfg.d_bar :]], dim=-1)  # eq. (3)
        else:
            ctx = z[:, :n]  # the sources (M drops the query)
            upd = 0.0
            for P, Q in zip(layer.P, layer.Q, strict=True):
                scores = torch.einsum("bjd,de,bie->bij", ctx, Q, z)  # z_jᵀ Q z_i, (B, T, n)
                upd = upd + torch.einsum("bij,bjd->bid", scores, ctx @ P.T) / n  # Σ_j (P z_j)(z_jᵀ Q z_i) / n
            z = z + upd  # eq. (2)
    return -z[:, -1, -1] * cfg.label_scale


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).detach().abs().max() / want.detach().abs().max().clamp_min(1e-300))


def _check(model: models.BilinearTransformer, ep: iclab.Episode) -> None:
    w = torch.randn(ep.batch_size, generator=iclab.generator(7), dtype=F64)  # a generic output gradient
    params = [p for p in model.parameters() if p.requires_grad]
    want = _literal(model, ep)
    want_grads = torch.autograd.grad((want * w).sum(), params, allow_unused=True)
    for path in (model, model.forward_tokens):
        got = path(ep)
        assert _rel(got, want) < RTOL
        grads = torch.autograd.grad((got * w).sum(), params, allow_unused=True)
        for (name, _), g, ref in zip(model.named_parameters(), grads, want_grads, strict=True):
            if ref is None or not ref.any():  # e.g. an FFN after the last attention layer: nothing it writes is read
                assert g is None or not g.any(), name
                continue
            assert g is not None and _rel(g, ref) < RTOL, (name, _rel(g, ref))


@pytest.mark.parametrize("ffn", ["dense", "sparse", "sparse_strict", "none"])
@pytest.mark.parametrize("order", ["ffn_first", "attention_first"])
def test_fast_path_equals_the_token_computation(
    ffn: str, order: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bilinear_fast, "CHUNK", 5)  # 37 prompts: 7 full chunks and a ragged one
    monkeypatch.setattr(_bilinear_fast, "NATIVE_PART", 5)  # the C calls: 8 parts of 5 (a ragged lane group each)
    cfg = models.BilinearTransformerConfig(d=3, d_bar=8, n_blocks=3, init_std=0.3, ffn=ffn, order=order)  # type: ignore[arg-type]
    model = models.BilinearTransformer(cfg, generator=iclab.generator(0)).to(F64)
    _check(model, tasks.quadratic(3).sample(37, 11, generator=iclab.generator(1), dtype=F64))


@pytest.mark.parametrize("heads, label_scale", [(2, 1.0), (1, 2.5), (3, 0.7)])
def test_fast_path_with_heads_and_label_scale(heads: int, label_scale: float, path: str) -> None:
    cfg = models.BilinearTransformerConfig(
        d=2, d_bar=6, n_blocks=2, init_std=0.4, n_heads=heads, label_scale=label_scale
    )
    model = models.BilinearTransformer(cfg, generator=iclab.generator(2)).to(F64)
    _check(model, tasks.quadratic(2).sample(70, 6, generator=iclab.generator(3), dtype=F64))  # 3 chunks, ragged


def test_fast_path_is_taken_on_cpu_and_needs_no_token_pass(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = models.BilinearTransformer(models.BilinearTransformerConfig(d=3, d_bar=8, init_std=0.3)).to(F64)
    ep = tasks.quadratic(3).sample(9, 7, generator=iclab.generator(4), dtype=F64)
    want = model.forward_tokens(ep)

    def refuse(*_: object) -> None:
        raise AssertionError("forward_tokens called")

    monkeypatch.setattr(models.BilinearTransformer, "forward_tokens", refuse)
    pred = model(ep)
    pred.sum().backward()  # the fused node's backward
    assert _rel(pred, want) < RTOL
    with torch.no_grad():  # evaluation: nothing is kept for a backward
        assert _rel(model(ep), want) < RTOL


def test_fast_path_does_not_depend_on_the_thread_count(path: str) -> None:
    """Chunks run on torch's threads; their gradient sums are added in chunk order, so 1 and 2 threads agree bit for bit."""
    model = models.BilinearTransformer(models.BilinearTransformerConfig(d=3, d_bar=8, init_std=0.3))
    ep = tasks.quadratic(3).sample(200, 9, generator=iclab.generator(5))
    out = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            pred = model(ep)
            out.append([pred.detach(), *torch.autograd.grad(pred.square().sum(), list(model.parameters()))])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_the_c_kernel_is_built_where_a_compiler_is() -> None:
    """Not a silent fallback: with cc and an AVX2 CPU (as on the CI machines) the kernel builds and is used."""
    if native_kernels.compiler() is None:
        pytest.skip("no C compiler or no AVX2 here")
    lib = _bilinear_fast.native(13, 5)
    assert lib is not None
    assert _bilinear_fast._uses_native(torch.zeros(4, 201, 13), 5)
    assert not _bilinear_fast._uses_native(torch.zeros(4, 9, 13, dtype=torch.float16), 5)  # the torch code
    assert lib.bl_lanes_f32() in (8, 16) and lib.bl_lanes_f64() == lib.bl_lanes_f32() // 2


@pytest.mark.parametrize("order", ["ffn_first", "attention_first"])
def test_c_kernel_float32_is_as_accurate_as_the_torch_float32_pass(order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 instance (45 prompts: ragged lane groups) against the float64 token pass: its error is at most 5x
    that of the torch code's float32 pass, with a floor of 1e-5."""
    if native_kernels.compiler() is None:
        pytest.skip("the C kernel cannot be built here")
    cfg = models.BilinearTransformerConfig(d=3, d_bar=8, n_blocks=3, init_std=0.1, order=order)  # type: ignore[arg-type]
    model = models.BilinearTransformer(cfg, generator=iclab.generator(6)).to(F64)
    ep = tasks.quadratic(3).sample(45, 40, generator=iclab.generator(7), dtype=F64)

    def value_and_grads(m: models.BilinearTransformer, e: iclab.Episode) -> list[torch.Tensor]:
        y = m(e)
        return [y.detach(), *torch.autograd.grad(y.square().sum(), list(m.parameters()))]

    want = value_and_grads(model, ep)
    model.float()
    errors = []
    for native in (True, False):
        monkeypatch.setattr(_bilinear_fast, "NATIVE", native)
        got = value_and_grads(model, ep.to(dtype=torch.float32))
        errors.append([_rel(g.double(), w) for g, w in zip(got, want, strict=True)])
    assert len(errors[0]) >= 4
    for ours, torch_code in zip(*errors, strict=True):
        assert ours <= max(5 * torch_code, 1e-5), (ours, torch_code)


def test_without_a_compiler_the_torch_code_runs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(native_kernels, "_loaded", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path))
    assert _bilinear_fast.native(9, 4) is None and not _bilinear_fast._uses_native(torch.zeros(2, 5, 9), 4)
    model = models.BilinearTransformer(models.BilinearTransformerConfig(d=3, d_bar=8, init_std=0.3)).to(F64)
    _check(model, tasks.quadratic(3).sample(9, 7, generator=iclab.generator(8), dtype=F64))


def test_token_path_under_transforms_and_second_order() -> None:
    """``torch.func`` transforms (Ensemble's vmap) and double backward go through forward_tokens."""
    model = models.BilinearTransformer(models.BilinearTransformerConfig(d=2, d_bar=5, init_std=0.3)).to(F64)
    ep = tasks.quadratic(2).sample(6, 5, generator=iclab.generator(6), dtype=F64)
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (ep,)).square().sum())(params)
    want = torch.autograd.grad(model.forward_tokens(ep).square().sum(), list(params.values()))
    for g, w in zip(grads.values(), want, strict=True):
        assert _rel(g, w) < RTOL
    with pytest.raises(RuntimeError):  # the fused backward is once-differentiable
        (g,) = torch.autograd.grad(model(ep).square().sum(), [model.attn[0].P_free], create_graph=True)
        g.sum().backward()
