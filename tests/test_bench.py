"""The benchmark harness runs and reports what docs/performance.md quotes (tiny sizes; no timing claims)."""

from __future__ import annotations

import pytest
import torch

from iclab.bench import training_step


@pytest.mark.parametrize("pattern", ["sparse", "full"])
def test_training_step_reports_both_passes(pattern: str) -> None:
    r = training_step(d=3, n=5, batch=32, pattern=pattern, device=torch.device("cpu"), repeats=1)
    for key in ("ms_per_step", "token_ms_per_step", "gflop_per_step", "model_gflop_per_step", "moments_ms", "data_ms"):
        assert r[key] >= 0, key
    assert r["ms_per_step"] > 0 and r["token_ms_per_step"] > 0
    # the moment form does fewer matmul FLOPs per step than the token pass it replaces
    assert r["gflop_per_step"] < r["model_gflop_per_step"]
