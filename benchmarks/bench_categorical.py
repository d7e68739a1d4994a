"""Benchmark: one training step of the Wang et al. 2025 categorical attention models at the paper's minibatch.

    python benchmarks/bench_categorical.py [cpu|cuda] [--repeats 5] [--rounds 3] [--general] [--torch-head] [--no-peer]
        [--kernel softmax|rbf|exp|linear] [--blocks 2]

§6.1 set-up (d = 10, C = 25, d' = 5, N = 125), minibatch 512 contexts, softmax attention, float32: forward +
backward + global-norm clipping + Adam, for the 2-block GD model (the paper's "GD", Fig. 3/4) and the 2-block
Trained TF (free matrices, same skeleton; its fast path, ``iclab.models._categorical_fast``). With the authors'
PyTorch port set up (``../shared/peer-bench/README.md``) their 512-context step (``tf_minibatch_step``,
``gd_minibatch_step`` of peer-bench/bench_categorical.py) and ours are timed alternately in one run
(``benchmarks/peers.py``: authors, iclab, authors, iclab, …) and the ratios are printed; otherwise that column is
skipped with the reason. ``--general`` also times the Trained TF by its general path (``model.fast = False``, the
code before the fast path), ``--torch-head`` its fast path without the C kernel (``_categorical_fast.NATIVE = False``).
``--kernel rbf --blocks 1`` times Fig. 2 with RBF attention (``wang2025.fig2_rbf``): the models with that attention
kernel and that many blocks (the authors' harness takes softmax, linear and rbf).
Prints ms per step, contexts/s and achieved GFLOP/s (matmul-family FLOPs of what runs, ``torch.utils.flop_counter``,
the C kernel's counted as the torch head's products) against this machine's measured float32 matmul peak; writes
benchmarks/results/bench-categorical-<device>.json (``bench-categorical-<kernel>-<blocks>block-<device>.json`` for
another kernel or depth) with the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from iclab.bench import matmul_peak, measure_step
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import CategoricalTransformer, CategoricalTransformerConfig, _categorical_fast
from iclab.tasks.categorical import RBFMixtureCategorical
from peers import loadavg, peer_missing, peer_provenance, run_peer, side_by_side

PEER = "icl_attention_categorical"
#: the authors' harness keys for each of our models
PEER_KEYS = {"free": "tf_minibatch_step", "gd": "gd_minibatch_step"}


def training_step(
    mode: str,
    *,
    device: torch.device,
    batch: int = 512,
    n: int = 125,
    n_blocks: int = 2,
    kernel: str = "softmax",
    repeats: int = 5,
    fast: bool = True,
    native: bool = True,
) -> dict[str, float]:
    """One Adam step of the ``n_blocks``-block model with ``kernel`` attention (``mode`` 'gd' or 'free';
    ``fast=False``: the free model's general path, ``native=False``: its fast path without the C kernel)."""
    task = RBFMixtureCategorical.draw(generator=generator(0))
    cfg = CategoricalTransformerConfig(n_blocks=n_blocks, kernel=kernel, mode=mode)  # type: ignore[arg-type]
    model = CategoricalTransformer(cfg, generator=generator(1)).to(device)
    model.fast = fast
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ep = task.sample(batch, n, generator=generator(2, device))

    def loss() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model.predict(ep), ep.label_query)

    before, _categorical_fast.NATIVE = _categorical_fast.NATIVE, native and _categorical_fast.NATIVE
    try:
        r = measure_step(loss, opt, clip=1.0, clip_mode="global", device=device, items=batch, per="contexts",
                         repeats=repeats)  # fmt: skip
        _categorical_fast.NATIVE = False  # count the C kernel's products too: the same ones as the torch head's
        with FlopCounterMode(display=False) as fc:
            loss().backward()
        opt.zero_grad(set_to_none=True)
    finally:
        _categorical_fast.NATIVE = before
    r["gflop_per_step"] = fc.get_total_flops() / 1e9
    r["achieved_gflops"] = r["gflop_per_step"] / r["ms_per_step"] * 1e3
    return r


def _summary(mine: list[float], theirs: list[float]) -> dict[str, object]:
    """The same fields as ``peers.side_by_side`` for a model timed inside another model's alternation."""
    out: dict[str, object] = {"iclab_ms": [round(t, 2) for t in mine], "iclab_median_ms": statistics.median(mine)}
    if theirs:
        out.update(authors_ms=[round(t, 2) for t in theirs], authors_median_ms=statistics.median(theirs),
                   ratio=statistics.median(theirs) / statistics.median(mine))  # fmt: skip
    else:
        out["ratio"] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="steps per iclab measurement (median)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations authors/iclab")
    parser.add_argument("--peer-steps", type=int, default=15, help="the authors' minibatch steps per measurement")
    parser.add_argument("--general", action="store_true", help="also time the Trained TF's general path")
    parser.add_argument("--torch-head", action="store_true", help="also time its fast path without the C kernel")
    parser.add_argument("--no-peer", action="store_true", help="skip the authors' column")
    parser.add_argument("--no-tune-allocator", action="store_true", help="leave glibc malloc at its defaults")
    parser.add_argument("--kernel", default="softmax", choices=["softmax", "rbf", "exp", "linear"])
    parser.add_argument("--blocks", type=int, default=2, help="attention blocks of both models")
    args = parser.parse_args()
    tuned = not args.no_tune_allocator and tune_cpu_allocator()
    device = resolve_device(args.device)
    threads = torch.get_num_threads()
    peak = matmul_peak(device)
    missing = (
        "--no-peer"
        if args.no_peer
        else peer_missing(PEER)
        if device.type == "cpu"
        else "the authors' harness runs on the CPU only"
    )
    if not missing and args.kernel == "exp":
        missing = "the authors' harness has no exp kernel"
    if missing:
        print(f"authors' column skipped: {missing}")
    # the C kernel serves the softmax head; the other kernels' first block is torch code
    native = args.kernel == "softmax" and _categorical_fast.NATIVE and device.type == "cpu"
    native = native and _categorical_fast.native() is not None
    out: dict[str, object] = {"provenance": provenance(device), "matmul_peak_gflops": peak, "allocator_tuned": tuned,
                              "c_kernel": native, "loadavg_start": loadavg(),
                              "authors": None if missing else peer_provenance(PEER)}  # fmt: skip
    print(f"Trained TF's shared head: {'the C kernel _kv_softmax.c' if native else 'torch code (no C kernel)'}")
    models = {"free": ("free", True, True), "gd": ("gd", True, True)}
    if args.torch_head:
        models["free_torch_head"] = ("free", True, False)
    if args.general:
        models["free_general"] = ("free", False, False)
    mine: dict[str, list[float]] = {k: [] for k in models}
    theirs: dict[str, list[float]] = {k: [] for k in PEER_KEYS}
    last: dict[str, dict[str, float]] = {}

    def ours() -> float:  # every model once per round, the Trained TF's time returned
        for name, (mode, fast, c_kernel) in models.items():
            last[name] = training_step(mode, device=device, n_blocks=args.blocks, kernel=args.kernel,
                                       repeats=args.repeats, fast=fast, native=c_kernel)  # fmt: skip
            mine[name].append(last[name]["ms_per_step"])
        return mine["free"][-1]

    def peer() -> float:  # one run of the authors' harness times both of their models
        peer_args = ["--kernel", args.kernel, "--layers", str(args.blocks), "--mb-steps", str(args.peer_steps),
                     "--loop-steps", "1"]  # fmt: skip
        res = run_peer("bench_categorical.py", peer_args, threads=threads)
        for name, key in PEER_KEYS.items():
            theirs[name].append(float(res[key]["median_ms"]))  # type: ignore[index]
        return theirs["free"][-1]

    side_by_side(ours, None if missing else peer, rounds=args.rounds)
    for name in models:
        row = {**last[name], "fraction_of_peak": last[name]["achieved_gflops"] / peak}
        row.update(_summary(mine[name], theirs.get(name, [])))
        out[f"{name}_{args.blocks}block"] = row
        ratio = row["ratio"]
        label = {"free": "Trained TF", "gd": "GD", "free_torch_head": "Trained TF (torch head)",
                 "free_general": "Trained TF (general path)"}[name]  # fmt: skip
        print(f"{label:26s} iclab {row['iclab_median_ms']:7.1f} ms", end="")
        print(f"   authors {row['authors_median_ms']:7.1f} ms   ratio {ratio:4.1f}x" if ratio else "")
    out.update(loadavg_end=loadavg(), kernel=args.kernel, blocks=args.blocks)
    print(json.dumps(out, indent=2))
    variant = "" if (args.kernel, args.blocks) == ("softmax", 2) else f"{args.kernel}-{args.blocks}block-"
    atomic_write_json(Path(__file__).parent / "results" / f"bench-categorical-{variant}{device.type}.json", out)


if __name__ == "__main__":
    main()
