"""Reduced multi-head linear attention (Zhang, Singh, Latham, Saxe 2025) and its equivalent networks.

Every equivalence is checked in float64 to 1e-10: eq. (M)/(S) against literal per-head loops, the
token-level layer with zero blocks against the reduced model (also along a GD trajectory), ATTN_M
against the MLP on the cubic feature (eq. 6-7) along a GD trajectory, ATTN_S against its
convolutional form (eq. 13), and the softmax layer against a literal per-head, per-target loop.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import iclab
from conftest import F64, assert_close, random_episode, random_spd
from iclab import models
from iclab.models.linear_attention import LinearAttention, embed
from iclab.models.reduced_attention import context_statistic, cubic_feature, prefix_statistics
from iclab.training import full_batch_gd

D = 4


def _ep(batch: int = 6, n: int = 9, *, seed: int = 0) -> iclab.Episode:
    return random_episode(batch, n, D, seed=seed, covariance=random_spd(D, seed=seed + 100))


def _merged(H: int = 3, *, seed: int = 1, w_init: float = 2.0, **kw) -> models.MergedAttention:
    return models.MergedAttention(D, H, w_init=w_init, generator=iclab.generator(seed), **kw).to(F64)


def _separate(H: int = 3, R: int = 2, *, seed: int = 2, w_init: float = 2.0, **kw) -> models.SeparateAttention:
    return models.SeparateAttention(D, H, R, w_init=w_init, generator=iclab.generator(seed), **kw).to(F64)


# --- statistics ----------------------------------------------------------------------------------


def test_context_statistic_and_cubic_feature() -> None:
    """β = (1/N) Σ y_n x_n (eq. 4); z = vec(β x_qᵀ) stacks columns, = x_q ⊗ β (eq. 38)."""
    ep = _ep()
    beta = context_statistic(ep)
    loop = torch.stack([sum(ep.y[b, i] * ep.x[b, i] for i in range(ep.n)) / ep.n for b in range(ep.batch_size)])
    assert_close(beta, loop)
    z = cubic_feature(beta, ep.x_query)
    for b in range(ep.batch_size):
        assert_close(z[b], torch.kron(ep.x_query[b], beta[b]))
        assert_close(z[b], torch.outer(beta[b], ep.x_query[b]).T.reshape(-1))  # vec = column stacking


def test_prefix_statistics_match_a_loop() -> None:
    """Eq. (23): prefix m predicts y_{m+1} from the first m pairs, with β_m = (1/m) Σ_{j≤m} y_j x_j."""
    ep = _ep(batch=3, n=5)
    beta, xq, yq = prefix_statistics(ep)
    assert beta.shape == xq.shape == (3, 5, D) and yq.shape == (3, 5)
    for m in range(1, ep.n + 1):
        sub = iclab.Episode(x=ep.x[:, :m], y=ep.y[:, :m], x_query=ep.x_query, y_query=ep.y_query)
        assert_close(beta[:, m - 1], context_statistic(sub))
        target_x = ep.x[:, m] if m < ep.n else ep.x_query
        target_y = ep.y[:, m] if m < ep.n else ep.y_query
        assert torch.equal(xq[:, m - 1], target_x) and torch.equal(yq[:, m - 1], target_y)


# --- initialisation ------------------------------------------------------------------------------


def test_init_scales_follow_app_c2() -> None:
    """Eq. (34)/(36): Var v = w²/H, Var U = w²/(H D²), Var k = Var q = w²/(H R D); 3σ on the sample variance."""
    w, H, R, S = 0.3, 50, 3, 40
    m = models.MergedAttention(D, H, w_init=w, generator=iclab.generator(0), n_seeds=S)
    s = models.SeparateAttention(D, H, R, w_init=w, generator=iclab.generator(1), n_seeds=S)
    assert m.v.shape == (S, H) and m.U.shape == (S, H, D, D)
    assert s.v.shape == (S, H) and s.k.shape == s.q.shape == (S, H, R, D)
    for t, var in ((m.v, w**2 / H), (m.U, w**2 / (H * D * D)), (s.v, w**2 / H), (s.k, w**2 / (H * R * D))):
        t = t.detach().double().reshape(-1)
        # the sample variance of n Gaussians has std var·√(2/n)
        assert abs(float(t.var()) - var) < 3 * var * (2 / t.numel()) ** 0.5, (float(t.var()), var)
    for t in (m.v.detach(), s.q.detach()):
        assert abs(float(t.mean())) < 3 * float(t.std()) / t.numel() ** 0.5


def test_init_is_seeded_and_zero_init_draws_nothing() -> None:
    a, b = _merged(seed=5), _merged(seed=5)
    assert torch.equal(a.U, b.U) and torch.equal(a.v, b.v)
    g = iclab.generator(3)
    state = g.get_state()
    z = models.SeparateAttention(D, 2, w_init=0.0, generator=g)
    assert torch.equal(g.get_state(), state) and not z.k.any()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: models.MergedAttention(0, 2), r"MergedAttention\.d must be an int >= 1; got 0"),
        (lambda: models.MergedAttention(D, 0), r"MergedAttention\.n_heads"),
        (lambda: models.MergedAttention(D, 2, w_init=-1.0), r"MergedAttention\.w_init"),
        (lambda: models.SeparateAttention(D, 2, 0), r"SeparateAttention\.rank must be an int >= 1; got 0"),
        (lambda: models.SeparateAttention(D, 2, n_seeds=0), r"SeparateAttention\.n_seeds"),
        (lambda: models.CubicFeatureMLP(D, 0), r"CubicFeatureMLP\.width"),
        (lambda: LinearAttention(D, key_query="split"), r"LinearAttention\.key_query must be one of"),
        (lambda: LinearAttention(D, sources="query"), r"LinearAttention\.sources must be one of"),
        (lambda: LinearAttention(D, pattern="sparse", key_query="separate"), r"LinearAttention\.key_query"),
        (lambda: LinearAttention(D, pattern="sparse", zero_blocks=True), r"LinearAttention\.zero_blocks"),
        (lambda: models.LinearTransformerConfig(readout="plus"), r"LinearTransformerConfig\.readout"),
    ],
)
def test_bad_arguments_are_rejected(make, match: str) -> None:
    with pytest.raises(iclab.ConfigError, match=match):
        make()


def test_predict_errors() -> None:
    ep = _ep()
    batched = models.MergedAttention(D, 2, n_seeds=3).to(F64)
    with pytest.raises(ValueError, match="n_seeds=3"):
        batched.predict(ep)
    with pytest.raises(iclab.ShapeError, match="float32 parameters; got a torch.float64 episode"):
        models.SeparateAttention(D, 2).predict(ep)
    with pytest.raises(iclab.ShapeError, match="d=4; got an episode with d=3"):
        _merged().predict(random_episode(2, 3, 3, seed=0))
    with pytest.raises(
        iclab.ShapeError, match=r"from_statistics needs statistics of shape \(B, 4\) and x_query \(B, 4\)"
    ):
        _merged().from_statistics(torch.zeros(3, 4, dtype=F64), torch.zeros(3, 3, dtype=F64))


# --- the reduced forward passes ------------------------------------------------------------------


def test_merged_equals_eq_M_loop() -> None:
    """ŷ_q = Σ_i v_i βᵀ U_i x_q (eq. M), and W = Σ_i v_i U_i."""
    ep, m = _ep(), _merged(H=4)
    beta = context_statistic(ep)
    loop = sum(m.v[i] * torch.einsum("bi,ij,bj->b", beta, m.U[i], ep.x_query) for i in range(4))
    with torch.no_grad():
        assert_close(m.predict(ep), loop.detach())
        assert_close(m.effective_matrix(), sum(m.v[i] * m.U[i] for i in range(4)).detach())


def test_separate_equals_eq_S_loop() -> None:
    """ŷ_q = Σ_i Σ_r v_i βᵀ k_ir q_irᵀ x_q (eq. S): one value weight shared by the R pairs of a head."""
    ep, s = _ep(), _separate(H=3, R=2)
    beta = context_statistic(ep)
    loop = sum(s.v[i] * (beta @ s.k[i, r]) * (ep.x_query @ s.q[i, r]) for i in range(3) for r in range(2)).detach()
    with torch.no_grad():
        assert_close(s.predict(ep), loop)
        assert_close(s.predict_conv(ep), loop)  # eq. (13), K_ir = I ⊗ k_irᵀ


def test_conv_kernels_are_kronecker_blocks() -> None:
    s = _separate(H=2, R=1)
    K = s.conv_kernels()
    assert K.shape == (2, 1, D, D * D)
    assert_close(K[1, 0], torch.kron(torch.eye(D, dtype=F64), s.k[1, 0].detach().unsqueeze(0)))


def test_seeds_axis_equals_separate_models() -> None:
    """A model with n_seeds = S is S independent models: from_statistics, select and stack agree."""
    ep = _ep()
    for cls, kw in ((models.MergedAttention, {}), (models.SeparateAttention, {"rank": 2})):
        batched = cls(D, 3, w_init=2.0, generator=iclab.generator(0), n_seeds=4, **kw).to(F64)
        with torch.no_grad():
            y = batched.from_statistics(context_statistic(ep), ep.x_query)
            assert y.shape == (4, ep.batch_size)
            for s in range(4):
                assert_close(y[s], batched.select(s).predict(ep))
            again = cls.stack([batched.select(s) for s in range(4)])
            assert all(torch.equal(getattr(again, k), getattr(batched, k)) for k in batched.names)


# --- token level ---------------------------------------------------------------------------------


def _token_predict(layer: LinearAttention, ep: iclab.Episode) -> torch.Tensor:
    return layer(embed(ep), ep.n)[:, -1, -1]  # +ŷ_q (Zhang et al. read out +)


@pytest.mark.parametrize("sources", ["context", "all"])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_token_layer_with_zero_blocks_equals_reduced(kind: str, sources: str, residual: bool) -> None:
    """The full (d+1)-wide layer with zero blocks and random "*" entries predicts exactly eq. (M)/(S)."""
    ep = _ep()
    red = _merged() if kind == "merged" else _separate()
    layer = red.token_layer(star_std=0.7, generator=iclab.generator(9), sources=sources, residual=residual)
    assert (layer.P[:, :-1] != 0).all()  # the "*" rows are really random
    with torch.no_grad():
        assert_close(_token_predict(layer, ep), red.predict(ep))
    assert_close(layer.Q[:, :D, :D], (red.U if kind == "merged" else red.k.mT @ red.q).detach())


def test_nonzero_blocks_change_the_prediction() -> None:
    """Sanity of the previous test: breaking a zero block does change ŷ_q (App. G, eq. 91)."""
    ep, red = _ep(), _merged()
    layer = red.token_layer(star_std=0.7, generator=iclab.generator(9))
    with torch.no_grad():
        layer.P_free[:, -1, :D] = 0.3  # the vector part of the value row
        assert (_token_predict(layer, ep) - red.predict(ep)).abs().max() > 1e-2


def test_zero_blocks_option_of_the_layer() -> None:
    for kq in ("merged", "separate"):
        layer = LinearAttention(
            D, n_heads=2, key_query=kq, rank=2 if kq == "separate" else None, init_std=1.0, zero_blocks=True
        )
        assert not layer.P[:, -1, :D].any() and (layer.P[:, -1, -1] != 0).all()
        if kq == "merged":
            assert not layer.Q[:, -1, :D].any() and (layer.Q[:, :D, :D] != 0).all()
        else:
            assert not layer.W_K[..., -1].any() and layer.W_K.shape == (2, 2, D + 1)


def _symmetrised(ep: iclab.Episode) -> iclab.Episode:
    """Every sequence with w and with −w: odd moments of w vanish exactly on the training set."""
    return iclab.Episode(
        x=torch.cat([ep.x, ep.x]),
        y=torch.cat([ep.y, -ep.y]),
        x_query=torch.cat([ep.x_query, ep.x_query]),
        y_query=torch.cat([ep.y_query, -ep.y_query]),
    )


@pytest.mark.parametrize("kind", ["merged", "separate"])
def test_token_level_gd_equals_reduced_gd(kind: str) -> None:
    """Full-batch GD on every entry of the token-level layer (autograd) follows the reduced model's GD
    exactly when the training set is symmetric in w: the zero blocks stay 0 (App. D.1, F.1).

    They are an invariant but unstable set: the value vector and u (or the scalar key) are coupled like
    a two-layer linear net through E(y_q x_q βᵀ) ≈ Λ², so rounding noise grows as exp(2·lr·λ_max²·t).
    Tr Λ ≈ 1 (the paper's scale) keeps that growth below e^2 over this run."""
    base = _ep(batch=20, n=7, seed=4)
    ep = _symmetrised(random_episode(20, 7, D, seed=4, covariance=random_spd(D, seed=104) / D))
    assert base.n == ep.n
    red = _merged(w_init=1.0) if kind == "merged" else _separate(R=1, w_init=2.0)
    layer = red.token_layer(star_std=0.2, generator=iclab.generator(3), sources="all")
    lr, steps = 0.2, 40
    traj = full_batch_gd(red, ep, lr=lr, steps=steps, method="samples")
    params = [p for p in layer.parameters()]
    for t in range(steps + 1):
        loss = (_token_predict(layer, ep) - ep.y_query).pow(2).mean()
        assert_close(loss.detach(), traj.train_loss[t])
        if kind == "merged":
            assert_close(layer.Q[:, :D, :D].detach(), traj.params["U"][t])
            assert float(layer.Q[:, -1, :D].detach().abs().max()) < 1e-10
        else:
            assert_close(layer.W_K[..., :D].detach(), traj.params["k"][t])
            assert float(layer.W_K[..., -1].detach().abs().max()) < 1e-10
        assert_close(layer.P[:, -1, -1].detach(), traj.params["v"][t])
        assert float(layer.P[:, -1, :D].detach().abs().max()) < 1e-10
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=lr)
    assert float(traj.train_loss[-1]) < 0.8 * float(traj.train_loss[0])  # the run really trained


# --- ATTN_M ≡ MLP(z) (eq. 6-7, Fig. 1) --------------------------------------------------------------


def test_merged_attention_equals_cubic_mlp_along_gd() -> None:
    """Mapped weights (w_2 = v, W_1[i] = vec(U_i)ᵀ) give the same function, hence the same GD curve."""
    ep = _ep(batch=30, n=8, seed=7)
    attn = _merged(H=8, w_init=1.0)
    mlp = attn.mlp()
    with torch.no_grad():
        assert_close(mlp.predict(ep), attn.predict(ep))
    lr = 0.1
    for _ in range(60):
        losses = []
        for model in (attn, mlp):
            loss = (model.predict(ep) - ep.y_query).pow(2).mean()
            grads = torch.autograd.grad(loss, list(model.parameters()))
            with torch.no_grad():
                for p, g in zip(model.parameters(), grads, strict=True):
                    p.sub_(g, alpha=lr)
            losses.append(loss.detach())
        assert_close(losses[0], losses[1])
    assert_close(mlp.W1.detach(), attn.U.detach().mT.reshape(8, -1))
    assert_close(mlp.w2.detach(), attn.v.detach())
    assert float(losses[0]) < 0.9 * float((ep.y_query**2).mean())  # the run really trained


# --- softmax and separate key/query on the token layer --------------------------------------------


def _softmax_reference(layer: LinearAttention, z: torch.Tensor, n: int) -> torch.Tensor:
    """Literal loops: for each head and target j, softmax over sources i of z_iᵀ Q_h z_j (ρ = 1)."""
    B, T, _ = z.shape
    m = n if layer.sources == "context" else T
    out = torch.zeros_like(z)
    for h in range(layer.n_heads):
        for b in range(B):
            for j in range(T):
                s = torch.stack([z[b, i] @ layer.Q[h] @ z[b, j] for i in range(m)])
                a = torch.softmax(s, 0)
                out[b, j] += sum(a[i] * (layer.P[h] @ z[b, i]) for i in range(m))
    return z + out if layer.residual else out


@pytest.mark.parametrize(("sources", "residual"), [("context", True), ("all", False)])
def test_softmax_layer_matches_loops(sources: str, residual: bool) -> None:
    ep = _ep(batch=2, n=5)
    layer = LinearAttention(
        D,
        n_heads=2,
        activation="softmax",
        key_query="separate",
        rank=2,
        init_std=0.5,
        generator=iclab.generator(0),
        sources=sources,
        residual=residual,
    ).to(F64)
    z = embed(ep)
    with torch.no_grad():
        assert_close(layer(z, ep.n), _softmax_reference(layer, z, ep.n))


def test_separate_key_query_is_low_rank_product() -> None:
    layer = LinearAttention(D, n_heads=3, key_query="separate", rank=2, init_std=1.0, generator=iclab.generator(1))
    layer = layer.to(F64)
    Q = layer.Q.detach()
    assert Q.shape == (3, D + 1, D + 1)
    assert_close(Q[1], (layer.W_K[1].T @ layer.W_Q[1]).detach())
    assert int(torch.linalg.matrix_rank(Q[0])) == 2


def test_transformer_readout_and_config_options() -> None:
    """readout='positive' flips the sign; the new options reach every layer; load_matrices takes W_K/W_Q."""
    ep = _ep()
    cfg = dict(d=D, n_layers=2, n_heads=2, init_std=0.4, activation="softmax", key_query="separate", rank=3)
    neg = models.LinearTransformer(models.LinearTransformerConfig(**cfg), generator=iclab.generator(0)).to(F64)
    pos_cfg = models.LinearTransformerConfig(**cfg, readout="positive", sources="all", residual=False)
    pos = models.LinearTransformer(pos_cfg, generator=iclab.generator(0)).to(F64)
    assert all(layer.sources == "all" and not layer.residual and layer.rank == 3 for layer in pos.layers)
    pos2 = models.LinearTransformer(dataclasses.replace(pos_cfg, sources="context", residual=True)).to(F64)
    pos2.load_matrices(
        P=neg.P, W_K=torch.stack([la.W_K for la in neg.layers]), W_Q=torch.stack([la.W_Q for la in neg.layers])
    )
    with torch.no_grad():
        assert_close(pos2.predict(ep), -neg.predict(ep))
        assert (pos.predict(ep) - pos2.predict(ep)).abs().max() > 1e-3
