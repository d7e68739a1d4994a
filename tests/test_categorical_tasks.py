"""The categorical generators of Wang et al. 2025 (§6.1 eq. (45), App. F): shapes, seeding, formulas, label law."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from iclab.core.errors import ConfigError, ShapeError
from iclab.tasks.categorical import (
    FixedEpisodes,
    QuadrantCategorical,
    RBFMixtureCategorical,
    check_labels,
    expand_queries,
    fixed_training_set,
    latent,
    log_probabilities,
    quadrant,
    query_grid,
    random_embedding,
)

F64 = torch.float64


@pytest.fixture(scope="module")
def rbf() -> RBFMixtureCategorical:
    return RBFMixtureCategorical.draw(generator=iclab.generator(0))


@pytest.fixture(scope="module")
def quad() -> QuadrantCategorical:
    return QuadrantCategorical.draw(generator=iclab.generator(0))


def test_defaults_are_the_papers(rbf, quad) -> None:
    assert (rbf.d, rbf.num_classes, rbf.d_embed, rbf.n_anchors, rbf.scale, rbf.dist) == (10, 25, 5, 5, 10.0, 0.1)
    assert (quad.d, quad.num_classes, quad.d_embed, quad.scale) == (2, 20, 5, 1.0)


@pytest.mark.parametrize("name", ["rbf", "quad"])
def test_episode_shapes_dtypes_ranges(name, request) -> None:
    task = request.getfixturevalue(name)
    ep = task.sample(16, 30, generator=iclab.generator(1), dtype=F64)
    assert ep.x.shape == (16, 30, task.d) and ep.x_query.shape == (16, task.d) and ep.x.dtype == F64
    assert ep.labels.shape == (16, 30) and ep.label_query.shape == (16,) and ep.labels.dtype == torch.int64
    assert ep.y is None and ep.y_query is None
    for lab in (ep.labels, ep.label_query):
        assert int(lab.min()) >= 0 and int(lab.max()) < task.num_classes
    assert float(ep.x.abs().max()) <= 1.0 and float(ep.x_query.abs().max()) <= 1.0
    assert ep.task["W_e"].shape == (task.d_embed, task.num_classes)
    torch.testing.assert_close(ep.task["p_query"].sum(-1), torch.ones(16, dtype=F64), rtol=0, atol=1e-12)
    sub = ep[torch.tensor([3, 5])]  # per-context task entries are sliced with the prompts
    assert all(sub.task[k].shape[0] == 2 for k in ep.batched)


@pytest.mark.parametrize("name", ["rbf", "quad"])
def test_seeded_reproducible(name, request) -> None:
    task = request.getfixturevalue(name)
    a = task.sample(8, 20, generator=iclab.generator(3))
    b = task.sample(8, 20, generator=iclab.generator(3))
    c = task.sample(8, 20, generator=iclab.generator(4))
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels) and torch.equal(a.label_query, b.label_query)
    assert not torch.equal(a.x, c.x)
    assert torch.equal(
        random_embedding(5, 25, generator=iclab.generator(7)), random_embedding(5, 25, generator=iclab.generator(7))
    )


def test_rbf_context_parameters(rbf) -> None:
    """c_j distinct; σ_j² makes bump j equal 0.1 at its nearest other anchor (App. E)."""
    t = rbf.contexts(64, generator=iclab.generator(2), dtype=F64)
    cats = t["categories"]
    assert cats.shape == (64, 5) and all(len(set(row.tolist())) == 5 for row in cats)
    mu, s2 = t["anchors"], t["sigma2"]
    sq = torch.cdist(mu, mu).square() + torch.diag(torch.full((5,), math.inf, dtype=F64))
    at_nearest = torch.exp(-sq.amin(-1) / s2)
    torch.testing.assert_close(at_nearest, torch.full_like(at_nearest, 0.1), rtol=0, atol=1e-12)
    assert bool((sq.amin(-1) > 0).all())


def test_rbf_latent_matches_eq_45_loop(rbf) -> None:
    t = rbf.contexts(3, generator=iclab.generator(5), dtype=F64)
    x = torch.rand(3, 7, 10, generator=iclab.generator(6), dtype=F64) * 2 - 1
    f = latent(t, x)
    W = rbf.W_e
    for b in range(3):
        for i in range(7):
            ref = sum(
                10.0
                * W[:, t["categories"][b, j]]
                * math.exp(-float((x[b, i] - t["anchors"][b, j]).square().sum()) / float(t["sigma2"][b, j]))
                for j in range(5)
            )
            torch.testing.assert_close(f[b, i], ref, rtol=1e-12, atol=1e-12)
    logp = log_probabilities(t, x)
    torch.testing.assert_close(logp, torch.log_softmax(f @ W, -1), rtol=0, atol=1e-12)


def test_quadrant_numbering_and_latent(quad) -> None:
    pts = torch.tensor([[0.5, 0.5], [-0.5, 0.5], [-0.5, -0.5], [0.5, -0.5], [0.0, 0.0]], dtype=F64)
    assert quadrant(pts).tolist() == [0, 1, 2, 3, 0]
    t = quad.contexts(4, generator=iclab.generator(8), dtype=F64)
    assert all(len(set(row.tolist())) == 4 for row in t["quadrant_categories"])
    f = latent(t, pts.expand(4, 5, 2))  # (4, 5, 5)
    expect = quad.W_e.T[t["quadrant_categories"][:, [0, 1, 2, 3, 0]]]
    torch.testing.assert_close(f, expect, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["rbf", "quad"])
def test_labels_follow_softmax_of_latent(name, request) -> None:
    """Σ_i (1[y_i = c] − p_c(x_i)) is a sum of independent centred terms: within 4.5σ for every class c.

    Seeded Monte Carlo over 64 contexts × 400 points; a label law off by a few percent fails (checked
    below by scoring uniform labels against the same bound).
    """
    task = request.getfixturevalue(name)
    ep = task.sample(64, 400, generator=iclab.generator(11), dtype=F64)
    p = log_probabilities(ep.task, ep.x).exp().reshape(-1, task.num_classes)  # (B·n, C)
    onehot = torch.nn.functional.one_hot(ep.labels.reshape(-1), task.num_classes).to(F64)
    z = (onehot - p).sum(0) / (p * (1 - p)).sum(0).sqrt()
    assert float(z.abs().max()) < 4.5, z
    wrong = torch.nn.functional.one_hot(
        torch.randint(0, task.num_classes, (p.shape[0],), generator=iclab.generator(0)), task.num_classes
    )
    z_wrong = (wrong.to(F64) - p).sum(0) / (p * (1 - p)).sum(0).sqrt()
    assert float(z_wrong.abs().max()) > 4.5  # the test has power against a wrong law
    # the query label too: mean of p_query[label] vs mean max probability is the calibration of one draw
    pq = ep.task["p_query"]
    torch.testing.assert_close(pq, log_probabilities(ep.task, ep.x_query[:, None]).exp()[:, 0], rtol=0, atol=1e-14)


def test_bayes_rates_of_the_synthetic_data() -> None:
    """Derived: §6.1 data with λ = 10 have Bayes rate 0.67–0.82 across W_e; App. F ≈ 0.545 < 0.6."""
    rbf_rates, quad_rates = [], []
    for s in range(4):
        r = RBFMixtureCategorical.draw(generator=iclab.generator(s)).bayes_rate(
            generator=iclab.generator(50 + s), contexts=512, points=16
        )
        q = QuadrantCategorical.draw(generator=iclab.generator(s)).bayes_rate(
            generator=iclab.generator(50 + s), contexts=512, points=16
        )
        assert 0 < r.stderr < 0.01 and 0 < q.stderr < 0.01 and r.samples == 512
        rbf_rates.append(r.mean)
        quad_rates.append(q.mean)
    assert all(0.65 < m < 0.85 for m in rbf_rates), rbf_rates
    assert 0.45 < sum(quad_rates) / 4 < 0.6, quad_rates
    assert all(m < 0.65 for m in quad_rates)


def test_bayes_rate_is_seeded(rbf) -> None:
    a = rbf.bayes_rate(generator=iclab.generator(1), contexts=64, points=4)
    b = rbf.bayes_rate(generator=iclab.generator(1), contexts=64, points=4)
    assert a == b


def test_fixed_training_set_serves_its_contexts(rbf) -> None:
    fixed = fixed_training_set(rbf, 32, 20, generator=iclab.generator(2))
    assert isinstance(fixed, FixedEpisodes) and fixed.size == 32
    mb = fixed.sample(8, 20, generator=iclab.generator(3))
    rows = [int(torch.nonzero((fixed.episodes.x_query == q).all(-1))[0]) for q in mb.x_query]
    assert len(set(rows)) == 8  # distinct contexts, all from the set
    assert torch.equal(mb.labels, fixed.episodes.labels[rows])
    assert torch.equal(mb.task["anchors"], fixed.episodes.task["anchors"][rows])
    again = fixed.sample(8, 20, generator=iclab.generator(3))
    assert torch.equal(again.x, mb.x)
    short = fixed.sample(4, 5, generator=iclab.generator(4), dtype=F64)
    assert short.x.shape == (4, 5, 10) and short.x.dtype == F64
    with pytest.raises(ConfigError, match=r"FixedEpisodes\.batch must be an int <= the set size L = 32; got 33"):
        fixed.sample(33, 20, generator=iclab.generator(0))
    with pytest.raises(ConfigError, match=r"FixedEpisodes\.n"):
        fixed.sample(4, 21, generator=iclab.generator(0))


def test_query_grid_and_expand_queries(quad) -> None:
    g = query_grid(101)
    assert g.shape == (101 * 101, 2)
    torch.testing.assert_close(g[1] - g[0], torch.tensor([0.02, 0.0], dtype=F64), rtol=0, atol=1e-12)
    assert float(g.min()) == -1.0 and float(g.max()) == 1.0
    ep = quad.sample(3, 10, generator=iclab.generator(1), dtype=F64)
    pts = g[::997]  # 11 points
    big = expand_queries(ep, pts)
    m = pts.shape[0]
    assert big.batch_size == 3 * m and big.label_query is None
    assert torch.equal(big.x[m : 2 * m], ep.x[1:2].expand(m, -1, -1))
    assert torch.equal(big.x_query[m : 2 * m], pts)
    torch.testing.assert_close(big.task["p_query"][m : 2 * m], log_probabilities(ep[1:2].task, pts[None]).exp()[0])
    with pytest.raises(ShapeError, match="expand_queries"):
        expand_queries(ep, torch.zeros(5, 3, dtype=F64))


def test_bad_input_is_named() -> None:
    g = iclab.generator(0)
    with pytest.raises(
        ConfigError, match=r"RBFMixtureCategorical\.W_e must be a \(d', C\) matrix with C >= 2 classes; got 'C = 1'"
    ):
        RBFMixtureCategorical(W_e=torch.randn(5, 1))
    with pytest.raises(ConfigError, match=r"random_embedding\.num_classes must be an int >= 2; got 1"):
        random_embedding(5, 1, generator=g)
    with pytest.raises(ConfigError, match=r"RBFMixtureCategorical\.n_anchors"):
        RBFMixtureCategorical(W_e=torch.randn(5, 4), n_anchors=5)
    with pytest.raises(ConfigError, match=r"RBFMixtureCategorical\.dist must be a float in \(0, 1\); got 1.5"):
        RBFMixtureCategorical(W_e=torch.randn(5, 25), dist=1.5)
    with pytest.raises(ConfigError, match=r"QuadrantCategorical\.d must be 2"):
        QuadrantCategorical(W_e=torch.randn(5, 20), d=3)
    with pytest.raises(ConfigError, match=r"QuadrantCategorical\.W_e .*C >= 4"):
        QuadrantCategorical(W_e=torch.randn(5, 3))
    with pytest.raises(ConfigError, match=r"RBFMixtureCategorical\.n must be an int >= 1"):
        RBFMixtureCategorical.draw(generator=g).sample(4, 0, generator=g)


@settings(max_examples=25, deadline=None)
@given(C=st.integers(2, 30), lo=st.integers(-5, 40), span=st.integers(0, 10))
def test_check_labels_property(C: int, lo: int, span: int) -> None:
    labels = torch.arange(lo, lo + span + 1)
    ok = lo >= 0 and lo + span < C
    if ok:
        check_labels("Owner", "labels", labels, C)
    else:
        with pytest.raises(
            ConfigError, match=rf"Owner\.labels must be in \[0, {C}\); got 'values in \[{lo}, {lo + span}\]'"
        ):
            check_labels("Owner", "labels", labels, C)
