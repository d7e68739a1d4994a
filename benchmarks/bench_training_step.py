"""Benchmark: the Fig.-1 training step of Ahn et al. 2023 (3 layers, d=5, n=20, batch 20 000).

    python benchmarks/bench_training_step.py            # or: iclab bench [--presets]

Prints ms per step, samples/s and achieved GFLOP/s against this machine's measured float32
matmul peak, for the eq.-(8) ("sparse") model and the full-P/Q model; writes
benchmarks/results/bench-<device>.json with the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import json
import sys

from iclab.bench import run_benchmarks
from iclab.core.devices import tune_cpu_allocator

if __name__ == "__main__":
    if "--no-tune-allocator" in sys.argv:
        sys.argv.remove("--no-tune-allocator")
    else:
        tune_cpu_allocator()  # as the iclab CLI does
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    print(json.dumps(run_benchmarks("benchmarks/results", device=device), indent=2))
