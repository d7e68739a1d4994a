"""Write the file-fuzzer table of docs/reliability.md from the counts tests/test_file_fuzzer.py records.

    python scripts/reliability_table.py --run    # run every fuzzer case (slow ones too), then rewrite the table
    python scripts/reliability_table.py          # rewrite the table from benchmarks/results/file_fuzzer.json

The table sits between ``<!-- fuzz:begin -->`` and ``<!-- fuzz:end -->``; its rows (cases tried, handled, data lost
per kind of file) and the provenance line come from the counts file, which the test module writes when
``ICLAB_FUZZ_COUNTS`` names it, so the page cannot drift from a run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COUNTS = ROOT / "benchmarks" / "results" / "file_fuzzer.json"
PAGE = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"


def run_fuzzer(counts: Path = COUNTS) -> None:
    """Every case of tests/test_file_fuzzer.py, the slow ones included, recording the counts in ``counts``."""
    env = {**os.environ, "ICLAB_FUZZ_COUNTS": str(counts)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly", "-m", "slow or not slow"]
    subprocess.run([*cmd, str(ROOT / "tests" / "test_file_fuzzer.py")], cwd=ROOT, env=env, check=True)


def table(data: dict[str, Any]) -> str:
    """The Markdown table of one counts file: a row per kind of file, then the totals and the provenance."""
    from iclab.core.provenance import describe

    rows = ["| file | cases | handled | data lost |", "|---|---|---|---|"]
    for kind, tried in data["tried"].items():
        rows.append(f"| {kind} | {tried} | {data['handled'][kind]} | {data['lost'][kind]} |")
    total = {k: sum(data[k].values()) for k in ("tried", "handled", "lost")}
    rows.append(f"| **all** | **{total['tried']}** | **{total['handled']}** | **{total['lost']}** |")
    return "\n".join(rows) + f"\n\n{describe(data['provenance'])}"


def rewrite(page: Path = PAGE, counts: Path = COUNTS) -> str:
    """``page`` with the block between the markers replaced by the table of ``counts`` (unchanged without them)."""
    text = page.read_text()
    if BEGIN not in text or END not in text or not counts.is_file():
        return text
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(json.loads(counts.read_text()))}\n{END}{tail}"


def main() -> None:
    if "--run" in sys.argv[1:]:
        run_fuzzer()
    PAGE.write_text(rewrite())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
