"""Shared test helpers: strict float64 comparisons and seeded episodes.

Exactness tests compare two learners in float64 to 1e-10 (STYLE item 11); import the helpers with
``from conftest import assert_close, random_episode, random_spd``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings
from torch import Tensor

import iclab
from iclab import tasks

F64 = torch.float64
F32 = torch.float32

# Property tests draw the same examples on every run (seeded like everything else here), so CI cannot
# flake on a new draw; HYPOTHESIS_PROFILE=explore searches fresh examples on demand.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

# Test tensors are tiny: intra-op threads only add overhead (3x here), and `make test` runs 2 xdist workers.
torch.set_num_threads(1)


def assert_close(actual: Tensor, expected: Tensor, *, rtol: float = 1e-10, atol: float = 1e-10, msg: str = "") -> None:
    """Same shape, dtype and device, and |actual − expected| <= atol + rtol·|expected| elementwise."""
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=atol, check_dtype=True, msg=(lambda m: f"{msg}\n{m}") if msg else None
    )


def rel_diff(a: Tensor, b: Tensor) -> float:
    """max|a − b| / max|b|: how far apart two predictions are, relative to their size."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def random_spd(d: int, *, seed: int, cond: float = 4.0, dtype: torch.dtype = F64) -> Tensor:
    """A random symmetric positive-definite (d, d) matrix with eigenvalues in [1/√cond, √cond]."""
    g = iclab.generator(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    evals = cond ** (torch.rand(d, generator=g, dtype=F64) - 0.5)
    return ((q * evals) @ q.T).to(dtype)


def random_episode(
    batch: int,
    n: int,
    d: int,
    *,
    seed: int,
    dtype: torch.dtype = F64,
    noise_std: float = 0.0,
    covariance: Tensor | None = None,
    weight_prior: str = "identity",
) -> iclab.Episode:
    """A seeded linear-regression episode (x ~ N(0, Σ), w ~ N(0, I) by default, noiseless)."""
    task = tasks.LinearRegression(d=d, covariance=covariance, weight_prior=weight_prior, noise_std=noise_std)
    return task.sample(batch, n, generator=iclab.generator(seed), dtype=dtype)


@pytest.fixture
def episode64() -> iclab.Episode:
    """B = 6 prompts, n = 10 pairs, d = 4, x ~ N(0, Σ) with a random SPD Σ, float64, noiseless."""
    return random_episode(6, 10, 4, seed=0, covariance=random_spd(4, seed=1))


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless chromium (Debian's, through Playwright) for the report's and the documentation site's browser tests,
    with a fresh temporary profile; the test skips, saying why, where there is none."""
    from iclab.reporting.site import BROWSER_ARGS, browser_executable

    executable = browser_executable()
    if executable is None:
        pytest.skip("browser tests skipped: no chromium executable on PATH (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests skipped: playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))
        yield b
        b.close()
