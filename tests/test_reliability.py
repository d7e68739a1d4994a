"""Faults injected into runs (docs/reliability.md): damaged files, planted pickles, two writers, a full or
read-only disk, oversized batches, divergence. Nothing is lost, nothing on disk is executed, no traceback."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from iclab.cli import app
from iclab.core.errors import ConfigError, CorruptFileError, DivergenceError, OutputError
from iclab.core.io import atomic_torch_save, safe_torch_load
from iclab.core.memory import check_fits
from iclab.core.seeding import generator
from iclab.experiments.locks import RunLockedError, run_lock
from iclab.experiments.runner import run_experiment
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import TrainConfig, train
from iclab.training import trainer as trainer_mod

TASK = LinearRegression(d=3)
SAMPLE = functools.partial(TASK.sample, n=10)
EXP = "zhang2025.fig1"  # a smoke run of a few seconds


def _model() -> LinearTransformer:
    return LinearTransformer(LinearTransformerConfig(d=3, n_layers=1, init_std=0.1), generator=generator(0))


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=40, batch_size=32, lr=0.01, checkpoint_every=10, eval_every=10, eval_batch=64, progress=False)
    return TrainConfig(**{**base, **kw})


class _Boom:
    """A pickle that runs code when loaded: it would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"model": _Boom(marker)}))
    path.with_name(path.name + ".sha256").unlink(missing_ok=True)


# --- damaged files -------------------------------------------------------------------------------------------------


def test_safe_load_names_the_file_for_garbage_truncation_and_bit_flips(tmp_path) -> None:
    path = tmp_path / "x.pt"
    atomic_torch_save(path, {"w": torch.arange(10_000.0)})
    data = path.read_bytes()
    assert torch.equal(safe_torch_load(path)["w"], torch.arange(10_000.0))
    for damaged in (
        data[: len(data) // 2],
        b"garbage" * 10,
        bytes(b ^ 0xFF if i == len(data) // 2 else b for i, b in enumerate(data)),
    ):
        path.write_bytes(damaged)
        with pytest.raises(CorruptFileError, match="x.pt"):
            safe_torch_load(path)


def test_planted_pickle_is_refused_and_never_runs(tmp_path) -> None:
    marker = tmp_path / "pwned"
    _plant_pickle(tmp_path / "evil.pt", marker)
    with pytest.raises(CorruptFileError, match=r"evil\.pt: refused to unpickle"):
        safe_torch_load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_torn_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog) -> None:
    full = train(_model(), SAMPLE, _cfg())
    out = tmp_path / "run"
    crash_cfg = _cfg()

    class Crash(Exception):
        pass

    calls = {"n": 0}

    def crashing(batch: int, **kw):
        calls["n"] += 1
        if calls["n"] == 2 + 35:  # the batch of step 35 (probe, test, then one per step)
            raise Crash
        return SAMPLE(batch, **kw)

    with pytest.raises(Crash):
        train(_model(), crashing, crash_cfg, out_dir=out)
    assert (out / "checkpoint.pt").is_file() and (out / "checkpoint.prev.pt").is_file()
    ck = out / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:100])  # torn
    with caplog.at_level(logging.WARNING, logger="iclab"):
        resumed = train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert resumed.resumed_from == 20  # the previous checkpoint
    assert resumed.history == full.history
    assert "checkpoint.pt" in caplog.text and "falling back" in caplog.text
    assert (out / "checkpoint.pt.corrupt").is_file()  # kept aside, not deleted


def test_both_checkpoints_damaged_restarts_the_run(tmp_path, caplog) -> None:
    out = tmp_path / "run"
    full = train(_model(), SAMPLE, _cfg(), out_dir=out)
    (out / "checkpoint.pt").write_bytes(b"junk")
    _plant_pickle(out / "checkpoint.prev.pt", tmp_path / "pwned")
    with caplog.at_level(logging.WARNING, logger="iclab"):
        again = train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert again.resumed_from is None and again.history == full.history
    assert "restarting this training run" in caplog.text
    assert not (tmp_path / "pwned").exists()


def test_damaged_results_and_summary_are_recomputed(tmp_path, caplog) -> None:
    first = run_experiment(EXP, "smoke", out=tmp_path)
    (first.out_dir / "results.pt").write_bytes(b"not a torch file")
    (first.out_dir / "summary.json").write_text("{")
    (first.out_dir / "claims.json").write_text("\x00")
    with caplog.at_level(logging.WARNING, logger="iclab"):
        again = run_experiment(EXP, "smoke", out=tmp_path)
    assert not again.reused and "results.pt" in caplog.text
    assert [c.to_dict() for c in again.claims] == [c.to_dict() for c in first.claims]
    json.loads((again.out_dir / "claims.json").read_text())
    json.loads((again.out_dir / "summary.json").read_text())


def test_malicious_results_pickle_never_runs(tmp_path, caplog) -> None:
    first = run_experiment(EXP, "smoke", out=tmp_path)
    marker = tmp_path / "pwned"
    _plant_pickle(first.out_dir / "results.pt", marker)
    with caplog.at_level(logging.WARNING, logger="iclab"):
        again = run_experiment(EXP, "smoke", out=tmp_path)
    assert not marker.exists()
    assert "results.pt" in caplog.text and "refused to unpickle" in caplog.text
    assert (first.out_dir / "results.pt.corrupt").is_file()
    assert [c.measured for c in again.claims] == [c.measured for c in first.claims]


def test_reused_results_load_without_pickle_and_match(tmp_path) -> None:
    first = run_experiment(EXP, "smoke", out=tmp_path)
    again = run_experiment(EXP, "smoke", out=tmp_path)
    assert again.reused and [c.measured for c in again.claims] == [c.measured for c in first.claims]


def test_cli_damaged_run_dir_gives_no_traceback(tmp_path, caplog) -> None:
    args = ["run", EXP, "--preset", "smoke", "--out", str(tmp_path)]
    assert CliRunner().invoke(app, args).exit_code == 0
    (run_dir,) = (tmp_path / EXP).iterdir()
    (run_dir / "results.pt").write_bytes(b"\x80\x04garbage")
    for ck in run_dir.rglob("checkpoint.pt"):
        ck.write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="iclab"):
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and res.exception is None, res.output
    assert "damaged results" in caplog.text


# --- one writer per run directory ----------------------------------------------------------------------------------


def test_second_writer_waits_then_reuses(tmp_path) -> None:
    results = {}

    def go(key: str) -> None:
        results[key] = run_experiment(EXP, "smoke", out=tmp_path)

    threads = [threading.Thread(target=go, args=(k,)) for k in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.reused for r in results.values()) == [False, True]  # computed once


def test_no_wait_names_the_holder(tmp_path) -> None:
    first = run_experiment(EXP, "smoke", out=tmp_path)
    with run_lock(first.out_dir):
        with pytest.raises(RunLockedError, match=rf"process {os.getpid()} on "):
            run_experiment(EXP, "smoke", out=tmp_path, wait=False)
        res = CliRunner().invoke(app, ["run", EXP, "--preset", "smoke", "--out", str(tmp_path), "--no-wait"])
    assert res.exit_code == 2 and "is being written by" in res.output and res.exc_info[0] is SystemExit


@pytest.mark.slow
def test_two_cli_processes_at_once_compute_once(tmp_path) -> None:
    cmd = [sys.executable, "-m", "iclab.cli", "run", EXP, "--preset", "smoke", "--out", str(tmp_path), "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert json.loads(outs[0][0]) == json.loads(outs[1][0])
    summary = json.loads(next((tmp_path / EXP).iterdir()).joinpath("summary.json").read_text())
    assert summary["passed"]


# --- memory, disk --------------------------------------------------------------------------------------------------


def test_oversized_batch_refused_before_allocation(tmp_path) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"train\.batch_size = 1000000000 needs an estimated .* GiB"):
        train(_model(), SAMPLE, _cfg(batch_size=1_000_000_000), out_dir=tmp_path / "r")
    assert time.perf_counter() - t0 < 5
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


def test_oversized_batch_in_an_experiment_names_the_experiment_field(tmp_path) -> None:
    args = ["run", "ahn2023.fig1", "--preset", "smoke", "--out", str(tmp_path), "batch_size=1000000000"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "train.batch_size = 1000000000 needs an estimated" in " ".join(res.output.split())


def test_allow_large_lifts_the_memory_check(monkeypatch) -> None:
    huge = 1e18
    with pytest.raises(ConfigError, match="x.batch_size"):
        check_fits("x", "batch_size", 1, huge, torch.device("cpu"))
    monkeypatch.setenv("ICLAB_ALLOW_LARGE", "1")
    check_fits("x", "batch_size", 1, huge, torch.device("cpu"))


def _no_writes() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_unwritable_out_fails_before_any_work(tmp_path) -> None:
    cmd = [sys.executable, "-m", "iclab.cli", "run", EXP, "--preset", "smoke", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_no_writes)
    assert res.returncode == 2 and "cannot write the run directory" in res.stderr and "Traceback" not in res.stderr
    assert not list(tmp_path.rglob("checkpoint.pt"))


def test_read_only_out(tmp_path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through read-only permissions; the RLIMIT_FSIZE test covers this case")
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="cannot write the run directory"):
            run_experiment(EXP, "smoke", out=tmp_path / "runs")
    finally:
        tmp_path.chmod(0o755)


def test_disk_full_mid_run_keeps_the_last_good_checkpoint(tmp_path, monkeypatch) -> None:
    real, calls = trainer_mod.atomic_torch_save, {"n": 0}

    def filling(path, obj):
        calls["n"] += 1
        if calls["n"] == 3:  # the third checkpoint (step 30) finds the disk full
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, obj)

    monkeypatch.setattr(trainer_mod, "atomic_torch_save", filling)
    out = tmp_path / "run"
    with pytest.raises(OutputError, match=r"No space left on device.*last good checkpoint is kept.*step 20"):
        train(_model(), SAMPLE, _cfg(), out_dir=out)
    monkeypatch.setattr(trainer_mod, "atomic_torch_save", real)
    resumed = train(_model(), SAMPLE, _cfg(), out_dir=out)  # space freed: the same call resumes
    assert resumed.resumed_from == 20
    assert resumed.history == train(_model(), SAMPLE, _cfg()).history


# --- divergence ----------------------------------------------------------------------------------------------------


def test_divergence_names_step_parameter_and_last_loss_and_keeps_the_good_checkpoint(tmp_path) -> None:
    out = tmp_path / "run"
    cfg = _cfg(optimizer="sgd", lr=3.0, steps=200, log_every=1)
    with pytest.raises(DivergenceError) as info:
        train(_model(), SAMPLE, cfg, out_dir=out)
    msg = str(info.value)
    assert (
        "at step" in msg
        and "last finite train loss" in msg
        and "lower lr or enable clip" in msg
        and "skip_nonfinite" in msg
    )
    assert "parameter" in msg or "non-finite loss" in msg
    if (out / "checkpoint.pt").is_file():  # the checkpoint on disk is the last good one, never the diverged state
        ck = safe_torch_load(out / "checkpoint.pt")
        assert all(torch.isfinite(v).all() for v in ck["model"].values())
        assert "the last good checkpoint is kept" in msg


def test_atomic_writes_are_readable_like_open(tmp_path: Path) -> None:
    """mkstemp makes 0600 files; an atomically written report or figure is readable as open() would make it."""
    import os

    from iclab.core.io import FILE_MODE, atomic_write_text

    atomic_write_text(tmp_path / "report.md", "x")
    assert os.stat(tmp_path / "report.md").st_mode & 0o777 == FILE_MODE
    assert FILE_MODE & 0o044, "group and others may read (under the usual umask)"
