"""Write the "Paper preset" table of each docs/papers page and of docs/performance.md (issue 20) from
benchmarks/results/paper_presets.json: what was run at `paper` (claims, wall) and what `iclab estimate` projects.

    python scripts/paper_preset_tables.py            # rewrite the marked sections in place

Each page holds the table between ``<!-- paper-preset:begin -->`` and ``<!-- paper-preset:end -->``; the notes
(diagnoses, reduced-budget runs) live in the JSON beside the numbers, so the tables cannot drift from the data.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from iclab.experiments.estimate import format_seconds  # noqa: E402

BEGIN, END = "<!-- paper-preset:begin -->", "<!-- paper-preset:end -->"


def _row(name: str, entry: dict) -> str:
    run = entry.get("run")
    est = entry.get("estimate")
    claims = f"**{run['passed']}/{run['claims']}**" if run else "not run"
    wall = f"{format_seconds(run['seconds'])} ({run['where']})" if run else "—"
    if est is None:
        projected = "not probed"
    else:
        projected = format_seconds(est["projected_seconds"])
        if not est.get("complete", True):
            projected += " (lower bound)"
        if est.get("probe"):
            projected += f" ({est['probe']})"
    return f"| {name} | {claims} | {wall} | {projected} | {entry.get('note', '')} |"


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


def main() -> None:
    data = json.loads((ROOT / "benchmarks" / "results" / "paper_presets.json").read_text())
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
        f" asserts every claim: {format_seconds(total)} of one-thread test time in all, about 7 min wall with two"
        f" workers.\n\n{rows}"
    )
    _replace(ROOT / "docs" / "performance.md", perf)
    _replace(ROOT / "docs" / "scaling.md", scaling_table(entries), "<!-- scaling:begin -->", "<!-- scaling:end -->")


if __name__ == "__main__":
    main()
