"""No function in src/iclab is longer than 80 lines (``def`` to its last line, nested functions included), so each
can be read on one screen: a longer one is split into named steps. Read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import iclab

ROOT = Path(iclab.__file__).parent
MAX_LINES = 80


def long_functions(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """'path:line name (n lines)' of every function or method under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    assert long_functions() == []


def test_the_checker_counts_from_def_to_the_last_line(tmp_path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(79))  # a def and 79 lines: 80, allowed
    method = body.replace("    ", "        ") + "        return x0\n"  # a def and 80 lines: 81
    (tmp_path / "m.py").write_text(f"def ok():\n{body}\n\nclass C:\n    async def long(self):\n{method}")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/m.py:84 long (81 lines)"]
