"""Run an experiment at a preset: resolve its config, reuse or resume its run directory, write
results, figures and ``claims.json``.

Layout: ``<out>/<experiment>/<preset>-<config hash>/`` holding ``config.yaml``, ``results.pt``,
``claims.json``, ``summary.json`` (the experiment, preset, wall ``seconds`` of all pieces, ``pieces``, whether every
claim passed, the figures, ``skipped_steps``), figures (``*.png``), ``pieces.json`` while an experiment is unfinished,
and one sub-directory per training run (checkpoints and ``metrics.jsonl``). Same config, same directory: a finished
experiment is reused, an interrupted one resumes its training runs from their checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.progress import Progress

from iclab.core.config import apply_overrides, config_hash, from_dict, route_shorthand, to_dict
from iclab.core.devices import resolve_device
from iclab.core.errors import ConfigError, CorruptFileError, IclabError, OutputError, did_you_mean, is_int
from iclab.core.io import (
    atomic_torch_save,
    atomic_write_json,
    atomic_write_text,
    quarantine,
    read_json,
    safe_torch_load,
)
from iclab.core.provenance import git_commit
from iclab.core.safe_parse import is_finite_number
from iclab.experiments.backends import Backend, RayBackend
from iclab.experiments.locks import run_lock
from iclab.experiments.registry import (
    CARD_PACKAGES,
    PRESETS,
    ClaimResult,
    Experiment,
    RunContext,
    all_experiments,
    get,
)
from iclab.training.run import DIVERGED, RETRY
from iclab.training.stop import Stopped
from iclab.training.trainer import CHECKPOINT

log = logging.getLogger("iclab")


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` returns: the resolved config, the run directory, the card's results, its checked claims and figure paths."""

    experiment: Experiment
    preset: str
    config: Any
    out_dir: Path
    results: dict[str, Any]
    claims: list[ClaimResult]
    figures: list[Path]
    seconds: float
    reused: bool

    @property
    def passed(self) -> bool:
        """Every checked claim passed (claims not checked at this preset do not count)."""
        return all(c.passed for c in self.claims if c.checked)

    def claims_json(self) -> list[dict[str, Any]]:
        """The claims as JSON-ready dicts (``claims.json``)."""
        return [c.to_dict() for c in self.claims]


def resolve_config(
    exp: Experiment, preset: str, overrides: list[str] | tuple[str, ...] = (), seeds: int | None = None
) -> Any:
    """The experiment's config at ``preset`` with ``key=value`` overrides, validated."""
    if preset not in PRESETS:
        raise ConfigError(f"preset must be one of {list(PRESETS)}; got {preset!r}{did_you_mean(preset, list(PRESETS))}")
    data = route_shorthand(exp.config, dict(exp.presets[preset]), owner=exp.name)
    data = apply_overrides(data, list(overrides), cls=exp.config, owner=exp.name)
    if seeds is not None:
        names = {f.name for f in dataclasses.fields(exp.config)}
        if "seeds" not in names:
            raise ConfigError(f"experiment {exp.name!r} has no seeds to set (it is deterministic)")
        if seeds < 1:
            raise ConfigError(f"--seeds must be an int >= 1; got {seeds}")
        data["seeds"] = seeds
    return from_dict(exp.config, data, owner=exp.name)


def judge(preset: str, claims: list[ClaimResult]) -> list[ClaimResult]:
    """At ``smoke``, report the claims that carry a ``smoke_reason`` as not checked, with that reason."""
    if preset != "smoke":
        return claims
    return [c.not_checked(c.smoke_reason) if c.smoke_reason and c.checked else c for c in claims]


def run_experiment(
    name: str,
    preset: str = "quick",
    *,
    out: str | Path = "runs",
    device: str = "cpu",
    seeds: int | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    force: bool = False,
    progress: Progress | None = None,
    wait: bool = True,
    backend: Backend | None = None,
) -> ExperimentResult:
    """Run ``name`` at ``preset`` into ``out/<name>/<preset>-<hash>/`` (reuse it when finished, resume it otherwise).

    ``backend`` (:mod:`iclab.experiments.backends`): where the experiment's independent training runs execute, as
    tasks of a local process pool or of Ray; the driver (this process) gathers them, plots and checks the claims. The
    run directory, the seeds and the numbers are the same whichever backend ran them.

    One process writes a run directory at a time: a second one waits for the lock and then reuses the result, or with
    ``wait=False`` raises ``RunLockedError`` naming the holder. A damaged ``results.pt`` (torn, failing its checksum,
    or a pickle asking for code) is moved aside and recomputed; nothing in it is executed.
    """
    exp = get(name)
    cfg = resolve_config(exp, preset, overrides, seeds)
    dev = resolve_device(device)
    out = Path(out).absolute()  # every path a task gets is absolute: a worker's working directory may be elsewhere
    run_dir = out / exp.name / f"{preset}-{config_hash(cfg)}"
    config_text = yaml.safe_dump({"experiment": exp.name, "preset": preset, "config": to_dict(cfg)}, sort_keys=False)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", config_text)  # also the write probe: fail here, before any work
    except OSError as e:
        raise OutputError(f"cannot write the run directory {run_dir} ({e.strerror or e}); choose another --out") from e
    if isinstance(backend, RayBackend):
        backend.check_shared_storage(Path(out))
    with _output_errors(exp.name, run_dir), run_lock(run_dir, wait=wait):
        return _run_locked(exp, preset, cfg, dev, run_dir, force, progress, backend)


#: what a recompute keeps of a run directory: its config and the lock the recompute holds
_KEPT_BY_FORCE = frozenset({"config.yaml", ".lock", "lock.json"})


def clear_run_dir(run_dir: Path) -> None:
    """Delete what ``run_dir`` holds from earlier (results, figures, claims, the time of earlier pieces, and every
    training run's checkpoints), so that ``--force`` retrains every run: a checkpoint is matched to its run by the
    run's config, not by the code that sampled its data, so after a change to the code it would be loaded as it
    stands. The caller holds the directory's lock."""
    for entry in run_dir.iterdir():
        if entry.name in _KEPT_BY_FORCE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextlib.contextmanager
def _output_errors(name: str, run_dir: Path) -> Iterator[None]:
    """A write that fails for want of space or permission (figures, claims, summary; the checkpoints and
    ``results.pt`` say so themselves) as one :class:`OutputError` line: what is kept, and that the same command
    finishes it (the results, once written, are reused)."""
    try:
        yield
    except OSError as e:
        if e.errno not in _OUTPUT_ERRNOS:
            raise
        kept = "results.pt is kept" if (run_dir / "results.pt").is_file() else "the checkpoints are kept"
        raise OutputError(
            f"{name}: could not write {e.filename or run_dir} ({e.strerror or e}); {kept}: free space and run the "
            "same command again"
        ) from e


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def _run_locked(
    exp: Experiment,
    preset: str,
    cfg: Any,
    dev: torch.device,
    run_dir: Path,
    force: bool,
    progress: Progress | None,
    backend: Backend | None = None,
) -> ExperimentResult:
    t0 = time.perf_counter()
    results_path = run_dir / "results.pt"
    if force:
        clear_run_dir(run_dir)
    reuse = None if force else reuse_results(exp, preset, cfg, run_dir)
    reused = reuse is not None
    if reuse is not None:
        results, figures, claims = reuse
    else:
        task_device = getattr(backend, "task_device", None)  # "cuda" for Ray or SLURM tasks with GPUs
        ctx = RunContext(
            out_dir=run_dir,
            device=dev,
            preset=preset,
            progress=progress,
            experiment=exp.name,
            backend=backend,
            task_device=task_device,
        )
        _say_resuming(exp.name, run_dir, progress)
        try:
            results = exp.run(cfg, ctx)
        except Stopped as e:  # its runs checkpointed: no results, no claims (the experiment is not finished)
            add_piece(run_dir, time.perf_counter() - t0)
            raise Stopped(f"{exp.name}: {progress_text(run_dir, e.not_started)}", e.reason, e.not_started) from None
        except Exception:  # a run failed (the others finished or checkpointed): the same command, once mended, goes on
            add_piece(run_dir, time.perf_counter() - t0)
            raise
        try:
            atomic_torch_save(results_path, results)
        except OSError as e:
            raise OutputError(
                f"{exp.name}: could not write {results_path} ({e.strerror or e}); the training runs' checkpoints are "
                "kept: free space and run the same command again"
            ) from e
        figures = exp.plot(results, cfg, run_dir)
        claims = judge(preset, exp.claims(results, cfg))
    seconds, pieces = time.perf_counter() - t0, 1
    skipped: dict[str, tuple[int, int]] = {}
    retried: dict[str, tuple[float, int, float]] = {}
    # the code that made the results: a reused result keeps its commit; a run in pieces names the last piece's code
    commit = stored_commit(run_dir) if reused else git_commit()
    if reused:  # a damaged summary only loses the first run's time
        seconds, pieces, skipped, retried = stored_summary(run_dir, seconds)
    else:  # an experiment stopped on a deadline and continued: the time of every piece
        earlier = pieces_seconds(run_dir)
        seconds, pieces = seconds + sum(earlier), 1 + len(earlier)
        skipped, retried = dict(ctx.skipped), dict(ctx.retried)
        _say_skipped(exp.name, skipped, retried)
    atomic_write_json(run_dir / "claims.json", [c.to_dict() for c in claims])
    atomic_write_json(
        run_dir / "summary.json",
        {
            "experiment": exp.name,
            "preset": preset,
            "seconds": seconds,
            "passed": all(c.passed for c in claims if c.checked),
            "figures": [f.name for f in figures],
            "commit": commit,
        }
        | ({"pieces": pieces} if pieces > 1 else {})
        | ({"skipped_steps": {k: list(v) for k, v in skipped.items()}} if skipped else {})
        | ({"retried": {k: list(v) for k, v in retried.items()}} if retried else {}),
    )
    (run_dir / PIECES).unlink(missing_ok=True)  # their time is in the summary now
    return ExperimentResult(exp, preset, cfg, run_dir, results, claims, figures, seconds, reused)


def run_progress(run_dir: Path) -> tuple[int, list[str]]:
    """How much of a run directory's training is done, from the checkpoints under it: the runs finished, and each
    partial run as ``"<run> at step k/K"``. Runs with no checkpoint (not started, or kept in memory) are not seen."""
    finished, partial = 0, []
    for path in sorted(run_dir.rglob(CHECKPOINT)):
        if (path.parent / RETRY / DIVERGED).is_file():  # a first attempt that diverged: its retry counts
            continue
        try:
            ck = safe_torch_load(path)
        except CorruptFileError:
            continue  # the trainer moves it aside and falls back when it resumes
        if not isinstance(ck, dict):
            continue
        if ck.get("finished"):
            finished += 1
        else:
            steps = ck.get("config", {}).get("steps", "?")
            partial.append(f"{path.parent.relative_to(run_dir).as_posix()} at step {ck.get('step', '?')}/{steps}")
    return finished, partial


def progress_text(run_dir: Path, not_started: int = 0) -> str:
    """:func:`run_progress` in words: "5 runs finished, 2 partial (seed5 at step 3000/8000, seed6 at step 120/8000),
    4 not started"."""
    finished, partial = run_progress(run_dir)
    text = f"{finished} run{'s' * (finished != 1)} finished"
    if partial:
        shown = ", ".join(partial[:4]) + (f", {len(partial) - 4} more" if len(partial) > 4 else "")
        text += f", {len(partial)} partial ({shown})"
    if not_started:
        text += f", {not_started} not started"
    return text


def _say_resuming(name: str, run_dir: Path, progress: Progress | None) -> None:
    """Before work on a run directory that holds checkpoints: how much is done ("resuming: ...")."""
    if not any(run_dir.rglob(CHECKPOINT)):
        return
    line = f"{name}: resuming: {progress_text(run_dir)}"
    if progress is not None:
        progress.console.print(line, soft_wrap=True, markup=False, highlight=False)  # one line, as written
    else:
        log.info(line)


def reuse_results(
    exp: Experiment, preset: str, cfg: Any, run_dir: Path
) -> tuple[Any, list[Path], list[ClaimResult]] | None:
    """The finished results of ``run_dir``, their figures and claims; ``None`` when there are none, or when
    ``results.pt`` is damaged or does not hold this experiment's results (a pickle of another shape: ``{'hello': 1}``),
    which the card's own ``plot`` and ``claims`` are the schema of. A damaged file is moved aside (numbered, never
    over an earlier one) with one warning line, and the caller recomputes it."""
    path = run_dir / "results.pt"
    if not path.is_file():
        return None
    try:
        results = safe_torch_load(path, allowed=results_types())
        figures = exp.plot(results, cfg, run_dir)
        claims = judge(preset, exp.claims(results, cfg))
        if not isinstance(claims, list) or not all(isinstance(c, ClaimResult) for c in claims):
            raise TypeError("its claims are not a list of claims")
    except CorruptFileError as e:
        reason = e.reason
    except (IclabError, ArithmeticError, LookupError, TypeError, AttributeError, ValueError, RuntimeError) as e:
        text = str(e).strip().splitlines()
        reason = f"does not hold {exp.name}'s results ({type(e).__name__}: {text[0][:200] if text else ''})"
    else:
        return results, figures, claims
    dest = quarantine(path)
    log.warning("damaged results %s: %s; moved to %s, recomputing", path, reason, dest.name)
    return None


PIECES = "pieces.json"


def add_piece(run_dir: Path, seconds: float) -> None:
    """Keep the wall time of a piece of the experiment that stopped on a deadline or a signal, or ended on a failed
    run (``PIECES``: one entry per piece), so that the finished experiment's ``seconds`` are those of all its pieces."""
    entries = [*pieces_seconds(run_dir), round(seconds, 3)]
    atomic_write_json(run_dir / PIECES, [{"seconds": s} for s in entries])


def pieces_seconds(run_dir: Path) -> list[float]:
    """The wall times of the stopped pieces kept in ``PIECES`` (none if there is no such file; a damaged one is
    moved aside with one warning line, its time lost)."""
    path = run_dir / PIECES
    if not path.is_file():
        return []
    try:
        entries = read_json(path)
    except CorruptFileError as e:
        reason = e.reason
    else:
        items = entries if isinstance(entries, list) else [None]
        times: list[Any] = [e.get("seconds") if isinstance(e, dict) else None for e in items]
        if all(is_finite_number(t) and t >= 0 for t in times):
            return [float(t) for t in times]
        reason = f"holds no list of times in seconds (got {_short(entries)})"
    dest = quarantine(path)
    log.warning("damaged %s: %s; moved to %s, the time of its pieces is not counted", path, reason, dest.name)
    return []


def stored_commit(run_dir: Path) -> dict[str, Any] | None:
    """The commit that ``summary.json`` records as the code that made the results (``{"sha": str, "dirty": ...}``), or
    None where it records none or is damaged (:func:`stored_summary` says so and sets it aside)."""
    try:
        summary = read_json(run_dir / "summary.json")
    except (CorruptFileError, OSError):
        return None
    commit = summary.get("commit") if isinstance(summary, dict) else None
    return commit if isinstance(commit, dict) and isinstance(commit.get("sha"), str) else None


def stored_summary(
    run_dir: Path, default: float
) -> tuple[float, int, dict[str, tuple[int, int]], dict[str, tuple[float, int, float]]]:
    """The first run's wall time, its number of pieces (``pieces``, else 1), the training runs that skipped
    non-finite steps (``skipped_steps``: name -> (skipped, steps)) and those that diverged and trained again at a lower
    lr (``retried``: name -> (lr, step, retry lr)) from ``summary.json`` (entries of another shape are left out):
    ``default``, 1 and none when the file is missing, damaged or holds no finite time ≥ 0 (``[]``, ``null``,
    ``{"seconds": "abc"}``); a damaged one is moved aside with one warning line (the caller rewrites it)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return default, 1, {}, {}
    try:
        summary = read_json(path)
    except CorruptFileError as e:
        reason = e.reason
    else:
        seconds = summary.get("seconds") if isinstance(summary, dict) else None
        if is_finite_number(seconds) and seconds >= 0:
            pieces = summary.get("pieces", 1)
            pieces = int(pieces) if is_finite_number(pieces) and pieces >= 1 else 1
            notes = skipped_entries(summary.get("skipped_steps")), retried_entries(summary.get("retried"))
            return float(seconds), pieces, *notes
        reason = f"holds no time in seconds (got {_short(summary)})"
    dest = quarantine(path)
    log.warning("damaged summary %s: %s; moved to %s, rewriting it", path, reason, dest.name)
    return default, 1, {}, {}


def skipped_entries(value: object) -> dict[str, tuple[int, int]]:
    """summary.json's ``skipped_steps`` (run name -> [skipped, steps]); entries of another shape are left out."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k): (int(v[0]), int(v[1]))
        for k, v in value.items()
        if isinstance(v, list) and len(v) == 2 and all(is_int(x, 0) for x in v)
    }


def retried_entries(value: object) -> dict[str, tuple[float, int, float]]:
    """summary.json's ``retried`` (run name -> [lr, step it diverged at, retry lr]); entries of another shape are left
    out."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k): (float(v[0]), int(v[1]), float(v[2]))
        for k, v in value.items()
        if isinstance(v, list)
        and len(v) == 3
        and is_finite_number(v[0])
        and is_int(v[1], -1)
        and is_finite_number(v[2])
    }


def _say_skipped(
    name: str, skipped: dict[str, tuple[int, int]], retried: dict[str, tuple[float, int, float]] | None = None
) -> None:
    """One warning line naming the training runs that skipped steps for a non-finite loss or gradient, and one naming
    those that diverged and trained again at a lower lr (at most four each)."""
    for kind, runs in (
        (
            "skipped steps with a non-finite loss or gradient",
            [f"{k}: {s} of {n}" for k, (s, n) in sorted(skipped.items())],
        ),
        (
            "diverged and trained again at a lower lr",
            [f"{k}: lr {a:g} at step {t}, then {b:g}" for k, (a, t, b) in sorted((retried or {}).items())],
        ),
    ):
        if runs:
            more = f", {len(runs) - 4} more" if len(runs) > 4 else ""
            log.warning(
                "%s: %d training run%s %s (%s%s)",
                name,
                len(runs),
                "s" * (len(runs) != 1),
                kind,
                ", ".join(runs[:4]),
                more,
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def results_types() -> list[type]:
    """The classes a ``results.pt`` may hold besides tensors and containers: the plain-data dataclasses defined in the
    experiment modules and in the card packages of ``iclab.cards`` entry points (results, rows, configs). Nothing else
    is unpickled from a run directory."""
    all_experiments()  # imports every card
    prefixes = tuple(f"{p}." for p in CARD_PACKAGES)
    return [
        obj
        for mod_name, mod in list(sys.modules.items())
        if mod_name.startswith(prefixes) and mod is not None
        for obj in vars(mod).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod_name
    ]
