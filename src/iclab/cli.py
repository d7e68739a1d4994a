"""The ``iclab`` command line: list, run, reproduce, estimate, train, bench."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from iclab.core.errors import IclabError, OutputError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="In-context learning lab: reproduce papers, train models, benchmark.",
)
console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def _fail(e: Exception) -> None:
    console.print(f"[red]error:[/red] {e}")
    raise typer.Exit(2) from e


@app.callback()
def _setup(
    tune_allocator: Annotated[
        bool, typer.Option(help="keep freed tensor memory in the process (glibc; ~25% faster CPU steps)")
    ] = True,
    deterministic: Annotated[
        bool, typer.Option(help="PyTorch's deterministic kernels: seeded runs bit-reproducible with several threads")
    ] = True,
    allow_large: Annotated[
        bool, typer.Option(help="train batches larger than the memory available is estimated to hold")
    ] = False,
) -> None:
    """In-context learning lab: reproduce papers, train models, benchmark."""
    import logging
    import os

    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)
    if allow_large:
        os.environ["ICLAB_ALLOW_LARGE"] = "1"
    if tune_allocator:
        from iclab.core.devices import tune_cpu_allocator

        tune_cpu_allocator()
    if deterministic:
        from iclab.core.seeding import use_deterministic_algorithms

        use_deterministic_algorithms()


@app.command("list")
def list_cmd() -> None:
    """List experiments and their presets."""
    from iclab.experiments.registry import all_experiments

    table = Table(title="iclab experiments")
    for col in ("experiment", "presets", "title"):
        table.add_column(col)
    for name, exp in all_experiments().items():
        table.add_row(name, ", ".join(exp.presets), exp.title)
    Console().print(table)


_STATUS = {"passed": "[green]yes[/green]", "failed": "[red]NO[/red]", "not checked": "[yellow]not checked[/yellow]"}


def _print_claims(res: object) -> None:
    table = Table(title=f"{res.experiment.name} [{res.preset}] {res.seconds:.1f}s{' (reused)' if res.reused else ''}")  # type: ignore[attr-defined]
    for col in ("claim", "passed", "measured", "expected"):
        table.add_column(col)
    for c in res.claims:  # type: ignore[attr-defined]
        table.add_row(c.name, _STATUS[c.status], str(c.measured), c.expected)
    console.print(table)


@app.command()
def run(
    experiment: Annotated[str, typer.Argument(help="experiment name, e.g. ahn2023.fig1 (see `iclab list`)")],
    overrides: Annotated[list[str] | None, typer.Argument(help="config overrides key=value")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "quick",
    seeds: Annotated[int | None, typer.Option(help="number of seeds (runs)")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    out: Annotated[Path, typer.Option(help="output root")] = Path("runs"),
    force: Annotated[bool, typer.Option(help="recompute even if a finished run exists")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the claims as JSON on stdout")] = False,
    wait: Annotated[bool, typer.Option(help="wait for another process writing the same run directory")] = True,
) -> None:
    """Run one experiment at a preset; write its figures and claims under OUT."""
    from iclab.experiments.runner import run_experiment

    try:
        with _progress() as bar:
            res = run_experiment(
                experiment,
                preset,
                out=out,
                device=device,
                seeds=seeds,
                overrides=overrides or [],
                force=force,
                progress=bar,
                wait=wait,
            )
    except IclabError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(json.dumps(res.claims_json(), indent=2) + "\n")
    else:
        _print_claims(res)
        console.print(f"figures and claims in {res.out_dir}")


@app.command()
def reproduce(
    paper: Annotated[str | None, typer.Argument(help="paper (e.g. ahn2023) or experiment; default: all")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "quick",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    out: Annotated[Path, typer.Option(help="output root")] = Path("runs"),
    force: Annotated[bool, typer.Option(help="recompute finished runs")] = False,
    strict: Annotated[bool, typer.Option(help="exit 1 if any claim fails")] = False,
    wait: Annotated[bool, typer.Option(help="wait for another process writing the same run directory")] = True,
) -> None:
    """Run every registered experiment (or one paper's) and write OUT/report.md."""
    from iclab.experiments.registry import select
    from iclab.experiments.runner import run_experiment
    from iclab.reporting.report import write_report

    try:
        exps = select(paper)
    except IclabError as e:
        _fail(e)
    results, failures = [], {}
    with _progress() as bar:
        for exp in exps:
            try:
                res = run_experiment(exp.name, preset, out=out, device=device, force=force, progress=bar, wait=wait)
            except OutputError as e:  # no experiment can write: stop now, with one line
                _fail(e)
            except Exception as e:  # one broken experiment must not lose the others' report
                failures[exp.name] = f"{type(e).__name__}: {e}"
                detail = str(e) if isinstance(e, IclabError) else traceback.format_exc()  # our errors: one line
                console.print(f"[red]{exp.name} failed[/red]\n{detail}")
                continue
            results.append(res)
            _print_claims(res)
    path = write_report(results, out, preset=preset, failures=failures)
    n = sum(c.checked for r in results for c in r.claims)
    ok = sum(c.passed for r in results for c in r.claims if c.checked)
    console.print(f"report: {path}  ({ok}/{n} checked claims passed, {len(failures)} experiments failed)")
    if failures or (strict and ok < n):
        raise typer.Exit(1)


@app.command()
def estimate(
    paper: Annotated[str | None, typer.Argument(help="paper (e.g. zhang2025) or experiment; default: all")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="config overrides key=value")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "paper",
    probe_steps: Annotated[int, typer.Option(help="steps each training run is probed for (and half as many)")] = 50,
    probe_runs: Annotated[int, typer.Option(help="runs probed in full; later runs train one step")] = 1_000_000,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the estimates as JSON on stdout")] = False,
) -> None:
    """Project each experiment's wall time at PRESET from a short probe of every training run (nothing is kept)."""
    from iclab.experiments.estimate import estimate_experiment, format_seconds
    from iclab.experiments.registry import select

    try:
        exps = select(paper)
        table = Table(title=f"projected wall time at {preset} on {device} (probe: {probe_steps} steps a run)")
        for col in ("experiment", "runs", "steps", "probe", "projected", "note"):
            table.add_column(col)
        rows = []
        for exp in exps:
            with console.status(f"probing {exp.name}"):
                est = estimate_experiment(
                    exp.name,
                    preset,
                    probe_steps=probe_steps,
                    probe_runs=probe_runs,
                    device=device,
                    overrides=overrides or [],
                )
            rows.append(est.to_dict())
            note = "" if est.complete else f"lower bound: {est.error}"
            table.add_row(
                exp.name,
                str(len(est.runs)),
                str(est.train_steps),
                format_seconds(est.wall_seconds),
                format_seconds(est.projected_seconds),
                note[:80],
            )
    except IclabError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        Console().print(table)


@app.command("train")
def train_cmd(
    config: Annotated[Path, typer.Option("--config", help="YAML file with task/model/train sections")],
    overrides: Annotated[list[str] | None, typer.Argument(help="overrides like train.lr=0.01 model.n_layers=4")] = None,
) -> None:
    """Train one model from a config file (resumable: same config, same directory)."""
    from iclab.core.config import apply_overrides, load_yaml
    from iclab.training.run_config import parse_run_config, run_training

    try:
        cfg = parse_run_config(apply_overrides(load_yaml(config), overrides or []))
    except IclabError as e:
        _fail(e)
    result, out = run_training(cfg)
    console.print(f"final test loss {result.final_test_loss:.6g} after {cfg.train.steps} steps; run in {out}")


@app.command()
def bench(
    out: Annotated[Path, typer.Option(help="where to write the benchmark JSON")] = Path("benchmarks/results"),
    quick: Annotated[bool, typer.Option(help="fewer repetitions")] = False,
    presets: Annotated[bool, typer.Option(help="also time every experiment at the quick preset")] = False,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
) -> None:
    """Measure matmul peak, training-step throughput and preset times; write JSON and print a table."""
    from iclab.bench import run_benchmarks

    try:
        report = run_benchmarks(out, quick=quick, device=device, presets=presets)
    except IclabError as e:
        _fail(e)
    table = Table(title="iclab bench")
    table.add_column("benchmark")
    table.add_column("result")
    for k, v in report.items():
        table.add_row(k, json.dumps(v) if not isinstance(v, str) else v)
    Console().print(table)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
