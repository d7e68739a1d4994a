"""Device selection."""

from __future__ import annotations

import torch

from iclab.core.errors import ConfigError


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU; anything else is checked to exist."""
    if isinstance(name, torch.device):
        return name
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:<i>'; got {name!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r} was asked for but CUDA is not available on this machine; use 'cpu' or 'auto'"
        )
    return dev
