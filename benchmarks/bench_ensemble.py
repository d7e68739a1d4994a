"""Benchmark: S seeds of the Fig.-1 model trained as one vmapped Ensemble vs one after another.

    python benchmarks/bench_ensemble.py [cpu|cuda] [--seeds 5] [--batch 20000] [--repeats 5]

The median training step (forward, backward, Adam) of S members at the Fig.-1 sizes (3 layers, d=5, n=20)
for the eq.-(8) model and the full-P/Q model; prints ms per step for both ways and the ratio, with the
measurement's provenance (``iclab.core.provenance``); ``--out FILE`` also writes it as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from iclab.bench import timeit
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training.ensemble import Ensemble, ensemble_loss, ensemble_sampler
from iclab.training.trainer import mse_loss


def bench(pattern: str, seeds: int, batch: int, repeats: int, device: torch.device) -> dict[str, float]:
    cfg = LinearTransformerConfig(d=5, n_layers=3, pattern=pattern, init_std=1e-2)
    members = [LinearTransformer(cfg, generator=generator(s)).to(device) for s in range(seeds)]
    tasks = [LinearRegression.random_rotation((1.0,) * 5, generator=generator(s)) for s in range(seeds)]
    samples = [functools.partial(t.sample, n=20) for t in tasks]
    data = [f(batch, generator=generator(s, device), dtype=torch.float32).to(device) for s, f in enumerate(samples)]
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in members]

    def sequential() -> None:
        for m, ep, opt in zip(members, data, opts, strict=True):
            opt.zero_grad(set_to_none=True)
            mse_loss(m, ep).backward()
            opt.step()

    ens = Ensemble(members).to(device)
    ens_ep = ensemble_sampler(samples)(batch, generator=generator(0, device), dtype=torch.float32).to(device)
    ens_opt = torch.optim.Adam(ens.parameters(), lr=1e-3)
    loss = ensemble_loss()

    def together() -> None:
        ens_opt.zero_grad(set_to_none=True)
        loss(ens, ens_ep).backward()
        ens_opt.step()

    seq_ms, ens_ms = (1e3 * timeit(f, device=device, repeats=repeats, warmup=1) for f in (sequential, together))
    return {
        "pattern": pattern,
        "seeds": seeds,
        "batch": batch,
        "sequential_ms": seq_ms,
        "ensemble_ms": ens_ms,
        "speedup": seq_ms / ens_ms,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("device", nargs="?", default="cpu")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the result as JSON here")
    a = ap.parse_args()
    dev = torch.device(a.device)
    report = {
        "provenance": provenance(dev),
        "rows": [bench(p, a.seeds, a.batch, a.repeats, dev) for p in ("sparse", "full")],
    }
    print(json.dumps(report, indent=2))
    if a.out:
        atomic_write_json(a.out, report)
