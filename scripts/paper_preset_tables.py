"""Write the "Paper preset" table of each docs/papers page, of docs/performance.md and docs/scaling.md from
benchmarks/results/paper_presets.json: what was run at `paper` (claims, wall) and what `iclab estimate` projects.

    python scripts/paper_preset_tables.py                       # rewrite the marked sections in place
    python scripts/paper_preset_tables.py record RUN_DIR [--workers N] [--threads N] [--conditions TEXT] [--note TEXT]
    python scripts/paper_preset_tables.py estimate EXPERIMENT [--probe-steps 3] [--set k=v ...]

``record`` reads a finished run directory (summary.json, claims.json, config.yaml) into the JSON and rewrites the
tables: as the preset's ``run`` when its config is the paper preset's, else as one of its ``reduced`` runs, labelled
with every setting that differs from the paper (``seeds=1 (paper 6)``), so a reduced budget can never pass for the
paper's. Each record carries :func:`iclab.core.provenance.provenance` (date, commit, CPU, torch threads, torch),
``workers`` (``--workers``: the local pool the run used), ``pieces`` (a run stopped on deadlines and continued: its
``seconds`` are those of all pieces), ``skipped_steps`` (training runs that skipped steps for a non-finite loss or gradient),
``retried`` (those that diverged and trained again at a lower lr) and, only where the machine was not quiet, ``conditions``
(what else ran). A reduced run's ``--note`` stays with that run (the experiment's note, the projection's, is kept).
``estimate`` probes the preset (:func:`iclab.experiments.estimate.estimate_experiment`, every run) and writes the
projection with the probe's provenance and overrides.

Each page holds the table between ``<!-- paper-preset:begin -->`` and ``<!-- paper-preset:end -->``; the notes
(diagnoses, reduced-budget runs) live in the JSON beside the numbers, so the tables cannot drift from the data. An
experiment with no record (a new card) is shown as "not run" / "not probed". The marked sections are rewritten in
place, each file re-read just before it is replaced (atomically), so text outside the markers is never touched.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from iclab.core.config import to_dict  # noqa: E402
from iclab.core.provenance import describe, provenance  # noqa: E402
from iclab.experiments.estimate import format_seconds  # noqa: E402
from iclab.experiments.registry import all_experiments, get  # noqa: E402
from iclab.experiments.runner import resolve_config  # noqa: E402

JSON = ROOT / "benchmarks" / "results" / "paper_presets.json"

BEGIN, END = "<!-- paper-preset:begin -->", "<!-- paper-preset:end -->"
SCALING = ("<!-- scaling:begin -->", "<!-- scaling:end -->")


def where(record: dict[str, Any]) -> str:
    """How a run was measured, from its fields: ``2026-11-26, 2 × x86_64, 1 thread, --workers 2; beside ...``."""
    text = describe(record.get("provenance"))
    if record.get("workers"):
        text += f", --workers {record['workers']}"
    if record.get("pieces", 1) > 1:
        text += f", in {record['pieces']} pieces"
    skipped = record.get("skipped_steps") or {}
    if skipped:
        runs = ", ".join(f"{k} {s} of {n}" for k, (s, n) in sorted(skipped.items()))
        text += f"; steps skipped for a non-finite loss or gradient: {runs}"
    retried = record.get("retried") or {}
    if retried:
        runs = ", ".join(f"{k} at lr {a:g} (step {t}, then {b:g})" for k, (a, t, b) in sorted(retried.items()))
        text += f"; diverged and trained again from the initial weights at a lower lr: {runs}"
    if record.get("conditions"):
        text += f"; {record['conditions']}"
    return text


def probe(est: dict[str, Any]) -> str:
    """How a projection was probed: ``3 steps × every run, test_batch=2000; 2026-11-26, 2 × x86_64, 1 thread``."""
    runs = "every run" if est.get("probe_runs") is None else f"{est['probe_runs']} runs"
    text = f"{est['probe_steps']} steps × {runs}"
    if est.get("overrides"):
        text += ", " + " ".join(est["overrides"])
    return f"{text}; {where(est)}"


def _row(name: str, entry: dict) -> str:
    run = entry.get("run")
    est = entry.get("estimate")
    claims = f"**{run['passed']}/{run['claims']}**" if run else "not run"
    for red in entry.get("reduced", []):
        claims += (
            f"; reduced budget ({red['overrides']}): {red['passed']}/{red['claims']} in"
            f" {format_seconds(red['seconds'])} ({where(red)})"
        )
    wall = f"{format_seconds(run['seconds'])} ({where(run)})" if run else "—"
    if est is None:
        projected = "not probed"
    else:
        projected = format_seconds(est["projected_seconds"])
        if not est.get("complete", True):
            projected += " (lower bound)"
        projected += f" ({probe(est)})"
    notes = [entry.get("note", "")]
    notes += [f"Reduced run ({red['overrides']}): {red['note']}" for red in entry.get("reduced", []) if red.get("note")]
    return f"| {name} | {claims} | {wall} | {projected} | {'<br>'.join(n for n in notes if n)} |"


def table(entries: dict[str, dict], names: list[str]) -> str:
    head = [
        "| experiment | claims at paper | wall (date, machine, threads) | projected (`iclab estimate`: probe; date,"
        " machine, threads) | paper vs ours, diagnosis |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + [_row(n, entries.get(n, {})) for n in names])


def _threads(est: dict[str, Any]) -> int:
    machine = (est.get("provenance") or {}).get("machine") or {}
    return int(machine.get("threads") or est.get("threads") or 1)


def scaling_table(entries: dict[str, dict], names: list[str]) -> str:
    """docs/scaling.md: every experiment's paper preset, projected wall and core-hours (projected wall × the probe's
    torch threads), their total and the total of those not yet run at paper."""
    head = [
        "| experiment | training runs | steps in all | projected wall, one process | core-hours | measured at paper |",
        "|---|---|---|---|---|---|",
    ]
    rows, total, unrun = [], 0.0, []
    for name in names:
        e = entries.get(name, {})
        est, run = e.get("estimate"), e.get("run")
        measured = f"{format_seconds(run['seconds'])}, {run['passed']}/{run['claims']}" if run else "—"
        if est is None:
            rows.append(f"| {name} | | | not probed | | {measured} |")
            continue
        core_h = est["projected_seconds"] * _threads(est) / 3600
        total += core_h
        if not run:
            unrun.append(core_h)
        bound = "" if est.get("complete", True) else " (lower bound)"
        rows.append(
            f"| {name} | {est['train_runs']} | {est['train_steps']:,} | {format_seconds(est['projected_seconds'])}{bound}"
            f" | {core_h:.3g} | {measured} |"
        )
    rows.append(f"| **all probed** | | | | **{total:,.0f}** | |")
    # what is left: the probed experiments without a run at paper (reduced runs do not count)
    rows.append(f"| **not yet run at paper: {len(unrun)}** | | | | **{sum(unrun):,.0f}** | |")
    return "\n".join(head + rows)


def replace_block(path: Path, body: str, begin: str = BEGIN, end: str = END) -> bool:
    """Put ``body`` between ``begin`` and ``end`` in ``path``: the file is read just before it is replaced (atomically,
        by a rename), so an edit made to the rest of it meanwhile is kept. A page without the paper-preset markers gets
    them appended (other markers must be there).
        Returns whether the file changed."""
    text = path.read_text()
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        new = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, count=1, flags=re.S)
    elif begin == BEGIN:
        new = text.rstrip("\n") + "\n\n## Paper preset\n\n" + block + "\n"
    else:
        raise SystemExit(f"{path}: no {begin} marker")
    if new == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(new)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.loads(json.dumps(tree))}  # tuples as lists, as config.yaml holds them


def departures(name: str, config: dict[str, Any]) -> list[str]:
    """``key=value (paper P)`` for every setting of a run's config that is not the paper preset's."""
    paper = _flat(to_dict(resolve_config(get(name), "paper")))
    ran = _flat(config)
    return [
        f"{k}={ran.get(k)} (paper {paper.get(k)})" for k in sorted(set(paper) | set(ran)) if ran.get(k) != paper.get(k)
    ]


def _write(data: dict[str, Any]) -> None:
    JSON.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def _run_provenance(run_dir: Path, threads: int | None, commit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The provenance of a run directory made on this machine, recorded after the run: its date is when the run wrote
    summary.json, its threads ``threads`` (the run's, not this process's), its commit the one summary.json records
    (``commit``: the code that ran, which may be a worktree's) or else this checkout's; the load at recording time says
    nothing of the run's and is left out."""
    prov = provenance()
    if commit is not None:
        prov["commit"] = commit
    stamp = datetime.datetime.fromtimestamp((run_dir / "summary.json").stat().st_mtime, datetime.UTC)
    prov["date"] = stamp.isoformat(timespec="seconds")
    if threads is not None:
        prov["machine"]["threads"] = threads
    prov["load"] = None
    return prov


def record(
    run_dir: Path,
    note: str | None = None,
    *,
    workers: int | None = None,
    threads: int | None = None,
    conditions: str | None = None,
    prov: dict[str, Any] | None = None,
) -> str:
    """Write one finished run into the JSON: ``run`` at the paper's settings, else ``reduced`` (with its departures),
    with its provenance (the run directory's own if it records one, else this machine and checkout, dated when the
    run finished, with the run's torch ``threads``: 1 per worker with ``workers``; ``prov``: one given instead),
    ``workers`` and ``conditions``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    claims = [c for c in json.loads((run_dir / "claims.json").read_text()) if c.get("checked", True)]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    name = summary["experiment"]
    if summary["preset"] != "paper":
        raise SystemExit(f"{run_dir}: preset {summary['preset']!r}; only paper runs (or reduced paper runs) go here")
    off = departures(name, config["config"])
    entry: dict[str, Any] = {
        "claims": len(claims),
        "passed": sum(bool(c["passed"]) for c in claims),
        "seconds": round(float(summary["seconds"]), 1),
        "failed": [c["name"] for c in claims if not c["passed"]],
    }
    if off:
        entry["overrides"] = ", ".join(off)
        if note:
            entry["note"] = note
    workers = workers if workers is not None else summary.get("workers")  # where a run directory records it
    if threads is None and workers:
        threads = 1  # --workers: one torch thread per worker (--cpus-per-task 1)
    if workers:
        entry["workers"] = int(workers)
    if int(summary.get("pieces", 1)) > 1:  # stopped by --time-limit or a signal and continued (seconds: all pieces)
        entry["pieces"] = int(summary["pieces"])
    # training runs that skipped steps for a non-finite loss or gradient ([skipped, steps]) and those that diverged
    # and trained again at a lower lr ([lr, step, retry lr])
    for key in ("skipped_steps", "retried"):
        if summary.get(key):
            entry[key] = summary[key]
    if conditions:
        entry["conditions"] = conditions
    entry["provenance"] = (
        prov
        if prov is not None
        else summary.get("provenance") or _run_provenance(run_dir, threads, summary.get("commit"))
    )
    data = json.loads(JSON.read_text())
    target = data["experiments"].setdefault(name, {})
    if off:  # one entry per set of departures: a rerun of the same reduced budget replaces its entry
        kept = [r for r in target.get("reduced", []) if r["overrides"] != entry["overrides"]]
        target["reduced"] = [*kept, entry]
    else:
        target["run"] = entry
        if note:
            target["note"] = note
    _write(data)
    return f"{name}: {'reduced' if off else 'run'} {entry['passed']}/{entry['claims']} in {entry['seconds']} s"


def estimate(name: str, probe_steps: int, overrides: list[str] | None = None, conditions: str | None = None) -> str:
    """Probe ``name`` at paper (every run, ``probe_steps`` steps; ``overrides`` such as a smaller test batch, recorded
    with the projection) and write its projection, with the probe's provenance, into the JSON."""
    from iclab.experiments.estimate import estimate_experiment

    t0 = time.perf_counter()
    est = estimate_experiment(name, "paper", probe_steps=probe_steps, overrides=overrides or ()).to_dict()
    est.pop("runs")
    est["probe_wall"] = round(time.perf_counter() - t0)
    if conditions:
        est["conditions"] = conditions
    data = json.loads(JSON.read_text())
    data["experiments"].setdefault(name, {})["estimate"] = est
    _write(data)
    return f"{name}: {format_seconds(est['projected_seconds'])} projected, {est['core_hours']} core-hours"


def names(entries: dict[str, dict]) -> list[str]:
    """The recorded experiments in the JSON's order, then every registered one without a record (a new card)."""
    return [*entries, *(n for n in all_experiments() if n not in entries)]


def blocks(data: dict[str, Any] | None = None) -> list[tuple[Path, str, str, str]]:
    """Every generated section: (file, begin marker, end marker, body). Pages that do not exist are left out."""
    data = data if data is not None else json.loads(JSON.read_text())
    entries: dict[str, dict] = data["experiments"]
    every = names(entries)
    intro = data["intro"]
    by_paper: dict[str, list[str]] = {}
    for name in every:
        by_paper.setdefault(name.split(".")[0], []).append(name)
    out = []
    for paper, paper_names in by_paper.items():
        page = ROOT / "docs" / "papers" / f"{paper}.md"
        if page.is_file():
            out.append((page, BEGIN, END, intro + "\n\n" + table(entries, paper_names)))
    verified = [n for n, e in entries.items() if e.get("run") and e["run"].get("verify")]
    total = sum(entries[n]["run"]["seconds"] for n in verified)
    rows = table(entries, every)
    for n in verified:
        rows = rows.replace(f"| {n} |", f"| {n} ✓ |", 1)
    perf = (
        f"{intro}\n\n`make verify-paper` (tests/test_paper_presets.py) runs the {len(verified)} presets marked ✓ and"
        f" asserts every claim: {format_seconds(total)} of one-thread test time in all"
    )
    if vp := data.get("verify_paper"):
        perf += (
            f", {format_seconds(vp['seconds'])} wall with {vp['workers']} workers"
            f" ({where({**vp, 'workers': None})}: {vp['passed']}/{vp['experiments']} pass)"
        )
    out.append((ROOT / "docs" / "performance.md", BEGIN, END, f"{perf}.\n\n{rows}"))
    out.append((ROOT / "docs" / "scaling.md", *SCALING, scaling_table(entries, every)))
    return out


def write_tables() -> list[Path]:
    """Rewrite every generated section; the files that changed."""
    return [path for path, begin, end, body in blocks() if replace_block(path, body, begin, end)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    rec = sub.add_parser("record", help="record a finished paper (or reduced paper) run, then rewrite the tables")
    rec.add_argument("run_dir", type=Path)
    rec.add_argument("--workers", type=int, help="the --workers the run used (a local process pool)")
    rec.add_argument("--threads", type=int, help="torch threads of the run (default: 1 with --workers, else torch's)")
    rec.add_argument("--conditions", help="what else ran on the machine, if it was not quiet (e.g. beside a probe)")
    rec.add_argument("--note", help="the row's note: the paper's number beside ours, the diagnosis")
    est = sub.add_parser("estimate", help="probe a paper preset and record its projection, then rewrite the tables")
    est.add_argument("experiment")
    est.add_argument("--probe-steps", type=int, default=3)
    est.add_argument("--set", action="append", default=[], help="a config override for the probe, e.g. test_batch=2000")
    est.add_argument("--conditions", help="what else ran on the machine, if it was not quiet")
    args = parser.parse_args()
    if args.command == "record":
        print(record(args.run_dir, args.note, workers=args.workers, threads=args.threads, conditions=args.conditions))
    elif args.command == "estimate":
        print(estimate(args.experiment, args.probe_steps, args.set, args.conditions))
    for path in write_tables():
        print(f"rewrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
