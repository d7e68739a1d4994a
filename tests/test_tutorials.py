"""The tutorials of the documentation site (docs/tutorials/*.py, Jupytext percent format) run as notebooks.

Each is read by jupytext and executed cell by cell by nbclient in a fresh IPython kernel, as a reader running it in
Jupyter would, at the small sizes its ``ICLAB_TUTORIAL_SIZE=small`` branch picks (a few seconds each); the
tutorials' own asserts are the checks. The full sizes (what a reader gets by default) are the slow test below.
The notebooks are stored without outputs: they are ``.py`` files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="the tutorials need the docs extra (pip install -e '.[docs]')")
jupytext = pytest.importorskip("jupytext", reason="the tutorials need the docs extra (pip install -e '.[docs]')")

TUTORIALS = Path(__file__).parents[1] / "docs" / "tutorials"
NAMES = ("gradient_descent", "new_task", "reproduce_figure", "theory_meets_training")


def execute(name: str, size: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """Run ``docs/tutorials/<name>.py`` as a notebook in a new kernel (working directory ``cwd``)."""
    monkeypatch.setenv("ICLAB_TUTORIAL_SIZE", size)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # small tensors: threads only add overhead beside the xdist workers
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = jupytext.read(TUTORIALS / f"{name}.py")
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    return client.execute()


def test_every_tutorial_is_tested() -> None:
    assert sorted(p.stem for p in TUTORIALS.glob("*.py")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = execute(name, "small", tmp_path, monkeypatch)
    code = [c for c in notebook.cells if c.cell_type == "code"]  # type: ignore[attr-defined]
    assert code and all(c.execution_count for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == []


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs_at_full_size(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    execute(name, "full", tmp_path, monkeypatch)


def test_tutorials_are_stored_without_outputs() -> None:
    """Percent-format sources only: no notebook JSON, no output cells committed."""
    for path in TUTORIALS.glob("*.py"):
        text = path.read_text()
        assert text.startswith("# %% [markdown]\n# # "), f"{path.name} starts with its title cell"
        assert '"outputs"' not in text and "execution_count" not in text
    assert list(TUTORIALS.glob("*.ipynb")) == []
