"""Explicit randomness: every draw goes through a ``torch.Generator`` made here."""

from __future__ import annotations

import hashlib

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
