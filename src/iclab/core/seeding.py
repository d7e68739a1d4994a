"""Explicit randomness: every draw goes through a ``torch.Generator`` made here."""

from __future__ import annotations

import hashlib
import os

import torch


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh generator on ``device`` seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def derive_seed(seed: int, *names: object) -> int:
    """A 63-bit seed derived from ``seed`` and a path of names, stable across runs and platforms.

    Streams that must not overlap (the task draw of a run, its init, its training data, its test
    batch) each get their own derived seed: ``derive_seed(3, "test")``.
    """
    h = hashlib.blake2b(repr((int(seed), *map(str, names))).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def use_deterministic_algorithms(enabled: bool = True) -> None:
    """Make seeded runs bit-reproducible with several threads (and on CUDA): PyTorch's deterministic kernels.

    Without it a seeded run on 2 CPU threads is not bit-reproducible: the backward of an advanced-index gather
    (embedding look-ups such as ``W.T[labels]`` or ``wte[tokens]``) accumulates in a thread-dependent order, and a
    1500-step language run drifted by 0.003 nats between identical runs (docs/papers/wang2025.md). Measured cost on
    this CPU: none (the language models' steps, 2 threads). ``warn_only``: an op without a deterministic kernel warns
    instead of raising. For cuBLAS the workspace setting PyTorch asks for is exported unless already set.
    """
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)
