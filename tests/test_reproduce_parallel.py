"""``iclab reproduce`` on a pool of processes: whole experiments, longest first, the same claims as one after another;
a broken experiment is reported and the others finish."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from iclab.cli import app
from iclab.core.io import atomic_write_json
from iclab.experiments import parallel, registry
from iclab.experiments.parallel import LONGEST_AT_QUICK, Done, Job, cores, default_workers, expected_seconds, schedule
from iclab.experiments.parallel import run_one as _run_one

# two experiments of a few seconds at smoke, and one made to fail in its worker
GOOD, BROKEN = ("ahn2023.theorem5", "sun2025.constructions"), "zhang2025.fig5"


def test_schedule_puts_the_longest_first() -> None:
    names = ["a", "b", "c", "d"]
    assert schedule(names, {"a": 1.0, "b": 30.0, "c": 5.0, "d": 30.0}) == ["b", "d", "c", "a"]  # ties as given
    # no recorded time: first (they may be long), in the static order, then as given
    slow = LONGEST_AT_QUICK[0]
    assert schedule(["x", "a", slow], {"a": 100.0}) == [slow, "x", "a"]
    assert schedule([], {}) == []


def test_expected_seconds_reads_the_newest_summary(tmp_path: Path) -> None:
    assert expected_seconds(tmp_path, "e.x", "quick") is None
    atomic_write_json(tmp_path / "e.x" / "quick-aaa" / "summary.json", {"seconds": 12.5})
    atomic_write_json(tmp_path / "e.x" / "smoke-bbb" / "summary.json", {"seconds": 1.0})
    assert expected_seconds(tmp_path, "e.x", "quick") == 12.5
    (tmp_path / "e.x" / "quick-ccc").mkdir()
    (tmp_path / "e.x" / "quick-ccc" / "summary.json").write_text("{torn")  # a damaged one is skipped
    assert expected_seconds(tmp_path, "e.x", "quick") == 12.5


def test_default_workers_are_the_cores_for_several_experiments_on_the_cpu() -> None:
    assert default_workers(42) == cores() >= 1
    assert default_workers(1) == 1  # one experiment: in the driver, as before
    assert default_workers(42, backend="ray") == default_workers(42, device="cuda") == 1


def _claims(out: Path, name: str) -> list[dict[str, object]]:
    (path,) = (out / name).glob("smoke-*/claims.json")
    claims: list[dict[str, object]] = json.loads(path.read_text())
    return claims


def _reproduce(out: Path, workers: int, names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> Result:
    monkeypatch.setattr(registry, "select", lambda _: [registry.get(n) for n in names])
    args = ["reproduce", "--preset", "smoke", "--out", str(out), "--workers", str(workers)]
    return CliRunner().invoke(app, args)


def _broken_in_its_worker(job: Job) -> Done:
    """The pool's task, with BROKEN's ``run`` raising in the worker process (after the others started)."""
    if job.name == BROKEN:
        exp = registry.get(BROKEN)
        registry._REGISTRY[BROKEN] = dataclasses.replace(exp, run=_boom)
    return _run_one(job)


def _boom(cfg: object, ctx: object) -> None:
    raise RuntimeError("a broken experiment")


def test_pool_gives_the_serial_claims_and_survives_a_broken_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serial = _reproduce(tmp_path / "serial", 1, GOOD, monkeypatch)
    assert serial.exit_code == 0, serial.output
    monkeypatch.setattr(parallel, "run_one", _broken_in_its_worker)  # travels to the workers by name
    pool = _reproduce(tmp_path / "pool", 2, (BROKEN, *GOOD), monkeypatch)
    output = pool.output
    assert pool.exit_code == 1, output
    assert f"{BROKEN} failed" in output and "RuntimeError: a broken experiment" in output
    assert "1 experiments failed" in output
    for name in GOOD:
        assert _claims(tmp_path / "pool", name) == _claims(tmp_path / "serial", name)
    report = json.loads((tmp_path / "pool" / "report.json").read_text())
    assert [e["name"] for e in report["experiments"]] == list(GOOD)  # the order given, not the order run
    assert report["failures"] == {BROKEN: "RuntimeError: a broken experiment"}
