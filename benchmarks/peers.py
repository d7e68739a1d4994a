"""Side-by-side timing against the authors' own code.

The authors' repositories are not dependencies of iclab. Their timing harnesses live in
``../shared/peer-bench`` (``PEER_BENCH``); ``setup.sh`` there unpacks the repositories into ``/tmp/peers``
(``PEERS``) and builds a separate venv ``/tmp/benv`` (``PEER_PYTHON``) with the same torch wheel. Each harness
times one training step of a paper configuration and writes JSON.

:func:`side_by_side` alternates the two sides in one run — authors, iclab, authors, iclab, … — so that a
change of machine load hits both, and reports each side's median and their ratio. When the authors' code
is not set up, :func:`peer_missing` says why and the benchmark prints that it skipped that column. The benchmark's
result file carries the run's :func:`iclab.core.provenance.provenance` (date, commit, CPU, threads, torch), and
:func:`peer_provenance` that of the authors' side: their repository's pinned commit and the peer venv's torch.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_BENCH = Path(os.environ.get("PEER_BENCH", ROOT.parent / "shared" / "peer-bench"))
PEERS = Path(os.environ.get("PEERS", "/tmp/peers"))
PEER_PYTHON = Path(os.environ.get("PEER_PYTHON", "/tmp/benv/bin/python"))


def peer_missing(repo: str) -> str | None:
    """None when the authors' ``repo`` (a folder name under ``PEERS``) can be timed, else the reason it cannot."""
    for path, what in ((PEER_BENCH, "the harnesses"), (PEER_PYTHON, "the peer venv"), (PEERS / repo, repo)):
        if not path.exists():
            return f"{what} not found at {path} (see {PEER_BENCH / 'README.md'}: setup.sh)"
    return None


def run_peer(script: str, args: list[str], *, threads: int, timeout: float = 900) -> dict[str, object]:
    """Run one peer harness (``script`` in ``PEER_BENCH``) in the peer venv; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [str(PEER_PYTHON), str(PEER_BENCH / script), "--threads", str(threads), *args, "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=PEER_BENCH)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{script} failed (exit {proc.returncode}): " + " | ".join(tail))
        return json.loads(out.read_text())


def side_by_side(ours: Callable[[], float], peer: Callable[[], float] | None, *, rounds: int = 3) -> dict[str, object]:
    """Alternate ``peer()`` and ``ours()`` (each returns ms per step) ``rounds`` times; medians and the ratio.

    ``peer`` None (its code is not set up): only our side is timed, and ``ratio`` is None.
    """
    return alternate({"iclab": ours}, peer, rounds=rounds)["iclab"]


def alternate(
    ours: dict[str, Callable[[], float]], peer: Callable[[], float] | None, *, rounds: int = 3
) -> dict[str, dict[str, object]]:
    """Each round: ``peer()`` once, then each of ``ours`` (ms per step each); per key of ``ours`` the medians and
    the ratio to the authors' median (None without ``peer``), as :func:`side_by_side` gives for one."""
    mine: dict[str, list[float]] = {k: [] for k in ours}
    theirs: list[float] = []
    for _ in range(rounds):
        if peer is not None:
            theirs.append(peer())
        for key, fn in ours.items():
            mine[key].append(fn())
    out: dict[str, dict[str, object]] = {}
    for key, ts in mine.items():
        row: dict[str, object] = {"iclab_ms": [round(t, 3) for t in ts], "iclab_median_ms": statistics.median(ts)}
        if theirs:
            row.update(
                authors_ms=[round(t, 2) for t in theirs],
                authors_median_ms=statistics.median(theirs),
                ratio=statistics.median(theirs) / statistics.median(ts),
            )
        else:
            row["ratio"] = None
        out[key] = row
    return out


def loadavg() -> str:
    """The 1/5/15-minute load average: a timing is only worth quoting when the machine was quiet."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def peer_provenance(repo: str) -> dict[str, object]:
    """The authors' side of a side-by-side timing: their repository's commit (``PEERS/COMMITS.txt``, written by
    ``setup.sh``: name, commit, commit date) and the peer venv's Python and torch."""
    out: dict[str, object] = {"repo": repo, "commit": None, "python": None, "torch": None}
    try:
        for line in (PEERS / "COMMITS.txt").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == repo:
                out["commit"] = fields[1]
    except OSError:
        pass
    code = "import platform, torch; print(platform.python_version(), torch.__version__)"
    try:
        proc = subprocess.run([str(PEER_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0 and len(proc.stdout.split()) == 2:
            out["python"], out["torch"] = proc.stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    return out
