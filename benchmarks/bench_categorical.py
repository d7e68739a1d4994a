"""Benchmark: one training step of the Wang et al. 2025 categorical attention models at the paper's minibatch.

    python benchmarks/bench_categorical.py [cpu|cuda] [--repeats 5]

§6.1 set-up (d = 10, C = 25, d' = 5, N = 125), minibatch 512 contexts, softmax attention, float32: forward +
backward + global-norm clipping + Adam, for the 2-block GD model (the paper's "GD", Fig. 3/4) and the 2-block
Trained TF (free matrices, same skeleton). The authors' PyTorch port takes 330 ms for this 512-context step on
this 2-core CPU (spec 004 issue). Prints ms per step, contexts/s and achieved GFLOP/s (matmul-family FLOPs,
``torch.utils.flop_counter``) against this machine's measured float32 matmul peak; writes
benchmarks/results/bench-categorical-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from iclab.bench import matmul_peak, measure_step
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.seeding import generator
from iclab.models import CategoricalTransformer, CategoricalTransformerConfig
from iclab.tasks.categorical import RBFMixtureCategorical

AUTHORS_TORCH_MS = 330.0


def training_step(
    mode: str, *, device: torch.device, batch: int = 512, n: int = 125, n_blocks: int = 2, repeats: int = 5
) -> dict[str, float]:
    task = RBFMixtureCategorical.draw(generator=generator(0))
    cfg = CategoricalTransformerConfig(n_blocks=n_blocks, kernel="softmax", mode=mode)  # type: ignore[arg-type]
    model = CategoricalTransformer(cfg, generator=generator(1)).to(device)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ep = task.sample(batch, n, generator=generator(2, device))
    r = measure_step(lambda: torch.nn.functional.cross_entropy(model.predict(ep), ep.label_query), opt, clip=1.0,
                     clip_mode="global", device=device, items=batch, per="contexts", repeats=repeats)  # fmt: skip
    return {**r, "speedup_vs_authors_torch": AUTHORS_TORCH_MS / r["ms_per_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-tune-allocator", action="store_true", help="leave glibc malloc at its defaults")
    args = parser.parse_args()
    tuned = not args.no_tune_allocator and tune_cpu_allocator()
    device = resolve_device(args.device)
    peak = matmul_peak(device)
    out = {"device": str(device), "threads": torch.get_num_threads(), "cpu": platform.processor(),
           "matmul_peak_gflops": peak, "allocator_tuned": tuned}  # fmt: skip
    for mode in ("gd", "free"):
        r = training_step(mode, device=device, repeats=args.repeats)
        r["fraction_of_peak"] = r["achieved_gflops"] / peak
        out[f"{mode}_2block"] = r
    print(json.dumps(out, indent=2))
    atomic_write_json(Path(__file__).parent / "results" / f"bench-categorical-{device.type}.json", out)


if __name__ == "__main__":
    main()
