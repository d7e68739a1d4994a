"""iclab.training.lbfgs.LBFGS: torch.optim.LBFGS's iterations with the two-loop recursion in C over ring buffers.

The direction is −H g for the L-BFGS inverse-Hessian estimate (Nocedal & Wright 2006, eq. 7.19, built here as a
dense matrix); whole runs equal torch.optim.LBFGS's in float64 to 1e-10, with and without the strong-Wolfe line
search, past the history size (the ring buffer wraps); a checkpoint of either optimiser continues bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iclab.training import lbfgs
from iclab.training.lbfgs import LBFGS, direction


def _dense_direction(pairs: list[tuple[torch.Tensor, torch.Tensor]], gamma: float, g: torch.Tensor) -> torch.Tensor:
    """−H g with H = V_kᵀ … (γ I) … V_k + Σ ρ s sᵀ terms, built by the BFGS update of eq. (7.19), oldest pair first."""
    p = g.numel()
    H = gamma * torch.eye(p, dtype=g.dtype)
    for s, y in pairs:
        rho = 1.0 / y.dot(s)
        V = torch.eye(p, dtype=g.dtype) - rho * torch.outer(y, s)
        H = V.T @ H @ V + rho * torch.outer(s, s)
    return -(H @ g)


def _state(pairs: list[tuple[torch.Tensor, torch.Tensor]], history: int) -> dict:
    state: dict = {"first": 0, "count": 0}
    for s, y in pairs:
        lbfgs._push(state, s, y, 1.0 / y.dot(s), history)
    return state


def _pairs(p: int, m: int, seed: int, dtype: torch.dtype = torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(p, p, generator=gen, dtype=dtype)
    A = A @ A.T + p * torch.eye(p, dtype=dtype)  # SPD: every yᵀs > 0
    steps = [torch.randn(p, generator=gen, dtype=dtype) for _ in range(m)]
    return [(s, A @ s) for s in steps]


@pytest.mark.parametrize("native", [True, False])
@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 23), m=st.integers(1, 12), history=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_direction_is_the_inverse_hessian_estimate_times_the_gradient(native, p, m, history, seed) -> None:
    pairs = _pairs(p, m, seed)
    gamma = 0.37
    g = torch.randn(p, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    old = lbfgs.NATIVE
    lbfgs.NATIVE = native
    try:
        d = direction(_state(pairs, history), g, torch.tensor(gamma, dtype=torch.float64))
    finally:
        lbfgs.NATIVE = old
    want = _dense_direction(pairs[-history:], gamma, g)
    assert torch.allclose(d, want, rtol=1e-10, atol=1e-10 * float(want.abs().max()))


def test_the_ring_buffer_keeps_the_newest_pairs_in_age_order() -> None:
    pairs = _pairs(4, 11, 0)
    state = _state(pairs, 3)
    cap, first, count = state["S"].shape[0], state["first"], state["count"]
    assert (cap, count) == (3, 3)
    rows = [(first + j) % cap for j in range(count)]
    for row, (s, y) in zip(rows, pairs[-3:], strict=True):
        assert torch.equal(state["S"][row], s) and torch.equal(state["Y"][row], y)


def test_the_buffers_grow_by_doubling_up_to_the_history() -> None:
    state = _state(_pairs(3, 20, 1), 600)
    assert state["S"].shape == (32, 3) and state["count"] == 20 and state["first"] == 0


def _problem(seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)).to(dtype)
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(torch.randn(q.shape, generator=gen, dtype=dtype) * 0.5)
    x = torch.randn(64, 5, generator=gen, dtype=dtype)
    y = torch.randn(64, 2, generator=gen, dtype=dtype)
    return model, x, y


def _run(opt_cls, model, x, y, steps: int, **kw) -> tuple[list[float], torch.optim.Optimizer]:
    opt = opt_cls(model.parameters(), **kw)
    losses = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        losses.append(float(opt.step(closure).detach()))
    return losses, opt


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
@pytest.mark.parametrize("native", [True, False])
def test_a_run_equals_torch_lbfgs_in_float64(line_search, native, monkeypatch) -> None:
    monkeypatch.setattr(lbfgs, "NATIVE", native)
    kw = dict(lr=0.5 if line_search is None else 1.0, history_size=6, max_iter=4, line_search_fn=line_search)
    ref, x, y = _problem()
    ours = copy.deepcopy(ref)
    # 16 steps × up to 4 iterations: the history wraps; longer runs amplify the dot products' rounding (1e-10 at 30)
    want, _ = _run(torch.optim.LBFGS, ref, x, y, 16, **kw)
    got, opt = _run(LBFGS, ours, x, y, 16, **kw)
    assert want[-1] < 0.3 * want[0]  # it descends (not a run stuck at its start)
    assert got == pytest.approx(want, rel=1e-10, abs=1e-12)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9)
    assert opt.state[next(ours.parameters())]["count"] == 6


def test_float32_follows_torch_lbfgs_to_rounding() -> None:
    kw = dict(lr=0.5, history_size=600, max_iter=4)
    ref, x, y = _problem(dtype=torch.float32)
    ours = copy.deepcopy(ref)
    want, _ = _run(torch.optim.LBFGS, ref, x, y, 8, **kw)
    got, _ = _run(LBFGS, ours, x, y, 8, **kw)
    assert got == pytest.approx(want, rel=1e-4)  # float32 dots rounded apart: 3e-5 at step 8, 0.6 % at step 18


@pytest.mark.parametrize("source", [torch.optim.LBFGS, LBFGS])
def test_a_checkpoint_of_either_optimiser_continues(source) -> None:
    kw = dict(lr=0.5, history_size=5, max_iter=4)
    model, x, y = _problem(1)
    _, opt = _run(source, model, x, y, 7, **kw)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    straight, _ = _run_from(source, model, opt, x, y, 8)  # the same optimiser object, 8 more steps
    resumed_model, _, _ = _problem(1)
    resumed_model.load_state_dict(saved_model)
    resumed_opt = LBFGS(resumed_model.parameters(), **kw)
    resumed_opt.load_state_dict(saved_opt)
    again, _ = _run_from(LBFGS, resumed_model, resumed_opt, x, y, 8)
    if source is LBFGS:
        assert again == straight  # bit for bit
    else:
        assert again == pytest.approx(straight, rel=1e-10)
    assert "old_dirs" not in resumed_opt.state[next(resumed_model.parameters())]


def _run_from(_cls, model, opt, x, y, steps: int) -> tuple[list[float], torch.optim.Optimizer]:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return [float(opt.step(closure).detach()) for _ in range(steps)], opt


def test_a_second_parameter_group_is_refused() -> None:
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = LBFGS([a])
    opt.add_param_group({"params": [b]})
    with pytest.raises(ValueError, match="one parameter group"):
        opt.step(lambda: a.sum() + b.sum())


def test_a_trainer_run_stopped_and_continued_is_bit_identical(tmp_path) -> None:
    """The trainer's checkpoint holds this optimiser's ring buffers (their shapes pass its state check) and a stopped
    L-BFGS run continues bit for bit."""
    from iclab.core.seeding import generator
    from iclab.models import LinearTransformer, LinearTransformerConfig
    from iclab.tasks import LinearRegression
    from iclab.training import TrainConfig, train
    from iclab.training.stop import Stopped

    def model() -> LinearTransformer:
        cfg = LinearTransformerConfig(d=3, n_layers=2, pattern="pattern11", init_std=0.1)
        return LinearTransformer(cfg, generator=generator(0))

    sample = lambda batch, **kw: LinearRegression(d=3).sample(batch, n=8, **kw)  # noqa: E731
    cfg = TrainConfig(
        steps=24, batch_size=128, train_size=128, resample_every=0, optimizer="lbfgs", lr=0.1, lbfgs_history=10,
        eval_every=6, eval_batch=64, checkpoint_every=0, progress=False,
    )  # fmt: skip
    full = train(model(), sample, cfg)
    with pytest.raises(Stopped):
        train(model(), sample, cfg, out_dir=tmp_path, stop_when=lambda done: done == 11)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["optimizer"]["state"][0]
    assert state["S"].shape[0] == state["count"] == 10  # 11 steps × 4 iterations: the history of 10 is full
    resumed = train(model(), sample, cfg, out_dir=tmp_path)
    assert resumed.history == full.history
    for p, q in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(p, q)
