"""Benchmark: the linear transformer's moment form by its C kernel (:mod:`iclab.models._moment_fast`) against the torch
code of the same form, at the training steps of Ahn, Cheng, Daneshmand, Sra 2023 (d = 5, n = 20).

    python benchmarks/bench_moment_fast.py [--threads 2] [--repeats 9] [--steps 20] [--out FILE]

Two measurements, each A against B in one process, alternating (ABAB…, medians), threads pinned alike:

* ``steps``: one AdamW step (forward, backward, per-matrix clip, update) on a fixed batch, as ``iclab bench
  --roofline`` times it (``ahn2023.fig1.full``, ``fig6``, ``fig7``), by the kernel and by the torch code;
* ``trainer``: ``iclab.training.train`` running the Fig.-6 paper trainer (AdamW, a fresh batch of 40 000 prompts every
  step) for ``--steps`` steps under cProfile, kernel on and off: ms per step and the share of the batch draw
  (``LinearRegression.sample``), the prompt's moments (``context_moments``), forward, backward and the rest
  (optimiser, clipping, the trainer's bookkeeping).

Writes the numbers with their provenance (``iclab.core.provenance``) to ``--out``
(default benchmarks/results/bench-moment-cpu.json).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from iclab.core.provenance import provenance
from iclab.models import _moment_fast
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression
from iclab.training import train
from iclab.training.optim import clip_gradients
from iclab.training.trainer import mse_loss

STEPS = {"ahn2023.fig1.full": ("full", 3, 20_000), "ahn2023.fig6": ("pattern11", 3, 40_000),
         "ahn2023.fig7": ("pattern11", 4, 40_000)}  # fmt: skip


def _task() -> LinearRegression:
    return LinearRegression.random_rotation(AHN2023_SPECTRUM, generator=torch.Generator().manual_seed(0))


def _model(pattern: str, layers: int) -> LinearTransformer:
    cfg = LinearTransformerConfig(d=5, n_layers=layers, pattern=pattern)  # type: ignore[arg-type]
    return LinearTransformer(cfg, generator=torch.Generator().manual_seed(1))


def _alternate(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median ms of each callable, timed in turn ``repeats`` times after one warm-up each."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats + 1):
        for k, run in runs.items():
            t = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}


def _with_native(native: bool, fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        _moment_fast.NATIVE = native
        fn()

    return run


def bench_steps(repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for key, (pattern, layers, batch) in STEPS.items():
        model = _model(pattern, layers)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ep = _task().sample(batch, 20, generator=torch.Generator().manual_seed(2))
        params = list(model.parameters())

        def step(model: LinearTransformer = model, opt: torch.optim.Optimizer = opt, ep=ep, params=params) -> None:  # type: ignore[no-untyped-def]
            opt.zero_grad(set_to_none=True)
            mse_loss(model, ep).backward()
            clip_gradients(params, 0.01, "per_matrix")
            opt.step()

        ms = _alternate({"kernel": _with_native(True, step), "torch": _with_native(False, step)}, repeats)
        out[key] = {**ms, "speedup": ms["torch"] / ms["kernel"]}
        print(f"{key}: kernel {ms['kernel']:.1f} ms, torch {ms['torch']:.1f} ms, {out[key]['speedup']:.2f}x")
    return out


SHARES = {
    "draw": "linear_regression.py:*(sample)",
    "moments": "attention_core.py:*(context_moments)",
    "forward": "linear_attention.py:*(forward)",
    "backward": "_tensor.py:*(backward)",
}


def _profiled_run(native: bool, steps: int) -> dict[str, float]:
    """ms per step of the Fig.-6 paper trainer at N = 20 and each part's share (cProfile's cumulative times)."""
    from iclab.experiments.ahn2023.fig6 import _variable_n_notebook

    _moment_fast.NATIVE = native
    cfg = dataclasses.replace(_variable_n_notebook(), steps=steps, eval_every=10**6, checkpoint_every=10**6)
    cfg = dataclasses.replace(cfg, progress=False)
    sample = functools.partial(_task().sample, n=20)
    train(_model("pattern11", 3), sample, dataclasses.replace(cfg, steps=2))  # warm-up (the kernel's build)
    model = _model("pattern11", 3)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    train(model, sample, cfg)
    prof.disable()
    total = time.perf_counter() - t
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    cum = {}
    for part, pattern in SHARES.items():
        suffix, name = pattern.split(":*")
        cum[part] = sum(v[3] for (f, _, fn), v in stats.items() if f.endswith(suffix) and f"({fn})" == name)
    cum["forward"] -= cum["moments"]  # the moments are drawn inside the model's forward
    out = {"ms_per_step": total / steps * 1e3}
    out |= {f"share_{k}": v / total for k, v in cum.items()}
    out["share_rest"] = 1.0 - sum(v / total for v in cum.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/bench-moment-cpu.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    result: dict[str, object] = {"provenance": provenance(), "steps": bench_steps(a.repeats)}
    trainer = {}
    for native in (True, False, True, False):  # alternating; the last of each kept
        trainer["kernel" if native else "torch"] = _profiled_run(native, a.steps)
    result["trainer_fig6_paper"] = trainer
    for k, v in trainer.items():
        print(f"fig6 paper trainer, {k}: " + ", ".join(f"{n} {x:.3g}" for n, x in v.items()))
    _moment_fast.NATIVE = True
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
