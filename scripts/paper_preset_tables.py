"""Write the "Paper preset" table of each docs/papers page and of docs/performance.md (issue 20) from
benchmarks/results/paper_presets.json: what was run at `paper` (claims, wall) and what `iclab estimate` projects.

    python scripts/paper_preset_tables.py            # rewrite the marked sections in place
    python scripts/paper_preset_tables.py record RUN_DIR --where "session 13, --workers 2" [--note TEXT]
    python scripts/paper_preset_tables.py estimate EXPERIMENT --probe "3 steps × every run, 1 thread" [--set k=v]

``record`` reads a finished run directory (summary.json, claims.json, config.yaml) into the JSON and rewrites the
tables: as the preset's ``run`` when its config is the paper preset's, else as one of its ``reduced`` runs, labelled
with every setting that differs from the paper (``seeds=1 (paper 6)``), so a reduced budget can never pass for the
paper's. A reduced run's ``--note`` stays with that run (the experiment's note, the projection's, is kept).
``estimate`` probes the preset (:func:`iclab.experiments.estimate.estimate_experiment`, every run) and writes the
projection.

Each page holds the table between ``<!-- paper-preset:begin -->`` and ``<!-- paper-preset:end -->``; the notes
(diagnoses, reduced-budget runs) live in the JSON beside the numbers, so the tables cannot drift from the data.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from iclab.core.config import to_dict  # noqa: E402
from iclab.experiments.estimate import format_seconds  # noqa: E402
from iclab.experiments.registry import get  # noqa: E402
from iclab.experiments.runner import resolve_config  # noqa: E402

JSON = ROOT / "benchmarks" / "results" / "paper_presets.json"

BEGIN, END = "<!-- paper-preset:begin -->", "<!-- paper-preset:end -->"


def _row(name: str, entry: dict) -> str:
    run = entry.get("run")
    est = entry.get("estimate")
    claims = f"**{run['passed']}/{run['claims']}**" if run else "not run"
    for red in entry.get("reduced", []):
        claims += (
            f"; reduced budget ({red['overrides']}): {red['passed']}/{red['claims']} in"
            f" {format_seconds(red['seconds'])} ({red['where']})"
        )
    wall = f"{format_seconds(run['seconds'])} ({run['where']})" if run else "—"
    if est is None:
        projected = "not probed"
    else:
        projected = format_seconds(est["projected_seconds"])
        if not est.get("complete", True):
            projected += " (lower bound)"
        if est.get("probe"):
            projected += f" ({est['probe']})"
    notes = [entry.get("note", "")]
    notes += [f"Reduced run ({red['overrides']}): {red['note']}" for red in entry.get("reduced", []) if red.get("note")]
    return f"| {name} | {claims} | {wall} | {projected} | {'<br>'.join(n for n in notes if n)} |"


def table(entries: dict[str, dict], names: list[str]) -> str:
    head = [
        "| experiment | claims at paper | wall, 2-core CPU | projected (`iclab estimate`) | paper vs ours, diagnosis |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + [_row(n, entries[n]) for n in names])


PROBE_THREADS = 2  # `iclab estimate` ran with torch's default threads on the 2-core CPU


def scaling_table(entries: dict[str, dict]) -> str:
    """docs/scaling.md: every experiment's paper preset, projected wall and core-hours on this CPU (issue 16)."""
    head = [
        "| experiment | training runs | steps in all | projected wall, one process | core-hours | measured at paper |",
        "|---|---|---|---|---|---|",
    ]
    rows, total = [], 0.0
    for name, e in entries.items():
        est, run = e.get("estimate"), e.get("run")
        measured = f"{format_seconds(run['seconds'])}, {run['passed']}/{run['claims']}" if run else "—"
        if est is None:
            rows.append(f"| {name} | | | not probed | | {measured} |")
            continue
        core_h = est["projected_seconds"] * PROBE_THREADS / 3600
        total += core_h
        bound = "" if est.get("complete", True) else " (lower bound)"
        rows.append(
            f"| {name} | {est['train_runs']} | {est['train_steps']:,} | {format_seconds(est['projected_seconds'])}{bound}"
            f" | {core_h:.3g} | {measured} |"
        )
    rows.append(f"| **all probed** | | | | **{total:,.0f}** | |")
    return "\n".join(head + rows)


def _replace(path: Path, body: str, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text()
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n## Paper preset (issue 20)\n\n" + block + "\n"
    path.write_text(text)


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


def record(run_dir: Path, where: str, note: str | None) -> str:
    """Write one finished run into the JSON: ``run`` at the paper's settings, else ``reduced`` (with its departures)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    claims = [c for c in json.loads((run_dir / "claims.json").read_text()) if c.get("checked", True)]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    name = summary["experiment"]
    if summary["preset"] != "paper":
        raise SystemExit(f"{run_dir}: preset {summary['preset']!r}; only paper runs (or reduced paper runs) go here")
    off = departures(name, config["config"])
    entry = {
        "claims": len(claims),
        "passed": sum(bool(c["passed"]) for c in claims),
        "seconds": round(float(summary["seconds"]), 1),
        "where": where,
        "failed": [c["name"] for c in claims if not c["passed"]],
    }
    if off:
        entry["overrides"] = ", ".join(off)
    data = json.loads(JSON.read_text())
    target = data["experiments"].setdefault(name, {})
    if off:  # one entry per set of departures: a rerun of the same reduced budget replaces its entry
        if note:
            entry["note"] = note
        kept = [r for r in target.get("reduced", []) if r["overrides"] != entry["overrides"]]
        target["reduced"] = [*kept, entry]
    else:
        target["run"] = entry
        if note:
            target["note"] = note
    JSON.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return f"{name}: {'reduced' if off else 'run'} {entry['passed']}/{entry['claims']} in {entry['seconds']} s"


def estimate(name: str, probe: str, probe_steps: int, overrides: list[str] | None = None) -> str:
    """Probe ``name`` at paper (every run, ``probe_steps`` steps; ``overrides`` such as a smaller test batch, which
    ``probe`` must then name) and write its projection into the JSON."""
    from iclab.experiments.estimate import estimate_experiment

    t0 = time.perf_counter()
    est = estimate_experiment(name, "paper", probe_steps=probe_steps, overrides=overrides or ()).to_dict()
    est.pop("runs")
    est |= {"probe": probe, "probe_wall": round(time.perf_counter() - t0)}
    data = json.loads(JSON.read_text())
    data["experiments"].setdefault(name, {})["estimate"] = est
    JSON.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return f"{name}: {format_seconds(est['projected_seconds'])} projected, {est['core_hours']} core-hours"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    rec = sub.add_parser("record", help="record a finished paper (or reduced paper) run, then rewrite the tables")
    rec.add_argument("run_dir", type=Path)
    rec.add_argument("--where", required=True, help='e.g. "session 13, --workers 2, 1 thread each"')
    rec.add_argument("--note", help="the row's note: the paper's number beside ours, the diagnosis")
    est = sub.add_parser("estimate", help="probe a paper preset and record its projection, then rewrite the tables")
    est.add_argument("experiment")
    est.add_argument(
        "--probe", required=True, help='how it was probed, e.g. "3 steps × every run, 1 thread, session 14"'
    )
    est.add_argument("--probe-steps", type=int, default=3)
    est.add_argument("--set", action="append", default=[], help="a config override for the probe, e.g. test_batch=2000")
    args = parser.parse_args()
    if args.command == "record":
        print(record(args.run_dir, args.where, args.note))
    elif args.command == "estimate":
        print(estimate(args.experiment, args.probe, args.probe_steps, args.set))
    write_tables()


def write_tables() -> None:
    data = json.loads(JSON.read_text())
    entries: dict[str, dict] = data["experiments"]
    intro = data["intro"]
    by_paper: dict[str, list[str]] = {}
    for name in entries:
        by_paper.setdefault(name.split(".")[0], []).append(name)
    for paper, names in by_paper.items():
        _replace(ROOT / "docs" / "papers" / f"{paper}.md", intro + "\n\n" + table(entries, names))
    total = sum(e["run"]["seconds"] for e in entries.values() if e.get("run") and e["run"].get("verify"))
    verified = [n for n, e in entries.items() if e.get("run") and e["run"].get("verify")]
    rows = table(entries, list(entries))
    for n in verified:
        rows = rows.replace(f"| {n} |", f"| {n} ✓ |", 1)
    perf = (
        f"{intro}\n\n`make verify-paper` (tests/test_paper_presets.py) runs the {len(verified)} presets marked ✓ and"
        f" asserts every claim: {format_seconds(total)} of one-thread test time in all, 5 min 34 s wall with two"
        f" workers (session 16, all 14 pass).\n\n{rows}"
    )
    _replace(ROOT / "docs" / "performance.md", perf)
    _replace(ROOT / "docs" / "scaling.md", scaling_table(entries), "<!-- scaling:begin -->", "<!-- scaling:end -->")


if __name__ == "__main__":
    main()
