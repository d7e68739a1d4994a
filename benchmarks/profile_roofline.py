"""Where a roofline step's time goes: each op's share and its own memory-traffic bound.

    python benchmarks/profile_roofline.py wang2025.s61.gd [--steps 3] [--top 15] [--threads 2] [--smoke]

Runs one step of :func:`iclab.roofline.cases` (its key as printed by ``iclab bench --roofline``) under
``torch.profiler`` and prints, per op and input shape, the self time per step, its share, the bytes it must move
(its inputs read once and an output of its largest input's size written once, float itemsize of the inputs: the
model of an elementwise op or a product whose operands stream once) and that traffic's time at the stream bandwidth
measured in the same run (``iclab.bench.stream_bandwidth``). An op whose self time is near its own traffic time is
bound by the memory system, whatever is done around it; one far above it (a narrow product, a strided copy) is
where a step can still gain. Prints only: a profile taken on a loaded machine is a guide, not a measurement.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.profiler import ProfilerActivity, profile

from iclab.bench import stream_bandwidth
from iclab.core.devices import tune_cpu_allocator
from iclab.roofline import cases


def _bytes(shapes: list[list[int]], itemsize: int) -> int:
    """Inputs read once and one output of the largest input's size written once."""
    sizes = [math.prod(s) for s in shapes if s]
    return (sum(sizes) + max(sizes, default=0)) * itemsize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("key")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--smoke", action="store_true", help="the tiny shapes of the smoke roofline")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as the ``iclab`` CLI trains
    dev = torch.device("cpu")
    case = cases(args.smoke)[args.key](dev)
    for _ in range(2):
        case.step()
    bw = stream_bandwidth(dev, mib=1 if args.smoke else 256, repeats=3)["best"] * 1e9
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(args.steps):
            case.step()
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events) / args.steps / 1e3  # ms per step, every aten op
    itemsize = torch.empty((), dtype=case.dtype).element_size()
    print(f"{case.label}\nself time of aten ops {total:.1f} ms / step; stream bandwidth {bw / 1e9:.1f} GB/s")
    print(f"{'op':34s} {'ms/step':>8s} {'share':>6s} {'traffic ms':>10s} {'× traffic':>9s}  input shapes")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        ms = e.self_cpu_time_total / args.steps / 1e3
        traffic_ms = _bytes(e.input_shapes, itemsize) * e.count / args.steps / bw * 1e3
        ratio = ms / traffic_ms if traffic_ms else float("inf")
        shapes = ", ".join(str(s) for s in e.input_shapes if s)
        print(f"{e.key:34s} {ms:8.2f} {ms / total:6.1%} {traffic_ms:10.2f} {ratio:9.1f}  {shapes}")


if __name__ == "__main__":
    main()
