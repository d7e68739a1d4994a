"""Benchmark: one training step of the 12-layer bilinear transformer of Sun, Jadbabaie, Azizan 2025
(L = 6 blocks [bilinear FFN → LSA], d = 4, d̄ = 12, n = 200, batch 4000: the Fig.-7 configuration).

    python benchmarks/bench_bilinear.py [cpu|cuda] [--batch 4000] [--repeats 5]

Prints ms per Adam step (forward, backward, global clip, update) of ``model(episode)`` (on a CPU the fused path of
:mod:`iclab.models._bilinear_fast`: its C kernel where it can be built), of the same fused path by its torch code
(``NATIVE = False``) and of ``model.forward_tokens`` (sub-layer by sub-layer), timed alternately, and three
yardsticks measured in the same run:

* the memory-traffic bound (``iclab.bench.memory_traffic_bound``): the bytes a layer-by-layer step must move for the
  model's own (B, T, D) activations, (5·2L − 2)·A with A = B·T·D·4 bytes, over the best streaming bandwidth of
  256 MiB copy / add / scale kernels at this thread count;
* the FLOP bound: the model's matmul FLOPs (``FlopCounterMode`` on the token path, the same for both paths up to the
  fused path's skipped work) at the square-matmul peak (``iclab.bench.matmul_peak``);
* the shape bound: the same FLOPs at the rate of the model's own 13-wide matmul shapes (``token_matmul_peak``);
* the GEMM floor (:func:`gemm_floor`): the fused path's matrix products alone, each on hot operands of one chunk.

Also the sampling time of a batch. Writes benchmarks/results/bench-bilinear-<device>.json with the measurement's
provenance (``iclab.core.provenance``); docs/performance.md's tables are generated from it.

    python benchmarks/bench_bilinear.py cpu --linear [--repeats 5]

times the linear transformer of ``sun2025.linear_depth`` instead (``ffn="none"``, d = 3, d̄ = 12, n = 200, batch
4000; L = 1, 3, 6, 12 attention layers): its moment form (the prompt's Gram matrix and query row through the layers,
:mod:`iclab.models._moment_fast`) by the C kernel and by torch, against the token pass, alternated; writes
bench-linear-transformer-<device>.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from iclab import models, tasks
from iclab.bench import alternate, matmul_peak, memory_traffic_bound, timeit, token_matmul_peak
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import _bilinear_fast, _moment_fast
from iclab.models._bilinear_fast import CHUNK
from iclab.training.optim import clip_gradients


def gemm_floor(device: torch.device, *, batch: int, n: int, d: int, d_bar: int, n_blocks: int, chunk: int, repeats: int) -> float:  # fmt: skip
    """Seconds the fused path's matrix products alone take, each timed on hot (in-cache) operands of one chunk.

    The products of :mod:`iclab.models._bilinear_fast` for ``chunk`` prompts, batch-last, block by block: FFN
    [b; a] = W z (the first block on the d + 1 live rows), Gram G = Σ z zᵀ, z ← R z, and backward dR = Σ g zᵀ,
    du = S z + Rᵀ g, d[W_0; W_1] = [∂a; ∂b] zᵀ, dz += [W_0ᵀ W_1ᵀ][∂a; ∂b] (none for the first block; the last block
    updates the query alone). Times the sequence back to back on one chunk's buffers and scales by the number of
    chunks: no elementwise work, no memory traffic beyond the chunk, no Python between the calls. The best this
    BLAS does on the model's own shapes, so (floor) / (memory bound) is what any program built on it cannot beat.
    """
    D, T, db = d_bar + 1, n + 1, d_bar
    g = generator(0, device)
    z = torch.randn(D, chunk * T, generator=g, device=device)
    zp, gp = z.view(D, chunk, T).permute(1, 0, 2), torch.randn_like(z).view(D, chunk, T).permute(1, 0, 2)
    W, Wd = torch.randn(2 * db, db, generator=g, device=device), torch.randn(db, 2 * db, generator=g, device=device)
    R, dab = torch.randn(chunk, D, D, generator=g, device=device), torch.randn(2 * db, chunk * T, generator=g, device=device)  # fmt: skip

    def products() -> None:
        for block in range(n_blocks):
            k = d + 1 if block == 0 else db
            W[:, :k] @ z[:k]  # FFN [b; a]
            torch.bmm(zp[:, :, :n], zp[:, :, :n].transpose(1, 2))  # Gram
            if block < n_blocks - 1:
                torch.bmm(R, zp)  # z ← R z
                torch.bmm(gp, zp.transpose(1, 2))  # dR
                torch.bmm(R, zp).baddbmm_(R.transpose(1, 2), gp)  # du = S z + Rᵀ g
            else:  # the last block: the query alone (its dR is one row)
                torch.bmm(R, zp)  # du = S z
            z[:k] @ dab.T  # d[W_0; W_1]
            if block > 0:
                Wd @ dab  # dz += [W_0ᵀ W_1ᵀ][∂a; ∂b]

    return timeit(products, device=device, repeats=repeats, warmup=1) * -(-batch // chunk)


def bench(device: str = "cpu", *, batch: int = 4000, n: int = 200, n_blocks: int = 6, repeats: int = 5) -> dict[str, float]:  # fmt: skip
    dev = resolve_device(device)
    task = tasks.quadratic(4)
    cfg = models.BilinearTransformerConfig(d=4, d_bar=12, n_blocks=n_blocks, init_std=0.02)
    model = models.BilinearTransformer(cfg, generator=generator(0)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    ep = task.sample(batch, n, generator=generator(1, dev))
    assert ep.y_query is not None

    def step(predict: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            (predict() - ep.y_query).square().mean().backward()
            clip_gradients(params, 1.0, "global")
            opt.step()

        return run

    peak = matmul_peak(dev, repeats=repeats)
    shape_peak = token_matmul_peak(dev, batch=batch, tokens=n + 1, width=cfg.d_bar + 1, repeats=repeats)
    mem = memory_traffic_bound(dev, batch=batch, tokens=n + 1, width=cfg.d_bar + 1, sublayers=2 * n_blocks, repeats=repeats)  # fmt: skip
    with FlopCounterMode(display=False) as fc:  # the model's FLOPs: the token path's matmuls, forward + backward
        model.forward_tokens(ep).square().mean().backward()
    flops = fc.get_total_flops()

    def torch_code() -> torch.Tensor:  # the fused path by its torch code (the node is chosen in the forward)
        native, _bilinear_fast.NATIVE = _bilinear_fast.NATIVE, False
        try:
            return model(ep)
        finally:
            _bilinear_fast.NATIVE = native

    runs = {"fused": step(lambda: model(ep)), "fused_torch": step(torch_code), "tokens": step(lambda: model.forward_tokens(ep))}  # fmt: skip
    sec = alternate(runs, device=dev, rounds=repeats)
    data = timeit(lambda: task.sample(batch, n, generator=generator(2, dev)), device=dev, repeats=repeats, warmup=1)
    floor = gemm_floor(dev, batch=batch, n=n, d=cfg.d, d_bar=cfg.d_bar, n_blocks=n_blocks, chunk=CHUNK, repeats=repeats)
    fused, tokens, bound = sec["fused"], sec["tokens"], mem["memory_bound_ms"] / 1e3
    return {
        "native": dev.type == "cpu" and _bilinear_fast._uses_native(ep.x.new_empty(1, 1, cfg.d_bar + 1), cfg.d + 1),
        "ms_per_step": round(fused * 1e3, 1),
        "torch_fused_ms_per_step": round(sec["fused_torch"] * 1e3, 1),
        "token_ms_per_step": round(tokens * 1e3, 1),
        "speedup_vs_torch_fused": round(sec["fused_torch"] / fused, 2),
        "speedup_vs_tokens": round(tokens / fused, 2),
        "traffic_gb": round(mem["traffic_gb"], 3),
        "bandwidth_gbps": round(mem["bandwidth_gbps"], 1),
        **{k: round(v, 1) for k, v in mem.items() if k.startswith("bandwidth_") and k != "bandwidth_gbps"},
        "memory_bound_ms": round(bound * 1e3, 1),
        "x_memory_bound": round(fused / bound, 2),
        "token_x_memory_bound": round(tokens / bound, 2),
        "gemm_floor_ms": round(floor * 1e3, 1),
        "gemm_floor_x_memory_bound": round(floor / bound, 2),
        "matmul_peak_gflops": round(peak, 1),
        "gflop_per_step": round(flops / 1e9, 3),
        "achieved_gflops": round(flops / fused / 1e9, 2),
        "flop_bound_ms": round(flops / (peak * 1e9) * 1e3, 1),
        "x_flop_bound": round(fused / (flops / (peak * 1e9)), 2),
        "token_matmul_peak_gflops": round(shape_peak, 1),
        "shape_bound_ms": round(flops / (shape_peak * 1e9) * 1e3, 1),
        "x_shape_bound": round(fused / (flops / (shape_peak * 1e9)), 2),
        "data_ms": round(data * 1e3, 1),
    }


def bench_linear(device: str = "cpu", *, batch: int = 4000, n: int = 200, depths: tuple[int, ...] = (1, 3, 6, 12), repeats: int = 5) -> dict[str, object]:  # fmt: skip
    """ms per Adam step of the ``sun2025.linear_depth`` model at every depth, alternated: its moment form by the C
    kernel of :mod:`iclab.models._moment_fast` (``model(episode)``), the same form by its torch code
    (``_moment_fast.NATIVE = False``) and the token pass (``model.forward_tokens``: every layer on every token)."""
    dev = resolve_device(device)
    task = tasks.quadratic(3)
    ep = task.sample(batch, n, generator=generator(1, dev))
    assert ep.y_query is not None
    out: dict[str, object] = {"batch": batch, "n": n}
    for L in depths:
        cfg = models.BilinearTransformerConfig(d=3, d_bar=12, n_blocks=L, ffn="none", init_std=0.02)
        model = models.BilinearTransformer(cfg, generator=generator(0)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        params = list(model.parameters())

        def step(predict: Callable[[], torch.Tensor], native: bool = True, opt: torch.optim.Optimizer = opt,
                 params: list[torch.nn.Parameter] = params) -> Callable[[], None]:  # fmt: skip
            def run() -> None:
                saved, _moment_fast.NATIVE = _moment_fast.NATIVE, native and _moment_fast.NATIVE
                try:
                    opt.zero_grad(set_to_none=True)
                    (predict() - ep.y_query).square().mean().backward()
                    clip_gradients(params, 1.0, "global")
                    opt.step()
                finally:
                    _moment_fast.NATIVE = saved

            return run

        runs = {"c": step(lambda m=model: m(ep)), "torch": step(lambda m=model: m(ep), native=False),
                "tokens": step(lambda m=model: m.forward_tokens(ep))}  # fmt: skip
        sec = alternate(runs, device=dev, rounds=repeats)
        out[f"L{L}"] = {
            "moment_ms_per_step": round(sec["c"] * 1e3, 2),
            "moment_torch_ms_per_step": round(sec["torch"] * 1e3, 1),
            "token_ms_per_step": round(sec["tokens"] * 1e3, 1),
        }
    out["data_ms"] = round(timeit(lambda: task.sample(batch, n, generator=generator(2, dev)), device=dev, repeats=repeats, warmup=1) * 1e3, 1)  # fmt: skip
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("device", nargs="?", default="cpu")
    ap.add_argument("--batch", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-tune-allocator", action="store_true", help="leave glibc malloc at its defaults")
    ap.add_argument("--linear", action="store_true", help="the linear transformer of sun2025.linear_depth instead")
    a = ap.parse_args()
    tuned = not a.no_tune_allocator and tune_cpu_allocator()
    prov = provenance(resolve_device(a.device))
    run = bench_linear if a.linear else bench
    out = {"provenance": prov, **run(a.device, batch=a.batch, repeats=a.repeats), "allocator_tuned": tuned}
    print(json.dumps(out, indent=2))
    name = "bench-linear-transformer" if a.linear else "bench-bilinear"
    atomic_write_json(Path(__file__).parent / "results" / f"{name}-{resolve_device(a.device).type}.json", out)
