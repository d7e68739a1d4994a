"""The task contract: a seeded, batched, on-device episode sampler."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from iclab.core.episode import Episode


@runtime_checkable
class Task(Protocol):
    """Samples ``batch`` episodes of ``n`` context pairs, on ``generator``'s device."""

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        """``batch`` episodes of ``n`` context pairs and one query each, drawn with ``generator`` on its device."""
        ...
