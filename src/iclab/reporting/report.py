"""The reproduction report: every figure beside its claims table, as Markdown (and JSON)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from iclab.core.io import atomic_write_json, atomic_write_text
from iclab.experiments.runner import ExperimentResult


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


_STATUS = {"passed": "yes", "failed": "**NO**", "not checked": "not checked"}


def _count(r: ExperimentResult) -> str:
    checked = [c for c in r.claims if c.checked]
    unchecked = len(r.claims) - len(checked)
    return f"{sum(c.passed for c in checked)}/{len(checked)}" + (f" (+{unchecked} not checked)" if unchecked else "")


def write_report(
    results: Sequence[ExperimentResult], out: str | Path, *, preset: str, failures: dict[str, str] | None = None
) -> Path:
    """Write ``<out>/report.md`` and ``<out>/report.json``; figure links are relative to ``out``."""
    out = Path(out)
    failures = failures or {}
    n_claims = sum(c.checked for r in results for c in r.claims)
    n_pass = sum(c.passed for r in results for c in r.claims if c.checked)
    n_unchecked = sum(not c.checked for r in results for c in r.claims)
    lines = [
        f"# iclab reproduction report (preset `{preset}`)",
        "",
        f"{len(results)} experiments, {n_pass}/{n_claims} claims passed"
        + (f" ({n_unchecked} more not checked at this preset)" if n_unchecked else "")
        + (f", {len(failures)} experiments failed to run" if failures else "")
        + f"; total {sum(r.seconds for r in results):.0f} s.",
        "",
        "| experiment | claims passed | seconds | run directory |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| [{r.experiment.name}](#{r.experiment.name.replace('.', '')}) | {_count(r)} | {r.seconds:.1f}{' (reused)' if r.reused else ''} | `{os.path.relpath(r.out_dir, out)}` |"
        )
    for name, err in failures.items():
        lines.append(f"| {name} | **failed to run** | | `{err}` |")
    for r in results:
        lines += ["", f"## {r.experiment.name}", "", f"**{r.experiment.title}**", ""]
        if r.experiment.description:
            lines += [r.experiment.description.strip(), ""]
        for fig in r.figures:
            lines.append(f"![{fig.stem}]({os.path.relpath(fig, out)})")
        lines += ["", "| claim | passed | measured | expected | detail |", "|---|---|---|---|---|"]
        for c in r.claims:
            lines.append(f"| {c.name} | {_STATUS[c.status]} | {_fmt(c.measured)} | {c.expected} | {c.detail} |")
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    atomic_write_json(
        out / "report.json",
        {
            "preset": preset,
            "experiments": [
                {"name": r.experiment.name, "seconds": r.seconds, "dir": str(r.out_dir), "claims": r.claims_json()}
                for r in results
            ],
            "failures": failures,
        },
    )
    return path
