"""The ``iclab`` command line: list, run, reproduce, report, estimate, train, sweep, bench."""

from __future__ import annotations

import datetime
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from iclab.core.errors import ConfigError, IclabError, OutputError

if TYPE_CHECKING:  # the commands import what they need when they run (a fast `iclab --help`)
    from iclab.experiments.backends import Backend
    from iclab.experiments.parallel import Done
    from iclab.experiments.runner import ExperimentResult

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="In-context learning lab: reproduce papers, train models, benchmark.",
)
console = Console(stderr=True)


class PipedProgress(Progress):
    """rich's progress bar, which draws nothing where its console is not a terminal (a log file, a batch job's output,
    ``nohup``): there progress prints one plain line instead, at most one per ``interval`` seconds, and the last of
    a task of finished runs (``cheng2024.fig4: 108 runs on local: 12/108, 0:41:10 elapsed``); a training run's own
    steps only every ``interval``, so that short runs print nothing."""

    def __init__(self, *columns: Any, interval: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.interval, self._last = interval, time.monotonic()

    def advance(self, task_id: TaskID, advance: float = 1) -> None:  # runs finished (a pool's, Ray's, SLURM's)
        super().advance(task_id, advance)
        self._line(task_id, last=True)

    def update(self, task_id: TaskID, **kwargs: Any) -> None:  # a training run's steps: update(completed=...)
        super().update(task_id, **kwargs)
        if "completed" in kwargs or "advance" in kwargs:
            self._line(task_id, last=False)

    def _line(self, task_id: TaskID, *, last: bool) -> None:
        if self.console.is_terminal:
            return
        task, now = self._tasks[task_id], time.monotonic()
        if (last and task.finished) or now - self._last >= self.interval:
            self._last = now
            elapsed = datetime.timedelta(seconds=int(task.elapsed or 0))
            total = f"/{task.total:.0f}" if task.total is not None else ""
            self.console.print(f"{task.description}: {task.completed:.0f}{total}, {elapsed} elapsed", highlight=False)


def _progress() -> Progress:
    return PipedProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def out_path(value: str | Path) -> Path:
    """``--out``: a folder name; an empty one (``--out ''``, which would write into the current folder) is refused."""
    if not str(value).strip():
        raise typer.BadParameter("must name a folder; got ''")
    return Path(value)


def _fail(e: Exception) -> NoReturn:
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


BackendOpt = Annotated[
    str, typer.Option("--backend", help="local | ray | slurm: where independent training runs execute")
]
SlurmOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--slurm",
        help="slurm: KEY=VALUE, repeatable: partition=P, time=MINUTES (per task), folder=DIR (job logs), "
        "max-requeues=N, parallel=N; any other key is an sbatch option (account=A, qos=Q, constraint=C)",
    ),
]
WorkersOpt = Annotated[int, typer.Option(help="local backend: worker processes (1: this process, as before)")]
AddressOpt = Annotated[
    str | None, typer.Option(help="ray: a running cluster's address (auto | HOST:PORT); default: start a local Ray")
]
CpusOpt = Annotated[float, typer.Option(help="CPUs (and torch threads) per task")]
GpusOpt = Annotated[float, typer.Option(help="ray: GPUs per task (its training runs on cuda)")]
TimeLimitOpt = Annotated[
    str | None,
    typer.Option(
        "--time-limit",
        help="stop after DURATION (90s, 45m, 2h, 1h30m): the runs checkpoint at their next step and the command exits "
        "75; the same command continues (SIGTERM and SIGUSR1 do the same, Ctrl-C too but exits 130)",
    ),
]


def _time_limited(command: Callable[..., None]) -> Callable[..., None]:
    """A command under ``--time-limit`` and SIGTERM / SIGUSR1 / SIGINT (:mod:`iclab.training.stop`): a run asked to
    stop checkpoints at its next step boundary and the command exits 75 (130 after Ctrl-C) with one line saying what
    is done; a second signal kills at once. The same command continues."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        import time

        from iclab.training import stop

        limit = kwargs.get("time_limit")
        try:
            deadline = None if limit is None else time.time() + stop.parse_duration(limit)
        except IclabError as e:
            _fail(e)
        with stop.handling(deadline):
            try:
                command(*args, **kwargs)
            except stop.Stopped as e:
                sys.stderr.write(f"{e}\n")
                interrupted = "SIGINT" in (stop.requested(), e.reason)
                raise typer.Exit(stop.EX_INTERRUPTED if interrupted else stop.EX_TEMPFAIL) from None

    return wrapper


def _backend(
    backend: str, workers: int, address: str | None, cpus: float, gpus: float, slurm: list[str] | None = None
) -> Backend:
    """The backend the options name (one local worker: in this process, as RunContext and run_sweep decide)."""
    from iclab.experiments.backends import make_backend

    try:
        if backend == "slurm":
            from iclab.experiments.slurm import slurm_backend

            return slurm_backend(slurm or [], cpus_per_task=cpus, gpus_per_task=gpus)
        if slurm:
            raise ConfigError("--slurm options need --backend slurm")
        b = make_backend(backend, workers=workers, address=address, cpus_per_task=cpus, gpus_per_task=gpus)
    except IclabError as e:
        _fail(e)
    return b


def _print_claims(res: ExperimentResult) -> None:
    table = Table(title=f"{res.experiment.name} [{res.preset}] {res.seconds:.1f}s{' (reused)' if res.reused else ''}")
    for col in ("claim", "passed", "measured", "expected"):
        table.add_column(col)
    for c in res.claims:
        table.add_row(c.name, _STATUS[c.status], str(c.measured), c.expected)
    console.print(table)


@app.command()
@_time_limited
def run(
    experiment: Annotated[str, typer.Argument(help="experiment name, e.g. ahn2023.fig1 (see `iclab list`)")],
    overrides: Annotated[list[str] | None, typer.Argument(help="config overrides key=value")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "quick",
    seeds: Annotated[int | None, typer.Option(help="number of seeds (runs)")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    out: Annotated[Path, typer.Option(help="output root", parser=out_path)] = Path("runs"),
    force: Annotated[
        bool, typer.Option(help="recompute: delete the run directory's results and checkpoints, retrain every run")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the claims as JSON on stdout")] = False,
    wait: Annotated[bool, typer.Option(help="wait for another process writing the same run directory")] = True,
    backend: BackendOpt = "local",
    workers: WorkersOpt = 1,
    address: AddressOpt = None,
    cpus_per_task: CpusOpt = 1,
    gpus_per_task: GpusOpt = 0,
    slurm: SlurmOpt = None,
    time_limit: TimeLimitOpt = None,
) -> None:
    """Run one experiment at a preset; write its figures and claims under OUT.

    With --workers K (or --backend ray) its independent training runs are tasks of a process pool (a Ray cluster);
    the claims are the same."""
    from iclab.experiments.runner import run_experiment

    pool = _backend(backend, workers, address, cpus_per_task, gpus_per_task, slurm)
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
                backend=pool,
            )
    except IclabError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(json.dumps(res.claims_json(), indent=2) + "\n")
    else:
        _print_claims(res)
        console.print(f"figures and claims in {res.out_dir}")


def _reproduce_on_pool(
    names: list[str], preset: str, out: Path, device: str, force: bool, wait: bool, workers: int, threads: int
) -> tuple[list[ExperimentResult], dict[str, str]]:
    """Whole experiments on ``workers`` processes of ``threads`` torch threads, longest first; each one's claims (or
    its failure) printed as it ends. The results and failures in the order of ``names``, as the serial loop gives."""
    from iclab.experiments.parallel import run_experiments

    with _progress() as bar:
        task = bar.add_task(f"{len(names)} experiments, {min(workers, len(names))} at a time", total=len(names))

        def show(d: Done) -> None:
            bar.advance(task)
            if d.result is not None:
                _print_claims(d.result)
            else:
                console.print(f"[red]{d.name} failed[/red]\n{d.detail}")

        done = run_experiments(
            names,
            preset,
            out=out,
            device=device,
            force=force,
            wait=wait,
            workers=workers,
            threads=max(1, threads),
            on_done=show,
        )
    results: list[ExperimentResult] = []
    failures: dict[str, str] = {}
    for d in done:
        if d.output_error:  # no experiment can write: stop, with one line
            _fail(OutputError(d.detail))
        if d.result is not None:
            results.append(d.result)
        else:
            failures[d.name] = d.error or "failed"
    return results, failures


@app.command()
@_time_limited
def reproduce(
    paper: Annotated[str | None, typer.Argument(help="paper (e.g. ahn2023) or experiment; default: all")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "quick",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    out: Annotated[Path, typer.Option(help="output root", parser=out_path)] = Path("runs"),
    force: Annotated[
        bool, typer.Option(help="recompute: delete each run directory's results and checkpoints, retrain every run")
    ] = False,
    strict: Annotated[bool, typer.Option(help="exit 1 if any claim fails")] = False,
    wait: Annotated[bool, typer.Option(help="wait for another process writing the same run directory")] = True,
    backend: BackendOpt = "local",
    workers: Annotated[
        int | None,
        typer.Option(
            help="processes: several experiments run this many at a time, longest first, each in one process of "
            "--cpus-per-task threads (default: the cores; 1 for one experiment, a GPU or Ray); one experiment: its "
            "training runs are spread over them; 1: everything in this process, one after another"
        ),
    ] = None,
    address: AddressOpt = None,
    cpus_per_task: CpusOpt = 1,
    gpus_per_task: GpusOpt = 0,
    time_limit: TimeLimitOpt = None,
) -> None:
    """Run every registered experiment (or one paper's) and write OUT/report.md."""
    from iclab.experiments.registry import select
    from iclab.experiments.runner import run_experiment
    from iclab.reporting.report import write_report
    from iclab.reporting.site import write_site
    from iclab.training.stop import Stopped

    try:
        exps = select(paper)
    except IclabError as e:
        _fail(e)
    from iclab.experiments.parallel import default_workers

    if workers is None:
        workers = default_workers(len(exps), backend, device)
    results: list[ExperimentResult] = []
    failures: dict[str, str] = {}
    if backend == "local" and workers > 1 and len(exps) > 1:  # whole experiments on a pool of processes
        names = [e.name for e in exps]
        results, failures = _reproduce_on_pool(names, preset, out, device, force, wait, workers, int(cpus_per_task))
        exps = []  # all ran: the loop below has nothing left
    pool = _backend(backend, workers, address, cpus_per_task, gpus_per_task)
    with _progress() as bar:
        for exp in exps:
            try:
                res = run_experiment(
                    exp.name, preset, out=out, device=device, force=force, progress=bar, wait=wait, backend=pool
                )
            except OutputError as e:  # no experiment can write: stop now, with one line
                _fail(e)
            except Stopped as e:  # the experiments before it wrote their results; no report until all finish
                raise Stopped(f"{len(results)}/{len(exps)} experiments finished; {e.progress}", e.reason) from None
            except Exception as e:  # one broken experiment must not lose the others' report
                failures[exp.name] = f"{type(e).__name__}: {e}"
                detail = str(e) if isinstance(e, IclabError) else traceback.format_exc()  # our errors: one line
                console.print(f"[red]{exp.name} failed[/red]\n{detail}")
                continue
            results.append(res)
            _print_claims(res)
    path = write_report(results, out, preset=preset, failures=failures)
    if results or failures:
        console.print(f"site: {write_site(out, results=results, failures=failures)}")
    n = sum(c.checked for r in results for c in r.claims)
    ok = sum(c.passed for r in results for c in r.claims if c.checked)
    console.print(f"report: {path}  ({ok}/{n} checked claims passed, {len(failures)} experiments failed)")
    if failures or (strict and ok < n):
        raise typer.Exit(1)


@app.command()
def report(
    run_dirs: Annotated[
        list[Path] | None, typer.Argument(help="with --compare: the run directories to compare (two or more)")
    ] = None,
    out: Annotated[Path, typer.Option(help="output root holding the run directories", parser=out_path)] = Path("runs"),
    compare: Annotated[
        bool, typer.Option(help="write OUT/report/compare.html: RUN_DIRS' curves overlaid, their configs diffed")
    ] = False,
    serve: Annotated[
        bool, typer.Option(help="serve OUT on localhost and print the report's URL, until Ctrl-C")
    ] = False,
    port: Annotated[int, typer.Option(help="port for --serve (0: any free one)", min=0, max=65535)] = 8000,
    screenshot: Annotated[bool, typer.Option(help="also save OUT/report/index.png (playwright + chromium)")] = False,
) -> None:
    """Write the HTML report OUT/report/ from the run of each card's own config under OUT (and OUT/sweeps/);
    with --compare, only OUT/report/compare.html for RUN_DIRS (e.g. two learning rates of one figure)."""
    from iclab.reporting import site

    if compare or run_dirs:
        try:
            page = site.write_compare(out, run_dirs or [])
        except IclabError as e:
            _fail(e)
        console.print(f"compare: {page}  (open it in a browser; no server needed)")
        return
    try:
        index = site.write_site(out)
    except IclabError as e:
        _fail(e)
    console.print(f"site: {index}  (open it in a browser; no server needed)")
    if screenshot:
        shot = site.screenshot(index.parent)
        console.print(
            f"screenshot: {shot}" if shot else "[yellow]no screenshot: playwright or chromium missing[/yellow]"
        )
    if serve:  # OUT, not OUT/report: the pages link the figures where the runs wrote them (../<experiment>/...)
        try:  # regular files under OUT only, never through a symbolic link
            httpd = site.serve(out, port)
        except OSError as e:
            _fail(OutputError(f"cannot serve on 127.0.0.1:{port} ({e.strerror or e}); choose another --port"))
        with httpd:
            console.print(f"serving http://127.0.0.1:{httpd.server_port}/{site.SITE_DIR}/index.html  (Ctrl-C to stop)")
            try:
                httpd.serve_forever()
            except KeyboardInterrupt:
                console.print("stopped")


@app.command()
def estimate(
    paper: Annotated[str | None, typer.Argument(help="paper (e.g. zhang2025) or experiment; default: all")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="config overrides key=value")] = None,
    preset: Annotated[str, typer.Option(help="smoke | quick | paper")] = "paper",
    probe_steps: Annotated[
        int, typer.Option(help="steps each training run is probed for (full-batch runs also half as many)")
    ] = 50,
    probe_runs: Annotated[
        int,
        typer.Option(
            help="runs probed in full; later runs train one step and borrow the probed runs' mean step cost (an "
            "underestimate where later runs are larger: wang2025.fig3 projects 3.5 h with 1, 20 h with all)"
        ),
    ] = 1_000_000,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i]")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the estimates as JSON on stdout")] = False,
    per_run: Annotated[bool, typer.Option(help="also print every training run's projection and core-hours")] = False,
) -> None:
    """Project each experiment's wall time and core-hours at PRESET from a short probe of every training run (nothing
    is kept). Core-hours are what --workers or Ray spread; the longest run is the wall time no worker count beats.
    A sweep spec (SPEC.yaml) gets `iclab sweep SPEC.yaml --dry-run`'s plan: each point, its state and projection."""
    from iclab.experiments.estimate import estimate_experiment, format_seconds
    from iclab.experiments.registry import select

    if paper is not None and paper.endswith((".yaml", ".yml")):
        from iclab.experiments.sweep import load_sweep_spec

        try:
            parsed = load_sweep_spec(paper, validate=False)
        except IclabError as e:
            _fail(e)
        _dry_run(parsed, Path("runs"), probe_steps)
        return

    try:
        exps = select(paper)
        table = Table(title=f"projected wall time at {preset} on {device} (probe: {probe_steps} steps a run)")
        for col in ("experiment", "runs", "steps", "probe", "projected", "core-h", "longest run", "note"):
            table.add_column(col)
        run_table = Table(title="training runs")
        for col in ("experiment", "run", "steps", "projected", "core-h"):
            run_table.add_column(col)
        rows: list[dict[str, Any]] = []
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
                f"{est.core_hours:.3g}",
                format_seconds(est.longest_run_seconds),
                note[:80],
            )
            for r in est.runs:
                core_h = r.projected_seconds * est.threads / 3600
                run_table.add_row(exp.name, r.name, str(r.steps), format_seconds(r.projected_seconds), f"{core_h:.3g}")
    except IclabError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        if per_run:
            Console().print(run_table)
        Console().print(table)
        total = sum(r["core_hours"] for r in rows)
        threads = rows[0]["threads"] if rows else 1
        console.print(f"total: {total:.3g} core-hours at {threads} threads a process")


@app.command("train")
@_time_limited
def train_cmd(
    config: Annotated[Path, typer.Option("--config", help="YAML file with task/model/train sections")],
    overrides: Annotated[list[str] | None, typer.Argument(help="overrides like train.lr=0.01 model.n_layers=4")] = None,
    time_limit: TimeLimitOpt = None,
) -> None:
    """Train one model from a config file (resumable: same config, same directory). Errors are one line, as `iclab
    run`'s: a config refused, an `out:` that cannot be written (probed before any work), a full disk, a divergence."""
    from iclab.core.config import apply_overrides, config_hash, load_yaml
    from iclab.core.io import probe_writable
    from iclab.training.run_config import parse_run_config, run_training

    try:
        cfg = parse_run_config(apply_overrides(load_yaml(config), overrides or []))
        probe_writable(Path(cfg.out) / config_hash(cfg), "set another out: in the config")
        result, out = run_training(cfg)
    except IclabError as e:
        _fail(e)
    console.print(f"final test loss {result.final_test_loss:.6g} after {cfg.train.steps} steps; run in {out}")


@app.command()
@_time_limited
def sweep(
    spec: Annotated[Path, typer.Argument(help="sweep spec YAML (see examples/sweeps/)")],
    out: Annotated[
        Path,
        typer.Option(help="output root: points in OUT/<experiment>/..., the table in OUT/sweeps/", parser=out_path),
    ] = Path("runs"),
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:i] (experiment points)")] = "cpu",
    dry_run: Annotated[bool, typer.Option(help="list the points, their state and projected cost; run nothing")] = False,
    probe_steps: Annotated[int, typer.Option(help="--dry-run: steps each point's cost probe trains")] = 50,
    backend: BackendOpt = "local",
    workers: WorkersOpt = 1,
    address: AddressOpt = None,
    cpus_per_task: CpusOpt = 1,
    gpus_per_task: GpusOpt = 0,
    slurm: SlurmOpt = None,
    time_limit: TimeLimitOpt = None,
) -> None:
    """Run an experiment (or a train config) over grid / zip / list axes and seeds; write OUT/sweeps/NAME/sweep.parquet
    and one figure per swept key. Finished points are reused; a failing point is reported and the others go on."""
    from iclab.experiments._sweep_limits import MAX_POINTS
    from iclab.experiments.sweep import check_points, format_failure, load_sweep_spec, run_sweep

    try:
        parsed = load_sweep_spec(spec, validate=False)
        if not dry_run or parsed.size <= MAX_POINTS:  # a larger dry run validates each point as it plans it
            check_points(parsed)
    except IclabError as e:
        _fail(e)
    if dry_run:
        _dry_run(parsed, out, probe_steps)
        return
    pool = _backend(backend, workers, address, cpus_per_task, gpus_per_task, slurm)
    try:
        with _progress() as bar:
            task = bar.add_task(f"sweep {parsed.name}", total=parsed.size)
            result = run_sweep(parsed, out=out, backend=pool, device=device, on_done=lambda _: bar.advance(task))
    except IclabError as e:
        _fail(e)
    points = {p.label: p for p in parsed.points()}
    for o in result.failures:
        console.print(f"[red]{format_failure(o, points[o.label])}[/red]")
    n = len(result.table)
    console.print(
        f"sweep {parsed.name}: {n - len(result.failures)}/{n} points ok in {result.seconds:.1f} s; "
        f"table {result.out_dir / 'sweep.parquet'}, {len(result.figures)} figures"
    )
    if result.failures:
        raise typer.Exit(1)


def _dry_run(parsed: Any, out: Path, probe_steps: int) -> None:
    """``iclab sweep --dry-run``: one line per point as it is planned (a large sweep streams: nothing expanded), then
    the projected total."""
    from iclab.experiments.estimate import format_seconds, iter_plan_sweep

    stdout = Console(soft_wrap=True)
    stdout.print(f"sweep {parsed.name}: {parsed.size} points\npoint\tstate\tprojected\trun directory", markup=False)
    total = 0.0
    try:
        for r in iter_plan_sweep(parsed, out=out, probe_steps=probe_steps):
            total += r["projected_seconds"]
            line = f"{r['point']}\t{r['state']}\t{format_seconds(r['projected_seconds'])}\t{r['run_dir']}"
            stdout.print(line, markup=False, highlight=False)
    except IclabError as e:
        _fail(e)
    console.print(f"projected total: {format_seconds(total)} of one worker")


@app.command()
def bench(
    out: Annotated[Path, typer.Option(help="where to write the benchmark JSON")] = Path("benchmarks/results"),
    quick: Annotated[bool, typer.Option(help="fewer repetitions")] = False,
    presets: Annotated[bool, typer.Option(help="also time every experiment at the quick preset")] = False,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    roofline: Annotated[
        bool, typer.Option("--roofline", help="every paper's step against its FLOP and memory bound")
    ] = False,
    smoke: Annotated[bool, typer.Option(help="with --roofline: tiny shapes (seconds)")] = False,
    only: Annotated[str | None, typer.Option(help="with --roofline: the steps whose key contains this")] = None,
) -> None:
    """Measure matmul peak, training-step throughput and preset times; write JSON and print a table.
    ``--roofline``: every paper's training step against its roofline (roofline-<device>.json)."""
    if roofline:
        from iclab.roofline import run_roofline

        rows = run_roofline(out, device=device, smoke=smoke, rounds=2 if quick else 3, only=only)["steps"]
        report: dict[str, object] = {k: f"{r['ms_per_step']:.3g} ms, {r['x_bound']:.2f}x its {r['bound']} bound"
                                     for k, r in rows.items()}  # fmt: skip
    else:
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


#: the C kernels ``iclab doctor`` builds or loads, shape-specialised ones at a paper's shape:
#: (what it runs, the import path of its module, the arguments of the module's ``native()``)
DOCTOR_KERNELS = (
    ("Cheng et al.'s kernel-attention stack", "iclab.models._kernel_fast", ()),
    ("Wang et al.'s Trained TF softmax head", "iclab.models._categorical_fast", ()),
    ("Wang et al.'s Trained TF rbf head (per-key term)", "iclab.models._quad_form", ()),
    ("Sun et al.'s bilinear stack, d = 4", "iclab.models._bilinear_fast", (13, 5)),
    ("Zhang et al.'s query row, d = 4", "iclab.models._query_fast", (5,)),
    ("Ahn et al.'s linear stack (moment form), d = 5", "iclab.models._moment_fast", (6,)),
    ("|K| and Cholesky label draws", "iclab.core.symabs", ()),
    ("Sun et al.'s polynomial labels", "iclab.tasks.polynomial", ()),
    ("the L-BFGS two-loop recursion", "iclab.training.lbfgs", ()),
    ("Zhang et al.'s reduced separate-head flow", "iclab.training._reduced_flow", ()),
)


@app.command()
def doctor(
    prune: Annotated[
        bool, typer.Option("--prune", help="remove built kernels unused for a while or past the cache's file limit")
    ] = False,
) -> None:
    """Report the Python, torch, CPU and compiler, and build or load every C kernel: which run, and why any does not."""
    import importlib
    import os
    import platform
    import warnings

    import torch

    from iclab.core import native

    info = Table(title="iclab doctor", show_header=False)
    info.add_column("item")
    info.add_column("value")
    info.add_row("python", f"{platform.python_version()} ({sys.executable})")
    info.add_row("torch", f"{torch.__version__}, {torch.get_num_threads()} threads")
    flags = native.cpu_flags()
    isa = ", ".join(f"{k} {'yes' if v else 'no'}" if v is not None else f"{k} ?" for k, v in flags.items())
    info.add_row(
        "CPU", f"{native.cpu_model()} ({platform.machine()}): {isa}; torch dispatches {native.cpu_capability()}"
    )
    cc = native.find_compiler()
    info.add_row("C compiler", f"{cc} ({native.compiler_version(cc) or 'no version'})" if cc else "[red]none[/red]")
    info.add_row("ICLAB_NATIVE", os.environ.get("ICLAB_NATIVE", "unset (kernels on)"))
    with warnings.catch_warnings():  # the table below says what each warning would
        warnings.simplefilter("ignore", native.NativeKernelWarning)
        for _, module, args in DOCTOR_KERNELS:
            importlib.import_module(module).native(*args)
    kernels = Table(title="C kernels")
    for col in ("kernel", "runs", "state", "vectors"):
        kernels.add_column(col)
    kernels.add_column("library in the cache, or why the torch code runs", overflow="fold")
    used_for = {importlib.import_module(m)._SOURCE.name: what for what, m, _ in DOCTOR_KERNELS}
    for r in native.records():
        colour = "red" if r.status == "fallback" else "green"
        detail = r.reason if r.path is None else "; ".join(filter(None, [r.path.name, r.reason]))
        kernels.add_row(r.name, used_for.get(r.source.name, ""), f"[{colour}]{r.status}[/{colour}]", r.isa, detail)
    folder = native.kernel_dir()
    if prune:
        native.prune(folder)
    count, size = native.cache_usage(folder)
    state = "" if os.access(folder, os.W_OK) else " (not writable)" if folder.exists() else " (not created yet)"
    kept = f"at most {native.PRUNE_KEEP}, each used within {native.PRUNE_DAYS:g} days"
    info.add_row(
        "kernel cache",
        f"{folder}{state}: {count} libraries ({kept}), {size / 2**20:.1f} MiB; {len(native.pruned())} pruned now",
    )
    out = Console()
    out.print(info)
    out.print(kernels)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
