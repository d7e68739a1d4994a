"""The cost probe (``iclab estimate``): it trains every run for a few steps, projects the full steps, keeps nothing."""

from __future__ import annotations

import functools
import json
import os

import pytest
from typer.testing import CliRunner

from iclab.cli import app
from iclab.core.errors import ConfigError
from iclab.experiments.estimate import estimate_experiment, format_seconds
from iclab.experiments.registry import RunProbe, get
from iclab.experiments.runner import resolve_config


def test_run_probe_projects_fixed_plus_steps_times_step_cost() -> None:
    p = RunProbe("r", "sampled", steps=10_000, probed_steps=50, seconds=1.5, fixed_seconds=0.5, step_seconds=0.02)
    assert p.projected_seconds == pytest.approx(0.5 + 0.02 * 10_000)


def test_probe_cuts_every_run_and_projects_its_full_steps(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    est = estimate_experiment("zhang2025.fig3", "quick", probe_steps=8)
    cfg = resolve_config(get("zhang2025.fig3"), "quick", (), None)
    assert est.complete and est.error is None
    # one batched run of all seeds per rank, trained in chunks (it stops early once at the last plateau)
    assert {r.name.split("-")[0] for r in est.runs} == {f"R{R}" for R in cfg.ranks}
    assert est.train_steps == cfg.train.steps * len(cfg.ranks)
    assert all(r.probed_steps == 8 for r in est.runs)
    assert est.train_steps == sum(r.steps for r in est.runs)
    # the projection replaces probe seconds by full-run seconds: more steps cost more
    assert est.projected_seconds > est.wall_seconds
    assert all(r.fixed_seconds >= 0 and r.step_seconds >= 0 for r in est.runs)
    assert os.listdir(tmp_path) == []  # nothing kept (no runs/ directory)
    # the projection holds for the machine and code probed: it carries their provenance
    assert est.probe_runs is None and est.provenance is not None
    d = est.to_dict()
    assert d["provenance"]["machine"]["threads"] == est.threads and d["overrides"] == []


def test_probe_runs_cap_trains_later_runs_one_step() -> None:
    est = estimate_experiment("zhang2025.fig3", "quick", probe_steps=6, probe_runs=1)
    assert len(est.runs) > 1
    assert est.runs[0].probed_steps == 6
    assert all(r.probed_steps == 1 for r in est.runs[1:])
    assert not est.runs[0].borrowed and all(r.borrowed for r in est.runs[1:])
    assert est.runs[1].step_seconds == pytest.approx(est.runs[0].step_seconds)
    assert est.probe_runs == 1 and est.to_dict()["probe_runs"] == 1  # recorded: the rest borrowed its cost


def test_runs_shorter_than_the_probe_run_in_full() -> None:
    est = estimate_experiment("ahn2023.theorem2", "smoke", probe_steps=100_000)
    assert all(r.probed_steps == r.steps for r in est.runs)


def test_experiment_without_training_is_timed_whole() -> None:
    est = estimate_experiment("ahn2023.theorem5", "smoke", probe_steps=5)
    assert est.runs == () and est.projected_seconds == pytest.approx(est.wall_seconds)


@pytest.mark.parametrize("bad", [0, -3, True, 2.5])
def test_bad_probe_steps_refused(bad) -> None:
    with pytest.raises(ConfigError, match="probe_steps"):
        estimate_experiment("zhang2025.fig3", "smoke", probe_steps=bad)


def test_bad_override_refused_before_work() -> None:
    with pytest.raises(ConfigError, match=r"train\.lr"):
        estimate_experiment("zhang2025.fig3", "smoke", overrides=["lr=-1"])


def test_cli_estimate_json() -> None:
    res = CliRunner().invoke(app, ["estimate", "zhang2025.fig1", "--preset", "smoke", "--probe-steps", "4", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("[") :])
    assert rows[0]["experiment"] == "zhang2025.fig1" and rows[0]["complete"]
    assert rows[0]["projected_seconds"] >= 0


def test_cli_estimate_unknown_experiment() -> None:
    res = CliRunner().invoke(app, ["estimate", "zhang2025.nope"])
    assert res.exit_code == 2


@pytest.mark.parametrize(
    ("seconds", "text"), [(3.25, "3.2 s"), (42, "42 s"), (600, "10.0 min"), (7200, "2.0 h"), (4 * 86_400, "4.0 d")]
)
def test_format_seconds(seconds, text) -> None:
    assert format_seconds(seconds) == text


@pytest.fixture
def trained_steps(monkeypatch) -> list[int]:
    """The step count of every training run the probe trains, in order (``execute_all`` wrapped)."""
    from iclab.experiments import registry

    calls: list[int] = []
    real = registry.execute_all

    def counting(runs, **kw):
        calls.extend(r.train.steps for r in runs)
        return real(runs, **kw)

    monkeypatch.setattr(registry, "execute_all", counting)
    return calls


def test_sampled_runs_are_probed_once_by_the_trainers_step_timer(trained_steps) -> None:
    """A sampled run's cost per step is the trainer's in-loop median step (+ the evaluation amortised), so it is
    trained once for ``probe_steps``, not a second time for half as many."""
    est = estimate_experiment("ahn2023.fig1", "smoke", probe_steps=6)
    assert est.runs and all(r.regime == "sampled" for r in est.runs)
    assert trained_steps == [6] * len(est.runs)
    for r in est.runs:
        assert r.step_seconds > 0 and r.fixed_seconds >= 0
        assert r.step_seconds * r.probed_steps <= r.seconds  # the steps' share cannot exceed the probe's wall


def test_token_level_full_batch_runs_are_probed_by_the_trainers_step_timer(trained_steps) -> None:
    """Full-batch GD of a token-level module (Zhang et al. Fig. 5's softmax models) goes through the trainer, whose
    step timer the trajectory carries: trained once for ``probe_steps``, no K vs K/2 wall difference."""
    est = estimate_experiment("zhang2025.fig5", "smoke", probe_steps=4)
    assert est.runs and all(r.regime == "full_batch" for r in est.runs)
    assert trained_steps == [4] * len(est.runs)
    # the median of 4 steps times 4 can pass the 4 steps' sum on a busy machine: 1.5x of slack
    assert all(r.step_seconds > 0 and r.step_seconds * r.probed_steps <= 1.5 * r.seconds for r in est.runs)


def test_trainer_step_timer_counts_every_step_and_evaluation() -> None:
    import torch

    from iclab.core.seeding import generator
    from iclab.models import LinearTransformer, LinearTransformerConfig
    from iclab.tasks.linear_regression import LinearRegression
    from iclab.training import TrainConfig
    from iclab.training.trainer import train

    model = LinearTransformer(LinearTransformerConfig(d=3, n_layers=1), generator=generator(0))
    cfg = TrainConfig(steps=9, batch_size=16, eval_every=4, eval_batch=32, progress=False, seed=0)
    sample = functools.partial(LinearRegression(d=3).sample, n=5)
    res = train(model, sample, cfg)
    t = res.timing
    assert t is not None and t.steps == 9 and t.evals == 3  # steps 0, 4, 8
    assert 0 < t.step_seconds < res.seconds and t.eval_seconds > 0
    assert t.draws == 9 and t.draw_every == 1  # a new batch every step (resample_every 1)
    assert t.per_step() == t.step_seconds + t.eval_seconds / 4 + t.draw_seconds
    assert torch.isfinite(torch.tensor(t.per_step()))


def test_trainer_step_timer_amortises_the_drawing_of_new_batches() -> None:
    """A batch drawn every ``resample_every`` steps is timed apart (a median step alone missed it: Cheng et al.'s
    ReLU-GP batch cost as much as the step) and amortised over the steps that share it; a fixed set is drawn once
    and stays out of the cost per step."""
    import time

    from iclab.core.seeding import generator
    from iclab.models import LinearTransformer, LinearTransformerConfig
    from iclab.tasks.linear_regression import LinearRegression
    from iclab.training import TrainConfig
    from iclab.training.trainer import train

    task = LinearRegression(d=3)

    def slow(batch, *, generator, dtype):
        time.sleep(0.05)
        return task.sample(batch, 5, generator=generator, dtype=dtype)

    model = LinearTransformer(LinearTransformerConfig(d=3, n_layers=1), generator=generator(0))
    cfg = TrainConfig(steps=9, batch_size=16, resample_every=3, eval_every=0, eval_batch=32, progress=False, seed=0)
    t = train(model, slow, cfg).timing
    assert t is not None and t.draws == 3 and t.draw_every == 3  # steps 0, 3, 6
    assert t.step_seconds < 0.05 <= t.draw_seconds
    assert t.per_step() == t.step_seconds + t.draw_seconds / 3
    fixed = TrainConfig(steps=9, batch_size=16, train_size=16, eval_every=0, eval_batch=32, progress=False, seed=0)
    t = train(model, slow, fixed).timing
    assert t is not None and t.draws == 1 and t.draw_every == 0 and t.per_step() == t.step_seconds
