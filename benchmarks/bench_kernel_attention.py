"""Benchmark: one training step of the Cheng, Chen, Sra 2024 model at the paper's batch.

    python benchmarks/bench_kernel_attention.py [cpu|cuda] [--repeats 5]

A 3-layer softmax :class:`iclab.models.KernelTransformer` (V = [[A, 0], [0, r]], B, C blocks), d = 5,
n = 14, batch 30 000 (App. H.1): forward + backward + per-matrix clipping + Adam, float32. Also the
linear-h̃ model (associative path, no score matrix) and the K^exp-GP sampler at the same batch.
Prints ms per step, prompts/s and achieved GFLOP/s against this machine's measured float32 matmul
peak (:func:`iclab.bench.matmul_peak`); results are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from iclab.bench import matmul_peak, measure_step, timeit
from iclab.core.devices import resolve_device
from iclab.core.seeding import generator
from iclab.models import KernelTransformer, KernelTransformerConfig
from iclab.tasks.gaussian_process import GaussianProcess


def training_step(
    activation: str, *, device: torch.device, batch: int = 30_000, n: int = 14, d: int = 5, repeats: int = 5
) -> dict[str, float]:
    task = GaussianProcess.random_rotation(generator=generator(0), kernel="exp")
    model = KernelTransformer(
        KernelTransformerConfig(d=d, n_layers=3, activations=(activation,)), generator=generator(1)
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ep = task.sample(batch, n, generator=generator(2, device))
    return measure_step(lambda: (model.predict(ep) - ep.y_query).pow(2).mean(), opt, clip=1.0, clip_mode="per_matrix",
                        device=device, items=batch, per="prompts", repeats=repeats)  # fmt: skip


def sampler(*, device: torch.device, batch: int = 30_000, n: int = 14, repeats: int = 5) -> dict[str, float]:
    out = {}
    for kernel in ("exp", "relu"):
        task = GaussianProcess.random_rotation(generator=generator(0), kernel=kernel)
        sec = timeit(
            lambda task=task: task.sample(batch, n, generator=generator(3, device)), device=device, repeats=repeats
        )
        out[f"sample_{kernel}_ms"] = sec * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dev = resolve_device(args.device)
    peak = matmul_peak(dev, repeats=args.repeats)
    report: dict[str, object] = {
        "machine": f"{platform.machine()} threads={torch.get_num_threads()} torch={torch.__version__} device={dev}",
        "matmul_peak_gflops": round(peak, 1),
    }
    for act in ("softmax", "linear"):
        r = training_step(act, device=dev, repeats=args.repeats)
        r["x_flop_bound"] = r["ms_per_step"] / (r["gflop_per_step"] / peak * 1e3)
        report[f"step_{act}"] = {k: round(v, 3) for k, v in r.items()}
    report["data"] = {k: round(v, 1) for k, v in sampler(device=dev, repeats=args.repeats).items()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
