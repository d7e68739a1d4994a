"""Long runs in pieces: a run asked to stop (``--time-limit``, SIGTERM, SIGUSR1, SIGINT) checkpoints at its next
step boundary, the command exits 75 (130 after Ctrl-C), and the same call continues bit for bit."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from iclab import ConfigError
from iclab.cli import app
from iclab.core.seeding import generator
from iclab.experiments.runner import progress_text, run_experiment
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import TrainConfig, TrainingRun, TrainResult, load_history, stop, train
from iclab.training.run import ModelSpec

TASK = LinearRegression(d=3)
SAMPLE = functools.partial(TASK.sample, n=8)
# ahn2023.fig1 at smoke: one sampled training run of 20 steps (two with seeds=2); its claims' frozen smoke values
EXP, ARGS = "ahn2023.fig1", ["seeds=2"]
FROZEN = json.loads((Path(__file__).parent / "data" / "smoke_claims.json").read_text())


def _model() -> LinearTransformer:
    return LinearTransformer(
        LinearTransformerConfig(d=3, n_layers=2, pattern="sparse", init_std=0.1), generator=generator(0)
    )


def _cfg() -> TrainConfig:
    return TrainConfig(
        steps=40,
        batch_size=32,
        lr=0.01,
        eval_every=10,
        eval_batch=64,
        checkpoint_every=15,
        resample_every=7,
        snapshot_every=10,
        progress=False,
    )


def _snap(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {"A": m.A}  # type: ignore[dict-item]


def _sigterm_at(monkeypatch: pytest.MonkeyPatch, k: int) -> Callable[[], bool]:
    """From now on the k-th stop check requests a stop as the SIGTERM handler does; returns the real check."""
    calls = {"n": 0}
    real = stop.should_stop

    def should_stop() -> bool:
        calls["n"] += 1
        if calls["n"] == k:
            stop.request("SIGTERM")
        return real()

    monkeypatch.setattr(stop, "should_stop", should_stop)
    return real


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.history == b.history
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert a.snapshot_steps == b.snapshot_steps
    for k in a.snapshots:
        assert torch.equal(a.snapshots[k], b.snapshots[k])


@pytest.mark.parametrize("at", [17, 30])  # between checkpoints, and on one
def test_stopped_run_continues_bit_identically(tmp_path: Path, at: int) -> None:
    full = train(_model(), SAMPLE, _cfg(), out_dir=tmp_path / "full", snapshot_fn=_snap)
    with pytest.raises(stop.Stopped, match=rf"^incomplete: train at step {at}/40; run the same command"):
        train(_model(), SAMPLE, _cfg(), out_dir=tmp_path / "piece", snapshot_fn=_snap, stop_when=lambda k: k == at)
    rest = train(_model(), SAMPLE, _cfg(), out_dir=tmp_path / "piece", snapshot_fn=_snap)
    assert rest.resumed_from == at
    _same(full, rest)
    assert load_history(tmp_path / "piece") == load_history(tmp_path / "full")


def test_a_signal_stops_at_the_next_step_boundary(tmp_path: Path) -> None:
    """SIGUSR1 (what SLURM sends before its time limit) raised at step 11: the run checkpoints step 12 and stops."""

    def signal_at(k: int) -> bool:
        if k == 11:
            os.kill(os.getpid(), signal.SIGUSR1)
        return False

    full = train(_model(), SAMPLE, _cfg(), snapshot_fn=_snap)
    with stop.handling(), pytest.raises(stop.Stopped) as e:
        train(_model(), SAMPLE, _cfg(), out_dir=tmp_path, snapshot_fn=_snap, stop_when=signal_at)
    assert (e.value.reason, e.value.exit_code, e.value.progress) == ("SIGUSR1", 75, "train at step 12/40")
    assert stop.requested() is None  # the handlers and the flag are cleared after the command
    _same(full, train(_model(), SAMPLE, _cfg(), out_dir=tmp_path, snapshot_fn=_snap))


def test_past_deadline_starts_nothing(tmp_path: Path) -> None:
    with stop.handling(deadline=time.time() - 1), pytest.raises(stop.Stopped, match="train not started") as e:
        train(_model(), SAMPLE, _cfg(), out_dir=tmp_path)
    assert e.value.reason == "time limit" and e.value.not_started == 1
    assert not (tmp_path / "checkpoint.pt").exists()


def test_parse_duration() -> None:
    assert [stop.parse_duration(t) for t in ("90s", "45m", "2h", "1h30m", "1d", "30", "0.5s")] == [
        90,
        2700,
        7200,
        5400,
        86400,
        30,
        0.5,
    ]
    for bad in ("", "0s", "5x", "h", "1h 30m", "-3m", "1.5.2s"):
        with pytest.raises(ConfigError, match="--time-limit must be a duration > 0"):
            stop.parse_duration(bad)


def test_stopped_pickles_with_its_counts() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(stop.Stopped("seed1 at step 3/20", "SIGINT", 2)))
    assert (e.progress, e.reason, e.not_started, e.exit_code) == ("seed1 at step 3/20", "SIGINT", 2, 130)


def test_cli_run_stops_mid_run_and_continues_with_the_same_claims(tmp_path: Path, monkeypatch) -> None:
    """``iclab run``: a SIGTERM at the 5th stop check (one before the run's steps, then one after each step) exits 75
    with one line and writes no claims; the same command says how much is done, finishes, and measures the claims of
    an uninterrupted run (the frozen smoke values)."""
    real = _sigterm_at(monkeypatch, 5)
    cli = ["run", EXP, "--preset", "smoke", "--out", str(tmp_path)]
    first = CliRunner().invoke(app, cli)
    assert first.exit_code == 75, first.output
    line = "incomplete: ahn2023.fig1: 0 runs finished, 1 partial (seed0 at step 4/20); run the same command to continue"
    assert line in first.output
    run_dir = next((tmp_path / EXP).iterdir())
    assert not (run_dir / "claims.json").exists() and not (run_dir / "results.pt").exists()
    monkeypatch.setattr(stop, "should_stop", real)
    second = CliRunner().invoke(app, [*cli, "--json"])
    assert second.exit_code == 0, second.output
    assert "ahn2023.fig1: resuming: 0 runs finished, 1 partial (seed0 at step 4/20)" in second.output
    claims = json.loads((run_dir / "claims.json").read_text())
    assert {c["name"]: c["measured"] for c in claims} == FROZEN[EXP]
    assert progress_text(run_dir) == "1 run finished"


def test_a_finished_experiment_counts_the_time_of_every_piece(tmp_path: Path, monkeypatch) -> None:
    """summary.json's seconds are the wall time of all pieces (the stopped ones kept in pieces.json, which the finish
    folds into the summary and removes), and ``pieces`` says how many; a run in one piece has no ``pieces``."""
    calls = {"n": 0}
    real = stop.should_stop

    def stop_every_4th() -> bool:
        calls["n"] += 1
        if calls["n"] % 4 == 0:
            stop.request("SIGTERM")
        return real()

    monkeypatch.setattr(stop, "should_stop", stop_every_4th)
    cli = ["run", EXP, "--preset", "smoke", "--out", str(tmp_path)]
    for _ in range(2):
        assert CliRunner().invoke(app, cli).exit_code == 75
    run_dir = next((tmp_path / EXP).iterdir())
    stopped = [p["seconds"] for p in json.loads((run_dir / "pieces.json").read_text())]
    assert len(stopped) == 2 and all(s > 0 for s in stopped)
    monkeypatch.setattr(stop, "should_stop", real)
    assert CliRunner().invoke(app, cli).exit_code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pieces"] == 3 and summary["seconds"] > sum(stopped)
    assert not (run_dir / "pieces.json").exists()
    assert CliRunner().invoke(app, cli).exit_code == 0  # reused: the same time and pieces
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    one = tmp_path / "one"
    assert CliRunner().invoke(app, ["run", EXP, "--preset", "smoke", "--out", str(one)]).exit_code == 0
    assert "pieces" not in json.loads(next((one / EXP).iterdir()).joinpath("summary.json").read_text())


def test_a_piece_that_ends_on_a_failed_run_counts_its_time(tmp_path: Path, monkeypatch) -> None:
    """A training run that raises ends the command with its error; the time that piece took goes to pieces.json, and
    the same command, once the cause is gone, finishes with ``pieces`` = 2 and the time of both."""
    real = TrainingRun.execute

    def fails(self, **kw):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        raise RuntimeError("boom")

    monkeypatch.setattr(TrainingRun, "execute", fails)
    cli = ["run", EXP, "--preset", "smoke", "--out", str(tmp_path)]
    assert CliRunner().invoke(app, cli).exit_code != 0
    run_dir = next((tmp_path / EXP).iterdir())
    (failed,) = [p["seconds"] for p in json.loads((run_dir / "pieces.json").read_text())]
    assert failed >= 0.05
    monkeypatch.setattr(TrainingRun, "execute", real)
    assert CliRunner().invoke(app, cli).exit_code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pieces"] == 2 and summary["seconds"] > failed


def test_the_summary_names_the_runs_that_skipped_nonfinite_steps(tmp_path: Path, monkeypatch, caplog) -> None:
    """A run that skipped steps for a non-finite loss or gradient is named in summary.json (``skipped_steps``: run ->
    [skipped, steps]) and in one warning line, as is one that diverged and trained again at a lower lr (``retried``:
    run -> [lr, step, retry lr]); a reused experiment keeps the entries; a clean one has none."""
    monkeypatch.setattr(TrainResult, "skipped_steps", property(lambda self: 3))
    real = TrainingRun.execute

    def retried(self: TrainingRun, **kw: object) -> TrainResult:
        result = real(self, **kw)
        if self.name == "seed1":
            result.retry = {"lr": 0.02, "step": 7, "retry_lr": 0.01}
        return result

    monkeypatch.setattr(TrainingRun, "execute", retried)
    cli = ["run", EXP, "--preset", "smoke", "--out", str(tmp_path), *ARGS]
    with caplog.at_level("WARNING"):
        assert CliRunner().invoke(app, cli).exit_code == 0
    run_dir = next((tmp_path / EXP).iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_steps"] == {"seed0": [3, 20], "seed1": [3, 20]}
    assert summary["retried"] == {"seed1": [0.02, 7, 0.01]}
    assert (
        f"{EXP}: 2 training runs skipped steps with a non-finite loss or gradient (seed0: 3 of 20, seed1: 3 of 20)"
        in (caplog.text)
    )
    assert f"{EXP}: 1 training run diverged and trained again at a lower lr (seed1: lr 0.02 at step 7, then 0.01)" in (
        caplog.text
    )
    monkeypatch.undo()
    assert CliRunner().invoke(app, cli).exit_code == 0  # reused: the entry stays
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    clean = tmp_path / "clean"
    assert CliRunner().invoke(app, ["run", EXP, "--preset", "smoke", "--out", str(clean)]).exit_code == 0
    assert not {"skipped_steps", "retried"} & set(
        json.loads(next((clean / EXP).iterdir()).joinpath("summary.json").read_text())
    )


def test_cli_train_stops_and_continues(tmp_path: Path, monkeypatch) -> None:
    """``iclab train``: SIGTERM at the 4th stop check (before the steps, then after steps 1-3) exits 75 at step 3;
    the same command finishes with the metrics of an uninterrupted run."""
    yaml = "task: {{d: 3, n: 6}}\nmodel: {{n_layers: 1, pattern: sparse}}\n"
    yaml += "train: {{steps: 30, batch_size: 32, eval_batch: 32, eval_every: 5, progress: false}}\nout: {}\n"
    for name in ("pieces", "whole"):
        (tmp_path / f"{name}.yaml").write_text(yaml.format(tmp_path / name))
    real = _sigterm_at(monkeypatch, 4)
    first = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "pieces.yaml"), "--time-limit", "1h"])
    assert first.exit_code == 75 and "at step 3/30; run the same command to continue" in first.output, first.output
    monkeypatch.setattr(stop, "should_stop", real)
    for name in ("pieces", "whole"):
        res = CliRunner().invoke(app, ["train", "--config", str(tmp_path / f"{name}.yaml")])
        assert res.exit_code == 0, res.output
    (a,), (b,) = (list((tmp_path / n).glob("*/metrics.jsonl")) for n in ("pieces", "whole"))
    assert a.read_text() == b.read_text()


def test_cli_rejects_a_bad_time_limit(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", EXP, "--preset", "smoke", "--out", str(tmp_path), "--time-limit", "soon"])
    assert res.exit_code == 2 and "--time-limit must be a duration > 0" in res.output


def _iclab(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iclab", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_time_limit_subprocess_exits_75_then_finishes(tmp_path: Path, workers: str) -> None:
    """``iclab run <smoke card> --time-limit 1s`` exits 75 with the one line; the same command finishes with the
    claims of an uninterrupted run (in this process, and with ``--workers 2``)."""
    whole = run_experiment(EXP, "smoke", out=tmp_path / "whole", overrides=ARGS)
    cli = ["run", EXP, *ARGS, "--preset", "smoke", "--out", str(tmp_path / "pieces"), "--workers", workers]
    first = _iclab(*cli, "--time-limit", "1s")
    assert first.returncode == 75, first.stderr
    assert first.stderr.strip().splitlines()[-1].startswith("incomplete: ahn2023.fig1: ")
    assert first.stderr.strip().endswith("; run the same command to continue")
    second = _iclab(*cli, "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == whole.claims_json()


@pytest.mark.slow
def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    """Ctrl-C twice: the first asks the runs to stop, the second kills the command (by the signal, exit 130 in a
    shell)."""
    code = (
        "import os, signal, time\n"
        "from iclab.training import stop\n"
        "with stop.handling():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    assert stop.requested() == 'SIGINT'\n"
        "    print('first', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(30)\n"
        "print('survived')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == -signal.SIGINT and p.stdout == "first\n", p.stderr


@pytest.mark.parametrize(
    "text", ["[1, 2", "[1, 2]", "3", '{"seconds": 3}', '[{"seconds": -1}]', '[{"seconds": "abc"}]']
)
def test_a_damaged_pieces_file_is_moved_aside_and_its_time_not_counted(tmp_path: Path, text: str) -> None:
    from iclab.experiments.runner import add_piece, pieces_seconds

    (tmp_path / "pieces.json").write_text(text)
    assert pieces_seconds(tmp_path) == []
    assert not (tmp_path / "pieces.json").exists() and list(tmp_path.iterdir())  # quarantined beside
    add_piece(tmp_path, 2.5)
    add_piece(tmp_path, 1.0)
    assert pieces_seconds(tmp_path) == [2.5, 1.0]


def test_not_started_leaves_out_the_runs_an_earlier_piece_trained(tmp_path: Path) -> None:
    """A stop's "N not started" counts the runs of the batch with no checkpoint: one an earlier piece finished (or
    began) is in the progress line as finished (or partial) already. In this process, and as a pool's outcomes."""
    from iclab.experiments._tasks import Outcome
    from iclab.experiments.registry import _recount_not_started
    from iclab.training.run import ModelSpec, TrainingRun, execute_all

    spec = ModelSpec(LinearTransformer, LinearTransformerConfig(d=3, n_layers=2, pattern="sparse", init_std=0.1))
    cfg = TrainConfig(steps=4, batch_size=16, eval_every=0, progress=False)
    runs = [TrainingRun(name=f"r{i}", model=spec, task=SAMPLE, train=cfg, out_dir=tmp_path / f"r{i}") for i in range(4)]
    execute_all([runs[2]])  # an earlier piece finished r2
    stop.request("SIGTERM")
    try:
        with pytest.raises(stop.Stopped) as e:
            execute_all(runs)
    finally:
        stop.reset()
    assert e.value.progress == "r0 not started" and e.value.not_started == 3  # r0, r1, r3
    not_started = [stop.Stopped(f"x/r{i} not started", "SIGTERM", 4) for i in range(4)]
    outcomes = [Outcome(i, f"x/r{i}", v) for i, v in enumerate(not_started)]
    _recount_not_started(runs, outcomes)
    assert {v.not_started for v in not_started} == {3}


def _softmax_run(out_dir: Path | None, steps: int = 12) -> TrainingRun:
    """A full-batch run of Zhang et al. 2025 Fig. 5's token-level softmax attention (separate rank-one key and
    query), small: the regime whose paper runs take over an hour each."""
    from iclab.experiments.zhang2025._setup import token_spec

    spec = token_spec(3, 2, key_query="separate", activation="softmax", init_std=0.1)
    data = LinearRegression(d=3).sample(16, 6, generator=generator(1), dtype=torch.float64)
    cfg = TrainConfig(steps=steps, lr=0.5, eval_every=3, checkpoint_every=5, progress=False)
    return TrainingRun(name="softmax", model=spec, task=data, train=cfg, regime="full_batch", out_dir=out_dir)


@pytest.mark.parametrize("at", [4, 5, 11])  # between checkpoints, on one, the step before the last
def test_a_token_level_full_batch_run_stops_and_continues_bit_identically(tmp_path: Path, monkeypatch, at: int) -> None:
    """A token-level full-batch run (``TrainingRun.checkpoints``) checkpoints when asked to stop and the same call
    continues it: its trajectory (steps, parameters, training losses) equals an uninterrupted run's bit for bit, and a
    finished run is loaded, not retrained. The reduced models' runs keep no checkpoint."""
    full = _softmax_run(None).execute().trajectory
    real = _sigterm_at(monkeypatch, at + 1)  # one check before the run, then one after each step but the last
    run = _softmax_run(tmp_path / "softmax")
    assert run.checkpoints
    try:
        with pytest.raises(stop.Stopped, match=rf"softmax at step {at}/12"):
            run.execute()
    finally:
        stop.reset()
    monkeypatch.setattr(stop, "should_stop", real)
    assert progress_text(tmp_path) == f"0 runs finished, 1 partial (softmax at step {at}/12)"
    pieces = run.execute().trajectory
    again = run.execute()  # loaded from the finished checkpoint
    assert again.timing is None and progress_text(tmp_path) == "1 run finished"
    for traj in (pieces, again.trajectory):
        assert full is not None and traj is not None
        assert torch.equal(traj.steps, full.steps) and torch.equal(traj.train_loss, full.train_loss)
        assert full.params.keys() == traj.params.keys()
        assert all(torch.equal(traj.params[k], full.params[k]) for k in full.params)
    from iclab.models import MergedAttention

    reduced = TrainingRun(
        name="m", model=ModelSpec(MergedAttention, kwargs={"d": 3, "n_heads": 1}), task=_softmax_run(None).task,
        train=TrainConfig(steps=3), regime="full_batch",
    )  # fmt: skip
    assert not reduced.checkpoints


def test_cli_run_of_a_full_batch_card_stops_mid_run_and_continues_with_the_same_claims(
    tmp_path: Path, monkeypatch
) -> None:
    """``iclab run zhang2025.fig5``: its softmax runs train by full-batch GD; a SIGTERM in the middle of the first one
    exits 75 with that run partial, and the same command continues it and measures the frozen smoke claims."""
    exp = "zhang2025.fig5"
    real = _sigterm_at(monkeypatch, 4)
    cli = ["run", exp, "--preset", "smoke", "--out", str(tmp_path)]
    first = CliRunner().invoke(app, cli)
    assert first.exit_code == 75, first.output
    assert "0 runs finished, 1 partial (merged-seed0 at step 3/6), 1 not started" in first.output
    monkeypatch.setattr(stop, "should_stop", real)
    second = CliRunner().invoke(app, [*cli, "--json"])
    assert second.exit_code == 0, second.output
    run_dir = next((tmp_path / exp).iterdir())
    claims = json.loads((run_dir / "claims.json").read_text())
    assert {c["name"]: c["measured"] for c in claims} == FROZEN[exp]
    assert progress_text(run_dir) == "2 runs finished"
