"""Where and when a measurement was taken: the record every benchmark, paper-preset run and cost probe carries.

    from iclab.core.provenance import provenance, describe
    record = {"ms_per_step": 12.3, "provenance": provenance("cpu")}
    describe(record["provenance"])      # '2026-11-26, 2 × Intel(R) Xeon(R) ..., 2 threads'

:func:`provenance` returns ``date`` (ISO 8601, UTC), ``commit`` (``git rev-parse HEAD`` of the iclab checkout this
package runs from and whether its tracked files differ from it; None outside a checkout or without git), ``machine``
(CPU model from /proc/cpuinfo or :func:`platform.processor`, architecture, the cores this process may use, torch's
threads; the GPU's name on a CUDA device), ``python``, ``torch`` (``torch.__version__``), ``device`` and ``load`` (the 1/5/15-minute load average at
the time: a timing is worth quoting only on a quiet machine). Tables are written from these fields
(:func:`describe`), never from a hand-written label.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parents[3]  # the checkout, for a src-layout install in place


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> dict[str, Any] | None:
    """``{"sha": HEAD, "dirty": tracked files differ from it}`` of the iclab checkout, or None outside one."""
    if not (_ROOT / ".git").exists() or not shutil.which("git"):
        return None
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def provenance(device: str | torch.device | None = None) -> dict[str, Any]:
    """The provenance of a measurement taken now, on ``device`` (default: the CPU)."""
    machine: dict[str, Any] = {
        "cpu": _cpu_model(),
        "arch": platform.machine() or None,
        "cores": _cores(),
        "threads": torch.get_num_threads(),
    }
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name(dev)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(dev),
        "load": _load(),
    }


def describe(prov: dict[str, Any] | None, *, threads: bool = True) -> str:
    """A table cell from a provenance record: ``2026-11-26, 2 × Intel Xeon ..., 2 threads`` (date, cores × CPU model,
    torch threads; the device instead of the CPU off the CPU). A field not recorded is left out: a record converted
    from before provenance existed names the architecture where the CPU model is unknown (``2 × x86_64``)."""
    if not prov:
        return "unrecorded"
    machine = prov.get("machine") or {}
    parts = [str(prov.get("date") or "undated")[:10]]
    device = str(prov.get("device") or "cpu")
    if device != "cpu":
        parts.append(str(machine.get("gpu") or device))
    else:
        cpu = machine.get("cpu") or machine.get("arch") or "CPU unrecorded"
        parts.append(f"{machine['cores']} × {cpu}" if machine.get("cores") else cpu)
    if threads and machine.get("threads"):
        n = machine["threads"]
        parts.append(f"{n} thread{'s' if n != 1 else ''}")
    return ", ".join(parts)
