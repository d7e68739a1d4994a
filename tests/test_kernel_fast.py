"""The fused batch-last pass of KernelTransformer (iclab.models._kernel_fast) against the token-level evaluation.

Cheng, Chen, Sra 2024 eq. (2)-(5), (26): for every h̃, both value patterns of the experiments (V = [[A, 0], [0, r]]
with A free, Asm. 4.4, and A ≡ 0, Thm 4.5), 1 and 3 layers, several heads, σ ≠ 1, the 1/n factor and the exp cap:
the prediction and every parameter gradient agree with :meth:`KernelTransformer.forward_tokens` to 1e-10
relative in float64, over several chunks with a ragged last one, both for the torch code of the pass and for its C
kernel (``_kernel_attn.c``, float64 instance). Also: the C kernel's float32 instance as accurate as the torch
float32 pass, kept and replayed weights giving the same bits, the same bits on 1 and 2 threads, the token path where
the fused one does not apply, the torch code where no C kernel can be built, and the fallback under torch.func.vmap.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from iclab.core import native as native_kernels
from iclab.core.seeding import generator
from iclab.models import KernelTransformer, KernelTransformerConfig, _kernel_fast
from iclab.tasks.gaussian_process import GaussianProcess

CASES = [("softmax",), ("exp",), ("relu",), ("linear", "relu"), ("softmax", "exp")]
PATHS = ["native", "native-replay", "native-avx2", "torch"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch) -> str:
    """Run a test by the C kernel (skipped where it cannot be built), keeping every prompt's d out / d(K, A, r) from
    the forward or (``native-replay``) replaying the forward in the backward, by its AVX2 build (``native-avx2``: what
    a CPU without AVX-512 runs; the same as ``native`` on one), or by the torch code of the fused pass."""
    if request.param != "torch" and _kernel_fast.native() is None:
        pytest.skip("the C kernel cannot be built here (no compiler or no AVX2); the torch code runs instead")
    monkeypatch.setattr(_kernel_fast, "NATIVE", request.param != "torch")
    monkeypatch.setattr(_kernel_fast, "WIDE", request.param != "native-avx2")  # the build a CPU without AVX-512 runs
    if request.param == "native-replay":
        monkeypatch.setattr(_kernel_fast, "JACOBIAN_BYTES", 0)
    return request.param


def _episode(batch: int = 53, n: int = 6, seed: int = 2):
    task = GaussianProcess.random_rotation(generator=generator(0), kernel="exp")
    return task.sample(batch, n, generator=generator(seed), dtype=torch.float64)


def _model(acts, value, L, seed=1, **kw) -> KernelTransformer:
    cfg = KernelTransformerConfig(d=5, n_layers=L, activations=acts, value=value, init_std=0.4, **kw)
    return KernelTransformer(cfg, generator=generator(seed)).double()


def _value_and_grads(model, episode, fast: bool):
    model.fast = fast
    model.zero_grad()
    yhat = model(episode) if fast else model.forward_tokens(episode)
    (yhat.sin() * torch.linspace(0.5, 1.5, len(yhat), dtype=yhat.dtype)).sum().backward()
    return yhat.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("acts", CASES, ids=["-".join(c) for c in CASES])
@pytest.mark.parametrize("value", ["sparse", "label"])
@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("seed", [1, 7])
def test_fused_pass_equals_token_pass_values_and_gradients(acts, value, L, seed, path):
    model = _model(acts, value, L, seed=seed, sigma=1.3, divide_by_n=seed == 1, exp_logit_cap=1.5)
    model.fast_chunk = 16  # 53 prompts: four blocks, the last ragged
    ep = _episode(seed=seed + 1)
    y_fast, g_fast = _value_and_grads(model, ep, True)
    y_tok, g_tok = _value_and_grads(model, ep, False)
    assert _rel(y_fast, y_tok) < 1e-10
    assert g_fast.keys() == g_tok.keys()
    for name in g_tok:
        assert _rel(g_fast[name], g_tok[name]) < 1e-10, name


def test_exp_cap_is_active_in_the_exactness_cases():
    """The cap case above is not vacuous: some exp scores of that model exceed the cap of 1.5."""
    model = _model(("exp",), "sparse", 3, sigma=1.3, exp_logit_cap=1.5)
    with torch.no_grad():
        _, states = model.trace(_episode())
        x = states[:-1, :, :, :-1]  # (L, B, T, d): each layer's input covariates
        S = torch.einsum("lbjc,lhca,lbia->lhbji", x, model.BtC.transpose(-1, -2), x) / 1.3**2
    assert float(S.max()) > 1.5


def test_same_bits_on_one_and_two_threads(path):
    model = _model(("softmax",), "sparse", 3)
    model.fast_chunk = 8
    ep = _episode(batch=40)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        y1, g1 = _value_and_grads(model, ep, True)
        torch.set_num_threads(2)
        y2, g2 = _value_and_grads(model, ep, True)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(y1, y2)
    assert all(torch.equal(g1[k], g2[k]) for k in g1)


def test_fused_pass_is_taken_only_where_it_applies(monkeypatch):
    calls = []
    real = _kernel_fast.kernel_stack
    monkeypatch.setattr("iclab.models.kernel_attention.kernel_stack", lambda *a, **k: calls.append(1) or real(*a, **k))
    ep = _episode(batch=8)
    _model(("softmax",), "sparse", 2)(ep)
    assert calls == [1]
    for kw in (dict(value="full"), dict(qk="full")):  # the token pass
        cfg = dict(d=5, n_layers=2, activations=("softmax",), value="sparse") | kw
        KernelTransformer(KernelTransformerConfig(**cfg), generator=generator(1)).double()(ep)
    assert calls == [1]
    linear = KernelTransformer(
        KernelTransformerConfig(d=5, n_layers=2, activations=("linear",)), generator=generator(1)
    )
    linear.double()(ep)  # all-linear heads: the fused pass where it runs in C, else the moment form
    assert calls == [1, 1] if _kernel_fast.uses_native(ep.x, ep.n) else [1]
    before = len(calls)
    monkeypatch.setattr(_kernel_fast, "NATIVE", False)
    linear(ep)  # no C kernel: the moment form
    assert len(calls) == before


def test_vmap_falls_back_to_the_token_pass():
    model = _model(("softmax",), "sparse", 2)
    ep = _episode(batch=6)
    params = {k: torch.stack([p.detach(), 2 * p.detach()]) for k, p in model.named_parameters()}
    out = torch.func.vmap(lambda p: torch.func.functional_call(model, p, (ep,)))(params)
    model.fast = False
    assert torch.allclose(out[0], model.forward_tokens(ep), atol=1e-12)


def test_the_c_kernel_is_built_where_a_compiler_is() -> None:
    """Not a silent fallback: with cc and an AVX2 CPU (as on the CI machines) the kernel builds and is used."""
    if native_kernels.compiler() is None:
        pytest.skip("no C compiler or no AVX2 here")
    assert _kernel_fast.native() is not None
    assert _kernel_fast.uses_native(torch.zeros(4, 6, 5), 6)
    assert not _kernel_fast.uses_native(torch.zeros(4, 6, 33), 6)  # d over the kernel's limit: the torch code
    lib = _kernel_fast.native()
    wide = native_kernels.wide_flags() != ()  # an AVX-512 CPU: twice the lanes; the Jacobian is rounded to them
    assert (lib.ka_lanes_f32(), lib.ka_lanes_f64()) == ((16, 8) if wide else (8, 4))


@pytest.mark.parametrize("acts", CASES, ids=["-".join(c) for c in CASES])
@pytest.mark.parametrize("value", ["sparse", "label"])
def test_c_kernel_float32_is_as_accurate_as_the_torch_float32_pass(acts, value, monkeypatch):
    """The float32 instance (8 lanes, 61 prompts: a ragged last group) against the float64 token pass: its error is
    at most 5x that of the torch code's float32 pass (itself ~1e-3 for relu: this model's gradients are ill-conditioned
    in float32; ~1e-6 for softmax), with a floor of 1e-5."""
    if _kernel_fast.native() is None:
        pytest.skip("the C kernel cannot be built here")
    model = _model(acts, value, 3, sigma=1.3, exp_logit_cap=1.5)
    ep = _episode(batch=61, n=9)
    y64, g64 = _value_and_grads(model, ep, False)
    model.float()
    errors = []
    for native in (True, False):
        monkeypatch.setattr(_kernel_fast, "NATIVE", native)
        y32, g32 = _value_and_grads(model, ep.to(dtype=torch.float32), True)
        errors.append({"y": _rel(y32.double(), y64)} | {k: _rel(g32[k].double(), g64[k]) for k in g64})
    ours, torch_code = errors
    for name, err in ours.items():
        assert err <= max(5 * torch_code[name], 1e-5), (name, err, torch_code[name])


@pytest.mark.parametrize("value", ["sparse", "label"])
def test_kept_and_replayed_weights_give_the_same_bits(value, monkeypatch):
    """ka_backward from the weights ka_forward kept, or replaying the whole forward: the same numbers."""
    if _kernel_fast.native() is None:
        pytest.skip("the C kernel cannot be built here")
    monkeypatch.setattr(_kernel_fast, "NATIVE", True)
    monkeypatch.setattr(_kernel_fast, "JACOBIAN_BYTES", 0)  # KEEP is a choice of the replaying backward
    model = _model(("softmax", "exp"), value, 3, exp_logit_cap=1.5)
    ep = _episode(batch=37)
    runs = []
    for keep in (True, False):
        monkeypatch.setattr(_kernel_fast, "KEEP", keep)
        runs.append(_value_and_grads(model, ep, True))
    (y1, g1), (y2, g2) = runs
    assert torch.equal(y1, y2)
    assert all(torch.equal(g1[k], g2[k]) for k in g1)


def test_without_a_compiler_the_torch_code_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(native_kernels, "_loaded", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path))
    assert _kernel_fast.native() is None
    model = _model(("softmax",), "sparse", 2)
    ep = _episode(batch=9)
    y, g = _value_and_grads(model, ep, True)
    y_tok, g_tok = _value_and_grads(model, ep, False)
    assert _rel(y, y_tok) < 1e-10
    assert all(_rel(g[k], g_tok[k]) < 1e-10 for k in g)


@pytest.mark.parametrize("value", ["sparse", "label"])
def test_strided_prompt_views_give_the_bits_of_contiguous_copies(value, path):
    """An episode's x[:, :n], y[:, :n], x[:, n] are views of one (B, n + 1, ·) draw: the C kernel reads them by their
    batch strides, with no copy, and gets the bits of contiguous copies (and of a sliced batch stride)."""
    model = _model(("softmax", "exp"), value, 3, exp_logit_cap=1.5)
    ep = _episode(batch=37)
    assert not ep.x.is_contiguous()  # the case the strides are for
    copied = dataclasses.replace(ep, x=ep.x.contiguous(), y=ep.y.contiguous(), x_query=ep.x_query.contiguous())
    every_other = dataclasses.replace(ep, x=ep.x.repeat_interleave(2, 0)[::2], y=ep.y.repeat_interleave(2, 0)[::2],
                                      x_query=ep.x_query.repeat_interleave(2, 0)[::2])  # fmt: skip
    y0, g0 = _value_and_grads(model, ep, True)
    for other in (copied, every_other):
        y1, g1 = _value_and_grads(model, other, True)
        assert torch.equal(y0, y1)
        assert all(torch.equal(g0[k], g1[k]) for k in g0)


INSTANCES = [("exp",), ("relu",), ("softmax",), ("linear",), ("linear", "exp"), ("exp", "linear"), ("softmax", "exp")]


@pytest.mark.parametrize("d", [3, 5])
@pytest.mark.parametrize("acts", INSTANCES, ids="-".join)
@pytest.mark.parametrize("value", ["sparse", "label"])
def test_every_kernel_instance_equals_the_token_pass(d, acts, value, path):
    """The C kernel inlines a copy of its loops for d = 5 (and, with A free, one per h̃ with one head and one for the
    (linear, exp) heads of Cheng et al.'s Fig. 4) and runs the general loops elsewhere: each instance, with gradients (forward and backward) and without (the forward alone),
    against the token pass to 1e-10 in float64."""
    task = GaussianProcess.random_rotation(tuple(1.0 / (1 + k) for k in range(d)), generator=generator(0), kernel="exp")
    ep = task.sample(21, 7, generator=generator(3), dtype=torch.float64)
    cfg = KernelTransformerConfig(d=d, n_layers=3, activations=acts, value=value, init_std=0.4, exp_logit_cap=1.5)
    model = KernelTransformer(cfg, generator=generator(1)).double()
    y_fast, g_fast = _value_and_grads(model, ep, True)
    y_tok, g_tok = _value_and_grads(model, ep, False)
    assert _rel(y_fast, y_tok) < 1e-10
    assert all(_rel(g_fast[k], g_tok[k]) < 1e-10 for k in g_tok)
    with torch.no_grad():
        model.fast = True
        assert _rel(model(ep), y_tok) < 1e-10
