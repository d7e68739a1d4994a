"""iclab.core.threads.map_on_threads: ordered results, no autograd recording, torch's thread count restored; and
the relu-GP sampler in chunks (torch eigh, or the C kernel in float32) gives the sample of one batch."""

from __future__ import annotations

import pytest
import torch

from iclab.core import symabs
from iclab.core.seeding import generator
from iclab.core.threads import map_on_threads
from iclab.tasks.gaussian_process import GaussianProcess


@pytest.mark.parametrize("threads", [1, 2])
def test_results_in_order_without_grad_and_threads_restored(threads):
    old = torch.get_num_threads()
    w = torch.ones(3, requires_grad=True)
    try:
        torch.set_num_threads(threads)
        out = map_on_threads(lambda i: (i, torch.get_num_threads(), (w * i).requires_grad), range(7))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(old)
    assert [o[0] for o in out] == list(range(7))
    assert not any(o[2] for o in out)
    if threads > 1:
        assert {o[1] for o in out} == {1}  # each worker single-threaded


@pytest.mark.parametrize("kernel", ["relu", "exp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_eigh_sample_equals_one_batched_eigh(monkeypatch, dtype, kernel):
    """relu, float64: torch's eigh in chunks on threads; float32: the Jacobi C kernel's parts on threads; exp: the
    Cholesky C kernel's parts."""
    task = GaussianProcess.random_rotation(generator=generator(0), kernel=kernel)
    whole = task.sample(50, 6, generator=generator(1), dtype=dtype)
    monkeypatch.setattr(symabs, "PART", 8)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        chunked = task.sample(50, 6, generator=generator(1), dtype=dtype)
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(chunked.y, whole.y, rtol=0, atol=1e-12)
    torch.testing.assert_close(chunked.task["K_plus"], whole.task["K_plus"], rtol=0, atol=1e-12)
