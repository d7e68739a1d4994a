"""Benchmark: Gaussian-process episode generation (Cheng, Chen, Sra 2024 setting) against a training step.

    OMP_NUM_THREADS=1 python benchmarks/bench_gp_episodes.py [device] [--batch 30000] [--n 14] [--repeats 5]

For every label kernel, the time to sample one batch of episodes (d = 5, Σ = UᵀDU, ξ on the sphere,
labels ~ N(0, K₊) on all n + 1 points) in float32, as episodes/s, and the ratio to one Adam training step
(forward + backward + step) of the 3-layer softmax KernelTransformer on the same batch (Cheng, Chen, Sra 2024
redraw a batch every 10 steps, so a draw costs a tenth of its time per step). Then the ReLU kernel's draw (|K| and |K|^{1/2} g: an
eigendecomposition per prompt) by the batched Jacobi C kernel, by torch's eigh, and the training draw (y alone,
``with_K_plus=False``: Householder + QL in C), alternately in one run, at n = 14 and the n = 30 of Figs 3, 5, 6
(``--engine-rounds``, 0 skips it). Writes benchmarks/results/bench-gp-<device>.json
with the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import iclab
from iclab import models, tasks
from iclab.bench import alternate, timeit
from iclab.core import symabs
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance

KERNELS = ("linear", "relu", "exp", "rbf", "arccos")


def _ms(fn, device: str, repeats: int) -> float:
    """Median milliseconds per call (iclab.bench.timeit)."""
    return 1e3 * timeit(fn, device=torch.device(device), repeats=repeats, warmup=1)


def run(device: str = "cpu", batch: int = 30_000, n: int = 14, repeats: int = 5) -> dict[str, object]:
    g = iclab.generator(0, device=device)
    out: dict[str, object] = {"provenance": provenance(device), "batch": batch, "n": n, "d": 5}
    gen: dict[str, dict[str, float]] = {}
    for kernel in KERNELS:
        task = tasks.GaussianProcess.random_rotation(generator=iclab.generator(1), kernel=kernel)
        ms = _ms(lambda task=task: task.sample(batch, n, generator=g), device, repeats)
        gen[kernel] = {"ms": ms, "episodes_per_s": batch / (ms / 1e3)}
    out["generation"] = gen

    cfg = models.KernelTransformerConfig(d=5, n_layers=3, activations=("softmax",))
    model = models.KernelTransformer(cfg, generator=iclab.generator(2)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ep = tasks.GaussianProcess(kernel="exp").sample(batch, n, generator=g)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = (model.predict(ep) - ep.y_query).pow(2).mean()
        loss.backward()
        opt.step()

    train_ms = _ms(step, device, repeats)
    out["train_step_ms"] = train_ms
    out["generation_over_train_step"] = {k: v["ms"] / train_ms for k, v in gen.items()}
    return out


def relu_engines(device: str, batch: int, ns: tuple[int, ...], rounds: int) -> dict[str, dict[str, float]]:
    """Milliseconds per ReLU-GP batch with the C kernel and with torch's eigh (``symabs.NATIVE``), and the training
    draw without K₊ (the QL kernel), alternately."""
    g = iclab.generator(0, device=device)
    task = tasks.GaussianProcess.random_rotation(generator=iclab.generator(1), kernel="relu")
    out: dict[str, dict[str, float]] = {}
    for n in ns:

        def draw(native: bool, n: int = n, with_K_plus: bool = True) -> None:
            symabs.NATIVE = native
            task.sample(batch, n, generator=g, with_K_plus=with_K_plus)

        times = alternate(
            {
                "jacobi_c": lambda: draw(True),
                "torch_eigh": lambda: draw(False),
                "ql_c_y_only": lambda: draw(True, with_K_plus=False),
            },
            device=torch.device(device),
            rounds=rounds,
        )
        symabs.NATIVE = True
        out[f"n{n}"] = {k: 1e3 * v for k, v in times.items()} | {"speedup": times["torch_eigh"] / times["jacobi_c"]}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("device", nargs="?", default="cpu")
    ap.add_argument("--batch", type=int, default=30_000)
    ap.add_argument("--n", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine-rounds", type=int, default=5)
    args = ap.parse_args()
    res = run(args.device, args.batch, args.n, args.repeats)
    if args.engine_rounds and args.device == "cpu":
        res["relu_engines_ms"] = relu_engines(args.device, args.batch, (14, 30), args.engine_rounds)
    path = Path("benchmarks/results") / f"bench-gp-{args.device.replace(':', '')}.json"
    atomic_write_json(path, res)
    print(json.dumps(res, indent=2))
