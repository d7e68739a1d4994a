"""The bilinear FFN (eq. 3), its sparse form (eq. 11) and the bilinear transformer (Sun et al. 2025, Sec. 2.2)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import iclab
from conftest import F64, assert_close
from iclab import ConfigError, ShapeError, models, tasks
from iclab.models.bilinear import BilinearFFN
from iclab.training import TrainConfig, train


def _episode(d: int = 3, B: int = 6, n: int = 9, seed: int = 0) -> iclab.Episode:
    return tasks.quadratic(d).sample(B, n, generator=iclab.generator(seed), dtype=F64)


def _model(**kw: object) -> models.BilinearTransformer:
    cfg = models.BilinearTransformerConfig(**{"d": 3, "d_bar": 8, "n_blocks": 2, "init_std": 0.3, **kw})
    return models.BilinearTransformer(cfg, generator=iclab.generator(3)).to(F64)


def test_dense_ffn_is_eq3_with_the_label_masked() -> None:
    ffn = BilinearFFN(3, 8, init_std=0.5, generator=iclab.generator(0)).to(F64)
    z = torch.randn(4, 5, 9, generator=iclab.generator(1), dtype=F64)
    out = ffn(z)
    Z = z.transpose(1, 2)  # paper layout (D, T)
    W0 = torch.zeros(9, 9, dtype=F64)
    W1 = torch.zeros(9, 9, dtype=F64)
    W0[:8, :8], W1[:8, :8] = ffn.W0, ffn.W1
    assert_close(out.transpose(1, 2), Z + (W0 @ Z) * (W1 @ Z))  # eq. (3)
    assert torch.equal(out[..., -1], z[..., -1])


def test_sparse_ffn_writes_scratch_from_one_and_x_only() -> None:
    ffn = BilinearFFN(3, 8, sparse=True, init_std=0.5, generator=iclab.generator(0)).to(F64)
    assert ffn.W0_free.shape == (4, 4)
    W0 = ffn.W0
    assert torch.equal(W0[:4], torch.zeros(4, 8, dtype=F64)) and torch.equal(W0[:, 4:], torch.zeros(8, 4, dtype=F64))
    z = torch.randn(4, 5, 9, generator=iclab.generator(1), dtype=F64)
    out = ffn(z)
    u = z[..., :8]
    assert_close(out[..., :8], u + (u @ ffn.W0.T) * (u @ ffn.W1.T))
    assert torch.equal(out[..., :4], z[..., :4]) and torch.equal(out[..., -1], z[..., -1])


def test_no_ffn_is_the_linear_transformer_on_the_lifted_prompt() -> None:
    """ffn='none' reuses LinearAttention: equal to LinearTransformer(d = d̄) on x' = [1, x, 0]."""
    model = _model(ffn="none", n_blocks=3)
    ep = _episode()
    lin = models.LinearTransformer(models.LinearTransformerConfig(d=8, n_layers=3, init_std=0.0)).to(F64)
    lin.load_matrices(P=model.P, Q=model.Q)

    def lift(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.ones_like(x[..., :1]), x, torch.zeros(*x.shape[:-1], 4, dtype=F64)], -1)

    lifted = dataclasses.replace(ep, x=lift(ep.x), x_query=lift(ep.x_query), task={}, batched=())
    assert_close(model.predict(ep), lin.predict(lifted))
    assert len(model.sublayers()) == 3


def test_forward_is_the_composition_of_sublayers() -> None:
    for order in ("ffn_first", "attention_first"):
        model = _model(order=order)
        ep = _episode()
        z = models.embed_scratch(ep, 8)
        kinds = []
        for layer in model.sublayers():
            kinds.append(type(layer).__name__)
            z = layer(z, ep.n) if isinstance(layer, models.LinearAttention) else layer(z)
        assert_close(model.predict(ep), -z[:, -1, -1])
        first = "BilinearFFN" if order == "ffn_first" else "LinearAttention"
        assert kinds[0] == first and len(kinds) == 4


def test_block_predictions_are_the_sub_network_read_outs() -> None:
    model = _model(n_blocks=3)
    ep = _episode()
    preds = model.block_predictions(ep)
    assert preds.shape == (4, 6)
    assert torch.equal(preds[0], torch.zeros(6, dtype=F64))  # query label starts at 0
    assert_close(preds[-1], model.predict(ep))
    sub = _model(n_blocks=2)
    for name in ("P", "Q", "W0", "W1"):
        getattr(sub, name)  # exists
    sub.load_weights(P=model.P[:2], Q=model.Q[:2], W0=model.W0[:2], W1=model.W1[:2])
    assert_close(preds[2], sub.predict(ep))
    _, states = model.trace(ep)
    assert states.shape == (7, 6, 10, 9)


def _query_poly_degree(model: models.BilinearTransformer, ep: iclab.Episode) -> torch.Tensor:
    """Finite differences of the prediction along x_q(t) = a + t·b: the 3rd is 0 iff degree <= 2 in x_q."""
    b = torch.randn(ep.d, generator=iclab.generator(9), dtype=F64)
    ts = torch.arange(4, dtype=F64)
    preds = torch.stack([model.predict(dataclasses.replace(ep, x_query=ep.x_query + t * b)) for t in ts])
    return (preds[3] - 3 * preds[2] + 3 * preds[1] - preds[0]).abs().max() / preds.abs().max()


def test_strict_sparse_model_predicts_a_quadratic_in_x_query() -> None:
    """Eq. (11) (docs/errata.md): with P's (1, x) rows held at 0 the prediction has degree <= 2 in x_q; the paper's
    sparse model (free attention) and the dense model reach higher degrees."""
    ep = tasks.sparse_cubic().sample(5, 12, generator=iclab.generator(0), dtype=F64)
    cfg = dict(d=4, d_bar=10, n_blocks=3)
    assert _query_poly_degree(_model(ffn="sparse_strict", **cfg), ep) < 1e-10
    assert _query_poly_degree(_model(ffn="sparse", **cfg), ep) > 1e-6
    assert _query_poly_degree(_model(ffn="dense", **cfg), ep) > 1e-6


def test_strict_rows_stay_zero_under_training() -> None:
    model = models.BilinearTransformer(
        models.BilinearTransformerConfig(d=2, d_bar=5, n_blocks=2, ffn="sparse_strict", init_std=0.1),
        generator=iclab.generator(0),
    )
    task = tasks.quadratic(2)
    res = train(
        model,
        lambda batch, generator, dtype: task.sample(batch, 10, generator=generator, dtype=dtype),
        TrainConfig(steps=5, batch_size=32, eval_batch=32, lr=0.05, progress=False),
    )
    assert torch.equal(model.P[:, :, :3], torch.zeros_like(model.P[:, :, :3]))
    assert model.P[:, :, 3:].abs().max() > 0
    assert len(res.history) >= 1


def test_gradients_reach_every_trainable_weight() -> None:
    for ffn in ("dense", "sparse"):
        model = _model(ffn=ffn)
        ep = _episode()
        ((model.predict(ep) - ep.y_query) ** 2).mean().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d=0), r"BilinearTransformerConfig.d must be an int >= 1; got 0"),
        (dict(d=3, d_bar=3), r"d_bar must be an int >= 4 for d = 3 and ffn = 'dense'; got 3"),
        (dict(d=3, d_bar=4, ffn="sparse"), r"d_bar must be an int >= 5 for d = 3 and ffn = 'sparse'; got 4"),
        (dict(ffn="glu"), r"ffn must be one of"),
        (dict(n_blocks=0), r"n_blocks must be an int >= 1; got 0"),
        (dict(order="ffn_last"), r"order must be one of"),
        (dict(init="zeros"), r"init must be one of \('gaussian', 'identity'\); got 'zeros'"),
        (dict(label_scale=0.0), r"label_scale must be a finite float > 0; got 0.0"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        models.BilinearTransformerConfig(**kwargs)


def test_episode_errors() -> None:
    model = _model()
    with pytest.raises(ShapeError, match="built for d=3; got an episode with d=2"):
        model.predict(_episode(d=2))
    with pytest.raises(ShapeError, match="float64 parameters; got a torch.float32 episode"):
        model.predict(_episode().to(dtype=torch.float32))
    with pytest.raises(ConfigError, match=r"load_weights.P must be shape"):
        model.load_weights(P=torch.zeros(2, 3, 3, dtype=F64))
    with pytest.raises(ConfigError, match=r"zero outside the W̃ block"):
        _model(ffn="sparse").load_weights(W0=torch.ones(2, 8, 8, dtype=F64))


@pytest.mark.parametrize("ffn", ["dense", "sparse_strict", "none"])
def test_label_scale_is_an_exact_reparameterisation(ffn: str) -> None:
    """y/s in the prompt and s·z at the read-out with P′ = SPS⁻¹, Q′ = S⁻¹QS⁻¹: the paper's model, bit for bit."""
    ep = _episode()
    paper = _model(ffn=ffn)
    scaled = _model(ffn=ffn, label_scale=4.7)
    weights = dict(P=paper.P, Q=paper.Q) | (dict(W0=paper.W0, W1=paper.W1) if ffn != "none" else {})
    scaled.load_weights(**weights)
    assert_close(scaled.P, paper.P)
    assert_close(scaled.Q, paper.Q)
    stored_P, stored_Q = scaled.attn[0].P, scaled.attn[0].Q
    assert_close(stored_P[..., -1, :-1], paper.P[0][..., -1, :-1] / 4.7)  # the stored P′ really is rescaled
    assert_close(stored_Q[..., -1, -1], 4.7**2 * paper.Q[0][..., -1, -1])
    assert_close(scaled.predict(ep), paper.predict(ep), atol=1e-10)
    assert_close(scaled.block_predictions(ep), paper.block_predictions(ep), atol=1e-10)
    assert_close(scaled.trace(ep)[1], paper.trace(ep)[1], atol=1e-10)


@pytest.mark.parametrize("ffn", ["dense", "sparse", "sparse_strict", "none"])
def test_identity_init_starts_every_block_as_the_identity(ffn: str) -> None:
    ep = _episode()
    model = _model(ffn=ffn, init="identity", label_scale=4.0)
    _, states = model.trace(ep)
    assert torch.equal(states, states[:1].expand_as(states))  # no sub-layer changes the prompt
    assert torch.equal(model.predict(ep), torch.zeros(ep.batch_size, dtype=F64))
    assert bool((model.P == 0).all()) and bool((model.Q != 0).any())
    if ffn != "none":
        assert bool((model.W1 == 0).all()) and bool((model.W0 != 0).any())
    (model.predict(ep) - ep.y_query).pow(2).mean().backward()
    grads = [a.parametrizations.P_free.original.grad if ffn == "sparse_strict" else a.P_free.grad for a in model.attn]
    assert all(g is not None and g.abs().max() > 0 for g in grads)  # P moves at step 1; W_1, Q follow at step 2


def test_bilinear_residual_is_eq3_in_rows_to_second_order_and_under_vmap() -> None:
    """The fused FFN (one GEMM for both maps, a three-pass backward) = z + (z W_0ᵀ) ⊙ (z W_1ᵀ), any order."""
    from iclab.models.bilinear import bilinear_residual

    g = iclab.generator(11)
    z = torch.randn(3, 7, 5, generator=g, dtype=F64, requires_grad=True)
    W0, W1 = (torch.randn(5, 5, generator=g, dtype=F64, requires_grad=True) for _ in range(2))

    def literal(z, W0, W1):  # type: ignore[no-untyped-def]
        return z + (z @ W0.T) * (z @ W1.T)

    out = bilinear_residual(z, W0, W1)
    assert (out - literal(z, W0, W1)).abs().max() < 1e-12
    assert torch.autograd.gradcheck(bilinear_residual, (z, W0, W1))
    assert torch.autograd.gradgradcheck(bilinear_residual, (z, W0, W1))
    # a generic output gradient, against autograd through the literal formula
    w = torch.randn(out.shape, generator=g, dtype=F64)
    for a, b in zip(
        torch.autograd.grad((out * w).sum(), (z, W0, W1)),
        torch.autograd.grad((literal(z, W0, W1) * w).sum(), (z, W0, W1)),
        strict=True,
    ):
        assert (a - b).abs().max() < 1e-12
    zs = torch.randn(4, 3, 7, 5, generator=g, dtype=F64)
    got = torch.func.vmap(torch.func.grad(lambda t: bilinear_residual(t, W0, W1).square().sum()))(zs)
    want = torch.func.vmap(torch.func.grad(lambda t: literal(t, W0, W1).square().sum()))(zs)
    assert (got - want).abs().max() < 1e-10


@pytest.mark.parametrize("ffn", ["dense", "sparse", "sparse_strict"])
def test_pickles_for_worker_processes(ffn: str) -> None:
    """A trained model crosses a process boundary (``--workers``, Ray) whole: ``sparse_strict``'s row-mask
    parametrisation, which torch refuses to pickle, is rebuilt from the config; the weights, dtype, mode and the
    prediction are the same, and the masked rows stay masked."""
    import pickle

    model = models.BilinearTransformer(models.BilinearTransformerConfig(ffn=ffn), generator=iclab.generator(5)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=iclab.generator(6), dtype=F64))
    model.eval()
    again = pickle.loads(pickle.dumps(model))
    assert list(again.state_dict()) == list(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True))
    assert not again.training and next(again.parameters()).dtype == F64
    ep = tasks.PolynomialRegression(d=3).sample(8, 20, generator=iclab.generator(7), dtype=F64)
    assert torch.equal(again.predict(ep), model.predict(ep))
