"""Benchmark: one training step of the Cheng, Chen, Sra 2024 model at the paper's batch, beside the authors' step.

    python benchmarks/bench_kernel_attention.py [cpu|cuda] [--acts softmax exp relu linear] [--rounds 2]

The authors' workload (chengxiang/transformer-functional-gradient, ``run_exp``): a 3-layer model with one head,
V = [[A, 0], [0, r]] (A free), B, C blocks, d = 5, n = 14, batch 30 000, every head's output / n, float32;
forward + backward + per-matrix clipping + Adam, data resampled every 10 steps (exp-kernel GP labels, the code's
σ = √2; ``--kernel relu``: relu-kernel labels, which need every prompt's eigendecomposition: the authors' batched
eigh, iclab's Jacobi C kernel, ``iclab.core.symabs``). Both sides are charged the sampling amortised over 10 steps.
iclab's step is :class:`iclab.models.KernelTransformer` (the fused batch-last pass, ``iclab.models._kernel_fast``).
With the authors' code set up (``../shared/peer-bench/README.md``) the two are timed alternately in one run
(``benchmarks/peers.py``) and the ratio is printed; otherwise that column is skipped with the reason.
Writes benchmarks/results/bench-kernel-attention-<device>.json (``-relu`` before ``.json`` for relu-kernel data) with
the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from iclab.bench import timeit
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import KernelTransformer, KernelTransformerConfig
from iclab.tasks.gaussian_process import CODE_EXP_SIGMA, GaussianProcess
from iclab.training.optim import clip_gradients
from peers import loadavg, peer_missing, peer_provenance, run_peer, side_by_side

PEER = "transformer-functional-gradient"
RESAMPLE = 10  # the authors' run_exp draws a new batch every 10 steps


def iclab_step_ms(
    act: str, kernel: str, value: str, *, device: torch.device, batch: int, repeats: int
) -> dict[str, float]:
    """ms per step with the sampling amortised, and its two parts."""
    task = GaussianProcess.random_rotation(generator=generator(0), kernel=kernel, sigma=CODE_EXP_SIGMA)
    cfg = KernelTransformerConfig(d=5, n_layers=3, activations=(act,), value=value, divide_by_n=True)
    model = KernelTransformer(cfg, generator=generator(1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.9), weight_decay=0.0)
    params = list(model.parameters())
    ep = task.sample(batch, 14, generator=generator(2, device))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        (model.predict(ep) - ep.y_query).pow(2).mean().backward()  # the authors' ([Z_L]_{d+1,n+1} + y)²
        clip_gradients(params, 1.0, "per_matrix")
        opt.step()

    train = timeit(step, device=device, repeats=repeats)
    sample = timeit(lambda: task.sample(batch, 14, generator=generator(3, device)), device=device, repeats=2, warmup=1)
    return {"step_ms": train * 1e3, "sample_ms": sample * 1e3, "ms": (train + sample / RESAMPLE) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--acts", nargs="+", default=["softmax", "exp", "relu", "linear"])
    parser.add_argument("--values", nargs="+", default=["sparse", "label"], help="A free (sparse) and A ≡ 0 (label)")
    parser.add_argument("--kernel", default="exp", choices=["exp", "relu"], help="the label kernel of the data")
    parser.add_argument("--batch", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=5, help="steps per iclab measurement (median)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations authors/iclab")
    parser.add_argument("--out", type=Path, help="default: results/bench-kernel-attention-<device>[-relu].json")
    args = parser.parse_args()
    tune_cpu_allocator()
    dev = resolve_device(args.device)
    threads = torch.get_num_threads()
    missing = peer_missing(PEER) if dev.type == "cpu" else "the authors' harness runs on the CPU only"
    if missing:
        print(f"authors' column skipped: {missing}")
    report: dict[str, object] = {
        "provenance": provenance(dev),
        "workload": f"L=3, d=5, n=14, batch {args.batch}, {args.kernel}-kernel data resampled every {RESAMPLE} steps",
        "loadavg_start": loadavg(),
        "authors": None if missing else peer_provenance(PEER),
    }
    for act in args.acts:
        for value in args.values:
            parts: dict[str, float] = {}

            def ours(act: str = act, value: str = value, parts: dict[str, float] = parts) -> float:
                r = iclab_step_ms(act, args.kernel, value, device=dev, batch=args.batch, repeats=args.repeats)
                parts.update(r)
                return r["ms"]

            def theirs(act: str = act) -> float:  # the authors' P has A free; A ≡ 0 costs them the same
                peer_args = ["--N", "14", "--B", str(args.batch), "--kernel", args.kernel, "--act", act]
                out = run_peer("bench_functional_gradient.py", [*peer_args, "--steps", "6", "--warmup", "2",
                                                                "--gen-reps", "2"], threads=threads)  # fmt: skip
                return float(out["amortized_step_ms"])  # type: ignore[arg-type]

            row = side_by_side(ours, None if missing else theirs, rounds=args.rounds)
            row.update({f"iclab_{k}": round(v, 1) for k, v in parts.items()})
            report[f"h_{act}_{value}"] = row
            ratio = row["ratio"]
            print(f"h̃ {act:8s} V {value:6s} iclab {row['iclab_median_ms']:8.1f} ms", end="")
            print(f"   authors {row['authors_median_ms']:8.1f} ms   ratio {ratio:5.1f}x" if ratio else "")
    report["loadavg_end"] = loadavg()
    tag = "" if args.kernel == "exp" else f"-{args.kernel}"
    out = args.out or Path(__file__).parent / "results" / f"bench-kernel-attention-{dev.type}{tag}.json"
    atomic_write_json(out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
