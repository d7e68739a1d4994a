"""training.TrainingRun, the unit of work of every experiment: it pickles, it trains exactly what the trainer
(or Zhang et al.'s integrators) would, it resumes, and it refuses a malformed spec before any work."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pickle

import pytest
import torch

from iclab import ConfigError
from iclab.core.config import config_hash
from iclab.core.errors import DivergenceError
from iclab.core.seeding import derive_seed, generator
from iclab.models import LinearTransformer, LinearTransformerConfig, MergedAttention
from iclab.tasks import LinearRegression
from iclab.training import (
    ModelSpec,
    TrainConfig,
    TrainingRun,
    execute_all,
    full_batch_gd,
    population_flow,
    train,
)

TASK = LinearRegression.random_rotation((1.0, 0.5, 0.25), generator=generator(3))
MCFG = LinearTransformerConfig(d=3, n_layers=2, pattern="sparse", init_std=0.1)
TCFG = TrainConfig(steps=25, batch_size=64, lr=0.01, eval_every=5, eval_batch=128, snapshot_every=5, progress=False)


def snapshot_A(model: LinearTransformer) -> dict[str, torch.Tensor]:
    return {"A": model.A[:, 0]}


def _run(**kw: object) -> TrainingRun:
    base: dict[str, object] = dict(
        name="seed4",
        model=ModelSpec(LinearTransformer, MCFG),
        task=functools.partial(TASK.sample, n=8),
        train=TCFG,
        seed=4,
        snapshot=snapshot_A,
    )
    base.update(kw)
    return TrainingRun(**base)  # type: ignore[arg-type]


def test_a_run_trains_exactly_what_the_trainer_trains() -> None:
    res = _run().execute()
    model = LinearTransformer(MCFG, generator=generator(derive_seed(4, "init")))
    ref = train(model, functools.partial(TASK.sample, n=8), dataclasses.replace(TCFG, seed=4), snapshot_fn=snapshot_A)
    assert res.history == ref.history
    assert res.snapshot_steps == ref.snapshot_steps == [0, 5, 10, 15, 20, 25]
    assert torch.equal(res.snapshots["A"], ref.snapshots["A"])
    for p, q in zip(res.model.parameters(), ref.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert (res.name, res.seed) == ("seed4", 4)
    steps, loss = res.curve_tensor("test_loss")
    assert steps.dtype == torch.int64 and loss.dtype == torch.float64 and steps.tolist() == [0, 5, 10, 15, 20, 24]


def test_init_key_and_seed_decide_the_initialisation() -> None:
    a = _run().build_model()
    b = _run(init_key=("init", "other")).build_model()
    c = _run(seed=5).build_model()
    assert torch.equal(a.A, _run().build_model().A)
    assert not torch.equal(a.A, b.A) and not torch.equal(a.A, c.A)


def test_a_run_pickles_and_the_copy_gives_the_same_result() -> None:
    spec = _run()
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec or copy.name == spec.name  # partials of bound methods compare by identity
    a, b = spec.execute(), copy.execute()
    assert a.history == b.history
    assert pickle.loads(pickle.dumps(a)).history == a.history  # the result travels back too


def test_a_run_resumes_from_its_directory(tmp_path) -> None:
    spec = _run(out_dir=tmp_path / "seed4", train=dataclasses.replace(TCFG, checkpoint_every=10))
    first = spec.execute()
    again = spec.execute()  # finished: loaded, not retrained
    assert again.resumed_from == 25 and again.history == first.history
    assert (tmp_path / "seed4" / "checkpoint.pt").is_file() and (tmp_path / "seed4" / "metrics.jsonl").is_file()


def test_full_batch_regime_is_full_batch_gd() -> None:
    Lam = torch.diag(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    task = LinearRegression(d=3, covariance=Lam)
    eps = [task.sample(200, 6, generator=generator(derive_seed(s, "train")), dtype=torch.float64) for s in range(2)]
    kw = dict(d=3, n_heads=2, w_init=0.1, n_seeds=2)
    cfg = TrainConfig(optimizer="sgd", steps=40, lr=0.05, eval_every=10, batch_size=200, dtype="float64")
    spec = TrainingRun(
        name="merged",
        model=ModelSpec(MergedAttention, kwargs=kw, dtype="float64"),
        task=eps,
        train=cfg,
        regime="full_batch",
        Lambda=Lam,
    )
    res = spec.execute()
    ref_model = MergedAttention(**kw, generator=generator(derive_seed(0, "init"))).double()  # type: ignore[arg-type]
    ref = full_batch_gd(ref_model, eps, lr=0.05, steps=40, record_every=10, Lambda=Lam)
    assert res.trajectory is not None and res.history == []
    assert torch.equal(res.trajectory.loss, ref.loss) and torch.equal(res.trajectory.steps, ref.steps)
    assert torch.equal(res.trajectory.train_loss, ref.train_loss)


def test_population_regime_is_population_flow() -> None:
    Lam = torch.diag(torch.tensor([0.6, 0.4], dtype=torch.float64))
    model = MergedAttention(2, 2, w_init=0.1, generator=generator(1)).double()
    twin = MergedAttention(2, 2, w_init=0.1, generator=generator(1)).double()
    cfg = TrainConfig(optimizer="sgd", steps=30, lr=0.1, eval_every=3)
    res = TrainingRun(name="pop", model=model, task=Lam, train=cfg, regime="population", inv_n=0.1).execute()
    ref = population_flow(twin, Lam, inv_n=0.1, lr=0.1, steps=30, record_every=3)
    assert res.model is model  # a built module is trained in place
    assert res.trajectory is not None and torch.equal(res.trajectory.loss, ref.loss)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (dict(name=""), "name must be a non-empty string"),
        (dict(regime="online"), "regime must be one of"),
        (dict(model=LinearTransformerConfig()), "model must be a ModelSpec or an nn.Module"),
        (dict(train={"lr": 0.1}), "train must be a TrainConfig"),
        (dict(task=None), "task must be a sampler"),
        (dict(regime="full_batch"), "task must be an Episode or a sequence of Episodes"),
        (dict(regime="population"), "task must be the covariance"),
        (dict(regime="population", task=torch.eye(3)), "inv_n must be set in the population regime"),
    ],
)
def test_a_malformed_run_is_refused_at_construction(changes: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _run(**changes)


def test_execute_all_keeps_order_and_refuses_repeated_names() -> None:
    runs = [_run(name="a", seed=1), _run(name="b", seed=2)]
    res = execute_all(runs)
    assert [r.name for r in res] == ["a", "b"] and [r.seed for r in res] == [1, 2]
    with pytest.raises(ConfigError, match=r"distinct names; repeated: \['a'\]"):
        execute_all([runs[0], runs[0]])


# --------------------------------------------------------------------------------------------------- retry_lr

#: plain SGD at lr 1 blows this model up within a few steps (a non-finite loss: DivergenceError); at 0.05 it trains
DIVERGING = TrainConfig(steps=20, batch_size=64, lr=1.0, optimizer="sgd", eval_every=5, eval_batch=128, progress=False)


def test_a_run_that_diverges_trains_again_from_its_initial_weights_at_a_lower_lr(tmp_path, caplog) -> None:
    """With ``retry_lr`` a run that diverges trains once more from the same initial weights at lr × retry_lr, in
    ``out_dir/retry``: its weights are those of a fresh run at that lr, bit for bit; ``diverged.json`` records the
    first attempt (lr, the step it diverged at, the retry lr), and a second call goes straight to the finished retry.
    The first attempt's own checkpoints are kept, and :func:`run_progress` counts the retry, not them."""
    from iclab.experiments.runner import run_progress

    out = tmp_path / "runs" / "r"
    run = _run(train=dataclasses.replace(DIVERGING, checkpoint_every=1), retry_lr=0.05, snapshot=None, out_dir=out)
    with caplog.at_level("WARNING"):
        res = run.execute()
    assert res.retry is not None and res.retry["lr"] == 1.0 and res.retry["retry_lr"] == 0.05
    step = res.retry["step"]
    assert 1 <= step < DIVERGING.steps
    assert f"seed4: diverged at step {step} with lr 1" in caplog.text and "at lr 0.05 (retry_lr)" in caplog.text
    stored = json.loads((out / "retry" / "diverged.json").read_text())
    assert stored == res.retry | {"config": config_hash(dataclasses.replace(run.train, seed=4))}
    fresh = _run(train=dataclasses.replace(DIVERGING, lr=0.05, checkpoint_every=1), snapshot=None).execute()
    assert res.history == fresh.history and math.isfinite(res.final_test_loss)
    for p, q in zip(res.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert (out / "checkpoint.pt").is_file()  # the first attempt's last good checkpoint stays
    assert run_progress(tmp_path / "runs") == (1, [])
    caplog.clear()
    with caplog.at_level("WARNING"):
        again = run.execute()
    assert "diverged" not in caplog.text and again.retry == res.retry and again.resumed_from == DIVERGING.steps
    # a damaged record: the first attempt resumes, diverges again and writes it anew
    (out / "retry" / "diverged.json").write_text('{"lr": 1.0, "st')
    with caplog.at_level("WARNING"):
        third = run.execute()
    assert "the first attempt resumes" in caplog.text and third.retry == res.retry
    assert json.loads((out / "retry" / "diverged.json").read_text()) == stored
    # another config (here 30 steps at lr 0.02, which trains): the record is not this run's, the first attempt trains
    other = dataclasses.replace(run, train=dataclasses.replace(run.train, lr=0.02, optimizer="adam"))
    assert other.execute().retry is None and json.loads((out / "retry" / "diverged.json").read_text()) == stored


def test_without_retry_lr_a_divergence_is_raised_with_its_step() -> None:
    """No ``retry_lr``: the DivergenceError reaches the caller, its step on it (also after a pickle round trip, the
    way a worker's error could travel)."""
    with pytest.raises(DivergenceError) as info:
        _run(train=DIVERGING, snapshot=None).execute()
    assert info.value.step is not None and f"at step {info.value.step}" in str(info.value)
    back = pickle.loads(pickle.dumps(info.value))
    assert back.step == info.value.step and str(back) == str(info.value)
    in_memory = _run(train=DIVERGING, snapshot=None, retry_lr=0.05).execute()  # no out_dir: retried in memory
    assert in_memory.retry == {"lr": 1.0, "step": info.value.step, "retry_lr": 0.05}


def test_the_context_names_the_runs_that_retried(tmp_path) -> None:
    """RunContext.execute keeps, per run that diverged and retried, (lr, step, retry lr): the runner's summary reads
    it; a run that trained at its own lr is not named."""
    from iclab.experiments.registry import RunContext

    runs = [
        _run(name="bad", train=DIVERGING, snapshot=None, retry_lr=0.05),
        _run(name="good", train=dataclasses.replace(DIVERGING, lr=0.05), snapshot=None, retry_lr=0.05),
    ]
    ctx = RunContext(out_dir=tmp_path, device=torch.device("cpu"), preset="smoke")
    results = ctx.execute(runs)
    assert results[1].retry is None and set(ctx.retried) == {"bad"}
    lr, step, retry = ctx.retried["bad"]
    assert (lr, retry) == (1.0, 0.05) and step == results[0].retry["step"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(retry_lr=1.5), r"TrainingRun\('seed4'\).retry_lr must be null or a float in \(0, 1\); got 1.5"),
        (dict(retry_lr=0), r"retry_lr must be null or a float in \(0, 1\); got 0"),
        (dict(retry_lr=True), r"retry_lr must be null or a float in \(0, 1\); got True"),
        (dict(retry_lr=0.5, model=LinearTransformer(MCFG)), r"model must be a ModelSpec with retry_lr"),
        (
            dict(retry_lr=0.5, regime="population", task=torch.eye(3), inv_n=0.1),
            r"retry_lr must be null outside the sampled regime",
        ),
    ],
)
def test_retry_lr_is_checked(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _run(**kw)
