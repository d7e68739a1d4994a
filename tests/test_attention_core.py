"""The shared multi-head update equals a literal per-head, per-pair sum (float64)."""

from __future__ import annotations

import pytest
import torch

from conftest import F64, assert_close
from iclab import ConfigError, ShapeError
from iclab.core.seeding import generator
from iclab.models.attention_core import attention_update


def _literal(src, tgt, WQ, WV, acts, WK, sigma, scale):
    B, m, _ = src.shape
    T = tgt.shape[1]
    out = torch.zeros(B, T, WV.shape[1], dtype=F64)
    for h, act in enumerate(acts):
        keys = src if WK is None else src @ WK[h].T
        for b in range(B):
            for j in range(T):
                q = WQ[h] @ tgt[b, j]
                raw = torch.stack([keys[b, i] @ q for i in range(m)])
                if act == "linear":
                    w = raw
                elif act == "relu":
                    w = raw.clamp_min(0)
                elif act == "exp":
                    w = torch.exp(raw / sigma**2)
                else:
                    w = torch.softmax(raw / sigma**2, dim=0)
                out[b, j] += sum(w[i] * (WV[h] @ src[b, i]) for i in range(m))
    return scale * out


@pytest.mark.parametrize("with_keys", [False, True])
def test_mixed_heads_equal_the_literal_sum(with_keys: bool) -> None:
    g = generator(0)
    B, m, T, Ds, Dt, e = 2, 5, 6, 4, 3, 2
    acts = ("linear", "softmax", "softmax", "relu", "exp", "linear")
    H, k = len(acts), (3 if with_keys else Ds)
    src = torch.randn(B, m, Ds, generator=g, dtype=F64)
    tgt = torch.randn(B, T, Dt, generator=g, dtype=F64)
    WQ = 0.5 * torch.randn(H, k, Dt, generator=g, dtype=F64)
    WV = torch.randn(H, e, Ds, generator=g, dtype=F64)
    WK = torch.randn(H, k, Ds, generator=g, dtype=F64) if with_keys else None
    got = attention_update(src, tgt, WQ, WV, acts, key_maps=WK, sigma=1.3, scale=0.25)
    want = _literal(src, tgt, WQ, WV, acts, WK, 1.3, 0.25)
    assert float(want.abs().max()) > 1e-2
    assert_close(got, want)


def test_bad_input_names_the_argument() -> None:
    src, tgt = torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)
    WQ, WV = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    with pytest.raises(ConfigError, match="attention_update.activations"):
        attention_update(src, tgt, WQ, WV, ("gelu",))
    with pytest.raises(ShapeError, match="attention_update.query_maps"):
        attention_update(src, tgt, torch.zeros(2, 4, 4), WV, ("linear",))


# --- the moment form: z_{ℓ+1} = z_ℓ T_ℓ, carried as (G, q) ---------------------------------------------
def _regression_episode(B: int = 48, n: int = 9):
    from iclab.tasks import LinearRegression

    task = LinearRegression.random_rotation((1.0, 0.5, 2.0, 0.25), generator=generator(0))
    return task.sample(B, n, generator=generator(2)).to(dtype=F64)


def _same_values_and_gradients(model: torch.nn.Module, ep) -> None:
    from conftest import rel_diff

    got, want = model(ep), model.forward_tokens(ep)
    assert float(want.detach().abs().max()) > 1e-3
    assert rel_diff(got, want) < 1e-12
    params = list(model.parameters())
    g_got = torch.autograd.grad(got.square().mean(), params)
    g_want = torch.autograd.grad(want.square().mean(), params)
    for a, b in zip(g_got, g_want, strict=True):
        assert rel_diff(a, b) < 1e-11


_LINEAR_CASES = [
    dict(pattern="full"),
    dict(pattern="full", n_heads=3),
    dict(pattern="full", key_query="separate", rank=2, n_heads=2),
    dict(pattern="full", sources="all", residual=False, readout="positive"),
    dict(pattern="full", sources="all", n_heads=2),
    dict(pattern="pattern11"),
    dict(pattern="pattern11", n_heads=2, residual=False),
    dict(pattern="sparse"),
    dict(pattern="sparse", n_heads=3, readout="positive"),
    dict(pattern="sparse_symmetric", sources="all"),
    dict(pattern="sparse_symmetric", n_heads=2),
]


@pytest.mark.parametrize("case", _LINEAR_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_linear_transformer_moment_form_equals_the_token_pass(case: dict) -> None:
    """Ahn et al. eq. (3)-(4) through (G, q) alone, against every layer on every token (float64)."""
    from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig

    model = LinearTransformer(LinearTransformerConfig(d=4, n_layers=3, init_std=0.2, **case), generator=generator(1))
    model = model.double()
    ep = _regression_episode()
    assert model.moment_sources == case.get("sources", "context")
    if (
        case["pattern"].startswith("sparse")
        and case.get("residual", True)
        and case.get("sources", "context") == "context"
    ):
        assert all(layer.label_only for layer in model.layers)  # the d-space label-only form
    _same_values_and_gradients(model, ep)


@pytest.mark.parametrize("value", ["sparse", "label", "full"])
@pytest.mark.parametrize("qk", ["blocks", "full"])
@pytest.mark.parametrize("heads", [1, 2])
def test_kernel_transformer_linear_heads_moment_form_equals_the_token_pass(value: str, qk: str, heads: int) -> None:
    from iclab.models.kernel_attention import KernelTransformer, KernelTransformerConfig

    cfg = KernelTransformerConfig(
        d=4, n_layers=3, activations=("linear",) * heads, value=value, qk=qk, divide_by_n=heads == 2, init_std=0.2
    )
    model = KernelTransformer(cfg, generator=generator(1)).double()
    assert model.moment_sources == "context"
    _same_values_and_gradients(model, _regression_episode())


def test_non_linear_scores_have_no_moment_form() -> None:
    from iclab.models.kernel_attention import KernelTransformer, KernelTransformerConfig
    from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig

    assert LinearTransformer(LinearTransformerConfig(d=3, activation="relu")).moment_sources is None
    mixed = KernelTransformer(KernelTransformerConfig(d=3, activations=("linear", "softmax")))
    assert mixed.moment_sources is None
    with pytest.raises(ValueError, match="linear heads"):
        mixed.layers[0].transfer(torch.zeros(4, 4, 2), 5)
    relu = LinearTransformer(LinearTransformerConfig(d=3, activation="relu")).layers[0]
    with pytest.raises(ValueError, match="linear scores"):
        relu.transfer(torch.zeros(4, 4, 2), 5)


@pytest.mark.parametrize("case", _LINEAR_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("query_only", [False, True])
def test_moment_layer_equals_the_layer_on_tokens(case: dict, query_only: bool) -> None:
    """One layer as z ↦ z T(G) (the bilinear model's path) = the layer's token pass, values and every gradient."""
    from conftest import rel_diff
    from iclab.models.attention_core import embed, moment_layer
    from iclab.models.linear_attention import LinearAttention

    case = {k: v for k, v in case.items() if k != "readout"}
    layer = LinearAttention(4, init_std=0.3, generator=generator(1), **case).double()
    ep = _regression_episode()
    z = (embed(ep) + 0.1 * torch.randn(48, 10, 5, generator=generator(4), dtype=F64)).requires_grad_()
    got, want = moment_layer(layer, z, ep.n, query_only=query_only), layer(z, ep.n, query_only=query_only)
    assert got.shape == want.shape and rel_diff(got, want) < 1e-12
    w = torch.randn(want.shape, generator=generator(5), dtype=F64)  # a generic output gradient
    inputs = [z, *layer.parameters()]
    for a, b in zip(
        torch.autograd.grad((got * w).sum(), inputs), torch.autograd.grad((want * w).sum(), inputs), strict=True
    ):
        assert rel_diff(a, b) < 1e-11


def test_prefix_gram_to_second_order_and_under_vmap() -> None:
    from iclab.models.attention_core import prefix_gram

    g = generator(6)
    z = torch.randn(3, 6, 4, generator=g, dtype=F64, requires_grad=True)
    assert_close(prefix_gram(z, 4), z[:, :4].mT @ z[:, :4])
    assert torch.autograd.gradcheck(lambda t: prefix_gram(t, 4), (z,))
    assert torch.autograd.gradgradcheck(lambda t: prefix_gram(t, 4), (z,))
    assert torch.autograd.gradcheck(lambda t: prefix_gram(t, 6), (z,))  # every token a source
    zs = torch.randn(5, 3, 6, 4, generator=g, dtype=F64)
    grads = torch.func.vmap(torch.func.grad(lambda t: prefix_gram(t, 4).square().sum()))(zs)
    want = torch.func.vmap(torch.func.grad(lambda t: (t[:, :4].mT @ t[:, :4]).square().sum()))(zs)
    assert_close(grads, want)
    # a batch-last upstream gradient (strides (1, ·, ·)) gives the same result as a contiguous one
    G = prefix_gram(z, 4)
    up = torch.randn(4, 4, 3, generator=g, dtype=F64).permute(2, 0, 1)
    (a,) = torch.autograd.grad(G, z, up, retain_graph=True)
    (b,) = torch.autograd.grad(G, z, up.contiguous())
    assert_close(a, b)


def test_moment_layer_needs_linear_scores() -> None:
    from iclab.models.attention_core import moment_layer
    from iclab.models.linear_attention import LinearAttention

    with pytest.raises(ValueError, match="moment_layer needs a linear-score layer"):
        moment_layer(LinearAttention(3, pattern="full", activation="relu"), torch.zeros(2, 5, 4), 4)
    with pytest.raises(ValueError, match="token_transfer needs linear scores"):
        LinearAttention(3, pattern="full", activation="softmax").token_transfer(torch.zeros(2, 4, 4), 4)


def test_batched_matmul_is_the_per_prompt_product_to_second_order() -> None:
    from iclab.models.attention_core import batched_matmul

    g = generator(3)
    X = torch.randn(4, 3, 5, generator=g, dtype=F64, requires_grad=True)
    Y = torch.randn(3, 2, 5, generator=g, dtype=F64, requires_grad=True)
    assert_close(batched_matmul(X, Y), torch.einsum("ijb,jkb->ikb", X, Y))
    assert torch.autograd.gradcheck(batched_matmul, (X, Y))
    assert torch.autograd.gradgradcheck(batched_matmul, (X, Y))
    Xs, Ys = torch.randn(7, 4, 3, 5, generator=g, dtype=F64), torch.randn(7, 3, 2, 5, generator=g, dtype=F64)
    assert_close(torch.func.vmap(batched_matmul)(Xs, Ys), torch.einsum("sijb,sjkb->sikb", Xs, Ys))
    grads = torch.func.vmap(torch.func.grad(lambda a, b: batched_matmul(a, b).square().sum()))(Xs, Ys)
    assert_close(grads, 2 * torch.einsum("sikb,sjkb->sijb", torch.einsum("sijb,sjkb->sikb", Xs, Ys), Ys))


def test_moments_are_memoised_until_the_data_changes_in_place() -> None:
    import pickle

    from iclab.models.attention_core import context_moments
    from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig

    ep = _regression_episode(B=6, n=5)
    first = context_moments(ep)
    assert context_moments(ep)[0] is first[0]  # reused
    model = LinearTransformer(LinearTransformerConfig(d=4, init_std=0.3), generator=generator(1)).double()
    before = model(ep).detach().clone()
    ep.y[:, 0].mul_(-3.0)  # in place, through a view
    assert context_moments(ep)[0] is not first[0]
    fresh = type(ep)(x=ep.x.clone(), x_query=ep.x_query.clone(), y=ep.y.clone())
    assert_close(model(ep), model(fresh))
    assert not torch.allclose(model(ep), before)
    assert "_memo" not in pickle.loads(pickle.dumps(ep)).__dict__  # pickles carry data, not caches
    x = ep.x.clone().requires_grad_(True)  # inputs that need grad: nothing stored, the graph is kept
    ep_grad = type(ep)(x=x, x_query=ep.x_query, y=ep.y)
    model(ep_grad).sum().backward()
    assert x.grad is not None and "_memo" not in ep_grad.__dict__
    ep_new = type(ep)(x=ep.x.clone(), x_query=ep.x_query, y=ep.y)
    with torch.inference_mode():  # evaluated in inference mode first, trained on afterwards
        model(ep_new)
    model(ep_new).sum().backward()
    assert "_memo" in ep_new.__dict__
