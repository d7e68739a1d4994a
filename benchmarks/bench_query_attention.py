"""Benchmark: one training step of Zhang et al. 2025's Fig. 5 softmax models at the paper's size (P = 80 000 prompts
of N = 31 context tokens and the query, d = 4, float64, full-batch GD): ATTN_M (8 merged heads) and ATTN_S (5 rank-one
separate heads), one attention layer read at the query.

    python benchmarks/bench_query_attention.py [--threads 2] [--prompts 80000] [--rounds 4]

Times the whole step (forward, MSE, backward, SGD update) by the C kernel of the query row
(:mod:`iclab.models._query_fast`, built with AVX-512 where the CPU has it and as the AVX2 build a CPU without it
gets; with the gradient factors kept by the forward pass and, for comparison, with the full backward that reads the
prompts and runs the forward again) and by the torch pass (:func:`iclab.models.attention_core.attention_update`), alternately in one run. Writes
benchmarks/results/bench-query-attention-cpu.json with the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from iclab.bench import alternate
from iclab.core.devices import tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.experiments.zhang2025._setup import token_spec
from iclab.models import _query_fast
from iclab.tasks.linear_regression import LinearRegression

#: NATIVE, WIDE, FACTORS of iclab.models._query_fast
PATHS = {
    "c_avx512": (True, True, True),
    "c_avx512_full_backward": (True, True, False),
    "c_avx2": (True, False, True),
    "torch": (False, True, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--prompts", type=int, default=80_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "bench-query-attention-cpu.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as the ``iclab`` CLI trains: the factors' buffer is reused, not mapped afresh every step
    dev = torch.device("cpu")
    ep = LinearRegression(d=4).sample(args.prompts, 31, generator=generator(0), dtype=torch.float64)
    rows = {}
    for key, heads, init in (("ATTN_M", 8, 1e-6), ("ATTN_S", 5, 0.01)):
        model = token_spec(4, heads, key_query="merged" if key == "ATTN_M" else "separate", activation="softmax",
                           init_std=init).build()  # fmt: skip
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step(native: bool, wide: bool, factors: bool, model: torch.nn.Module = model,
                 opt: torch.optim.Optimizer = opt) -> None:  # fmt: skip
            _query_fast.NATIVE, _query_fast.WIDE, _query_fast.FACTORS = native, wide, factors
            loss = (model(ep) - ep.y_query).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        steps: dict[str, Callable[[], None]] = {
            name: (lambda flags=flags: step(*flags)) for name, flags in PATHS.items()
        }
        sec = alternate(steps, device=dev, rounds=args.rounds)
        rows[key] = {name: round(s * 1e3, 1) for name, s in sec.items()}
        gain = sec["c_avx512_full_backward"] / sec["c_avx512"]
        print(key, "ms per step:", rows[key], f"torch / C = {sec['torch'] / sec['c_avx512']:.1f}x, factors {gain:.2f}x")
    _query_fast.NATIVE, _query_fast.WIDE, _query_fast.FACTORS = True, True, True
    atomic_write_json(
        args.out,
        {
            "provenance": provenance(dev),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "prompts": args.prompts,
            "ms_per_step": rows,
        },
    )


if __name__ == "__main__":
    main()
