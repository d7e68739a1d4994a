"""Benchmark: full-batch GD of ATTN_S (Zhang et al. 2025, Fig. 3 sizes) and its population flow.

    python benchmarks/bench_attention_dynamics.py [cpu|cuda] [--P 80000] [--naive-epochs 3] [--epochs 2000]

Finite-P full-batch GD at P = 80 000 sequences, N = 31, H = 5, d = 4, rank 1 (float32), as ms per epoch:

* naive:   benchmarks/naive_attention_dynamics.py, token level, a Python loop over heads, autograd;
* samples: iclab.training.full_batch_gd(method='samples'): β (P, d) computed once, heads batched,
           closed-form gradient through W, O(P d²) per epoch;
* moments: full_batch_gd(method='moments'), the default: the (d², d²) moments of z = vec(β x_qᵀ) once
           per dataset, O(d⁴) per epoch whatever P is; also 6 seeds (6 datasets) as one batched model.

Before timing, the naive model and full_batch_gd are checked to follow the same iterates (float64,
symmetrised training set so that the zero blocks stay zero). Also times the population flow of Fig. 3
(10⁴ steps, 6 seeds batched). Writes benchmarks/results/attention-dynamics-<device>.json with the measurement's
provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import SeparateAttention
from iclab.tasks import LinearRegression
from iclab.tasks.linear_regression import rotated_covariance
from iclab.training import full_batch_gd, population_flow
from naive_attention_dynamics import NaiveSeparateAttention, tokens, train_epoch

D, H, N, LR = 4, 5, 31, 0.02
SPECTRUM = (0.4, 0.3, 0.2, 0.1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_equivalence() -> float:
    """Max |loss difference| between naive token-level GD and full_batch_gd over 6 epochs (float64)."""
    f64 = torch.float64
    task = LinearRegression(d=D, covariance=rotated_covariance(SPECTRUM, generator=generator(0)))
    ep = task.sample(200, N, generator=generator(1), dtype=f64)
    sym = type(ep)(  # every sequence with w and −w: the zero blocks stay zero under GD
        x=torch.cat([ep.x, ep.x]),
        y=torch.cat([ep.y, -ep.y]),
        x_query=torch.cat([ep.x_query, ep.x_query]),
        y_query=torch.cat([ep.y_query, -ep.y_query]),
    )
    red = SeparateAttention(D, H, w_init=0.5, generator=generator(2)).to(f64)
    naive = NaiveSeparateAttention(D, H).to(f64).load_reduced(red.v.detach(), red.k.detach(), red.q.detach())
    opt = torch.optim.SGD(naive.parameters(), lr=LR * 50)
    X = tokens(sym.x, sym.y, sym.x_query)
    naive_losses = torch.tensor([train_epoch(naive, X, sym.y_query, opt) for _ in range(6)], dtype=f64)
    traj = full_batch_gd(red, sym, lr=LR * 50, steps=5)
    return float((naive_losses - traj.train_loss).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("device", nargs="?", default="cpu")
    ap.add_argument("--P", type=int, default=80_000)
    ap.add_argument("--naive-epochs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args()
    device = torch.device(args.device)
    f32 = torch.float32
    out: dict[str, object] = {"provenance": provenance(device), "P": args.P, "N": N, "H": H}
    out["max_loss_diff_naive_vs_library_float64"] = check_equivalence()

    Lam = rotated_covariance(SPECTRUM, generator=generator(0))
    task = LinearRegression(d=D, covariance=Lam)
    eps = [task.sample(args.P, N, generator=generator(10 + s, device), dtype=f32) for s in range(args.seeds)]

    # naive token-level baseline
    naive = NaiveSeparateAttention(D, H).to(device)
    opt = torch.optim.SGD(naive.parameters(), lr=LR)
    X = tokens(eps[0].x, eps[0].y, eps[0].x_query)
    train_epoch(naive, X, eps[0].y_query, opt)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(args.naive_epochs):
        train_epoch(naive, X, eps[0].y_query, opt)
    _sync(device)
    out["naive_ms_per_epoch"] = (time.perf_counter() - t0) / args.naive_epochs * 1e3
    del X

    def timed(model, data, method: str, epochs: int) -> tuple[float, float]:
        full_batch_gd(model, data, lr=LR, steps=2, method=method)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        full_batch_gd(model, data, lr=LR, steps=0, method=method)  # statistics only
        _sync(device)
        t_stats = time.perf_counter() - t0
        t0 = time.perf_counter()
        full_batch_gd(model, data, lr=LR, steps=epochs, record_every=epochs, method=method)
        _sync(device)
        return (time.perf_counter() - t0 - t_stats) / epochs * 1e3, t_stats * 1e3

    single = SeparateAttention(D, H, w_init=0.01, generator=generator(3)).to(device)
    out["samples_ms_per_epoch"], out["samples_setup_ms"] = timed(single, eps[0], "samples", max(20, args.epochs // 50))
    out["moments_ms_per_epoch"], out["moments_setup_ms"] = timed(single, eps[0], "moments", args.epochs)
    batched = SeparateAttention(D, H, w_init=0.01, generator=generator(4), n_seeds=args.seeds).to(device)
    ms, setup = timed(batched, eps, "moments", args.epochs)
    out[f"moments_{args.seeds}_seeds_ms_per_epoch"], out[f"moments_{args.seeds}_seeds_setup_ms"] = ms, setup
    out["speedup_samples_vs_naive"] = out["naive_ms_per_epoch"] / out["samples_ms_per_epoch"]
    out["speedup_moments_vs_naive"] = out["naive_ms_per_epoch"] / out["moments_ms_per_epoch"]

    # population flow, Fig. 3: 10⁴ steps, 6 seeds batched, float64
    pop = SeparateAttention(D, H, w_init=0.05, generator=generator(5), n_seeds=args.seeds).to(device, torch.float64)
    t0 = time.perf_counter()
    traj = population_flow(pop, Lam.to(device), inv_n=1 / N, lr=0.25, steps=10_000, record_every=10)
    _sync(device)
    out["population_flow_1e4_steps_6_seeds_s"] = time.perf_counter() - t0
    out["population_flow_final_losses"] = traj.loss[:, -1].tolist()

    path = Path(__file__).parent / "results" / f"attention-dynamics-{device.type}.json"
    atomic_write_json(path, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
