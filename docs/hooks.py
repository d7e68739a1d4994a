"""MkDocs hooks of the documentation site (mkdocs.yml), all offline.

- Each tutorial, a Jupytext percent-format notebook ``docs/tutorials/<name>.py``, becomes the page
  ``tutorials/<name>.md`` (markdown cells as text, code cells as Python blocks); the ``.py`` is published beside it.
- MathJax 3 (``tex-svg-full.js``: TeX input with every extension, SVG output, so no font files) is copied into the
  site from the installed ``django-static-mathjax`` package: no CDN, the pages render maths from ``file://``.
- The docstrings' Sphinx roles (``:func:`iclab.training.train```, ``:class:`~iclab.core.Episode```) become links
  where the API reference documents the object (an optional autorefs cross-reference), plain code otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jupytext
from mkdocs.structure.files import File, Files

TUTORIALS = "tutorials"
MATHJAX = "assets/mathjax/tex-svg-full.js"
#: a Sphinx role as the docstring renderer leaves it: the role name, then the target as inline code
ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|const):<code>(~?)([\w.]+)(?:\(\))?</code>")


def mathjax_source() -> Path:
    """The MathJax bundle shipped by the ``django-static-mathjax`` package (import name ``mathjax``)."""
    import mathjax

    return Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" / "tex-svg-full.js"


def notebook_markdown(path: Path) -> str:
    """The page of the percent-format notebook at ``path``: its markdown cells, and its code cells as Python blocks."""
    cells = [c for c in jupytext.read(path).cells if c.source.strip()]
    parts = []
    for i, cell in enumerate(cells):
        source = cell.source.strip("\n")
        parts.append(source if cell.cell_type == "markdown" else f"```python\n{source}\n```")
        if i == 0:
            parts.append(
                f'!!! note "Run it"\n    This page is [`docs/tutorials/{path.name}`]({path.name}), a notebook in '
                "Jupytext's percent format that the tests execute at small sizes (tests/test_tutorials.py). Run it "
                f"with `python docs/tutorials/{path.name}`, or open it in Jupyter with `jupytext --to ipynb`."
            )
    return "\n\n".join(parts) + "\n"


def on_files(files: Files, config: Any) -> Files:
    """Add the tutorial pages and the MathJax bundle to the site's files."""
    for py in sorted((Path(config.docs_dir) / TUTORIALS).glob("*.py")):
        files.append(File.generated(config, f"{TUTORIALS}/{py.stem}.md", content=notebook_markdown(py)))
    files.append(File.generated(config, MATHJAX, abs_src_path=str(mathjax_source())))
    return files


def role_reference(match: re.Match[str]) -> str:
    """An optional cross-reference for one Sphinx role: ``~a.b.c`` shows ``c``, ``a.b.c`` shows ``a.b.c``."""
    tilde, target = match[1], match[2]
    title = target.rsplit(".", 1)[-1] if tilde else target
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Turn the Sphinx roles of the rendered docstrings into cross-references (autorefs resolves them later)."""
    return ROLE.sub(role_reference, html)
