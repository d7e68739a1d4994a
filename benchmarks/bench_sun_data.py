"""Benchmark: the data path and the evaluation pass of Sun, Jadbabaie, Azizan 2025's presets, against the
concatenating reference, timed alternately in one process.

    python benchmarks/bench_sun_data.py [--threads 1] [--rounds 7] [--out benchmarks/results/bench-sun-data-cpu.json]

Cases (the paper preset's shapes, App. I):

* ``sample``: a batch of random polynomials (:meth:`~iclab.tasks.PolynomialRegression.sample`) with the labels by
  :func:`~iclab.tasks.polynomial.polynomial_values` (chunked, threads) against ``einsum`` over the materialised
  (B, T, M) monomial features;
* ``embed``: the prompt of eq. (1) with the label scale (:func:`~iclab.models.bilinear.embed_scratch`, written in
  place) against the concatenation :func:`~iclab.models.bilinear._embed_reference`;
* ``step``: one Adam step of the fig2 paper model (10 layers, d = 4, d̄ = 15, n = 100, batch 4000, float32)
  including its batch draw, new data path against the old one;
* ``fig2_quick`` (``--quick``): ``sun2025.fig2`` at its quick preset end to end (two rounds; the old side also
  computes the snapshots' sub-network losses by the token layers);
* ``eval``: one test length of the evaluation pass (:func:`~iclab.experiments.sun2025._setup.loss_vs_length`,
  float64, ``--eval-batch`` prompts at n = 200), new data path against the old one.

Every pair computes the same numbers bit for bit (asserted here before timing). Prints the medians and the ratios and
writes them with the measurement's provenance (:func:`iclab.core.provenance.provenance`) to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import torch

from iclab.bench import alternate
from iclab.core.devices import tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.experiments import run_experiment
from iclab.experiments.sun2025._setup import loss_vs_length, make_task, model_base
from iclab.experiments.sun2025.fig2 import Fig2Config
from iclab.models import bilinear
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig, _embed_reference
from iclab.tasks import polynomial

CPU = torch.device("cpu")


def _einsum_values(x: torch.Tensor, w: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """The labels over the whole (B, T, M) feature tensor: the reference of :func:`polynomial_values`."""
    return torch.einsum("btm,bm->bt", polynomial.monomials(x, exponents), w)


def _concat_embed(episode, d_bar: int, label_scale: float = 1.0) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return _embed_reference(episode.x, episode.x_query, episode.y, d_bar, label_scale)


_BLOCKS = BilinearTransformer.block_predictions


def _token_blocks(model: BilinearTransformer, episode, *, fused: bool = False) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return _BLOCKS(model, episode)


@contextlib.contextmanager
def old_path() -> Iterator[None]:
    """The data path as one einsum over materialised features and a concatenated prompt; the sub-network losses of
    the snapshots by the token layers."""
    with (
        mock.patch.object(polynomial, "polynomial_values", _einsum_values),
        mock.patch.object(bilinear, "embed_scratch", _concat_embed),
        mock.patch.object(BilinearTransformer, "block_predictions", _token_blocks),
    ):
        yield


def _under(
    ctx: Callable[[], contextlib.AbstractContextManager[None]], fn: Callable[[], object]
) -> Callable[[], object]:
    def run() -> object:
        with ctx():
            return fn()

    return run


def _once_each(new: Callable[[], object], old: Callable[[], object], rounds: int = 2) -> dict[str, float]:
    """Median seconds of ``new`` and ``old`` run alternately ``rounds`` times each, no warm-up (a whole experiment)."""
    times: dict[str, list[float]] = {"new": [], "old": []}
    for _ in range(rounds):
        for key, fn in (("new", new), ("old", old)):
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _fig2_quick() -> object:
    """sun2025.fig2 at the quick preset, from scratch, in a directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-sun-") as tmp:
        return run_experiment("sun2025.fig2", "quick", out=tmp).claims


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--eval-batch", type=int, default=10_000, help="prompts of the evaluation case (the paper: 100 000)"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="also sun2025.fig2 at the quick preset end to end (minutes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as the ``iclab`` CLI runs: freed batches are not page-faulted in again
    cfg = Fig2Config()
    task = make_task(cfg)
    mc = BilinearTransformerConfig(**{**model_base(cfg, cfg.d), "init": "gaussian"}, n_blocks=cfg.n_blocks, ffn="dense")
    model = BilinearTransformer(mc, generator=generator(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    B, n = cfg.train.batch_size, cfg.n

    def sample() -> object:
        return task.sample(B, n, generator=generator(1))

    ep = task.sample(B, n, generator=generator(1))
    assert ep.y is not None and ep.y_query is not None
    with old_path():
        old = task.sample(B, n, generator=generator(1))
        assert old.y is not None and old.y_query is not None
        assert torch.equal(old.y, ep.y) and torch.equal(old.y_query, ep.y_query)
        assert torch.equal(bilinear.embed_scratch(ep, cfg.d_bar, 4.0), bilinear._embed_reference(ep.x, ep.x_query, ep.y, cfg.d_bar, 4.0))  # fmt: skip

    def step() -> object:
        e = task.sample(B, n, generator=generator(1))
        loss = (model(e) - e.y_query).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def evaluate() -> object:
        return loss_vs_length(model, task, (200,), args.eval_batch, 0)

    assert _under(old_path, evaluate)() == evaluate()
    cases = {
        "sample": sample,
        "embed": lambda: bilinear.embed_scratch(ep, cfg.d_bar, 4.0),
        "step": step,
        "eval": evaluate,
    }
    if args.quick:
        cases["fig2_quick"] = _fig2_quick
    out: dict[str, dict[str, float]] = {}
    for name, fn in cases.items():
        ref = _under(old_path, fn) if name != "embed" else lambda: _concat_embed(ep, cfg.d_bar, 4.0)
        t = _once_each(fn, ref) if name == "fig2_quick" else alternate({"new": fn, "old": ref}, device=CPU, rounds=args.rounds)  # fmt: skip
        out[name] = {"new_ms": 1e3 * t["new"], "old_ms": 1e3 * t["old"], "speedup": t["old"] / t["new"]}
        print(
            f"{name:7s} new {1e3 * t['new']:9.2f} ms  old {1e3 * t['old']:9.2f} ms  old/new {t['old'] / t['new']:.2f}x"
        )
    if args.out is not None:
        atomic_write_json(args.out, {"threads": args.threads, "eval_batch": args.eval_batch, "cases": out, "provenance": provenance(CPU)})  # fmt: skip
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
