"""The generalized attention layer of Cheng, Chen, Sra 2024 (eq. 2-3, 26).

Every exactness check compares the model with a literal, column-orientation evaluation of the
paper's formula Z + V Z M h̃(QZ, KZ) (the paper's layout, written independently of the model), or
with :class:`iclab.models.LinearAttention` (Examples 1-2), in float64.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F32, F64, assert_close, random_episode, random_spd
from iclab import models
from iclab.core.errors import ConfigError, ShapeError
from iclab.models.kernel_attention import ACTIVATIONS, KernelTransformer, KernelTransformerConfig

SEEDS = st.integers(0, 2**31 - 1)
FAST = settings(max_examples=15, deadline=None)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


def _episode(B: int, n: int, d: int, seed: int) -> iclab.Episode:
    return random_episode(B, n, d, seed=seed, covariance=random_spd(d, seed=seed + 1))


def _model(d: int, L: int = 2, seed: int = 0, r: float | None = 0.3, **kw) -> KernelTransformer:
    """A random float64 model; ``r`` sets every label step r (V_{D,D}) so that predictions are O(1)."""
    cfg = KernelTransformerConfig(d=d, n_layers=L, init_std=kw.pop("init_std", 0.15), **kw)
    model = KernelTransformer(cfg, generator=iclab.generator(seed)).to(F64)
    if r is not None:
        with torch.no_grad():
            for layer in model.layers:
                (layer.V_free[:, -1, -1] if cfg.value == "full" else layer.r_free).fill_(r)
    return model


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-10 and O(1): a comparison of vanishing predictions would prove nothing."""
    assert torch.isfinite(expected).all() and expected.abs().max() > 1e-2, expected
    assert_close(actual, expected)


def _paper_layer(Z: torch.Tensor, V: torch.Tensor, Q: torch.Tensor, K: torch.Tensor, act: str) -> torch.Tensor:
    """Z + V Z M h̃(QZ, KZ) for one prompt in the paper's orientation (tokens are columns), eq. (2)-(6)."""
    n = Z.shape[1] - 1
    M = torch.diag(torch.cat([torch.ones(n, dtype=Z.dtype), torch.zeros(1, dtype=Z.dtype)]))
    W = (Q @ Z).T @ (K @ Z)  # (n+1, n+1): [UᵀW]_{ij}
    if act == "linear":
        H = W
    elif act == "relu":
        H = torch.relu(W)
    elif act == "exp":
        H = torch.exp(W)
    else:  # the masked softmax of Example 3 / eq. (6): over rows i ≤ n, row n+1 zero
        E = torch.exp(W[:n])
        H = torch.cat([E / E.sum(0, keepdim=True), torch.zeros(1, n + 1, dtype=Z.dtype)])
    return Z + V @ Z @ M @ H


def _paper_predict(ep: iclab.Episode, layers: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]]):
    """−[Z_L]_{d+1, n+1} per prompt, multi-head eq. (26): Z + Σ_s V_s Z M h̃_s(Q_s Z, K_s Z)."""
    out = []
    for b in range(ep.batch_size):
        Z = torch.cat([torch.cat([ep.x[b], ep.x_query[b : b + 1]]).T, torch.cat([ep.y[b], ep.y.new_zeros(1)])[None]])
        for heads in layers:
            Z = Z + sum(_paper_layer(Z, V, Q, K, act) - Z for V, Q, K, act in heads)
        out.append(-Z[-1, -1])
    return torch.stack(out)


def _heads(model: KernelTransformer) -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]]:
    return [
        [(layer.V[s], layer.Q[s], layer.K[s], act) for s, act in enumerate(layer.activations)] for layer in model.layers
    ]


# --- eq. (2)-(3), (26) against the literal formula --------------------------------------------


@pytest.mark.parametrize("value", ["sparse", "label", "full"])
@pytest.mark.parametrize("qk", ["blocks", "full"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_layer_equals_paper_formula(act: str, qk: str, value: str) -> None:
    """Every (h̃, Q/K, V) parameterisation equals Z + V Z M h̃(QZ, KZ) evaluated with (n+1)² scores."""
    ep = _episode(3, 6, 3, seed=1)
    model = _model(3, L=3, activations=(act,), qk=qk, value=value, seed=2, init_std=0.12, r=0.4)
    with torch.no_grad():
        _same(model.predict(ep), _paper_predict(ep, _heads(model)))


@FAST
@given(d=st.integers(1, 5), n=st.integers(1, 9), L=st.integers(1, 3), seed=SEEDS)
def test_multihead_equals_eq26(d: int, n: int, L: int, seed: int) -> None:
    """Eq. (26): one layer with heads of different h̃ adds the heads' updates (every h̃ in one layer)."""
    ep = _episode(2, n, d, seed)
    model = _model(d, L=L, activations=ACTIVATIONS, seed=seed % 1000, init_std=0.1, r=0.2)
    with torch.no_grad():
        _same(model.predict(ep), _paper_predict(ep, _heads(model)))


@pytest.mark.parametrize("act", ["linear", "relu"])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_examples_1_2_equal_linear_attention(act: str, n_heads: int) -> None:
    """Examples 1-2: Attn^{linear/relu}_{V,Q,K} = V Z M h̃(Zᵀ QᵀK Z) is LinearAttention with P = V, Q_LA = QᵀK
    (LinearAttention divides by n, so ``divide_by_n=True``), with full Q, K and with Asm.-2.1 blocks."""
    d, n = 4, 7
    ep = _episode(5, n, d, seed=3)
    for qk in ("full", "blocks"):
        ours = _model(d, L=2, activations=(act,) * n_heads, value="full", qk=qk, divide_by_n=True, seed=4)
        cfg = models.LinearTransformerConfig(d=d, n_layers=2, n_heads=n_heads, activation=act, init_std=0.0)
        theirs = models.LinearTransformer(cfg).to(F64)
        Q, K = ours.Q, ours.K  # (L, H, D, D)
        theirs.load_matrices(P=ours.V.detach(), Q=(Q.transpose(-1, -2) @ K).detach())
        with torch.no_grad():
            _same(ours.predict(ep), theirs.predict(ep))


def test_example_3_softmax_with_asm21_equals_blocks() -> None:
    """Example 3: softmax attention with Q = [[B,0],[0,0]], K = [[C,0],[0,0]] (Asm. 2.1) equals eq. (2)
    with h̃ = (6) and (B, C); with a non-zero last column of Q it does not (the labels enter the scores)."""
    d = 3
    ep = _episode(4, 8, d, seed=5)
    blocks = _model(d, L=2, activations=("softmax",), qk="blocks", seed=6)
    full = _model(d, L=2, activations=("softmax",), qk="full", seed=7)
    full.load_matrices(A=blocks.A.detach(), r=blocks.r.detach(), Q=blocks.Q.detach(), K=blocks.K.detach())
    with torch.no_grad():
        _same(full.predict(ep), blocks.predict(ep))
        full.layers[0].Q_free[0, :-1, -1] += 0.5  # the label enters B x_i
        assert (full.predict(ep) - blocks.predict(ep)).abs().max() > 1e-3


def test_linear_path_never_forms_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN: linear h̃ is evaluated by associativity; no scores are formed for a linear head (and the patched
    scorer is the one the other heads use: a relu head reaches it)."""
    import iclab.models.attention_core as ka  # the shared update (KernelAttention and LinearAttention)

    def boom(*a, **k):
        raise AssertionError("scores formed for a linear head")

    monkeypatch.setattr(ka, "inner_product_scores", boom)
    model = _model(3, activations=("linear", "linear"))
    model.predict(_episode(2, 5, 3, seed=0))
    relu = _model(3, activations=("relu", "linear"))
    relu.fast = False  # the token pass (the C kernel forms its scores in C)
    with pytest.raises(AssertionError, match="scores formed"):
        relu.predict(_episode(2, 5, 3, seed=0))


# --- structure: mask, Lemma A.1, Remark E.2, last-layer A ------------------------------------


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_lemma_a1_true_label_in_slot(act: str) -> None:
    """Lemma A.1: y_{n+1} in the query's label slot shifts the final query slot by exactly y_{n+1}
    and changes nothing else, at every layer (the query is never a source)."""
    ep = _episode(4, 6, 3, seed=8)
    model = _model(3, L=3, activations=(act, "exp"), seed=9)
    with torch.no_grad():
        _, zs = model.trace(ep)
        _, zbar = model.trace(ep, query_label=ep.y_query)
    shift = torch.zeros_like(zs)
    shift[:, :, -1, -1] = ep.y_query
    assert_close(zbar, zs + shift, rtol=1e-12, atol=1e-12)
    assert_close(zs[0][:, -1, -1], torch.zeros(4, dtype=F64))


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_query_is_never_a_source(act: str) -> None:
    """M: moving the query changes no demonstration token at any layer."""
    ep = _episode(3, 5, 3, seed=10)
    moved = dataclasses.replace(ep, x_query=ep.x_query + 1.0)
    model = _model(3, L=3, activations=(act,), seed=11)
    with torch.no_grad():
        a, b = model.trace(ep)[1], model.trace(moved)[1]
    assert_close(a[:, :, :-1], b[:, :, :-1], rtol=0, atol=0)
    assert (a[-1, :, -1] - b[-1, :, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_remark_e2_only_BtC_matters(act: str) -> None:
    """Remark E.2 / Asm. 4.3: (B_ℓ, C_ℓ) → (ΛᵀB_ℓ, Λ⁻¹C_ℓ) leaves the prediction unchanged."""
    d = 4
    ep = _episode(3, 7, d, seed=12)
    model = _model(d, L=2, activations=(act,), seed=13)
    Lam = torch.eye(d, dtype=F64) + _randn(d, d, seed=14, scale=0.3)
    other = _model(d, L=2, activations=(act,), seed=15)
    other.load_matrices(
        A=model.A.detach(),
        r=model.r.detach(),
        B=Lam.T @ model.B.detach(),
        C=torch.linalg.inv(Lam) @ model.C.detach(),
    )
    with torch.no_grad():
        _same(other.predict(ep), model.predict(ep))
        assert_close(other.BtC, model.BtC)


def test_last_layer_A_has_no_effect_and_zero_gradient() -> None:
    """The last layer's A only moves covariates nobody reads; ∂f/∂A_k ≡ 0 exactly."""
    ep = _episode(4, 6, 3, seed=16)
    model = _model(3, L=3, activations=("softmax",), seed=17)
    loss = (model.predict(ep) - ep.y_query).pow(2).mean()
    loss.backward()
    assert torch.equal(model.layers[-1].A_free.grad, torch.zeros_like(model.layers[-1].A_free))
    assert model.layers[0].A_free.grad.abs().max() > 0
    before = model.predict(ep).detach()
    with torch.no_grad():
        model.layers[-1].A_free.add_(1.0)
    assert torch.equal(model.predict(ep).detach(), before)


def test_label_value_keeps_covariates() -> None:
    """A ≡ 0 (Thm 4.5): the covariate rows never change, only the label row."""
    ep = _episode(3, 5, 3, seed=18)
    model = _model(3, L=3, activations=("exp", "relu"), value="label", seed=19)
    with torch.no_grad():
        zs = model.trace(ep)[1]
    assert torch.equal(zs[:, :, :, :-1], zs[:1, :, :, :-1].expand_as(zs[:, :, :, :-1]))
    assert not torch.equal(zs[-1, :, :, -1], zs[0, :, :, -1])
    assert not any("A_free" in name for name, _ in model.named_parameters())


# --- options: 1/n, σ --------------------------------------------------------------------------


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_divide_by_n_is_V_over_n(act: str) -> None:
    """The code's 1/n equals the paper's layer with V/n (r_code = n · r_paper)."""
    n = 6
    ep = _episode(3, n, 3, seed=20)
    code = _model(3, L=2, activations=(act,), divide_by_n=True, seed=21)
    paper = _model(3, L=2, activations=(act,), seed=22)
    paper.load_matrices(A=code.A.detach() / n, r=code.r.detach() / n, B=code.B.detach(), C=code.C.detach())
    with torch.no_grad():
        _same(code.predict(ep), paper.predict(ep))


@pytest.mark.parametrize("act", ["exp", "softmax"])
def test_sigma_is_a_bandwidth(act: str) -> None:
    """exp(uᵀw/σ²) with (B, C) equals σ = 1 with (B/σ, C/σ) (Sec. 3.1.2)."""
    sigma = 1.7
    ep = _episode(3, 6, 3, seed=23)
    a = _model(3, L=2, activations=(act,), sigma=sigma, seed=24)
    b = _model(3, L=2, activations=(act,), seed=25)
    b.load_matrices(A=a.A.detach(), r=a.r.detach(), B=a.B.detach() / sigma, C=a.C.detach() / sigma)
    with torch.no_grad():
        _same(a.predict(ep), b.predict(ep))


def test_exp_logit_cap_is_exact_below_and_finite_above() -> None:
    """The training guard exp(min(s, cap)) changes nothing while every logit is below the cap and keeps
    float32 finite where the exact exp overflows."""
    ep = _episode(3, 6, 3, seed=28)
    exact = _model(3, activations=("exp",), seed=29)
    capped = _model(3, activations=("exp",), seed=29, exp_logit_cap=30.0)
    with torch.no_grad():
        assert torch.equal(capped.predict(ep), exact.predict(ep))
        for m in (exact, capped):
            m.layers[0].B_free.mul_(40.0)
        big = ep.to(dtype=F32)
        assert not torch.isfinite(exact.to(F32).predict(big)).all()
        assert torch.isfinite(capped.to(F32).predict(big)).all()


def test_predict_sign_and_shapes() -> None:
    """predict = +ŷ = −[Z_L]_{d+1,n+1}; trace gives (L+1, B, n+1, d+1); float32 works."""
    ep = _episode(5, 4, 3, seed=26)
    model = _model(3, L=4, activations=("relu", "softmax"), seed=27)
    with torch.no_grad():
        y, zs = model.trace(ep)
    assert zs.shape == (5, 5, 5, 4)
    assert_close(y, -zs[-1, :, -1, -1])
    assert_close(model.predict(ep).detach(), y)
    assert model.V.shape == (4, 2, 4, 4) and model.r.shape == (4, 2) and model.BtC.shape == (4, 2, 3, 3)
    m32 = _model(3, activations=("exp",)).to(F32)
    assert m32.predict(ep.to(dtype=F32)).dtype == F32


def test_trains_with_the_trainer(tmp_path) -> None:
    """A few Adam steps through iclab.training.train reduce the loss on a linear task."""
    import functools

    from iclab import tasks
    from iclab.training import TrainConfig, train

    task = tasks.LinearRegression(d=3)
    model = KernelTransformer(KernelTransformerConfig(d=3, activations=("linear",)), generator=iclab.generator(0))
    cfg = TrainConfig(steps=60, batch_size=256, lr=0.02, eval_every=59, eval_batch=512, progress=False, clip=1.0)
    res = train(model, functools.partial(task.sample, n=10), cfg)
    first, last = res.history[0]["train_loss"], res.history[-1]["train_loss"]
    assert last < 0.7 * first, (first, last)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(activations=("softmax", "gelu")), "KernelTransformerConfig.activations must be a non-empty tuple"),
        (dict(activations=()), "activations must be"),
        (dict(value="dense"), "KernelTransformerConfig.value must be one of"),
        (dict(qk="sparse"), "KernelTransformerConfig.qk must be one of"),
        (dict(sigma=0.0), "sigma must be a float > 0"),
        (dict(n_layers=0), "n_layers must be an int >= 1"),
        (dict(d=0), "d must be an int >= 1"),
        (dict(init_std=-1.0), "init_std must be a float >= 0"),
        (dict(exp_logit_cap=0.0), "exp_logit_cap must be null or a float > 0"),
    ],
)
def test_config_rejects_bad_values(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        KernelTransformerConfig(**kw)


def test_config_accepts_a_list_of_activations() -> None:
    cfg = KernelTransformerConfig(activations=["linear", "exp"])  # type: ignore[arg-type]  # YAML gives lists
    assert cfg.activations == ("linear", "exp") and cfg.n_heads == 2


def test_bad_inputs_are_named() -> None:
    model = _model(3, activations=("exp",))
    with pytest.raises(ShapeError, match="built for d=3"):
        model.predict(_episode(2, 4, 4, seed=0))
    with pytest.raises(ShapeError, match="float64 parameters; got a torch.float32 episode"):
        model.predict(_episode(2, 4, 3, seed=0).to(dtype=F32))
    with pytest.raises(ConfigError, match=r"load_matrices.blocks must be exactly \('A', 'r', 'B', 'C'\)"):
        model.load_matrices(A=model.A, r=model.r)
    with pytest.raises(ConfigError, match="load_matrices.B must be shape"):
        model.load_matrices(A=model.A, r=model.r, B=torch.zeros(2, 3, 4), C=model.C)
    ep = _episode(2, 4, 3, seed=0)
    cls = iclab.Episode(x=ep.x, x_query=ep.x_query, labels=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="regression episode"):
        model.predict(cls)


@pytest.mark.parametrize("value", ["sparse", "label", "full"])
def test_query_only_last_layer_equals_the_full_pass(value: str) -> None:
    """``forward`` updates only the query row in the last layer; ``trace`` runs every layer on every token:
    the same read-out to 1e-10 for every activation mix and value parameterisation (float64)."""
    ep = _episode(4, 9, 3, seed=5)
    for acts in (("softmax",), ("relu", "exp"), ("linear", "softmax", "relu")):
        cfg = KernelTransformerConfig(d=3, n_layers=3, activations=acts, value=value, qk="full")
        model = KernelTransformer(cfg, generator=iclab.generator(7)).double()
        y_trace, states = model.trace(ep)
        _same(model.predict(ep), y_trace)
        _same(y_trace, -states[-1][:, -1, -1])
