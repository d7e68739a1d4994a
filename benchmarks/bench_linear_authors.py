"""Benchmark: Ahn et al. 2023's and Zhang et al. 2025's training beside the authors' own loops, alternated in one run.

    python benchmarks/bench_linear_authors.py [--which varL varN fig3] [--rounds 3] [--steps 40]

* ``varL`` (Ahn et al., the authors' variable_L notebook, Figs 1 and 7): L = 3, d = 5, n = 20, batch 20 000, AdamW
  β = (0.99, 0.9), per-matrix clip 0.01, the batch redrawn every 100 steps (both sides are charged the draw
  amortised over those 100 steps).
* ``varN`` (the variable_N notebook, Fig. 6): batch 40 000 redrawn EVERY step, β = (0.99, 0.99), clip 0.001.
  For both, iclab's side is ``iclab.training.train`` itself (the trainer the presets run, with the draw of each new
  batch, the clip and the optimiser) for ``--steps`` steps of the preset's own :class:`~iclab.training.TrainConfig`
  (no evaluation, checkpoint or progress bar), for each weight pattern the presets train: eq. (8) (Fig. 1),
  pattern (11) (Figs 6, 7) and full P, Q (the authors' ``Transformer_F``, the like-for-like model).
* ``fig3`` (Zhang et al., linattn-icl ``train.train``, Fig. 3): one full-batch GD epoch of ATTN_S at P = 80 000
  (N = 31, H = 5, d = 4, rank one). iclab's side is :func:`iclab.training.full_batch_gd`: the moment route the preset
  runs (its cost per epoch does not grow with P; the one-off moments are charged over the paper's 10 001 epochs) and
  the per-sequence route (``method='samples'``), the like-for-like O(P) computation.

The authors' side runs ``../shared/peer-bench`` harnesses in their own venv (``benchmarks/peers.py``); without
them that column is skipped with the reason. Writes benchmarks/results/bench-linear-authors-cpu.json with the
measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from iclab.core.devices import tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig, SeparateAttention
from iclab.tasks import LinearRegression
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, rotated_covariance
from iclab.training import TrainConfig, full_batch_gd, train
from peers import alternate, loadavg, peer_missing, peer_provenance, run_peer

AHN_PEER, ZHANG_PEER = "LinearTransformer", "linattn-icl"
#: the authors' notebooks' settings (../shared/peer-bench/bench_lineartransformer.py CONFIGS), as TrainConfig
AHN = {
    "varL": dict(batch_size=20_000, resample_every=100, betas=(0.99, 0.9), clip=0.01, lr=0.01),
    "varN": dict(batch_size=40_000, resample_every=1, betas=(0.99, 0.99), clip=0.001, lr=0.01),
}
PATTERNS = ("sparse", "pattern11", "full")
ZHANG_EPOCHS = 10_001  # the authors' Fig. 3 command (--epoch 10001)


def ahn_step_ms(which: str, pattern: str, steps: int) -> float:
    """ms per step of ``iclab.training.train`` on the authors' ``which`` notebook settings (L = 3, d = 5, n = 20)."""
    task = LinearRegression.random_rotation(AHN2023_SPECTRUM, generator=generator(0))
    model = LinearTransformer(LinearTransformerConfig(d=5, n_layers=3, pattern=pattern), generator=generator(1))
    s = AHN[which]
    # steps a multiple of resample_every: each draw is charged over the steps it serves, as the authors' loop is
    steps = max(steps, s["resample_every"]) // s["resample_every"] * s["resample_every"]
    cfg = TrainConfig(optimizer="adamw", clip_mode="per_matrix", steps=steps, eval_every=0, progress=False, **s)
    sample = functools.partial(task.sample, n=20)
    train(model, sample, dataclasses.replace(cfg, steps=2))  # warm-up: allocator, native builds
    t0 = time.perf_counter()
    train(model, sample, cfg)
    return (time.perf_counter() - t0) / steps * 1e3


def ahn_rows(which: str, rounds: int, steps: int, threads: int) -> dict[str, Any]:
    missing = peer_missing(AHN_PEER)

    def theirs() -> float:
        out = run_peer("bench_lineartransformer.py", ["--config", which, "--steps", "30", "--warmup", "5"],
                       threads=threads)  # fmt: skip
        return float(out["amortized_step_ms"])  # type: ignore[arg-type]

    ours = {p: functools.partial(ahn_step_ms, which, p, steps) for p in PATTERNS}
    rows = alternate(ours, None if missing else theirs, rounds=rounds)
    print(which, json.dumps(rows))
    return {"settings": {k: list(v) if isinstance(v, tuple) else v for k, v in AHN[which].items()}, **rows}


def zhang_rows(rounds: int, threads: int) -> dict[str, Any]:
    missing = peer_missing(ZHANG_PEER)
    task = LinearRegression(d=4, covariance=rotated_covariance((0.4, 0.3, 0.2, 0.1), generator=generator(0)))
    ep = task.sample(80_000, 31, generator=generator(10))

    def epoch_ms(method: str, epochs: int) -> float:
        model = SeparateAttention(4, 5, w_init=0.01, generator=generator(3))
        t0 = time.perf_counter()
        full_batch_gd(model, ep, lr=0.02, steps=epochs, record_every=epochs, method=method)
        total = time.perf_counter() - t0  # with the one-off statistics, charged over the run's epochs
        return total / epochs * 1e3

    def theirs() -> float:
        out = run_peer("bench_linattn.py", ["--preset", "fig3", "--epochs", "5", "--warmup", "1"], threads=threads)
        return float(out["epoch"]["median_ms"])  # type: ignore[index]

    ours = {
        "moments": functools.partial(epoch_ms, "moments", ZHANG_EPOCHS),
        "samples": functools.partial(epoch_ms, "samples", 20),
    }
    rows = alternate(ours, None if missing else theirs, rounds=rounds)
    print("fig3", json.dumps(rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--which", nargs="+", default=["varL", "varN", "fig3"], choices=["varL", "varN", "fig3"])
    parser.add_argument("--rounds", type=int, default=3, help="alternations authors/iclab")
    parser.add_argument("--steps", type=int, default=200, help="iclab training steps per measurement")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench-linear-authors-cpu.json")
    args = parser.parse_args()
    tune_cpu_allocator()
    threads = torch.get_num_threads()
    report: dict[str, Any] = {
        "provenance": provenance(torch.device("cpu")),
        "loadavg_start": loadavg(),
        "authors": {p: (peer_missing(p) or peer_provenance(p)) for p in (AHN_PEER, ZHANG_PEER)},
    }
    for which in args.which:
        if which == "fig3":
            report["zhang2025_fig3"] = zhang_rows(args.rounds, threads)
        else:
            report[f"ahn2023_{which}"] = ahn_rows(which, args.rounds, args.steps, threads)
    report["loadavg_end"] = loadavg()
    atomic_write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
