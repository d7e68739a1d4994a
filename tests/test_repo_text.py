"""The repository speaks of the code and the papers: no work-log labels and no references to documents outside it
(meeting notes, trackers, private notes), in the code, tests, docs, scripts, benchmarks and data, and so none in the
report built from them. Papers are cited by author and year with their equation, section or figure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what a reader outside cannot follow: a sitting's number, a tracker's number, a private note's section, a folder
#: name standing for a paper (written split so that this file does not match itself)
LABELS = re.compile(
    "|".join(["ses" + r"sion [0-9]", "iss" + r"ue #?[0-9]", "sp" + r"ec 00[0-9]", "se" + r"ed[ -]00[0-9]"]), re.I
)
WHERE = [
    "src",
    "tests",
    "docs",
    "README.md",
    "CHANGELOG.md",
    "scripts",
    "benchmarks",
    "examples",
    "configs",
    "pyproject.toml",
    "Makefile",
]
TEXT = {".py", ".md", ".json", ".yaml", ".yml", ".txt", ".c", ".h", ".html", ".css", ".js", ".toml", ".cfg"}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *WHERE], cwd=ROOT, capture_output=True, check=False)
    if out.returncode != 0:  # not a git checkout (an sdist): every file below those folders
        return [p for w in WHERE for p in (ROOT / w).rglob("*") if p.is_file()]
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_no_work_log_labels_or_outside_references() -> None:
    found = []
    for path in tracked_files():
        if path.suffix not in TEXT or not path.is_file():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if LABELS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()[:100]}")
    assert not found, f"{len(found)} lines name a work log or an outside document:\n" + "\n".join(found[:40])
