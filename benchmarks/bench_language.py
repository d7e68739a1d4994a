"""Benchmark: one training step of the Wang et al. 2025 §6.3 language models (GD, GD + FF, 1-layer transformer).

    python benchmarks/bench_language.py [cpu|cuda] [--repeats 5] [--sizes quick paper]

One AdamW step (forward, backward, global-norm clip 1, update; β = (0.9, 0.95), weight decay 1e-2, as
``wang2025.language``) on next-token windows of the generated story corpus (``tasks.StoryLanguageData``, its BPE
vocabulary V ≈ 789), float32. Sizes: ``quick`` = the quick preset (d' = 64, H = 4, S = 64, batch 32) and ``paper``
= the paper's width and context (d' = 512, H = 8, S = 256) at batch 8 (the paper preset's batch 64 costs 8×; on a
CPU one such transformer step takes a second or more). Prints ms per step, tokens/s, matmul-family FLOPs
(``FlopCounterMode``) and achieved GFLOP/s against this machine's measured float32 matmul peak, and writes them to
benchmarks/results/bench-language-<device>.json with the measurement's provenance (``iclab.core.provenance``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F

from iclab.bench import matmul_peak, measure_step
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator
from iclab.models.language import LanguageGD, LanguageGPT
from iclab.tasks.language import StoryLanguageData

SIZES = {"quick": dict(d_embed=64, heads=4, seq_len=64, batch=32), "paper": dict(d_embed=512, heads=8, seq_len=256, batch=8)}  # fmt: skip


def training_step(
    name: str, *, d_embed: int, heads: int, seq_len: int, batch: int, device: torch.device, repeats: int
) -> dict[str, float]:
    data = StoryLanguageData.build(stories=4000, vocab_size=1024, seq_len=seq_len)
    V = data.vocab_size
    torch.manual_seed(0)
    if name == "gpt":
        model: torch.nn.Module = LanguageGPT(V, d_embed, heads, seq_len)
    else:
        model = LanguageGD(V, d_embed, heads, seq_len, ff=name == "gd_ff")
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=1e-2)
    inputs, targets = (t.to(device) for t in data.batch("train", batch, generator=generator(1)))

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    r = measure_step(loss, opt, clip=1.0, clip_mode="global", device=device, items=batch * seq_len, per="tokens",
                     repeats=repeats, warmup=1)  # fmt: skip
    return {"vocab": V, "params": sum(p.numel() for p in model.parameters()), **r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", default=["quick", "paper"], choices=sorted(SIZES))
    parser.add_argument("--no-tune-allocator", action="store_true", help="leave glibc malloc at its defaults")
    args = parser.parse_args()
    tuned = not args.no_tune_allocator and tune_cpu_allocator()
    device = resolve_device(args.device)
    peak = matmul_peak(device)
    out: dict[str, object] = {"provenance": provenance(device), "matmul_peak_gflops": round(peak, 1),
                              "allocator_tuned": tuned}  # fmt: skip
    for size in args.sizes:
        for name in ("gd", "gd_ff", "gpt"):
            r = training_step(name, **SIZES[size], device=device, repeats=args.repeats)
            r["x_flop_bound"] = r["ms_per_step"] / (r["gflop_per_step"] / peak * 1e3)
            out[f"{size}/{name}"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    print(json.dumps(out, indent=2))
    atomic_write_json(Path(__file__).parent / "results" / f"bench-language-{device.type}.json", out)


if __name__ == "__main__":
    main()
