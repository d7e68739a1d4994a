"""Polynomial regression tasks (Sun, Jadbabaie, Azizan 2025, Sec. 2.1, 4.2) and the [1; x; 0; y] prompt."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F32, F64, assert_close
from iclab import ConfigError, models, tasks
from iclab.tasks.polynomial import all_monomials, block_features, monomials, quadratic_features, smat


def test_quadratic_monomials_in_eq7_order() -> None:
    a = all_monomials(3, 2)
    assert a.tolist() == [
        [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1],
        [2, 0, 0], [1, 1, 0], [1, 0, 1], [0, 2, 0], [0, 1, 1], [0, 0, 2],
    ]  # fmt: skip
    for d in (1, 2, 3, 4, 5):
        assert all_monomials(d, 2).shape[0] == math.comb(d + 2, 2)
        assert all_monomials(d, 3).shape[0] == math.comb(d + 3, 3)
    assert tasks.quadratic(4).n_monomials == 15 and tasks.sparse_cubic().n_monomials == 10


def test_sample_is_the_polynomial_of_its_coefficients() -> None:
    task = tasks.quadratic(3)
    ep = task.sample(50, 7, generator=iclab.generator(0), dtype=F64)
    assert ep.x.shape == (50, 7, 3) and ep.y.shape == (50, 7) and ep.task["w"].shape == (50, 10)
    x, w = ep.x, ep.task["w"]
    manual = w[:, :1] + (w[:, None, 1:4] * x).sum(-1)
    for m, (j, k) in enumerate([(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]):
        manual = manual + w[:, None, 4 + m] * x[..., j] * x[..., k]
    assert_close(ep.y, manual)
    # svec convention: f(x) = [1 xᵀ] W [1; x] with W = smat(w)
    xb = torch.cat([torch.ones(50, 1, dtype=F64), ep.x_query], -1)
    assert_close(torch.einsum("bi,bij,bj->b", xb, smat(w, 3), xb), ep.y_query)


def test_sparse_cubic_has_the_ten_terms_of_sec_4_2() -> None:
    task = tasks.sparse_cubic()
    ep = task.sample(20, 5, generator=iclab.generator(1), dtype=F64)
    x, w = ep.x_query, ep.task["w"]
    x1, x2, x3, x4 = x.unbind(-1)
    terms = torch.stack(
        [torch.ones_like(x1), x1, x2, x3, x4, x1 * x2, x2 * x3, x3 * x4, x1 * x2 * x3, x2 * x3 * x4], -1
    )
    assert_close(ep.y_query, (w * terms).sum(-1))
    assert task.degree == 3


def test_zero_predictor_loss_closed_form_and_monte_carlo() -> None:
    assert tasks.quadratic(3).zero_predictor_loss() == 16 and tasks.quadratic(4).zero_predictor_loss() == 23
    assert tasks.sparse_cubic().zero_predictor_loss() == 10
    ep = tasks.quadratic(3).sample(200_000, 1, generator=iclab.generator(2), dtype=F64)
    y2 = ep.y_query**2
    assert abs(y2.mean().item() - 16) < 4 * y2.std().item() / math.sqrt(y2.numel())


def test_seeded_and_dtype() -> None:
    task = tasks.quadratic(2)
    a = task.sample(4, 3, generator=iclab.generator(5))
    b = task.sample(4, 3, generator=iclab.generator(5))
    assert torch.equal(a.y, b.y) and a.dtype == F32
    assert task.sample(4, 3, generator=iclab.generator(5), dtype=F64).dtype == F64


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 4), degree=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_monomials_match_direct_powers(d: int, degree: int, seed: int) -> None:
    a = all_monomials(d, degree)
    x = torch.randn(3, 5, d, generator=iclab.generator(seed), dtype=F64)
    direct = torch.prod(x.unsqueeze(-2) ** a, dim=-1)
    assert_close(monomials(x, a), direct)
    assert monomials(x, a).shape == (3, 5, a.shape[0])


def test_feature_maps() -> None:
    x = torch.tensor([[2.0, 3.0]], dtype=F64)
    assert quadratic_features(x).tolist() == [[1, 2, 3, 3, 6, 8]]
    assert block_features(x, 1).tolist() == [[1, 2, 3, 4, 6]]
    assert block_features(x, 2).tolist() == [[1, 2, 3, 6, 9]]
    assert block_features(x, 3).tolist() == [[1, 2, 3, 4, 6]]  # cyclic


def test_explicit_monomial_table() -> None:
    task = tasks.PolynomialRegression(d=2, monomials=((0, 0), (2, 1)))
    ep = task.sample(3, 4, generator=iclab.generator(0), dtype=F64)
    w = ep.task["w"]
    assert_close(ep.y, w[:, :1] + w[:, 1:] * ep.x[..., 0] ** 2 * ep.x[..., 1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d=0), r"PolynomialRegression.d must be an int >= 1; got 0"),
        (dict(d=3, monomials="cubic"), r"monomials must be one of \('quadratic', 'sparse_cubic'\).*got 'cubic'"),
        (dict(d=3, monomials="sparse_cubic"), r"d must be 4 for monomials='sparse_cubic'"),
        (dict(d=2, monomials=((1, 0, 0),)), r"an \(M, 2\) table of integer exponents"),
        (dict(d=2, monomials=((1, -1),)), r"non-negative exponents"),
        (dict(d=2, monomials=((1, 0), (1, 0))), r"distinct monomials"),
        (dict(d=2, monomials=-1), r"a degree >= 0"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tasks.PolynomialRegression(**kwargs)


def test_monomial_set_names_its_caller() -> None:
    """A bad monomial set given to FeatureLeastSquares is reported as its own field, not PolynomialRegression's."""
    ep = tasks.quadratic(3).sample(4, 5, generator=iclab.generator(0), dtype=F64)
    with pytest.raises(ConfigError, match=r"^FeatureLeastSquares\.monomials must be one of .*got 'cubic'"):
        iclab.algorithms.FeatureLeastSquares("cubic").predict(ep)
    with pytest.raises(ConfigError, match=r"^FeatureLeastSquares\.d must be 4 for monomials='sparse_cubic'.*got 3"):
        iclab.algorithms.FeatureLeastSquares("sparse_cubic").predict(ep)
    with pytest.raises(ConfigError, match=r"^FeatureLeastSquares\.monomials must be a degree >= 0; got -2"):
        iclab.algorithms.FeatureLeastSquares(-2).predict(ep)
    with pytest.raises(ConfigError, match=r"^PolynomialRegression\.monomials must be one of"):
        tasks.polynomial.monomial_set(3, "cubic")  # the default owner


def test_bad_batch_or_n() -> None:
    with pytest.raises(ConfigError, match=r"PolynomialRegression.n must be an int >= 1"):
        tasks.quadratic(2).sample(4, 0, generator=iclab.generator(0))


def test_embed_scratch_layout() -> None:
    ep = tasks.quadratic(2).sample(3, 4, generator=iclab.generator(0), dtype=F64)
    z = models.embed_scratch(ep, 6)
    assert z.shape == (3, 5, 7)
    assert torch.equal(z[..., 0], torch.ones(3, 5, dtype=F64))
    assert torch.equal(z[:, :4, 1:3], ep.x) and torch.equal(z[:, 4, 1:3], ep.x_query)
    assert torch.equal(z[..., 3:6], torch.zeros(3, 5, 3, dtype=F64))
    assert torch.equal(z[:, :4, -1], ep.y) and torch.equal(z[:, 4, -1], torch.zeros(3, dtype=F64))
    with pytest.raises(ConfigError, match=r"embed_scratch.d_bar must be an int >= d \+ 1 = 3; got 2"):
        models.embed_scratch(ep, 2)
