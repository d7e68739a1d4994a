"""``iclab bench --roofline``: every paper's step measured against its FLOP and memory bound (tiny shapes; no timing
claims)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from iclab.roofline import OPTIMISER_PASSES, Shape, cases, count_flops, run_roofline, step_bytes

CPU = torch.device("cpu")


def test_every_paper_has_a_step() -> None:
    keys = cases(smoke=True)
    assert set(keys) == set(cases(smoke=False))
    for paper in ("ahn2023", "zhang2025", "cheng2024", "sun2025", "wang2025"):
        assert any(k.startswith(paper) for k in keys), paper
    assert {"sun2025.eval", "wang2025.s61.gd", "wang2025.s61.free", "zhang2025.fig3", "zhang2025.fig5"} <= set(keys)


def test_step_bytes_states_its_formula() -> None:
    s = Shape(batch=2, tokens=3, width=5, sublayers=4, params=7, scores=6, score_layers=2, logits=9)
    act = 2 * 3 * 5 * 4
    b = step_bytes(s)
    assert b["activations"] == (5 * 4 - 2) * act
    assert b["scores"] == 5 * 2 * 2 * 6 * 4 and b["logits"] == 4 * 2 * 9 * 4
    assert b["parameters"] == (3 + OPTIMISER_PASSES["adam"]) * 7 * 4
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    e = step_bytes(Shape(batch=2, tokens=3, width=5, sublayers=4, itemsize=8, params=7, train=False))
    assert e["activations"] == 2 * 4 * 2 * 3 * 5 * 8 and e["parameters"] == 7 * 8


def test_flops_are_counted_on_a_slice_and_scaled() -> None:
    """Every FLOP of these models is per prompt: the count on a slice times batch / slice is the whole batch's."""
    case = cases(smoke=True)["ahn2023.fig1.full"](CPU)
    assert case.scale == 1.0  # the smoke batch is counted whole
    whole = count_flops(case)
    case.scale = 2.0
    assert count_flops(case) == 2 * whole > 0


def test_smoke_writes_its_json_with_provenance(tmp_path: Path) -> None:
    run_roofline(tmp_path, smoke=True, only="zhang2025.fig3")
    data = json.loads((tmp_path / "roofline-cpu-smoke-partial.json").read_text())
    assert data["smoke"] and data["provenance"]["machine"]["threads"] >= 1
    assert list(data["steps"]) == ["zhang2025.fig3"]


def test_every_smoke_case_reports_the_bound_that_applies(tmp_path: Path) -> None:
    """``iclab bench --roofline --smoke``: every step at tiny shapes (seconds), each row's bound from its numbers."""
    report = run_roofline(tmp_path, smoke=True)
    assert set(report["steps"]) == set(cases(smoke=True))
    assert json.loads((tmp_path / "roofline-cpu-smoke.json").read_text())["steps"].keys() == report["steps"].keys()
    for key, row in report["steps"].items():
        assert row["ms_per_step"] > 0 and row["gflop_per_step"] > 0 and row["gb_per_step"] > 0, key
        flop_ms = row["gflop_per_step"] / row["matmul_peak_gflops"] * 1e3
        byte_ms = row["gb_per_step"] / row["bandwidth_gbps"] * 1e3
        assert row["bound_ms"] == pytest.approx(max(flop_ms, byte_ms)), key
        assert row["bound"] == ("FLOPs" if flop_ms >= byte_ms else "bytes"), key
        assert row["x_bound"] == pytest.approx(row["ms_per_step"] / row["bound_ms"]), key
