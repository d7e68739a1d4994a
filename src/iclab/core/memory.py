"""Refuse a batch that cannot fit before allocating it: estimated bytes against the memory available.

    check_fits("ahn2023.fig1.train", "batch_size", nbytes=..., device=torch.device("cpu"))

The estimate of a training step is the batch's own bytes times :func:`activation_factor` (forward activations and
their gradients: 3 + 3 per layer, fitted to peak-RSS measurements of linear transformers with 1, 3 and 8 layers,
factors 5.5, 10.5 and 26.2; docs/reliability.md). ``ICLAB_ALLOW_LARGE=1`` (``iclab --allow-large``) turns the check
off.
"""

from __future__ import annotations

import os

import torch

from iclab.core.errors import ConfigError


def activation_factor(n_layers: int) -> int:
    """Estimated peak bytes of a training step per byte of its batch, for a model of ``n_layers`` layers."""
    return 3 + 3 * max(1, n_layers)


def allow_large() -> bool:
    return os.environ.get("ICLAB_ALLOW_LARGE", "") not in ("", "0", "false", "no")


def available_bytes(device: torch.device) -> int:
    """Memory free for new tensors on ``device``: the CUDA device's free bytes, else the host's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


def check_fits(owner: str, field: str, value: int, nbytes: float, device: torch.device, what: str = "") -> None:
    """Raise ``ConfigError`` naming ``owner.field`` when ``nbytes`` exceeds the memory available on ``device``."""
    if allow_large():
        return
    limit = available_bytes(device)
    if nbytes > limit:
        raise ConfigError(
            f"{owner}.{field} = {value} needs an estimated {format_bytes(nbytes)}{what} but {device.type} has "
            f"{format_bytes(limit)} available; lower it, or pass --allow-large (ICLAB_ALLOW_LARGE=1) to try anyway"
        )
