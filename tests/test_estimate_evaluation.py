"""The cost probe counts the evaluation that follows training (Sun et al. 2025's test-length sweep) at the size it
runs it: the sweep's time is in the probe's wall time outside its training runs, and so in the projection."""

from __future__ import annotations

import time

import pytest

from iclab.experiments.estimate import estimate_experiment
from iclab.experiments.sun2025 import _setup


def test_the_test_length_sweep_is_counted_outside_training(monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _setup.loss_vs_length
    calls: list[int] = []

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        time.sleep(0.05)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(_setup, "loss_vs_length", slow)
    est = estimate_experiment("sun2025.fig2", "smoke", probe_steps=2)
    assert calls and est.complete
    assert est.outside_seconds >= 0.05 * len(calls)
    assert est.projected_seconds >= est.outside_seconds + sum(r.projected_seconds for r in est.runs) - 1e-9
    assert est.to_dict()["outside_training_seconds"] == round(est.outside_seconds, 1)
