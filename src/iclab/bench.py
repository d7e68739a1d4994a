"""Benchmarks: this machine's matmul peak, training-step throughput, preset wall times.

Throughput is reported against the *measured* float32 matmul peak (no hard-coded hardware
numbers): FLOPs of a step are counted by ``torch.utils.flop_counter`` (matmul-family ops only,
the FLOPs that matter here), the FLOP-bound time is FLOPs / peak. Every result file carries the
:func:`~iclab.core.provenance.provenance` of its measurement (date, commit, CPU, threads, torch).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from iclab.core.devices import resolve_device
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig, Pattern
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression
from iclab.training.trainer import mse_loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(steps: dict[str, Callable[[], object]], *, device: torch.device, rounds: int) -> dict[str, float]:
    """Median seconds of each step, timed in turn ``rounds`` times after one warm-up each, so that every side of a
    comparison sees the same machine load."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for fn in steps.values():
        fn()
    for _ in range(rounds):
        for name, fn in steps.items():
            _sync(device)
            t = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def timeit(fn: Callable[[], object], *, device: torch.device, repeats: int = 10, warmup: int = 2) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def matmul_peak(device: torch.device, size: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 10) -> float:
    """Measured GFLOP/s of a square ``size`` matmul (the machine's practical peak)."""
    g = generator(0, device)
    a = torch.randn(size, size, generator=g, device=device, dtype=dtype)
    b = torch.randn(size, size, generator=g, device=device, dtype=dtype)
    sec = timeit(lambda: a @ b, device=device, repeats=repeats)
    return 2 * size**3 / sec / 1e9


def token_matmul_peak(
    device: torch.device, *, batch: int, tokens: int, width: int, dtype: torch.dtype = torch.float32, repeats: int = 5
) -> float:
    """Measured GFLOP/s of the matmul shapes of a token-wise model of ``width``-wide tokens (a roofline at shape).

    A square 2048² product is the machine's peak, but a model whose every product has an inner or outer
    dimension of ``width`` (≈ 13) cannot reach it: the GEMM does ``width`` FLOPs per element it moves. This
    times, back to back, the four shapes such a model runs — a shared weight on every token (B·T, D)·(D, D),
    its weight gradient (D, B·T)·(B·T, D), a per-prompt map (B, T, D)·(B, D, D) and a per-prompt Gram
    (B, D, T)·(B, T, D) — and returns their FLOPs over their time: the best rate the model's FLOPs can run at.
    """
    g = generator(0, device)
    x = torch.randn(batch, tokens, width, generator=g, device=device, dtype=dtype)
    y = torch.randn_like(x)
    w = torch.randn(width, width, generator=g, device=device, dtype=dtype)
    t = torch.randn(batch, width, width, generator=g, device=device, dtype=dtype)
    flat, flat_y = x.view(-1, width), y.view(-1, width)

    def shapes() -> None:
        flat @ w
        flat.T @ flat_y
        torch.bmm(x, t)
        torch.bmm(x.transpose(1, 2), y)

    sec = timeit(shapes, device=device, repeats=repeats)
    return 4 * 2 * batch * tokens * width * width / sec / 1e9


def stream_bandwidth(device: torch.device, *, mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """Measured memory bandwidth, GB/s, of three streaming kernels on float32 arrays of ``mib`` MiB each.

    ``copy`` (y ← x: reads 1, writes 1 array), ``add`` (z ← x + y: reads 2, writes 1) and ``scale`` (x ← 1·x in
    place: reads 1, writes 1), on torch's current thread count. Bytes are those the program asks for (reads +
    writes), not the hardware's (a store to a line not in cache also reads it, so ``copy`` and ``add`` report less
    than ``scale``). Arrays far larger than any cache (256 MiB against a 32 MiB L3 here) make it the memory system's
    rate. ``best`` is the highest of the three: the achievable bandwidth that :func:`memory_traffic_bound` divides by
    (the most favourable to the hardware, so the bound is as low as this measurement can make it).
    """
    n = mib * 2**20 // 4
    x = torch.ones(n, device=device)
    y, z = torch.ones_like(x), torch.empty_like(x)
    size = n * 4
    rates = {
        "copy": 2 * size / timeit(lambda: z.copy_(x), device=device, repeats=repeats, warmup=1),
        "add": 3 * size / timeit(lambda: torch.add(x, y, out=z), device=device, repeats=repeats, warmup=1),
        "scale": 2 * size / timeit(lambda: x.mul_(1.0), device=device, repeats=repeats, warmup=1),
    }
    out = {k: v / 1e9 for k, v in rates.items()}
    return {**out, "best": max(out.values())}


def activation_traffic(*, batch: int, tokens: int, width: int, sublayers: int, itemsize: int = 4) -> int:
    """Bytes a training step of a residual token-wise stack must move for the model's own (B, T, D) tensors.

    With A = batch · tokens · width · itemsize the size of one activation (41.8 MB for the step of Sun et al. 2025's 12-layer model), count

    * the prompt z_0 written once (its embedding): A;
    * per sub-layer, forward: read its input, write its output (2A); backward: read the output gradient, read the
      input it saved, write the input gradient (3A): 5A;
    * less what the read-out makes unnecessary: the last sub-layer's output is read at the query alone, so its
      output write and output-gradient read are B·D, not A (−2A), and the first sub-layer's input is data, so no
      input gradient is written (−A).

    Total (5S − 2)·A for S sub-layers. Weights (a few thousand numbers) and per-prompt (D, D) matrices such as an
    attention layer's Gram (B·D² against B·T·D) are left out, as is any second pass a particular implementation makes
    (recomputation, a Gram before a product): this is what any layer-by-layer program must move at least, the
    traffic a step has when its activations do not fit in cache. A program that keeps a chunk of prompts in cache
    through several layers moves less and can beat the resulting bound.
    """
    act = batch * tokens * width * itemsize
    return (5 * sublayers - 2) * act


def memory_traffic_bound(
    device: torch.device,
    *,
    batch: int,
    tokens: int,
    width: int,
    sublayers: int,
    itemsize: int = 4,
    repeats: int = 5,
    mib: int = 256,
) -> dict[str, float]:
    """The memory-traffic bound of a step: :func:`activation_traffic` bytes over :func:`stream_bandwidth`'s best rate,
    measured now (same threads, same load). Returns ``traffic_gb``, ``bandwidth_gbps`` (and each kernel's rate as
    ``bandwidth_<kernel>_gbps``) and ``memory_bound_ms``."""
    traffic = activation_traffic(batch=batch, tokens=tokens, width=width, sublayers=sublayers, itemsize=itemsize)
    bw = stream_bandwidth(device, mib=mib, repeats=repeats)
    return {
        "traffic_gb": traffic / 1e9,
        "bandwidth_gbps": bw["best"],
        **{f"bandwidth_{k}_gbps": v for k, v in bw.items() if k != "best"},
        "memory_bound_ms": traffic / (bw["best"] * 1e9) * 1e3,
    }


def measure_step(
    loss: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    clip: float,
    clip_mode: str,
    device: torch.device,
    items: int,
    per: str,
    repeats: int = 10,
    warmup: int = 2,
) -> dict[str, float]:
    """One optimiser step (zero grads, ``loss().backward()``, gradient clipping, update), timed and FLOP-counted.

    Returns ``ms_per_step``, ``<per>_per_s`` (``items`` per step, e.g. the batch), ``gflop_per_step``
    (matmul-family FLOPs of forward + backward, ``FlopCounterMode``) and ``achieved_gflops``. The one
    harness of every training-step benchmark (this module's and ``benchmarks/bench_*.py``).
    """
    from iclab.training.optim import clip_gradients

    params = [p for group in optimizer.param_groups for p in group["params"]]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        clip_gradients(params, clip, clip_mode)
        optimizer.step()

    with FlopCounterMode(display=False) as fc:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
    flops = fc.get_total_flops()
    sec = timeit(step, device=device, repeats=repeats, warmup=warmup)
    return {
        "ms_per_step": sec * 1e3,
        f"{per}_per_s": items / sec,
        "gflop_per_step": flops / 1e9,
        "achieved_gflops": flops / sec / 1e9,
    }


def training_step(
    *,
    d: int = 5,
    n: int = 20,
    n_layers: int = 3,
    batch: int = 20_000,
    pattern: Pattern = "sparse",
    device: torch.device,
    repeats: int = 10,
) -> dict[str, float]:
    """One Adam step (forward, backward, per-matrix clip, update) of the Fig.-1 configuration.

    Timed twice: as the library runs it (the moment form, :mod:`iclab.models.attention_core`, with the
    batch's moments computed once, as when a batch is reused for ``resample_every`` steps) and token by
    token (``forward_tokens``: eq. (3)-(4) on the (B, n+1, D) prompt, O(n·D²); for eq. (8) the label-only
    O(n·d) pass). ``model_gflop_per_step`` is the token pass's FLOP count: the model's FLOPs, the
    reference for the FLOP-bound time whatever shortcut runs (the MFU convention).
    """
    spectrum = AHN2023_SPECTRUM if d == len(AHN2023_SPECTRUM) else (1.0,) * d  # the paper's Σ at d = 5
    task = LinearRegression.random_rotation(spectrum, generator=generator(0))
    model = LinearTransformer(
        LinearTransformerConfig(d=d, n_layers=n_layers, pattern=pattern), generator=generator(1)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ep = task.sample(batch, n, generator=generator(2, device))
    with torch.no_grad():  # the one-off cost of a new batch: its moments (a fresh Episode object has no memo)
        cold = timeit(lambda: model(dataclasses.replace(ep)), device=device, repeats=repeats)
        warm = timeit(lambda: model(ep), device=device, repeats=repeats)  # memoised on ``ep``
    step: dict[str, Any] = dict(
        clip=0.01, clip_mode="per_matrix", device=device, items=batch, per="samples", repeats=repeats
    )
    out = measure_step(lambda: mse_loss(model, ep), opt, **step)

    def token_loss() -> torch.Tensor:
        assert ep.y_query is not None
        return (model.forward_tokens(ep) - ep.y_query).square().mean()

    tokens = measure_step(token_loss, opt, **step)
    sample_sec = timeit(lambda: task.sample(batch, n, generator=generator(3, device)), device=device, repeats=repeats)
    return {
        **out,
        "token_ms_per_step": tokens["ms_per_step"],
        "model_gflop_per_step": tokens["gflop_per_step"],
        "moments_ms": max(cold - warm, 0.0) * 1e3,
        "data_ms": sample_sec * 1e3,
    }


def preset_times(preset: str, out: Path, device: str) -> dict[str, float]:
    """Wall seconds of every registered experiment at ``preset`` (forced recomputation)."""
    from iclab.experiments.registry import all_experiments
    from iclab.experiments.runner import run_experiment

    times = {}
    for name in all_experiments():
        t = time.perf_counter()
        run_experiment(name, preset, out=out / "preset-runs", device=device, force=True)
        times[name] = time.perf_counter() - t
    return times


def run_benchmarks(
    out: str | Path, *, quick: bool = False, device: str = "cpu", presets: bool = False
) -> dict[str, Any]:
    dev = resolve_device(device)
    out = Path(out)
    repeats = 3 if quick else 10
    peak = matmul_peak(dev, repeats=repeats)
    report: dict[str, Any] = {
        "provenance": provenance(dev),
        "matmul_peak_gflops": round(peak, 1),
    }
    for pattern in ("sparse", "full"):
        r = training_step(pattern=pattern, device=dev, repeats=repeats)
        r["flop_bound_ms"] = r["model_gflop_per_step"] / peak * 1e3  # the model's FLOPs at the measured peak
        r["x_flop_bound"] = r["ms_per_step"] / r["flop_bound_ms"]
        r["token_x_flop_bound"] = r["token_ms_per_step"] / r["flop_bound_ms"]
        report[f"fig1_step_{pattern}"] = {k: round(v, 3) for k, v in r.items()}
    if presets:
        report["quick_preset_seconds"] = {k: round(v, 1) for k, v in preset_times("quick", out, device).items()}
    atomic_write_json(out / f"bench-{dev.type}.json", report)
    return report
