"""The command line: list, run --json, reproduce, train, errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from iclab.cli import app

runner = CliRunner()


def test_list() -> None:
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0 and "ahn2023.fig1" in res.output


def test_run_json(tmp_path) -> None:
    res = runner.invoke(app, ["run", "ahn2023.theorem5", "--preset", "smoke", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    claims = json.loads(res.stdout[res.stdout.index("[") :])
    assert {"name", "passed", "measured", "expected"} <= set(claims[0])


def test_run_unknown_experiment(tmp_path) -> None:
    res = runner.invoke(app, ["run", "ahn2023.fig99", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "unknown experiment" in res.output


def test_reproduce_one_experiment(tmp_path) -> None:
    res = runner.invoke(app, ["reproduce", "ahn2023.theorem5", "--preset", "smoke", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "ahn2023.theorem5" in (tmp_path / "report.md").read_text()


def test_train_from_yaml(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"task: {{d: 3, n: 6}}\nmodel: {{n_layers: 1, pattern: sparse}}\ntrain: {{steps: 5, batch_size: 32, eval_batch: 32, progress: false}}\nout: {tmp_path / 'runs'}\n"
    )
    res = runner.invoke(app, ["train", "--config", str(cfg), "train.lr=0.01"])
    assert res.exit_code == 0, res.output
    assert "final test loss" in res.output
    bad = runner.invoke(app, ["train", "--config", str(cfg), "train.lr=-1"])
    assert bad.exit_code == 2 and "TrainConfig.lr must be a float > 0" in bad.output
