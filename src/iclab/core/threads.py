"""Chunked CPU work on torch's threads (:func:`map_on_threads`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

_I = TypeVar("_I")
_T = TypeVar("_T")

_POOL: dict[int, ThreadPoolExecutor] = {}  # by worker count


def map_on_threads(fn: Callable[[_I], _T], items: Sequence[_I], on_gpu: bool = False) -> list[_T]:
    """[fn(i) for i in items] on torch's CPU threads, as a pool of single-threaded workers.

    For work split in independent chunks whose torch operations are too small for torch's own intra-op
    threads to split well (the fused kernel-attention pass, ``iclab.models._kernel_fast``), or that torch runs
    on one thread whatever its setting (a batched ``torch.linalg.eigh`` on the CPU): whole chunks on separate
    threads use the cores (the GIL is released inside every op). ``fn`` runs without autograd recording (grad
    mode is per thread). Results come back in order, so a sum over them is the same on any thread count.
    Serial when ``on_gpu``, on one thread, or for one item."""
    workers = torch.get_num_threads()
    if on_gpu or workers < 2 or len(items) < 2:
        with torch.no_grad():
            return [fn(i) for i in items]
    pool = _POOL.get(workers)
    if pool is None:
        pool = _POOL[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="iclab-chunks")

    def job(i: _I) -> _T:
        with torch.no_grad():  # grad mode is per thread: the pool's threads must not record a graph
            return fn(i)

    torch.set_num_threads(1)
    try:
        return list(pool.map(job, items))
    finally:
        torch.set_num_threads(workers)


def split_evenly(total: int, most: int) -> int:
    """The part size that splits ``total`` items into a multiple of 4 parts of at most ``most``: even work on 1, 2 or
    4 threads, and a split (hence the rounding of sums over the parts) that does not depend on the thread count."""
    parts = math.ceil(math.ceil(total / most) / 4) * 4
    return math.ceil(total / parts)
