"""The C steps of the separate-head reduced model (training/_reduced_flow.c): population flow (eq. 57, 84) and
full-batch GD on the moments of z (eq. 7, 44) give the torch loop's iterates, losses and snapshots (float64 to
1e-12 over hundreds of steps, float32 to rounding), with and without seeds, rank 1 and 2; other models keep the
torch loop."""

from __future__ import annotations

import pytest
import torch

import iclab
from iclab import models, tasks
from iclab.tasks.linear_regression import rotated_covariance
from iclab.training import _reduced_flow, full_batch_gd, population_flow

D, N = 4, 31
F64 = torch.float64


def _lambda() -> torch.Tensor:
    return rotated_covariance((0.4, 0.3, 0.2, 0.1), generator=iclab.generator(0))


def _separate(n_seeds: int | None, R: int, dtype: torch.dtype = F64) -> models.SeparateAttention:
    return models.SeparateAttention(D, 3, R, w_init=0.5, generator=iclab.generator(1), n_seeds=n_seeds).to(dtype)


def _both(run, monkeypatch):  # type: ignore[no-untyped-def]
    """(C, torch) trajectories of ``run()``; the C kernel is asserted to have run."""
    if _reduced_flow.native() is None:
        pytest.skip("the C kernel is off here (ICLAB_NATIVE=0 or no compiler): only the torch loop runs")
    calls = []
    for name in ("population_steps", "moment_steps"):
        real = getattr(_reduced_flow, name)
        monkeypatch.setattr(_reduced_flow, name, lambda *a, _f=real, **k: calls.append(1) or _f(*a, **k))
    fast = run()
    assert calls
    monkeypatch.setattr(_reduced_flow, "NATIVE", False)
    return fast, run()


def _close(a, b, rtol: float) -> None:  # type: ignore[no-untyped-def]
    assert torch.allclose(a.loss, b.loss, rtol=rtol, atol=0)
    for k in a.params:
        assert torch.allclose(a.params[k], b.params[k], rtol=rtol, atol=rtol * float(b.params[k].abs().max()))


@pytest.mark.parametrize(("n_seeds", "R"), [(None, 1), (None, 2), (3, 2)])
def test_population_flow_steps_equal_the_torch_loop(n_seeds, R, monkeypatch) -> None:
    Lam = _lambda()
    fast, slow = _both(
        lambda: population_flow(_separate(n_seeds, R), Lam, inv_n=1 / N, lr=0.5, steps=600, record_every=37),
        monkeypatch,
    )
    assert float(slow.loss.flatten()[-1]) < 0.5 * float(slow.loss.flatten()[0])  # it trains
    _close(fast, slow, 1e-12)


@pytest.mark.parametrize("n_seeds", [None, 2])
def test_full_batch_moment_steps_equal_the_torch_loop(n_seeds, monkeypatch) -> None:
    Lam = _lambda()
    task = tasks.LinearRegression(d=D, covariance=Lam)
    data = [task.sample(64, n=N, generator=iclab.generator(5 + s), dtype=F64) for s in range(n_seeds or 1)]
    episodes = data if n_seeds else data[0]

    def run():  # type: ignore[no-untyped-def]
        return full_batch_gd(_separate(n_seeds, 2), episodes, lr=0.5, steps=400, record_every=50, Lambda=Lam)

    fast, slow = _both(run, monkeypatch)
    _close(fast, slow, 1e-12)
    assert torch.allclose(fast.train_loss, slow.train_loss, rtol=1e-12, atol=0)


def test_float32_follows_the_torch_loop(monkeypatch) -> None:
    Lam = _lambda().float()
    fast, slow = _both(
        lambda: population_flow(_separate(2, 1, torch.float32), Lam, inv_n=1 / N, lr=0.5, steps=300, record_every=100),
        monkeypatch,
    )
    _close(fast, slow, 1e-4)


def test_other_models_keep_the_torch_loop() -> None:
    merged = models.MergedAttention(D, 2, w_init=0.5, generator=iclab.generator(1)).to(F64)
    blocks = models.SeparateAttention(D, 2, 1, w_init=0.5, generator=iclab.generator(1), all_blocks=True).to(F64)
    Lam = _lambda()
    for m in (merged, blocks):
        assert not _reduced_flow.population_steps(m, m.params(), 3, 0.1, Lam, Lam, Lam)
