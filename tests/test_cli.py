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
    assert bad.exit_code == 2 and "error: train.lr must be a float > 0; got -1.0" in bad.output


def test_cli_turns_on_deterministic_kernels_and_opts_out() -> None:
    """Seeded runs are bit-reproducible with several threads only with PyTorch's deterministic kernels: the CLI turns
    them on (``--no-deterministic`` opts out) and leaves the process as it found it here."""
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert runner.invoke(app, ["list"]).exit_code == 0
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(False)
        assert runner.invoke(app, ["--no-deterministic", "list"]).exit_code == 0
        assert not torch.are_deterministic_algorithms_enabled()  # left as PyTorch's default
    finally:
        torch.use_deterministic_algorithms(before)


def test_deterministic_training_is_bit_reproducible_on_two_threads() -> None:
    """Two seeded runs of a model with embedding look-ups (whose backward accumulates in a thread-dependent order
    without deterministic kernels) give bit-identical parameters on 2 threads."""
    import torch

    from iclab.core.seeding import use_deterministic_algorithms
    from iclab.models.language import LanguageGD, next_token_nll

    def run() -> torch.Tensor:
        torch.manual_seed(0)
        model = LanguageGD(50, 16, 2, 24)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(8):
            tokens = torch.randint(0, 50, (64, 25), generator=g)
            opt.zero_grad()
            next_token_nll(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    threads, before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(2)
        use_deterministic_algorithms()
        assert torch.equal(run(), run())
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(before)


def test_progress_prints_plain_lines_where_the_console_is_not_a_terminal(monkeypatch) -> None:
    """rich draws no bar into a log file: the CLI's progress prints a line per `interval` instead, and the last one of
    a task of finished runs; a training run's steps print only when the interval has passed (short runs: nothing)."""
    import io

    from rich.console import Console

    from iclab import cli

    clock = {"t": 0.0}
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock["t"])
    out = io.StringIO()
    bar = cli.PipedProgress(console=Console(file=out, force_terminal=False, width=200), interval=60.0)
    runs = bar.add_task("exp: 3 runs on local", total=3)
    steps = bar.add_task("seed0", total=100)
    bar.advance(runs)  # 0 s: no line yet
    clock["t"] = 30.0
    bar.update(steps, completed=100)  # a short run's last step: no line
    clock["t"] = 61.0
    bar.advance(runs)  # the interval passed
    bar.advance(runs)  # finished: always
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["exp: 3 runs on local: 2/3", "exp: 3 runs on local: 3/3"]
    terminal = io.StringIO()
    bar = cli.PipedProgress(console=Console(file=terminal, force_terminal=True), interval=0.0)
    bar.advance(bar.add_task("x", total=1))
    assert "x: 1/1" not in terminal.getvalue()  # a terminal gets rich's bar (when started), not lines
