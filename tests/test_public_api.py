"""The public API is chosen: ``iclab.__all__`` and each subpackage's ``__all__`` list what users may rely on.

Every name listed exists, every public object has a docstring (read by griffe, as the API reference of the
documentation site renders it, so a constant's docstring is the string under its assignment), and so has every public
method or property of a listed class. Nothing public is re-exported without being listed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import iclab

griffe = pytest.importorskip("griffe", reason="griffe comes with mkdocstrings[python] (pip install -e '.[docs]')")

SRC = Path(iclab.__file__).parents[1]
PACKAGES = (
    "iclab",
    "iclab.core",
    "iclab.tasks",
    "iclab.models",
    "iclab.algorithms",
    "iclab.constructions",
    "iclab.theory",
    "iclab.training",
    "iclab.experiments",
    "iclab.plotting",
    "iclab.reporting",
)


@pytest.fixture(scope="module")
def tree() -> object:
    return griffe.load("iclab", search_paths=[str(SRC)], resolve_aliases=True, resolve_external=False)


def _node(tree: object, package: str, name: str) -> object:
    parts = [*package.split(".")[1:], name]
    node = tree
    for part in parts:
        node = node[part]  # type: ignore[index]
    return node.final_target if node.is_alias else node  # type: ignore[attr-defined]


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_exist(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert names == sorted(set(names), key=names.index), f"{package}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ names what {package} does not have"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_reexport_is_listed(package: str) -> None:
    """A name imported into the package as ``from x import y as y`` (the re-export form) is in ``__all__``."""
    module = importlib.import_module(package)
    path = Path(module.__file__)
    text = path.read_text()

    reexported = {
        a.asname
        for node in ast.parse(text).body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
        if a.asname is not None and a.asname == a.name
    }
    assert sorted(reexported - set(module.__all__)) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_public_objects_have_docstrings(tree: object, package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__, f"{package} has no docstring"
    undocumented = []
    for name in module.__all__:
        node = _node(tree, package, name)
        if not node.docstring:  # type: ignore[attr-defined]
            undocumented.append(f"{package}.{name}")
        obj = getattr(module, name)
        if inspect.isclass(obj):
            undocumented += [f"{package}.{name}.{m}" for m in _undocumented_members(obj)]
    assert undocumented == [], "public objects without a docstring"


def _undocumented_members(cls: type) -> list[str]:
    """Public methods and properties that ``cls`` defines itself and that have no docstring (also not inherited)."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            doc = member.__doc__
        elif isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            doc = inspect.getdoc(getattr(cls, name))
        else:
            continue
        if not doc:
            out.append(name)
    return out


def test_subpackages_are_reachable_from_the_top() -> None:
    """``import iclab`` gives the learners' packages; every other public package imports by its own name."""
    for name in ("algorithms", "constructions", "models", "tasks"):
        assert name in iclab.__all__
    for package in PACKAGES[1:]:
        assert importlib.import_module(package).__all__
