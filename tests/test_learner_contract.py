"""One test battery, run on every learner (STYLE item 10; sklearn's estimator_checks).

Every entry of ``LEARNERS`` is a factory for a fresh learner on d = 4 inputs; every ``check_*``
takes a factory and raises on a broken contract. Known limits are declared in ``KNOWN_LIMITS``
with a reason and become strict xfails: if a limit is lifted the test XPASSes and fails, so the
declaration has to be removed.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import iclab
from conftest import F32, F64, assert_close, random_episode, random_spd
from iclab import algorithms, constructions, models
from iclab.models.linear_attention import ACTIVATIONS, PATTERNS

D = 4  # input dimension of every learner below
B, N = 7, 9  # batch and context size of the check episodes (B != D on purpose, see the xfail at the end)
Factory = Callable[[], iclab.Learner]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


def _preconditioners(L: int, seed: int) -> torch.Tensor:
    """(L, d, d) non-symmetric preconditioners around 0.4·I."""
    return 0.4 * torch.eye(D, dtype=F64) + 0.15 * _randn(L, D, D, seed=seed)


def _lsa(pattern: str, activation: str, n_heads: int = 1) -> nn.Module:
    cfg = models.LinearTransformerConfig(
        d=D, n_layers=2, n_heads=n_heads, pattern=pattern, activation=activation, init_std=0.3
    )
    return models.LinearTransformer(cfg, generator=iclab.generator(11)).to(F64)


LEARNERS: dict[str, Factory] = {
    "gd": lambda: algorithms.gd(torch.tensor([0.3, 0.2, 0.4], dtype=F64), d=D),
    "pgd": lambda: algorithms.pgd(random_spd(D, seed=1), torch.tensor([0.5, 0.3], dtype=F64)),
    "PGD": lambda: algorithms.PGD(_preconditioners(3, seed=2)),
    "PGD-per-prompt": lambda: algorithms.PGD(0.4 * torch.eye(D, dtype=F64) + 0.1 * _randn(2, B, D, D, seed=3)),
    "GDPlusPlus": lambda: algorithms.GDPlusPlus(
        torch.tensor([0.4, 0.5, 0.3], dtype=F64), torch.tensor([0.1, -0.2, 0.05], dtype=F64), random_spd(D, seed=4)
    ),
    "LeastSquares": algorithms.LeastSquares,
    "Ridge": lambda: algorithms.Ridge(0.1),
    "BayesPosteriorMean-oracle": algorithms.BayesPosteriorMean,  # reads task['w_cov'], task['noise_var']
    "BayesPosteriorMean-prior": lambda: algorithms.BayesPosteriorMean(prior_cov=random_spd(D, seed=5), noise_var=0.05),
    **{f"lsa-{p}-{a}": (lambda p=p, a=a: _lsa(p, a)) for p in PATTERNS for a in ACTIVATIONS},
    "lsa-full-linear-3heads": lambda: _lsa("full", "linear", n_heads=3),
    "lsa-pattern11-relu-2heads": lambda: _lsa("pattern11", "relu", n_heads=2),
    "construction-pgd": lambda: constructions.pgd(_preconditioners(3, seed=6)),
    "construction-gd_plus_plus": lambda: constructions.gd_plus_plus(
        torch.tensor([0.4, 0.5], dtype=F64), torch.tensor([0.2, -0.1], dtype=F64), random_spd(D, seed=7)
    ),
    "construction-one_layer": lambda: constructions.one_layer(_preconditioners(1, seed=8)[0]),
    "construction-one_layer-relu": lambda: constructions.one_layer(_preconditioners(1, seed=9)[0], activation="relu"),
}
# Later systems add their learners from ``tests/contract_<family>.py`` modules, each defining
# ``LEARNERS`` (factories for d = D inputs) and optionally ``KNOWN_LIMITS`` in the same form.
_EXTRA_LIMITS: dict[tuple[str, str], str] = {}
for _path in sorted(Path(__file__).parent.glob("contract_*.py")):
    _mod = importlib.import_module(_path.stem)
    assert _mod.D == D, f"{_path.name} must build learners for d = {D}"
    _clash = set(_mod.LEARNERS) & set(LEARNERS)
    assert not _clash, f"{_path.name} redefines learners {_clash}"
    LEARNERS.update(_mod.LEARNERS)
    _EXTRA_LIMITS.update(getattr(_mod, "KNOWN_LIMITS", {}))
MODULES = [name for name, make in LEARNERS.items() if isinstance(make(), nn.Module)]


def _fresh(make: Factory, dtype: torch.dtype) -> iclab.Learner:
    """A new learner whose parameters (if any) are in ``dtype``: modules follow PyTorch's ``.to``."""
    learner = make()
    return learner.to(dtype) if isinstance(learner, nn.Module) else learner


def _predict(learner: iclab.Learner, episode: iclab.Episode) -> torch.Tensor:
    with torch.no_grad():
        return learner.predict(episode)


def _episode(dtype: torch.dtype = F64, *, batch: int = B, n: int = N, seed: int = 0) -> iclab.Episode:
    # Small noise so that the oracle's σ² > 0 and no prediction is an exact interpolation.
    return random_episode(batch, n, D, seed=seed, dtype=dtype, noise_std=0.1, covariance=random_spd(D, seed=99))


def _nontrivial(y: torch.Tensor) -> None:
    """Every check compares predictions; they must be O(1) or the comparison proves nothing."""
    assert torch.isfinite(y).all(), y
    assert float(y.abs().max()) > 1e-2, f"predictions too small for the check to mean anything: {y}"


# --- the checks -------------------------------------------------------------------------------


def check_is_learner(make: Factory) -> None:
    assert isinstance(make(), iclab.Learner)


def check_predict_shape_and_dtype(make: Factory) -> None:
    """(B,) +ŷ in the episode's dtype, for float32 and float64 (modules cast with ``.to`` first)."""
    for dtype in (F32, F64):
        y = _predict(_fresh(make, dtype), _episode(dtype))
        assert y.shape == (B,)
        assert y.dtype == dtype
        _nontrivial(y)


def check_dtype_follows_episode(make: Factory) -> None:
    """One learner object serves float32 and float64 episodes, and answers in the episode's dtype."""
    learner = make()
    for dtype in (F32, F64):
        y = _predict(learner, _episode(dtype))
        assert y.dtype == dtype


def check_batch_independent(make: Factory) -> None:
    """Predicting a sub-batch (or a permuted batch) equals slicing the full prediction."""
    learner, ep = _fresh(make, F64), _episode()
    full = _predict(learner, ep)
    _nontrivial(full)
    assert_close(_predict(learner, ep[2:5]), full[2:5], rtol=1e-12, atol=1e-12)
    perm = torch.randperm(B, generator=iclab.generator(1))
    assert_close(_predict(learner, ep[perm]), full[perm], rtol=1e-12, atol=1e-12)


def check_context_order_invariant(make: Factory) -> None:
    """Permuting the n context pairs leaves every prediction unchanged (float64, 1e-10)."""
    learner, ep = _fresh(make, F64), _episode()
    perm = torch.randperm(N, generator=iclab.generator(2))
    assert not torch.equal(perm, torch.arange(N))
    shuffled = dataclasses.replace(ep, x=ep.x[:, perm], y=ep.y[:, perm])
    y = _predict(learner, ep)
    _nontrivial(y)
    assert_close(_predict(learner, shuffled), y)


def check_float32_matches_float64(make: Factory) -> None:
    """A float32 episode and its ``.to(float64)`` copy give the same predictions to float32 precision."""
    ep32 = _episode(F32)
    ep64 = ep32.to(dtype=F64)
    y32, y64 = _predict(_fresh(make, F32), ep32), _predict(_fresh(make, F64), ep64)
    assert y32.dtype == F32 and y64.dtype == F64
    _nontrivial(y64)
    scale = float(y64.abs().max())
    assert_close(y32.to(F64), y64, rtol=1e-4, atol=1e-4 * scale)


def check_ignores_y_query(make: Factory) -> None:
    """No learner reads the target: NaN, garbage or no y_query at all changes nothing, bit for bit."""
    learner, ep = _fresh(make, F64), _episode()
    y = _predict(learner, ep)
    for y_query in (torch.full((B,), float("nan"), dtype=F64), 1e6 * torch.randn(B, dtype=F64), None):
        assert torch.equal(_predict(learner, dataclasses.replace(ep, y_query=y_query)), y)


def check_ignores_true_weights(make: Factory) -> None:
    """Oracles may read Σ or the prior, never the answer w⋆ of the prompt."""
    learner, ep = _fresh(make, F64), _episode()
    y = _predict(learner, ep)
    task = {**ep.task, "w": torch.full_like(ep.task["w"], float("nan"))}
    assert torch.equal(_predict(learner, dataclasses.replace(ep, task=task)), y)


def check_does_not_mutate_episode(make: Factory) -> None:
    learner, ep = _fresh(make, F64), _episode()
    before = [t.clone() for t in (ep.x, ep.y, ep.x_query, ep.y_query, *ep.task.values())]
    _predict(learner, ep)
    after = [ep.x, ep.y, ep.x_query, ep.y_query, *ep.task.values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def check_deterministic(make: Factory) -> None:
    learner, ep = _fresh(make, F64), _episode()
    assert torch.equal(_predict(learner, ep), _predict(learner, ep))


def check_small_context(make: Factory) -> None:
    """n = 1 and n < d are valid episodes: finite (B,) predictions."""
    learner = _fresh(make, F64)
    for n in (1, D - 1):
        y = _predict(learner, _episode(n=n, seed=3))
        assert y.shape == (B,) and torch.isfinite(y).all()


CHECKS = [
    check_is_learner,
    check_predict_shape_and_dtype,
    check_dtype_follows_episode,
    check_batch_independent,
    check_context_order_invariant,
    check_float32_matches_float64,
    check_ignores_y_query,
    check_ignores_true_weights,
    check_does_not_mutate_episode,
    check_deterministic,
    check_small_context,
]

KNOWN_LIMITS: dict[tuple[str, str], str] = {
    **{
        (name, "check_dtype_follows_episode"): (
            "nn.Module learners keep their parameters' dtype (PyTorch convention): "
            "call model.to(episode.dtype) first; a mismatch raises a ShapeError naming both dtypes"
        )
        for name in MODULES
    },
    ("PGD-per-prompt", "check_batch_independent"): (
        "per-prompt preconditioners (L, B, d, d) belong to the B prompts they were built for; "
        "a sub-batch of another size cannot be paired with them"
    ),
    **_EXTRA_LIMITS,
}


def _cases():
    for name in LEARNERS:
        for check in CHECKS:
            reason = KNOWN_LIMITS.get((name, check.__name__))
            marks = [pytest.mark.xfail(strict=True, raises=(RuntimeError, ValueError), reason=reason)] if reason else []
            yield pytest.param(name, check, id=f"{name}-{check.__name__}", marks=marks)


@pytest.mark.parametrize(("name", "check"), list(_cases()))
def test_learner_contract(name: str, check: Callable[[Factory], None]) -> None:
    check(LEARNERS[name])


def test_known_limits_name_real_learners_and_checks() -> None:
    """A stale KNOWN_LIMITS entry would silently excuse nothing; keep the table honest."""
    check_names = {c.__name__ for c in CHECKS}
    for name, check in KNOWN_LIMITS:
        assert name in LEARNERS and check in check_names


def test_every_pattern_and_activation_is_in_the_battery() -> None:
    for p in PATTERNS:
        for a in ACTIVATIONS:
            assert f"lsa-{p}-{a}" in LEARNERS


def test_regression_learners_reject_classification_episodes() -> None:
    """A classification episode has no float y; regression learners say so with a ValueError."""
    ep = _episode()
    cls = iclab.Episode(x=ep.x, x_query=ep.x_query, labels=torch.zeros(B, N, dtype=torch.long))
    for name, make in LEARNERS.items():
        with pytest.raises(ValueError, match="regression episode"):
            _predict(_fresh(make, F64), cls)
        assert name  # the loop ran for every learner


def test_oracle_batch_independent_when_batch_equals_d() -> None:
    learner, ep = algorithms.BayesPosteriorMean(), _episode(batch=D)
    full = _predict(learner, ep)
    assert_close(_predict(learner, ep[1:3]), full[1:3], rtol=1e-12, atol=1e-12)


# --- the battery catches broken learners (sklearn tests its own estimator checks the same way) ---


class _Cheater:
    """Predicts the target it should not see."""

    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        return episode.y_query + 0.0 * episode.x_query.sum(-1)


class _PositionWeighted:
    """Least squares with weights that depend on the position of a pair in the context."""

    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        wts = torch.linspace(0.5, 1.5, episode.n, dtype=episode.dtype)  # (n,)
        w = torch.linalg.lstsq(episode.x * wts[:, None], (episode.y * wts).unsqueeze(-1)).solution  # (B, d, 1)
        return (episode.x_query.unsqueeze(1) @ w).reshape(-1)


class _BatchCoupled:
    """Subtracts the batch mean: each prediction depends on the other prompts."""

    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        y = algorithms.Ridge(0.1).predict(episode)
        return y - y.mean()


class _Float32Only:
    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        return algorithms.Ridge(0.1).predict(episode).float()


class _Mutator:
    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        episode.x.mul_(1.0 + 1e-3)
        return algorithms.Ridge(0.1).predict(episode)


@pytest.mark.parametrize(
    ("make", "check"),
    [
        (_Cheater, check_ignores_y_query),
        (_PositionWeighted, check_context_order_invariant),
        (_BatchCoupled, check_batch_independent),
        (_Float32Only, check_predict_shape_and_dtype),
        (_Float32Only, check_dtype_follows_episode),
        (_Mutator, check_does_not_mutate_episode),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_battery_catches_broken_learner(make: Factory, check: Callable[[Factory], None]) -> None:
    with pytest.raises(AssertionError):
        check(make)
