"""Benchmark: `make reproduce`'s job, ``iclab reproduce --preset quick``, end to end in a fresh process and a fresh
output folder: its wall time, each experiment's own seconds (its ``summary.json``) and the claims.

    python benchmarks/bench_reproduce.py [--workers N] [--out benchmarks/results/reproduce-quick-cpu.json]

Run it on a quiet machine: the experiments run ``--workers`` at a time (default: the cores), one torch thread each,
so another busy process shows up in the wall time. Writes the numbers with the measurement's provenance
(:func:`iclab.core.provenance.provenance`) to ``--out`` when given; docs/performance.md's "make reproduce" table is
made from that file (scripts/perf_tables.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.experiments.parallel import cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=cores())
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="iclab-reproduce-") as tmp:
        cmd = [sys.executable, "-m", "iclab", "reproduce", "--preset", args.preset, "--out", tmp]
        t0 = time.perf_counter()
        subprocess.run([*cmd, "--workers", str(args.workers)], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        seconds, passed, checked = {}, 0, 0
        for summary in sorted(Path(tmp).glob(f"*/{args.preset}-*/summary.json")):
            seconds[summary.parent.parent.name] = json.loads(summary.read_text())["seconds"]
            claims = json.loads(summary.with_name("claims.json").read_text())
            checked += sum(1 for c in claims if c["checked"])
            passed += sum(1 for c in claims if c["checked"] and c["passed"])
    out = {
        "preset": args.preset,
        "workers": args.workers,
        "wall_seconds": wall,
        "experiments": len(seconds),
        "experiment_seconds": dict(sorted(seconds.items(), key=lambda kv: -kv[1])),
        "claims_passed": passed,
        "claims_checked": checked,
    }
    total = sum(seconds.values())
    print(f"{args.preset}: {wall:.0f} s wall on {args.workers} workers; the experiments' own seconds add up to "
          f"{total:.0f} s; {passed}/{checked} claims pass")  # fmt: skip
    if args.out:
        torch.set_num_threads(1)  # the provenance names the threads of each experiment's process
        atomic_write_json(args.out, {"provenance": provenance(), **out})


if __name__ == "__main__":
    main()
