"""Benchmark: population flow (eq. 57, 84) and full-batch GD on the moments of z (eq. 7, 44) of Zhang et al. 2025's
separate-head reduced model (d = 4, H = 4, rank 1, one seed, float64: the Fig. 3 setting), by the C steps of
``training/_reduced_flow.c`` against the torch loop, timed alternately in one process.

    python benchmarks/bench_reduced_flow.py [--threads 1] [--rounds 9] [--steps 2000]
        [--out benchmarks/results/bench-reduced-flow-cpu.json]

Prints the medians per step and the ratios and writes them with the measurement's provenance
(:func:`iclab.core.provenance.provenance`) to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

import iclab
from iclab import models, tasks
from iclab.bench import alternate
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.tasks.linear_regression import rotated_covariance
from iclab.training import _reduced_flow, full_batch_gd, population_flow

CPU = torch.device("cpu")
D, H, N = 4, 4, 31


def _runs(steps: int) -> dict[str, Callable[[], object]]:
    Lam = rotated_covariance((0.4, 0.3, 0.2, 0.1), generator=iclab.generator(0))
    episode = tasks.LinearRegression(d=D, covariance=Lam).sample(
        256, n=N, generator=iclab.generator(1), dtype=torch.float64
    )

    def model() -> models.SeparateAttention:
        return models.SeparateAttention(D, H, 1, w_init=1e-3, generator=iclab.generator(2)).to(torch.float64)

    def flow() -> object:
        return population_flow(model(), Lam, inv_n=1 / N, lr=0.1, steps=steps, record_every=steps // 10)

    def gd() -> object:
        return full_batch_gd(model(), episode, lr=0.1, steps=steps, record_every=steps // 10)

    def torch_loop(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with mock.patch.object(_reduced_flow, "NATIVE", False):
                return fn()

        return run

    return {"flow C": flow, "flow torch": torch_loop(flow), "gd C": gd, "gd torch": torch_loop(gd)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert _reduced_flow.native() is not None, "the C kernel does not build here"
    t = alternate(_runs(args.steps), device=CPU, rounds=args.rounds)
    out: dict = {"d": D, "heads": H, "rank": 1, "steps": args.steps, "threads": args.threads, "rounds": args.rounds}
    for case in ("flow", "gd"):
        fast, slow = t[f"{case} C"], t[f"{case} torch"]
        out[case] = {
            "us_per_step": {"C": fast / args.steps * 1e6, "torch": slow / args.steps * 1e6},
            "ratio": slow / fast,
        }
        print(
            f"{case}: C {fast / args.steps * 1e6:.1f} us/step, torch {slow / args.steps * 1e6:.1f} us/step; {slow / fast:.1f}x"
        )
    if args.out:
        atomic_write_json(args.out, {"provenance": provenance(CPU), **out})
        print(json.dumps(out))


if __name__ == "__main__":
    main()
