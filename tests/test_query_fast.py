"""The C kernel for the query row of a softmax/ReLU attention layer (iclab.models._query_fast, ``_query_attn.c``).

Against the torch pass (:func:`iclab.models.attention_core.attention_update`, itself checked token by token against
the papers' equations in tests/test_linear_attention.py) and against the formula written out here (Zhang et al. 2025,
eq. M with softmax scores, Sec. 7): values and every parameter gradient to 1e-10 relative in float64, for softmax and
ReLU, merged and separate key-query, the query among the sources or not, with and without the residual, one and
several heads, a batch whose last group of lanes is ragged. Also: float32 as accurate as the torch float32 pass, the
same bits on 1 and 2 threads, the torch code where the kernel does not apply (a prompt that needs a gradient: the
second layer of a stack; torch.func.vmap; no compiler).
"""

from __future__ import annotations

import pytest
import torch

from iclab.core import native as native_kernels
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig, _query_fast
from iclab.tasks.linear_regression import LinearRegression

needs_kernel = pytest.mark.skipif(_query_fast.native(5) is None, reason="no C compiler or no AVX2 here")


@pytest.fixture(params=["native", "native-avx2"])
def build(request, monkeypatch) -> str:
    """The kernel as built here (AVX-512 where the CPU has it), and its AVX2 build (what a CPU without AVX-512 runs)."""
    monkeypatch.setattr(_query_fast, "WIDE", request.param == "native")
    return request.param


def _model(act: str, key_query: str = "merged", sources: str = "all", residual: bool = False, heads: int = 3,
           layers: int = 1, seed: int = 1) -> LinearTransformer:  # fmt: skip
    cfg = LinearTransformerConfig(d=4, n_layers=layers, n_heads=heads, activation=act, key_query=key_query,
                                  rank=1 if key_query == "separate" else None, sources=sources, residual=residual,
                                  readout="positive", init_std=0.6)  # fmt: skip
    return LinearTransformer(cfg, generator=generator(seed)).double()


def _episode(batch: int = 37, n: int = 9, seed: int = 2, dtype=torch.float64):
    return LinearRegression(d=4).sample(batch, n, generator=generator(seed), dtype=dtype)


def _value_and_grads(model, episode, native: bool, monkeypatch):
    monkeypatch.setattr(_query_fast, "NATIVE", native)
    model.zero_grad()
    yhat = model(episode)
    (yhat.sin() * torch.linspace(0.5, 1.5, len(yhat), dtype=yhat.dtype)).sum().backward()
    return yhat.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@needs_kernel
@pytest.mark.parametrize("act", ["softmax", "relu"])
@pytest.mark.parametrize("key_query", ["merged", "separate"])
@pytest.mark.parametrize("sources", ["all", "context"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("heads", [1, 3])
def test_kernel_matches_the_torch_pass(act, key_query, sources, residual, heads, build, monkeypatch) -> None:
    model, ep = _model(act, key_query, sources, residual, heads), _episode()
    layer = model.layers[0]
    z = torch.cat([torch.cat([ep.x, ep.y.unsqueeze(-1)], -1), torch.cat([ep.x_query, 0 * ep.y_query[:, None]], -1)
                   .unsqueeze(1)], 1)  # fmt: skip
    m = z.shape[1] if sources == "all" else ep.n
    assert _query_fast.applies(z, m, act, layer.Q, layer.P)
    y, g = _value_and_grads(model, ep, True, monkeypatch)
    y_ref, g_ref = _value_and_grads(model, ep, False, monkeypatch)
    assert _rel(y, y_ref) < 1e-10
    assert set(g) == set(g_ref) and all(_rel(g[k], g_ref[k]) < 1e-10 for k in g), {k: _rel(g[k], g_ref[k]) for k in g}


@needs_kernel
@pytest.mark.parametrize("act", ["softmax", "relu"])
@pytest.mark.parametrize("key_query", ["merged", "separate"])
@pytest.mark.parametrize("heads", [1, 3])
def test_the_forward_factors_give_the_full_backward(act, key_query, heads, build, monkeypatch) -> None:
    """A model reads the label column: the gradients summed from the factors the forward pass kept equal those of
    the backward that reads the prompts and runs the forward again (float64, 1e-10), on a ragged last group."""
    model, ep = _model(act, key_query, heads=heads), _episode(batch=45)
    calls = {"qa_factor_grads": 0, "qa_backward": 0}
    lib = _query_fast.native(5)
    for name in calls:  # count which backward runs
        fn = getattr(lib, f"{name}_f64")
        monkeypatch.setattr(lib, f"{name}_f64", lambda *a, fn=fn, name=name: calls.__setitem__(name, 1) or fn(*a))
    runs = {}
    for factors in (True, False):
        monkeypatch.setattr(_query_fast, "FACTORS", factors)
        runs[factors] = _value_and_grads(model, ep, True, monkeypatch)
        assert calls == {"qa_factor_grads": int(factors), "qa_backward": int(not factors)}
        calls.update(qa_factor_grads=0, qa_backward=0)
    (y, g), (y_full, g_full) = runs[True], runs[False]
    assert torch.equal(y, y_full)
    assert all(_rel(g[k], g_full[k]) < 1e-10 for k in g), {k: _rel(g[k], g_full[k]) for k in g}


@needs_kernel
@pytest.mark.parametrize("act", ["softmax", "relu"])
def test_a_gradient_on_other_columns_takes_the_full_backward(act, monkeypatch) -> None:
    """query_update keeps the factors of one column; a loss that reads every column of its result still gets the
    exact gradients (the full backward runs), against the torch pass."""
    model, ep = _model(act, heads=2), _episode(batch=21)
    layer = model.layers[0]
    z = torch.cat([torch.cat([ep.x, ep.y.unsqueeze(-1)], -1), torch.cat([ep.x_query, 0 * ep.y_query[:, None]], -1)
                   .unsqueeze(1)], 1)  # fmt: skip
    w = torch.linspace(0.5, 1.5, 5, dtype=z.dtype)
    grads = []
    for native in (True, False):
        monkeypatch.setattr(_query_fast, "NATIVE", native)
        model.zero_grad()
        out = layer(z, ep.n, query_only=True)  # (B, 1, D): every column enters the loss
        (out.sin() * w).sum().backward()
        grads.append([layer.Q_free.grad.clone(), layer.P_free.grad.clone()])
    assert all(_rel(a, b) < 1e-10 for a, b in zip(*grads, strict=True))


@needs_kernel
@pytest.mark.parametrize("act", ["softmax", "relu"])
def test_kernel_is_the_written_out_formula(act, build, monkeypatch) -> None:
    """out = scale Σ_h P_h Σ_i h̃(s_iᵀ Q_h t) s_i at the label entry, the query among the sources (Zhang et al.)."""
    monkeypatch.setattr(_query_fast, "NATIVE", True)
    model, ep = _model(act, heads=2), _episode(batch=11)
    layer = model.layers[0]
    Q, P = layer.Q.detach(), layer.P.detach()
    s = torch.cat(
        [torch.cat([ep.x, ep.y.unsqueeze(-1)], -1), torch.cat([ep.x_query, torch.zeros(11, 1)], -1).unsqueeze(1)], 1
    )  # fmt: skip  (B, m = n + 1, D)
    t = s[:, -1]
    logits = torch.einsum("bik,hkj,bj->bhi", s, Q, t)
    a = torch.softmax(logits, -1) if act == "softmax" else torch.relu(logits) / ep.n
    out = torch.einsum("hek,bhi,bik->be", P, a, s)[:, -1]
    with torch.no_grad():
        assert _rel(model(ep), out) < 1e-12


@needs_kernel
def test_float32_is_as_accurate_as_the_torch_float32_pass(build, monkeypatch) -> None:
    model, ep = _model("softmax", heads=3), _episode(batch=61)
    y64, g64 = _value_and_grads(model, ep, False, monkeypatch)
    model32, ep32 = model.float(), ep.to(dtype=torch.float32)
    errors = []
    for native in (True, False):
        y, g = _value_and_grads(model32, ep32, native, monkeypatch)
        errors.append({"y": _rel(y.double(), y64)} | {k: _rel(g[k].double(), g64[k]) for k in g64})
    ours, torch_code = errors
    for name, err in ours.items():
        assert err <= max(5 * torch_code[name], 1e-5), (name, err, torch_code[name])


@needs_kernel
def test_the_same_bits_on_one_and_two_threads(build, monkeypatch) -> None:
    """The batch is split into a thread-independent number of parts (4 here), summed in order."""
    model, ep = _model("softmax", heads=2), _episode(batch=4 * 256 + 13)
    assert len(_query_fast._bounds(ep.batch_size)) == 4
    threads = torch.get_num_threads()
    runs = []
    try:
        for k in (1, 2):
            torch.set_num_threads(k)
            runs.append(_value_and_grads(model, ep, True, monkeypatch))
    finally:
        torch.set_num_threads(threads)
    (y1, g1), (y2, g2) = runs
    assert torch.equal(y1, y2) and all(torch.equal(g1[k], g2[k]) for k in g1)


@needs_kernel
def test_a_prompt_that_needs_a_gradient_runs_the_torch_code(monkeypatch) -> None:
    """In a two-layer stack the last layer's input depends on the first layer's weights: the kernel (no input
    gradient) must not run there, and the gradients stay exact."""
    calls = []
    real = _query_fast.query_update
    monkeypatch.setattr(_query_fast, "query_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    model, ep = _model("softmax", layers=2, residual=True), _episode()
    y, g = _value_and_grads(model, ep, True, monkeypatch)
    assert not calls
    y_ref, g_ref = _value_and_grads(model, ep, False, monkeypatch)
    assert torch.equal(y, y_ref) and all(torch.equal(g[k], g_ref[k]) for k in g)
    model1 = _model("softmax")
    _value_and_grads(model1, ep, True, monkeypatch)
    assert calls  # and a one-layer model does use it


def test_limits_and_other_devices_run_the_torch_code() -> None:
    z = torch.zeros(4, 6, 5, dtype=torch.float64)
    Q = P = torch.zeros(1, 5, 5, dtype=torch.float64)
    assert not _query_fast.applies(torch.zeros(4, 6, 17, dtype=torch.float64), 6, "softmax", Q, P)  # width > 16
    assert not _query_fast.applies(z, 6, "linear", Q, P)  # linear scores: the moment form
    assert not _query_fast.applies(z.requires_grad_(), 6, "softmax", Q, P)
    assert not _query_fast.applies(z.detach().to(torch.bfloat16), 6, "softmax", Q, P)
    if native_kernels.compiler() is not None:
        assert _query_fast.applies(z.detach(), 6, "relu", Q, P)


def test_under_vmap_the_torch_code_runs(monkeypatch) -> None:
    model, ep = _model("softmax", heads=2), _episode(batch=5)
    params = {k: torch.stack([p.detach(), 2 * p.detach()]) for k, p in model.named_parameters()}
    out = torch.func.vmap(lambda p: torch.func.functional_call(model, p, (ep,)))(params)
    monkeypatch.setattr(_query_fast, "NATIVE", False)
    with torch.no_grad():
        ref = torch.func.functional_call(model, {k: v[1] for k, v in params.items()}, (ep,))
    assert _rel(out[1], ref) < 1e-12


def test_without_a_compiler_the_torch_code_runs(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(native_kernels, "_loaded", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ICLAB_KERNEL_DIR", str(tmp_path))
    assert _query_fast.native(5) is None
    model, ep = _model("softmax"), _episode(batch=9)
    z = torch.zeros(9, 10, 5, dtype=torch.float64)
    assert not _query_fast.applies(z, 10, "softmax", model.layers[0].Q, model.layers[0].P)
    with torch.no_grad():
        assert model(ep).shape == (9,)


def test_the_kernel_is_built_where_a_compiler_is() -> None:
    """Not a silent fallback: with cc and an AVX2 CPU (as on the CI machines) the kernel builds."""
    if native_kernels.compiler() is None:
        pytest.skip("no C compiler or no AVX2 here")
    lib = _query_fast.native(5)
    wide = native_kernels.wide_flags() != ()  # an AVX-512 CPU
    assert lib is not None and (lib.qa_lanes_f32(), lib.qa_lanes_f64()) == ((16, 8) if wide else (8, 4))
    assert _query_fast.native(3) is not lib  # one library per token width
