"""Every import inside iclab points down the layers of docs/architecture.md (DESIGN.md):

    core | plotting  <  tasks  <  models | algorithms  <  constructions  <  theory  <  training
      <  experiments  <  reporting  <  cli

A module may import its own layer and any layer below; siblings (models and algorithms, core and plotting)
never import each other. Read from the source with ``ast``, so lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iclab

ROOT = Path(iclab.__file__).parent

#: layer -> rank; siblings share a rank and may not import each other.
RANK = {
    "core": 0,
    "plotting": 0,
    "tasks": 1,
    "models": 2,
    "algorithms": 2,
    "constructions": 3,
    "theory": 4,
    "training": 5,
    "experiments": 6,
    "reporting": 7,
    "cli": 8,
    "__main__": 9,  # `python -m iclab`: runs the cli
    "bench": 7,  # the `iclab bench` verb: runs experiments, is run by the cli
}


def layer_of(module: str) -> str | None:
    """'iclab.models.bilinear' -> 'models'; 'iclab' (the package façade) -> None."""
    parts = module.split(".")
    if parts[0] != "iclab" or len(parts) == 1:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every iclab import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("iclab")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("iclab"):
                continue
            if mod == "iclab":  # `from iclab import models`: the names are sub-packages
                found += [(node.lineno, f"iclab.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, mod))
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = layer_of(_module_name(path))
        if src is None:
            continue
        assert src in RANK, f"{path}: layer {src!r} is not in the layer map; add it to RANK and docs/architecture.md"
        for line, mod in imports(path):
            dst = layer_of(mod)
            if dst is None or dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} (unknown layer {dst!r})")
            elif RANK[dst] >= RANK[src]:
                kind = "sideways" if RANK[dst] == RANK[src] else "up"
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}: {src} -> {dst} points {kind}")
    return bad


def test_every_import_points_down() -> None:
    assert violations() == []


def test_the_checker_catches_an_upward_and_a_sideways_import(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "iclab"
    (pkg / "models").mkdir(parents=True)
    (pkg / "core").mkdir()
    (pkg / "models" / "m.py").write_text("from iclab.algorithms.x import y\n")
    (pkg / "core" / "c.py").write_text("def f():\n    from ..training import train\n")
    (pkg / "core" / "ok.py").write_text("from iclab.core.errors import ConfigError\nimport torch\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    found = violations()
    assert len(found) == 2
    assert any("models -> algorithms points sideways" in v for v in found)
    assert any("core -> training points up" in v for v in found)


@pytest.mark.parametrize("module", ["iclab.models.bilinear", "iclab.cli", "iclab"])
def test_layer_names(module: str) -> None:
    assert layer_of(module) == {"iclab.models.bilinear": "models", "iclab.cli": "cli", "iclab": None}[module]
