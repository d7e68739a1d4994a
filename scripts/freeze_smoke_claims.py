"""Record every experiment's claim values at the ``smoke`` preset (tests/data/smoke_claims.json).

Run before a refactor that must not change results; the smoke test (tests/test_experiments.py) then asserts
that the measured values are unchanged. ``python scripts/freeze_smoke_claims.py [--out FILE] [NAME ...]``:
with NAMEs (a new card), only those are run and merged into the existing file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from iclab.experiments.registry import all_experiments
from iclab.experiments.runner import run_experiment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", default="tests/data/smoke_claims.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = args.names or list(all_experiments())
    out = Path(args.out)
    frozen: dict[str, dict[str, object]] = json.loads(out.read_text()) if args.names and out.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            res = run_experiment(name, "smoke", out=tmp)
            frozen[name] = {c.name: c.measured for c in res.claims}
            print(name, len(res.claims), f"{res.seconds:.1f}s", file=sys.stderr)
    out.write_text(json.dumps(frozen, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
