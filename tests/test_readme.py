"""The README's Python quickstart runs as written (a newcomer copies it first)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README has no Python quickstart"
    dtype = torch.get_default_dtype()
    try:
        for code in blocks:
            exec(compile(code, str(README), "exec"), {})
    finally:
        torch.set_default_dtype(dtype)  # the quickstart sets float64 for the whole process
