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


def test_token_matmul_peak_counts_the_four_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from iclab import bench

    calls: list[float] = []
    real = bench.timeit

    def count(fn, **kw):  # type: ignore[no-untyped-def]
        with FlopCounterMode(display=False) as fc:
            fn()
        calls.append(fc.get_total_flops())
        return real(fn, **kw)

    monkeypatch.setattr(bench, "timeit", count)
    rate = bench.token_matmul_peak(torch.device("cpu"), batch=8, tokens=11, width=5, repeats=1)
    # the FLOPs the rate is computed from are the FLOPs the timed function really does
    assert calls == [4 * 2 * 8 * 11 * 5 * 5]
    assert 0 < rate < float("inf")


def test_activation_traffic_counts_five_passes_per_sublayer() -> None:
    from iclab.bench import activation_traffic

    act = 4000 * 201 * 13 * 4  # one (B, T, D) float32 activation of the Sun et al. 2025 step: 41.8 MB
    assert activation_traffic(batch=4000, tokens=201, width=13, sublayers=12) == 58 * act  # (5·12 − 2)·A
    assert activation_traffic(batch=2, tokens=3, width=5, sublayers=1, itemsize=8) == 3 * 2 * 3 * 5 * 8


def test_memory_traffic_bound_is_bytes_over_the_best_bandwidth() -> None:
    from iclab.bench import activation_traffic, memory_traffic_bound

    r = memory_traffic_bound(torch.device("cpu"), batch=8, tokens=11, width=5, sublayers=4, repeats=1, mib=1)
    assert r["traffic_gb"] == activation_traffic(batch=8, tokens=11, width=5, sublayers=4) / 1e9
    kernels = [r[f"bandwidth_{k}_gbps"] for k in ("copy", "add", "scale")]
    assert r["bandwidth_gbps"] == max(kernels) > 0
    assert abs(r["memory_bound_ms"] - r["traffic_gb"] / r["bandwidth_gbps"] * 1e3) < 1e-9


def test_provenance_records_the_machine_and_the_checkout() -> None:
    from iclab.core.provenance import describe, provenance

    p = provenance("cpu")
    assert set(p) >= {"date", "commit", "machine", "python", "torch", "device"}
    assert p["date"].endswith("+00:00") and p["torch"] == torch.__version__ and p["device"] == "cpu"
    assert p["machine"]["threads"] == torch.get_num_threads() and p["machine"]["cores"] >= 1
    assert p["commit"] is None or (len(p["commit"]["sha"]) == 40 and p["commit"]["dirty"] in (True, False, None))
    assert describe(p).startswith(p["date"][:10] + ", ")
    old = {"date": "2026-11-23", "machine": {"cpu": None, "arch": "x86_64", "cores": 2, "threads": 1}}
    assert describe(old) == "2026-11-23, 2 × x86_64, 1 thread"  # a converted record: no CPU model, nothing invented


def test_every_result_file_carries_its_provenance() -> None:
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    for path in results.glob("*.json"):
        data = json.loads(path.read_text())
        records = [v for k, v in data.items() if k != "about"] if path.name.startswith("authors") else [data]
        if path.name == "paper_presets.json":
            continue  # tests/test_paper_presets.py
        for r in records:
            assert r["provenance"]["date"] and r["provenance"]["machine"]["threads"] >= 1, path.name


def test_performance_tables_are_generated_from_the_results() -> None:
    """docs/performance.md's benchmark tables are what scripts/perf_tables.py writes from benchmarks/results."""
    import importlib.util
    import re
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    sys.path.insert(0, str(scripts))
    try:
        spec = importlib.util.spec_from_file_location("perf_tables", scripts / "perf_tables.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(scripts))
    for path, begin, end, body in module.blocks():
        m = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), path.read_text(), re.S)
        assert m and m.group(1) == body, f"{path}: {begin} differs; run python scripts/perf_tables.py"
