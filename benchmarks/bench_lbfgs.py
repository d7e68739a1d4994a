"""Benchmark: one L-BFGS step of Ahn et al. 2023's Fig. 3 quick preset (3-layer linear transformer, d = 5, 8000
fixed prompts of n = 20, history 600, 4 iterations a step, float32) by :class:`iclab.training.lbfgs.LBFGS` against
``torch.optim.LBFGS``, both with a full history, timed alternately in one process.

    python benchmarks/bench_lbfgs.py [--threads 1] [--rounds 15] [--out benchmarks/results/bench-lbfgs-cpu.json]

Cases: ``step`` (the closure's forward and backward included) and ``direction`` (the two-loop recursion alone, 600
pairs: the C call against torch's loop of 4·600 tensor operations). Prints the medians and the ratios and writes them
with the measurement's provenance (:func:`iclab.core.provenance.provenance`) to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from pathlib import Path

import torch

from iclab.bench import alternate
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import lbfgs

CPU = torch.device("cpu")
HISTORY = 600


def _stepper(opt_cls: type[torch.optim.LBFGS], model: torch.nn.Module, batch) -> Callable[[], object]:  # type: ignore[no-untyped-def]
    opt = opt_cls(model.parameters(), lr=0.1, history_size=HISTORY, max_iter=4)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = ((model(batch) - batch.y_query) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(HISTORY // 4 + 10):  # fill the history
        opt.step(closure)
    return lambda: opt.step(closure)


def _torch_direction(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], g: torch.Tensor, gamma: torch.Tensor
) -> torch.Tensor:
    """torch.optim.LBFGS's two-loop recursion over lists of vectors."""
    ro = [1.0 / y.dot(s) for s, y in pairs]
    al: list[torch.Tensor] = [torch.zeros(())] * len(pairs)
    q = g.neg()
    for i in range(len(pairs) - 1, -1, -1):
        al[i] = pairs[i][0].dot(q) * ro[i]
        q.add_(pairs[i][1], alpha=-al[i])
    r = torch.mul(q, gamma)
    for i in range(len(pairs)):
        be = pairs[i][1].dot(r) * ro[i]
        r.add_(pairs[i][0], alpha=al[i] - be)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = LinearTransformerConfig(d=5, n_layers=3, pattern="full", init_std=0.1)
    model = LinearTransformer(cfg, generator=generator(0))
    batch = LinearRegression(d=5).sample(8000, n=20, generator=generator(1))
    steps = {
        "torch.optim.LBFGS": _stepper(torch.optim.LBFGS, copy.deepcopy(model), batch),
        "iclab LBFGS": _stepper(lbfgs.LBFGS, copy.deepcopy(model), batch),
    }
    p = sum(q.numel() for q in model.parameters())
    gen = generator(2)
    A = torch.randn(p, p, generator=gen) / p**0.5
    A = A @ A.T + torch.eye(p)  # curvature pairs y = A s of a positive definite Hessian
    pairs = [(s, A @ s) for s in torch.randn(HISTORY, p, generator=gen)]
    state: dict = {"first": 0, "count": 0}
    for s, y in pairs:
        lbfgs._push(state, s, y, 1.0 / y.dot(s), HISTORY)
    g, gamma = torch.randn(p, generator=gen), torch.tensor(0.5)
    directions = {
        "torch two-loop": lambda: _torch_direction(pairs, g, gamma),
        "C two-loop": lambda: lbfgs.direction(state, g, gamma),
    }
    torch.testing.assert_close(directions["C two-loop"](), directions["torch two-loop"](), rtol=1e-4, atol=1e-5)
    out = {"params": p, "history": HISTORY, "threads": args.threads, "rounds": args.rounds}
    for case, fns in (("step", steps), ("direction", directions)):
        t = alternate(fns, device=CPU, rounds=args.rounds)
        (old, new) = t.values()
        out[case] = {"seconds": t, "ratio": old / new}
        print(f"{case}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items()) + f"; {old / new:.1f}x")
    if args.out:
        atomic_write_json(args.out, {"provenance": provenance(CPU), **out})
        print(json.dumps(out["step"]))


if __name__ == "__main__":
    main()
