"""Faults at the writes of a run (docs/reliability.md): divergence between the metrics rows, a crash at any step of a
checkpoint rotation, a full disk at any write, checkpoints that load but do not fit the model, and ``iclab train``'s
errors. Nothing acknowledged is lost, no diverged state is written or resumed, no traceback."""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from iclab.cli import app
from iclab.core import io as io_mod
from iclab.core.errors import ConfigError, DivergenceError, OutputError
from iclab.core.io import atomic_torch_save, quarantine, safe_torch_load
from iclab.core.seeding import generator
from iclab.experiments import registry
from iclab.experiments.registry import ClaimResult, Experiment, RunContext
from iclab.experiments.runner import run_experiment
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import ModelSpec, TrainConfig, TrainingRun, train
from iclab.training import trainer as trainer_mod

TASK = LinearRegression(d=3)
SAMPLE = functools.partial(TASK.sample, n=10)


def _model() -> LinearTransformer:
    return LinearTransformer(LinearTransformerConfig(d=3, n_layers=1, init_std=0.1), generator=generator(0))


def _cfg(**kw: Any) -> TrainConfig:
    base = dict(steps=40, batch_size=32, lr=0.01, checkpoint_every=10, eval_every=10, eval_batch=64, progress=False)
    return TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


class Crash(BaseException):
    """A process killed mid-write (not an OSError: nothing handles it)."""


def _interrupted(out: Path, at_step: int = 35) -> None:
    """A run of :func:`_cfg` killed at ``at_step``: checkpoint.pt (step 30) and checkpoint.prev.pt (step 20) on disk."""
    calls = {"n": 0}

    def crashing(batch: int, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2 + at_step:  # the probe, the test set, then one batch per step
            raise Crash
        return SAMPLE(batch, **kw)

    with pytest.raises(Crash):
        train(_model(), crashing, _cfg(), out_dir=out)


# --- divergence between the metrics rows ----------------------------------------------------------------------------

DIVERGING = dict(optimizer="sgd", lr=0.1, steps=200, log_every=100, eval_every=100, checkpoint_every=5)


def test_divergence_between_rows_names_the_first_bad_step_and_never_writes_a_nan_checkpoint(tmp_path) -> None:
    """Rows every 100 steps, checkpoints every 5: every step's loss is checked, so the run stops at the first step
    whose loss is non-finite (the step a run logging every step names), no checkpoint holds a non-finite tensor, and
    the same command resumes from the last finite one and stops at the same step."""
    with pytest.raises(DivergenceError, match=r"non-finite loss .* at step (\d+)") as every_step:
        train(_model(), SAMPLE, _cfg(**{**DIVERGING, "log_every": 1}))
    bad = int(str(every_step.value).split(" at step ")[1].split()[0])
    assert 10 < bad < 100  # between the rows of the run below, after some checkpoints
    out = tmp_path / "run"
    with pytest.raises(DivergenceError) as info:
        train(_model(), SAMPLE, _cfg(**DIVERGING), out_dir=out)
    msg = str(info.value)
    assert "non-finite loss (" in msg and f"at step {bad} " in msg and f"at step {bad - 1})" in msg
    kept = 5 * (bad // 5)  # the newest checkpoint before the bad step
    assert f"the last good checkpoint is kept: {out / 'checkpoint.pt'} (step {kept})" in msg
    for path in out.glob("checkpoint*.pt"):
        ck = safe_torch_load(path)
        assert ck["step"] <= kept and all(torch.isfinite(v).all() for v in ck["model"].values())
    with pytest.raises(DivergenceError, match=rf"at step {bad} "):
        train(_model(), SAMPLE, _cfg(**DIVERGING), out_dir=out)


@pytest.mark.parametrize("in_place", [True, False])
def test_first_nonfinite_loss_read_in_place_or_stacked(in_place: bool) -> None:
    """The CPU reads the held losses in place; a GPU stacks them for one host sync: the same answer."""
    first = trainer_mod._first_nonfinite_loss
    assert first([torch.tensor(1.0), torch.tensor(2.0)], in_place) is None
    assert first([torch.tensor(1.0), torch.tensor(3e38) * 10, torch.tensor(float("nan"))], in_place) == 1
    assert first([torch.tensor(1e300, dtype=torch.float64)], in_place) is None  # finite beyond float32's range


@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_a_non_finite_checkpoint_is_set_aside_and_never_resumed(tmp_path, caplog, where: str) -> None:
    out = tmp_path / "run"
    _interrupted(out)
    ck = safe_torch_load(out / "checkpoint.pt")
    if where == "model":
        tensor = next(iter(ck["model"].values()))
    else:
        tensor = next(iter(ck["optimizer"]["state"].values()))["exp_avg"]
    tensor.view(-1)[0] = float("nan")
    atomic_torch_save(out / "checkpoint.pt", ck)  # a valid file holding a diverged state
    with caplog.at_level(logging.WARNING, logger="iclab"):
        resumed = train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert resumed.resumed_from == 20 and "non-finite" in caplog.text and "falling back" in caplog.text
    assert resumed.history == train(_model(), SAMPLE, _cfg()).history
    assert (out / "checkpoint.pt.corrupt").is_file()


# --- a crash at any step of a checkpoint rotation ------------------------------------------------------------------


def _ops(monkeypatch: pytest.MonkeyPatch, crash_at: int | None, log: list[tuple[str, str]]) -> None:
    """Count the filesystem steps of a write (fsync, unlink, rename); with ``crash_at``, that step raises Crash."""

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def op(*args: Any, **kw: Any) -> Any:
            if crash_at is not None and len(log) == crash_at:
                log.append(("crash", name))
                raise Crash
            log.append((name, Path(str(args[-1])).name if name != "fsync" else ""))
            return real(*args, **kw)

        return op

    for name in ("replace", "unlink", "fsync"):
        monkeypatch.setattr(io_mod.os, name, wrap(name, getattr(os, name)))


@pytest.mark.parametrize("fsyncs", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_crash_at_any_step_of_a_rotation_resumes_from_the_newest_good_checkpoint(
    tmp_path, monkeypatch, fsyncs: bool
) -> None:
    """Every step of the second checkpoint's writes (the new file, its sidecar, the renames of the rotation and of
    metrics.jsonl) is made to crash in turn: the same call then resumes from the newest checkpoint written in full
    (step 20 once checkpoint.new.pt has its name, else step 10) and ends bit-identical to an uninterrupted run. A
    crash at an fsync leaves what a crash at the next rename or unlink leaves (an fsync changes nothing a reader
    sees): those cases run under ``-m slow``."""
    full = train(_model(), SAMPLE, _cfg())
    clean: list[tuple[str, str]] = []
    with monkeypatch.context() as m:
        _ops(m, None, clean)
        train(_model(), SAMPLE, _cfg(steps=20), out_dir=tmp_path / "clean")
    first = next(i for i, op in enumerate(clean) if op == ("replace", "metrics.jsonl"))  # the end of step 10's save
    second = [i for i, op in enumerate(clean) if op == ("replace", "metrics.jsonl")][1]
    cases = [k for k in range(first + 1, second + 1) if fsyncs or clean[k][0] != "fsync"]
    assert len(cases) >= 8  # the unlinks and renames of the new file, its sidecar, the rotation and metrics.jsonl
    for k in cases:
        out = tmp_path / f"crash{k}"
        log: list[tuple[str, str]] = []
        with monkeypatch.context() as m:
            _ops(m, k, log)
            with pytest.raises(Crash):
                train(_model(), SAMPLE, _cfg(), out_dir=out)
        newest = 20 if ("replace", trainer_mod.NEWEST) in log[first + 1 :] else 10
        resumed = train(_model(), SAMPLE, _cfg(), out_dir=out)
        assert resumed.resumed_from == newest, (k, log[first + 1 :])
        assert resumed.history == full.history and _same_weights(resumed.model, full.model), k
        assert trainer_mod.load_history(out) == full.history


def test_quarantine_names_are_numbered_and_never_overwritten(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    names = []
    for i in range(3):
        atomic_torch_save(path, {"i": i})
        names.append(quarantine(path).name)
    assert names == ["checkpoint.pt.corrupt", "checkpoint.pt.corrupt.1", "checkpoint.pt.corrupt.2"]
    assert [safe_torch_load(tmp_path / n)["i"] for n in names] == [0, 1, 2]  # each with its own sidecar


# --- a full disk at any write --------------------------------------------------------------------------------------


def _filling(monkeypatch: pytest.MonkeyPatch, at: int, names: list[str]) -> None:
    """The ``at``-th atomic write (0-based) finds the disk full; ``names`` records every write tried."""
    real = io_mod._atomic

    def atomic(path: Path, *args: Any, **kw: Any) -> None:
        names.append(path.name)
        if len(names) - 1 == at:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, *args, **kw)

    monkeypatch.setattr(io_mod, "_atomic", atomic)


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_disk_full_at_every_write_of_a_training_run_loses_no_metrics_row(tmp_path, monkeypatch, every: bool) -> None:
    """ENOSPC at each write in turn (each checkpoint, its sidecar, each metrics.jsonl; without ``-m slow`` those of
    the first and the last checkpoint): one OutputError, then the same call completes with metrics.jsonl equal to an
    uninterrupted run's."""
    ref = tmp_path / "ref"
    full = train(_model(), SAMPLE, _cfg(), out_dir=ref)
    writes: list[str] = []
    with monkeypatch.context() as m:
        _filling(m, -1, writes)
        train(_model(), SAMPLE, _cfg(), out_dir=tmp_path / "count")
    assert len(writes) == 12  # 4 checkpoints: the file, its sidecar, metrics.jsonl
    for k in range(len(writes)) if every else (0, 1, 2, 9, 10, 11):
        out = tmp_path / f"full{k}"
        with monkeypatch.context() as m:
            _filling(m, k, [])
            with pytest.raises(OutputError, match="No space left on device") as info:
                train(_model(), SAMPLE, _cfg(), out_dir=out)
        msg = str(info.value)
        if writes[k] == "metrics.jsonl":
            assert "is written" in msg and "metrics.jsonl could not be" in msg, msg
        else:
            assert "could not write the checkpoint" in msg and "kept" in msg, msg
        again = train(_model(), SAMPLE, _cfg(), out_dir=out)
        assert again.history == full.history, k
        assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes(), k


def test_disk_full_at_the_last_metrics_write_is_repaired_by_the_rerun(tmp_path, monkeypatch) -> None:
    """The final checkpoint is written but metrics.jsonl is not: the message says exactly that, and the rerun (a
    finished run, reloaded) rewrites metrics.jsonl from the checkpoint's history."""
    ref = tmp_path / "ref"
    train(_model(), SAMPLE, _cfg(), out_dir=ref)
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _filling(m, 11, [])
        with pytest.raises(
            OutputError, match=r"the checkpoint of step 40 is written .* but metrics.jsonl could not be"
        ):
            train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert (out / "metrics.jsonl").read_bytes() != (ref / "metrics.jsonl").read_bytes()  # rows of steps 30-39 missing
    again = train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert again.resumed_from == 40
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


@dataclass(frozen=True, kw_only=True)
class _TinyConfig:
    steps: int = 20


def _tiny_run(cfg: _TinyConfig, ctx: RunContext) -> dict[str, Any]:
    train_cfg = _cfg(steps=cfg.steps, checkpoint_every=5, eval_every=5)
    model = ModelSpec(LinearTransformer, LinearTransformerConfig(d=3, n_layers=1, init_std=0.1))
    (done,) = ctx.execute([TrainingRun(name="seed0", model=model, task=SAMPLE, train=train_cfg, seed=0)])
    return {"final": torch.tensor([done.final_test_loss], dtype=torch.float64)}


TINY = Experiment(
    name="writecard.tiny",
    title="a tiny card for the disk-full test",
    config=_TinyConfig,
    presets={"smoke": {}, "quick": {}, "paper": {}},
    run=_tiny_run,
    plot=lambda results, cfg, out: [],
    claims=lambda results, cfg: [ClaimResult("final", True, float(results["final"][0]), "any")],
    module=__name__,
)


@pytest.fixture
def tiny_card() -> Any:
    registry.all_experiments()  # the real cards first: the tiny card must not hide them from a first load
    registry.register(TINY)
    try:
        yield TINY.name
    finally:
        registry._REGISTRY.pop(TINY.name, None)


def _run_disk_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exp: str, every_write: bool) -> None:
    ref = run_experiment(exp, "smoke", out=tmp_path / "ref")
    metrics = (ref.out_dir / "seed0" / "metrics.jsonl").read_bytes()
    writes: list[str] = []
    with monkeypatch.context() as m:
        _filling(m, -1, writes)
        run_experiment(exp, "smoke", out=tmp_path / "count")
    kinds = ("checkpoint.new.pt", "checkpoint.new.pt.sha256", "metrics.jsonl", "results.pt", "claims.json")
    cases = range(len(writes)) if every_write else sorted({writes.index(k) for k in kinds} | {len(writes) - 1})
    for k in cases:
        out = tmp_path / f"full{k}"
        with monkeypatch.context() as m:
            _filling(m, k, [])
            with pytest.raises(OutputError):  # every write, figures, claims and summary included: one line
                run_experiment(exp, "smoke", out=out)
        again = run_experiment(exp, "smoke", out=out)
        assert again.claims_json() == ref.claims_json(), (k, writes[k])
        assert (again.out_dir / "seed0" / "metrics.jsonl").read_bytes() == metrics, (k, writes[k])
        assert (again.out_dir / "summary.json").is_file()


def test_disk_full_at_each_kind_of_write_of_an_experiment(tmp_path, monkeypatch, tiny_card) -> None:
    """ENOSPC at the first write of each kind (a checkpoint, its sidecar, metrics.jsonl, results.pt, claims.json) and
    at the last (summary.json): the same call then completes, with the same claims and metrics.jsonl."""
    _run_disk_full(tmp_path, monkeypatch, tiny_card, every_write=False)


@pytest.mark.slow
def test_disk_full_at_every_write_of_an_experiment(tmp_path, monkeypatch, tiny_card) -> None:
    _run_disk_full(tmp_path, monkeypatch, tiny_card, every_write=True)


# --- checkpoints that load but do not fit --------------------------------------------------------------------------


def _first(d: dict[str, Any]) -> str:
    return next(iter(d))


TAMPER: dict[str, Callable[[dict[str, Any]], None]] = {
    "wrong shape": lambda ck: ck["model"].update({_first(ck["model"]): torch.zeros(2, 2)}),
    "wrong dtype": lambda ck: ck["model"].update({_first(ck["model"]): ck["model"][_first(ck["model"])].double()}),
    "a tensor missing": lambda ck: ck["model"].pop(_first(ck["model"])),
    "a tensor added": lambda ck: ck["model"].update({"extra": torch.zeros(1)}),
    "negative step": lambda ck: ck.update(step=-5),
    "step past the end": lambda ck: ck.update(step=10**9),
    "step not an int": lambda ck: ck.update(step="30"),
    "optimiser state of the wrong shape": lambda ck: ck["optimizer"]["state"][0].update(exp_avg=torch.zeros(7)),
    "optimiser groups not the model's": lambda ck: ck["optimizer"].update(param_groups=[]),
    "history not rows": lambda ck: ck.update(history=[1, 2]),
}


@pytest.mark.parametrize("damage", list(TAMPER))
def test_a_checkpoint_that_does_not_fit_the_model_is_set_aside(tmp_path, caplog, damage: str) -> None:
    """Right keys, wrong contents: one warning line naming the file, moved aside, the run goes on from the previous
    checkpoint and ends as an uninterrupted run; never a traceback."""
    out = tmp_path / "run"
    _interrupted(out)
    ck = safe_torch_load(out / "checkpoint.pt")
    TAMPER[damage](ck)
    atomic_torch_save(out / "checkpoint.pt", ck)
    with caplog.at_level(logging.WARNING, logger="iclab"):
        resumed = train(_model(), SAMPLE, _cfg(), out_dir=out)
    lines = [r.getMessage() for r in caplog.records if r.name == "iclab"]
    assert len(lines) == 1 and "checkpoint.pt" in lines[0] and "falling back to checkpoint.prev.pt" in lines[0]
    assert resumed.resumed_from == 20 and resumed.history == train(_model(), SAMPLE, _cfg()).history
    assert (out / "checkpoint.pt.corrupt").is_file()


def test_both_checkpoints_that_do_not_fit_restart_the_run(tmp_path, caplog) -> None:
    out = tmp_path / "run"
    _interrupted(out)
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        ck = safe_torch_load(out / name)
        ck["step"] = -1
        atomic_torch_save(out / name, ck)
    with caplog.at_level(logging.WARNING, logger="iclab"):
        again = train(_model(), SAMPLE, _cfg(), out_dir=out)
    assert again.resumed_from is None and caplog.text.count("restarting this training run") == 2
    assert again.history == train(_model(), SAMPLE, _cfg()).history


# --- iclab train --------------------------------------------------------------------------------------------------


def _train_yaml(tmp_path: Path, out: str) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "task: {d: 3, n: 6}\nmodel: {n_layers: 1}\n"
        f"train: {{steps: 30, batch_size: 16, eval_batch: 16, progress: false}}\nout: {out}\n"
    )
    return cfg


def test_iclab_train_probes_out_before_any_work(tmp_path, monkeypatch) -> None:
    trained = []
    monkeypatch.setattr(trainer_mod._Run, "loop", lambda *a, **k: trained.append(1))
    res = CliRunner().invoke(app, ["train", "--config", str(_train_yaml(tmp_path, "/proc/x"))])
    assert res.exit_code == 2 and res.exc_info[0] is SystemExit, res.output
    assert "cannot write the run directory /proc/x" in " ".join(res.output.split()) and not trained


@pytest.mark.parametrize("value", ["1e400", ".inf", "-.inf", ".nan"])
def test_iclab_train_refuses_an_infinite_lr(tmp_path, value: str) -> None:
    res = CliRunner().invoke(app, ["train", "--config", str(_train_yaml(tmp_path, str(tmp_path))), f"train.lr={value}"])
    assert res.exit_code == 2 and res.exc_info[0] is SystemExit
    assert "error: train.lr must be finite" in res.output


def test_iclab_train_divergence_is_one_line(tmp_path) -> None:
    args = ["train", "--config", str(_train_yaml(tmp_path, str(tmp_path))), "train.lr=100", "train.optimizer=sgd"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and res.exc_info[0] is SystemExit
    assert "error:" in res.output and "non-finite loss" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", float("inf")), ("eps", float("inf")), ("weight_decay", float("inf")), ("clip", float("inf"))],
)
def test_train_config_refuses_infinities(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^TrainConfig\.{field} must be (null or )?finite; got inf$"):
        _cfg(**{field: value})
    assert dataclasses.replace(_cfg(), **{field: 0.5}).lr > 0  # a finite value is taken
