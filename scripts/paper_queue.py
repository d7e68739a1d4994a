"""Run the experiments not yet run at ``paper`` one after another, cheapest first, in pieces within a deadline.

    python scripts/paper_queue.py --out ~/runs-paper --time-limit 2h45m [--workers 2] [--max-core-hours 20] [--keep-going]
    python scripts/paper_queue.py --dry-run          # the queue and each experiment's projection only

The queue is every experiment of benchmarks/results/paper_presets.json without a ``run`` at its paper settings:
those already started under ``--out`` first (the one with the most wall time in its pieces first: finish what is
furthest along), then by projected core-hours (``estimate``), up to ``--max-core-hours``. Each one runs as
``iclab run EXP --preset paper --workers N --cpus-per-task 1 --time-limit LEFT --out OUT``, where LEFT is what is
left of this call's ``--time-limit``: an experiment stopped on the deadline checkpoints its runs, and the next call
of this script (the same arguments) continues it first, bit for bit. Exit code 0 when the queue is done, 75 when the
deadline stopped it, else the failing ``iclab run``'s: a failure ends the queue, or with ``--keep-going`` (an
unattended run) the queue goes on with the next experiment and names the failed ones at its end. A finished run is recorded with
``python scripts/paper_preset_tables.py record RUN_DIR --workers N`` and its claims diagnosed by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from iclab.core.errors import CorruptFileError
from iclab.core.io import read_json
from iclab.core.safe_parse import is_finite_number
from iclab.experiments.runner import PIECES
from iclab.training.stop import parse_duration

JSON = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "paper_presets.json"
INCOMPLETE = 75  # iclab's exit code for "stopped: run the same command to continue"
MIN_PIECE = 120.0  # seconds: a piece shorter than this would only load and checkpoint


def queue(data: dict, max_core_hours: float | None = None, out: Path | None = None) -> list[tuple[str, float]]:
    """(experiment, projected core-hours) of every experiment without a paper run: those already started under
    ``out`` (a paper run directory without its summary) first, the one with the most time in its pieces (:func:`spent`)
    first, then the cheapest."""
    rows = [
        (name, float(entry["estimate"]["core_hours"]))
        for name, entry in data["experiments"].items()
        if "run" not in entry and entry.get("estimate", {}).get("core_hours") is not None
    ]
    rows = [r for r in rows if max_core_hours is None or r[1] <= max_core_hours]
    return sorted(rows, key=lambda r: (not started(out, r[0]), -spent(out, r[0]), r[1], r[0]))


def started(out: Path | None, name: str) -> bool:
    """Whether ``out`` holds a paper run directory of ``name`` that has not finished (no summary.json)."""
    return out is not None and any(not (d / "summary.json").exists() for d in (out / name).glob("paper-*"))


def spent(out: Path | None, name: str) -> float:
    """Seconds of wall time in the pieces (``pieces.json``) of ``name``'s unfinished paper run directories under
    ``out``; a file that does not read as pieces counts 0 (the run itself sets a damaged one aside)."""
    total = 0.0
    for d in (out / name).glob("paper-*") if out is not None else ():
        if (d / "summary.json").exists() or not (d / PIECES).is_file():
            continue
        try:
            pieces = read_json(d / PIECES)
        except CorruptFileError:
            continue
        if isinstance(pieces, list):
            total += sum(p["seconds"] for p in pieces if isinstance(p, dict) and is_finite_number(p.get("seconds")))
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path.home() / "runs-paper")
    ap.add_argument("--time-limit", default="2h", help="the whole call's deadline (90s, 45m, 2h, 1h30m)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-core-hours", type=float, default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the queue and stop")
    ap.add_argument(
        "--keep-going", action="store_true", help="after a failed experiment go on with the next (unattended runs)"
    )
    args = ap.parse_args(argv)
    deadline = time.monotonic() + parse_duration(args.time_limit)
    todo = queue(json.loads(JSON.read_text()), args.max_core_hours, args.out)
    for name, core_hours in todo:
        print(f"{name}: {core_hours:.1f} core-hours projected", flush=True)
    if args.dry_run:
        return 0
    failed: list[tuple[str, int]] = []
    for name, _ in todo:
        left = deadline - time.monotonic()
        if left < MIN_PIECE:
            return _report(failed) or INCOMPLETE
        cmd = [sys.executable, "-m", "iclab", "run", name, "--preset", "paper", "--workers", str(args.workers),
               "--cpus-per-task", "1", "--time-limit", f"{int(left)}s", "--out", str(args.out)]  # fmt: skip
        code = subprocess.call(cmd)
        if code == INCOMPLETE:
            return _report(failed) or INCOMPLETE
        if code != 0:  # a failure to look at
            failed.append((name, code))
            if not args.keep_going:
                break
    return _report(failed)


def _report(failed: list[tuple[str, int]]) -> int:
    """Print the experiments that failed; the first one's exit code, or 0 when none did."""
    for name, code in failed:
        print(f"{name}: failed (exit {code}); its log says why", flush=True)
    return failed[0][1] if failed else 0


if __name__ == "__main__":
    sys.exit(main())
