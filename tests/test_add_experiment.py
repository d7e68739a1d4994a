""" "Add an experiment" in docs/architecture.md is true: the card it shows is a real card, and a new card built from it
needs no edit outside its own file to pass the card checks, the smoke test and the paper-preset tables, and to show
in ``iclab list``.

The throwaway card lives in a temporary package named by an ``iclab.cards`` entry point (a ``*.dist-info`` folder on
``PYTHONPATH``, as an installed plugin has), and the checks run in a fresh interpreter, so nothing of it stays in
this process's registry.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TEMPLATE = ROOT / "src" / "iclab" / "experiments" / "ahn2023" / "isotropic.py"


def documented_card() -> str:
    """The first Python block of the "Add an experiment" section."""
    section = DOC.read_text().split("## Add an experiment", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "the section shows a card"
    return match.group(1)


def test_the_documented_card_is_the_real_card() -> None:
    assert documented_card() == TEMPLATE.read_text(), "docs/architecture.md shows isotropic.py as it is"


def _plugin(tmp_path: Path) -> dict[str, str]:
    """A package ``demo2099`` with one card ``demo2099.newcard`` built from the documented card, and the entry point
    that names it; returns the environment that puts it on the path."""
    pkg = tmp_path / "demo2099"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A throwaway paper package."""\n')
    (pkg / "newcard.py").write_text(documented_card().replace("ahn2023.isotropic", "demo2099.newcard"))
    info = tmp_path / "demo2099-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo2099\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[iclab.cards]\ndemo = demo2099\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_a_new_card_from_the_template_passes_with_no_other_edit(tmp_path: Path) -> None:
    env = _plugin(tmp_path)
    listed = subprocess.run(
        [sys.executable, "-m", "iclab", "list"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "demo2099.newcard" in listed.stdout
    tests = ["tests/test_cards.py", "tests/test_experiments.py", "tests/test_paper_presets.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests, "-k", "demo2099"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    counted = re.search(r"(\d+) passed", done.stdout)
    assert counted and int(counted.group(1)) >= 4, tail  # the card checks and the smoke run, at least
    assert " failed" not in done.stdout and " error" not in done.stdout, tail
