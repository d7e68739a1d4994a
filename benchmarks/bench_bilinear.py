"""Benchmark: one training step of the 12-layer bilinear transformer of Sun, Jadbabaie, Azizan 2025
(L = 6 blocks [bilinear FFN → LSA], d = 4, d̄ = 12, n = 200, batch 4000: the Fig.-7 configuration).

    python benchmarks/bench_bilinear.py [cpu|cuda] [--batch 4000] [--repeats 5]

Prints ms per Adam step (forward, backward, global clip, update), the FLOPs of a step counted by
``FlopCounterMode`` (matmul-family ops), achieved GFLOP/s against this machine's measured float32
matmul peak (``iclab.bench.matmul_peak``) and against the rate of the model's own 13-wide matmul shapes
(``iclab.bench.token_matmul_peak``: a roofline at shape), and the sampling time of a batch. The attention uses the
associative O(n·D²) form of :class:`~iclab.models.LinearAttention`. Writes
benchmarks/results/bench-bilinear-<device>.json; the numbers are discussed in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from iclab import models, tasks
from iclab.bench import matmul_peak, measure_step, timeit, token_matmul_peak
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.seeding import generator
from iclab.training.trainer import mse_loss


def bench(device: str = "cpu", *, batch: int = 4000, n: int = 200, n_blocks: int = 6, repeats: int = 5) -> dict[str, float]:  # fmt: skip
    dev = resolve_device(device)
    task = tasks.quadratic(4)
    cfg = models.BilinearTransformerConfig(d=4, d_bar=12, n_blocks=n_blocks, init_std=0.02)
    model = models.BilinearTransformer(cfg, generator=generator(0)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ep = task.sample(batch, n, generator=generator(1, dev))
    peak = matmul_peak(dev, repeats=repeats)
    shape_peak = token_matmul_peak(dev, batch=batch, tokens=n + 1, width=cfg.d_bar + 1, repeats=repeats)
    r = measure_step(lambda: mse_loss(model, ep), opt, clip=1.0, clip_mode="global", device=dev, items=batch,
                     per="prompts", repeats=repeats, warmup=1)  # fmt: skip
    flops, sec = r["gflop_per_step"] * 1e9, r["ms_per_step"] / 1e3
    data = timeit(lambda: task.sample(batch, n, generator=generator(2, dev)), device=dev, repeats=repeats, warmup=1)
    return {
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "matmul_peak_gflops": round(peak, 1),
        "ms_per_step": round(sec * 1e3, 1),
        "gflop_per_step": round(flops / 1e9, 3),
        "achieved_gflops": round(flops / sec / 1e9, 2),
        "flop_bound_ms": round(flops / (peak * 1e9) * 1e3, 1),
        "x_flop_bound": round(sec / (flops / (peak * 1e9)), 1),
        "token_matmul_peak_gflops": round(shape_peak, 1),
        "shape_bound_ms": round(flops / (shape_peak * 1e9) * 1e3, 1),
        "x_shape_bound": round(sec / (flops / (shape_peak * 1e9)), 1),
        "data_ms": round(data * 1e3, 1),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("device", nargs="?", default="cpu")
    ap.add_argument("--batch", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-tune-allocator", action="store_true", help="leave glibc malloc at its defaults")
    a = ap.parse_args()
    tuned = not a.no_tune_allocator and tune_cpu_allocator()
    out = {**bench(a.device, batch=a.batch, repeats=a.repeats), "allocator_tuned": tuned}
    print(json.dumps(out, indent=2))
    atomic_write_json(Path(__file__).parent / "results" / f"bench-bilinear-{resolve_device(a.device).type}.json", out)
