"""Benchmark: the cost of checking every training step's loss finite (``iclab.training.trainer``).

    python benchmarks/bench_finite_check.py [--reps 7] [--steps 3000]

The trainer holds each step's loss (``loss.detach()``, no host sync) and checks the held losses at each metrics row
(``_Run.check_losses``). This times :func:`iclab.training.train` on a tiny model (a 1-layer linear transformer, d = 3,
n = 10, batch 32, a row every 10 steps: a step of well under a millisecond, where the check weighs most) with the
check on and with it off (nothing held, nothing checked), interleaved, and reports the medians and the overhead in
per cent. Writes benchmarks/results/finite-check-<device>.json with the measurement's provenance.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import TrainConfig, train
from iclab.training import trainer as trainer_mod


class _Sink(list):  # type: ignore[type-arg]
    """A pending-loss list that holds nothing: the check switched off."""

    def append(self, item: Any) -> None:
        pass


def _seconds_per_step(cfg: TrainConfig, check: bool) -> float:
    model = LinearTransformer(LinearTransformerConfig(d=3, n_layers=1, init_std=0.1), generator=generator(0))
    sample = functools.partial(LinearRegression(d=3).sample, n=10)
    real_init = trainer_mod._Run.__init__

    def unchecked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.pending = _Sink()

    if not check:
        trainer_mod._Run.__init__ = unchecked_init  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        train(model, sample, cfg)
        return (time.perf_counter() - t0) / cfg.steps
    finally:
        trainer_mod._Run.__init__ = real_init  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(
        steps=args.steps, batch_size=32, lr=0.01, log_every=10, eval_every=0, eval_batch=64, checkpoint_every=0,
        progress=False,
    )  # fmt: skip
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.reps):
        on.append(_seconds_per_step(cfg, check=True))
        off.append(_seconds_per_step(cfg, check=False))
    with_check, without = statistics.median(on), statistics.median(off)
    record = {
        "benchmark": "finite-check",
        "model": "LinearTransformer d=3, 1 layer, n=10, batch 32, log_every 10",
        "steps": args.steps,
        "reps": args.reps,
        "us_per_step_checked": with_check * 1e6,
        "us_per_step_unchecked": without * 1e6,
        "overhead_percent": 100 * (with_check - without) / without,
        "provenance": provenance("cpu"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "finite-check-cpu.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
