"""Benchmarks: this machine's matmul peak, training-step throughput, preset wall times.

Throughput is reported against the *measured* float32 matmul peak (no hard-coded hardware
numbers): FLOPs of a step are counted by ``torch.utils.flop_counter`` (matmul-family ops only,
the FLOPs that matter here), the FLOP-bound time is FLOPs / peak.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from iclab.core.devices import resolve_device
from iclab.core.io import atomic_write_json
from iclab.core.seeding import generator
from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression
from iclab.training.trainer import mse_loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
        clip_gradients(params, clip, clip_mode)  # type: ignore[arg-type]
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
    pattern: str = "sparse",
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
    ).to(device)  # type: ignore[arg-type]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ep = task.sample(batch, n, generator=generator(2, device))
    with torch.no_grad():  # the one-off cost of a new batch: its moments (a fresh Episode object has no memo)
        cold = timeit(lambda: model(dataclasses.replace(ep)), device=device, repeats=repeats)
        warm = timeit(lambda: model(ep), device=device, repeats=repeats)  # memoised on ``ep``
    step = dict(clip=0.01, clip_mode="per_matrix", device=device, items=batch, per="samples", repeats=repeats)
    out = measure_step(lambda: mse_loss(model, ep), opt, **step)  # type: ignore[arg-type]

    def token_loss() -> torch.Tensor:
        assert ep.y_query is not None
        return (model.forward_tokens(ep) - ep.y_query).square().mean()

    tokens = measure_step(token_loss, opt, **step)  # type: ignore[arg-type]
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
        "machine": f"{platform.machine()} {platform.processor() or ''} threads={torch.get_num_threads()} torch={torch.__version__} device={dev}",
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
