"""Sweeps: grid / zip / list axes and seeds over an experiment or a train config; each point is the run
directory `iclab run` would use; the same table on every backend; failures and killed drivers lose nothing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from iclab.cli import app
from iclab.core.errors import ConfigError
from iclab.experiments.backends import LocalBackend, RayBackend, local_ray
from iclab.experiments.estimate import plan_sweep
from iclab.experiments.runner import run_experiment
from iclab.experiments.sweep import load_sweep_spec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "examples" / "sweeps" / "smoke.yaml"
COMPARED = ["train.lr", "seed", "status", "claims_passed", "claims_total", "reused", "error"]


def _train_spec(tmp: Path, **extra: object) -> dict[str, object]:
    """A train-config sweep small enough for a unit test (20 steps of 64 prompts)."""
    return {
        "name": "tiny",
        "train": str(ROOT / "configs" / "linear_sparse.yaml"),
        "overrides": {
            "train.steps": 20,
            "train.batch_size": 64,
            "train.eval_batch": 64,
            "train.eval_every": 10,
            "out": str(tmp / "train"),
        },
        **extra,
    }


def _metrics(table: pd.DataFrame) -> pd.DataFrame:
    fixed = {"seconds", "host", "run_dir", "start", "end"}
    return table[[c for c in table.columns if c not in fixed]].reset_index(drop=True)


@pytest.fixture(scope="module")
def local_table(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    pool = LocalBackend(workers=2)
    try:
        result = run_sweep(SMOKE, out=tmp_path_factory.mktemp("local"), backend=pool)
    finally:
        pool.close()
    assert result.ok
    return result.table


def test_smoke_sweep_layout(local_table: pd.DataFrame, tmp_path: Path) -> None:
    spec = load_sweep_spec(SMOKE)
    assert len(spec.points()) == 2 and len(local_table) == 2
    assert set(COMPARED) <= set(local_table.columns)
    assert (local_table["status"] == "ok").all()
    row = local_table.iloc[0]
    assert (row["experiment"], row["preset"], row["attempts"]) == ("ahn2023.fig1", "smoke", 1)
    assert Path(row["run_dir"]).name == f"smoke-{row['config_hash']}" and row["start"] <= row["end"]
    assert row["git_revision"] is None or len(row["git_revision"]) >= 40
    claim = "final_loss_equals_thm3_S_optimum"
    assert {claim, f"{claim}.expected", f"{claim}.passed"} <= set(local_table.columns), list(local_table.columns)
    # each point is the run directory `iclab run` would use: same config hash, reused when run again
    run_dir = Path(local_table["run_dir"][0])
    again = run_experiment("ahn2023.fig1", "smoke", out=run_dir.parents[1], overrides=["train.lr=0.01"])
    assert again.out_dir == run_dir and again.reused
    d = run_dir.parents[1] / "sweeps" / "smoke"
    assert {"sweep.parquet", "sweep.yaml", "summary.json", "sweep_train.lr.png"} <= {p.name for p in d.iterdir()}
    pd.testing.assert_frame_equal(pd.read_parquet(d / "sweep.parquet"), local_table)


def test_smoke_sweep_same_table_on_ray(local_table: pd.DataFrame, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with local_ray(num_cpus=2):
        result = run_sweep(SMOKE, out=tmp_path, backend=RayBackend())
    pd.testing.assert_frame_equal(_metrics(result.table), _metrics(local_table))


def test_serial_sweep_same_table(local_table: pd.DataFrame, tmp_path: Path) -> None:
    result = run_sweep(SMOKE, out=tmp_path)
    pd.testing.assert_frame_equal(_metrics(result.table), _metrics(local_table))


def test_killed_driver_reruns_only_the_missing_point(tmp_path: Path) -> None:
    spec = load_sweep_spec(_train_spec(tmp_path, grid={"model.n_layers": [1, 2]}))

    def die_after_first(_: object) -> None:
        raise KeyboardInterrupt  # the driver is killed once the first point is finished

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out=tmp_path, on_done=die_after_first)
    assert not (tmp_path / "sweeps" / "tiny" / "sweep.parquet").exists()
    table = run_sweep(spec, out=tmp_path).table
    assert table["reused"].tolist() == [True, False], "the finished point is reused, the missing one runs"
    assert (table["status"] == "ok").all()


def test_a_failing_point_does_not_stop_the_others(tmp_path: Path) -> None:
    spec_file = tmp_path / "diverge.yaml"
    spec = _train_spec(tmp_path, grid={"train.lr": [0.01, 1e12]})
    spec["overrides"] = {**spec["overrides"], "train.clip": None}  # type: ignore[dict-item]
    spec_file.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "train.lr=1e+12" in result.output and "DivergenceError" in result.output  # its config and traceback
    table = pd.read_parquet(tmp_path / "sweeps" / "tiny" / "sweep.parquet")
    assert table["status"].tolist() == ["ok", "diverged"]
    assert "DivergenceError" in table["error"][1] and table["error"][0] == ""
    assert table["final_test_loss"].notna()[0]


def test_seeds_are_rows_and_figures_average_them(tmp_path: Path) -> None:
    spec = load_sweep_spec(_train_spec(tmp_path, grid={"model.n_layers": [1, 2]}, seeds=[0, 1]))
    result = run_sweep(spec, out=tmp_path)
    assert list(zip(result.table["model.n_layers"], result.table["seed"], strict=True)) == [
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert len(set(result.table["final_test_loss"])) == 4, "every seed trains its own run"
    assert [f.name for f in result.figures] == ["sweep_model.n_layers.png"]
    rows = plan_sweep(spec, out=tmp_path, probe_steps=2)
    assert [r["state"] for r in rows] == ["done"] * 4 and all(r["projected_seconds"] == 0 for r in rows)


def test_points_combine_grid_zip_list(tmp_path: Path) -> None:
    spec = load_sweep_spec(
        _train_spec(
            tmp_path,
            grid={"train.lr": [0.01, 0.02]},
            zip={"task.n": [10, 20], "model.n_layers": [1, 2]},
            list=[{"train.clip": 0.01}, {"train.clip": 0.1}],
        )
    )
    points = spec.points()
    assert len(points) == 2 * 2 * 2
    assert spec.keys == ["train.lr", "task.n", "model.n_layers", "train.clip"]
    assert points[0].label == "train.lr=0.01,task.n=10,model.n_layers=1,train.clip=0.01"
    assert {(p.values["task.n"], p.values["model.n_layers"]) for p in points} == {(10, 1), (20, 2)}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"grid": {"train.lr": []}}, "non-empty lists"),
        ({"zip": {"task.n": [1, 2], "model.n_layers": [1]}}, "equal lengths"),
        ({"grdi": {}}, "unknown key 'grdi'"),
        ({"grid": {"train.lrr": [0.1]}}, r"sweep point train\.lrr=0\.1: .*lrr"),
        ({"grid": {"train.lr": ["fast"]}}, "must be a float"),
        ({"seeds": [0, 0]}, "seeds repeat"),
        ({"seeds": "three"}, "seeds must be"),
        ({"name": "../escape"}, "name must be"),
        ({"experiment": "ahn2023.fig1"}, "exactly one of"),
    ],
)
def test_bad_specs_are_refused_before_any_work(tmp_path: Path, patch: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_sweep_spec({**_train_spec(tmp_path), **patch})
    assert not (tmp_path / "train").exists()


def test_experiment_without_seed_key_refuses_seeds() -> None:
    with pytest.raises(ConfigError, match="no `seed` key"):
        load_sweep_spec({"experiment": "ahn2023.fig1", "preset": "smoke", "seeds": [0, 1]})
    spec = load_sweep_spec({"experiment": "ahn2023.theorem5", "preset": "smoke", "seeds": [0, 1]})
    assert [p.overrides for p in spec.points()] == [["seed=0"], ["seed=1"]]


def test_example_specs_are_valid() -> None:
    for path in sorted((ROOT / "examples" / "sweeps").glob("*.yaml")):
        assert load_sweep_spec(path).points(), path


BIG = {"experiment": "ahn2023.theorem2", "preset": "smoke", "grid": {"train.lr": [0.01] * 1000, "n": [20] * 1000}}


def test_a_million_points_are_refused_before_any_is_expanded(tmp_path: Path, monkeypatch) -> None:
    """A 10^6-point grid (a 10 kB file) once took gigabytes and hung, --dry-run too: refused before expanding."""
    monkeypatch.delenv("ICLAB_ALLOW_LARGE", raising=False)
    with pytest.raises(ConfigError, match=r"1000000 points is more than 10000.*--allow-large"):
        load_sweep_spec(BIG)
    with pytest.raises(ConfigError, match=r"1000000000 points is more than 10000"):
        load_sweep_spec({"experiment": "ahn2023.theorem5", "preset": "smoke", "seeds": 10**9})
    spec_file = tmp_path / "big.yaml"
    spec_file.write_text(yaml.safe_dump(BIG))
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(tmp_path), *extra])
        assert result.exit_code == 2 and "more than 10000" in result.output, result.output
    assert not (tmp_path / "sweeps").exists()


def test_allow_large_lifts_the_point_limit_and_points_stream() -> None:
    spec = load_sweep_spec(BIG, allow_large=True, validate=False)
    assert spec.size == 10**6
    first = next(spec.iter_points())  # one point, nothing else expanded
    assert first.values == {"train.lr": 0.01, "n": 20}


def test_dry_run_streams_one_line_per_point(tmp_path: Path) -> None:
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"experiment": "ahn2023.theorem5", "preset": "smoke", "seeds": 2}))
    done = tmp_path / "does-not-matter"
    result = CliRunner().invoke(app, ["sweep", str(spec_file), "--out", str(done), "--dry-run", "--probe-steps", "2"])
    assert result.exit_code == 0, result.output
    assert "2 points" in result.output and len(re.findall(r"seed=\d\s+new\s", result.output)) == 2, result.output


def test_a_train_sweep_may_not_write_outside_out(tmp_path: Path) -> None:
    spec = _train_spec(tmp_path / "inside")
    spec["overrides"] = {**spec["overrides"], "out": str(tmp_path / "elsewhere")}  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="is outside --out"):
        run_sweep(spec, out=tmp_path / "inside")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "inside").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_a_blown_up_loss_is_diverged() -> None:
    """A train point whose loss ends non-finite or a million times its first (lr 1000: 1e21) is ``diverged``."""
    from iclab.experiments.backends import Outcome
    from iclab.experiments.sweep import _diverged, _status

    assert _diverged(2.0, 1e21, 3.0) and _diverged(2.0, float("nan"), 1.0) and not _diverged(2.0, 0.5, 0.6)
    assert _status(Outcome(0, "a", value={"diverged": True}), {"diverged": True}) == "diverged"
    assert _status(Outcome(0, "a", error="Traceback ... DivergenceError: step 3"), {}) == "diverged"
    assert _status(Outcome(0, "a", error="Traceback ... ValueError"), {}) == "failed"
    assert _status(Outcome(0, "a", value={}), {}) == "ok"


@pytest.mark.slow
def test_estimate_accepts_a_sweep_spec() -> None:
    result = CliRunner().invoke(app, ["estimate", str(SMOKE), "--probe-steps", "2"])
    assert result.exit_code == 0, result.output
    assert "sweep smoke: 2 points" in result.output and "projected total" in result.output
