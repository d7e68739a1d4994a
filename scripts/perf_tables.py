"""Write the tables of docs/performance.md from the benchmark results in benchmarks/results/*.json.

    python scripts/perf_tables.py        # rewrite every generated section (these and the paper-preset tables)

Each table sits between ``<!-- perf:NAME:begin -->`` and ``<!-- perf:NAME:end -->``; its rows are read from the result
files the benchmarks write (``iclab bench``, ``benchmarks/bench_*.py``), with each file's provenance (date, machine,
threads: :func:`iclab.core.provenance.describe`), so the page cannot drift from the data. A result file that is
missing leaves its rows out. tests/test_bench.py regenerates the tables and compares them with the page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paper_preset_tables as presets

from iclab.core.provenance import describe

ROOT = presets.ROOT
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _ms(x: float) -> str:
    """Milliseconds at the precision a timing deserves: 13 900, 97.5, 6.1, 0.145."""
    if x >= 1000:
        return _int(x)
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _int(n: float) -> str:
    """An integer with thin groups: 80 000."""
    return f"{round(n):,}".replace(",", " ")


def _x(x: float) -> str:
    if x >= 1000:
        return f"{_int(x)}×"
    return f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def _linear_authors_rows() -> list[str]:
    """Ahn et al.'s notebooks and Zhang et al.'s Fig. 3 epoch beside iclab (benchmarks/bench_linear_authors.py)."""
    lin = _load("bench-linear-authors-cpu.json")
    if not lin:
        return []
    rows, when = [], describe(lin["provenance"])
    names = {"sparse": "eq. (8)", "pattern11": "pattern (11)", "full": "full P, Q"}
    for key, what in (
        ("ahn2023_varL", "batch 20 000 redrawn every 100 steps (the authors' variable_L notebook, Figs 1, 7)"),
        ("ahn2023_varN", "batch 40 000 redrawn every step (the variable_N notebook, Fig. 6)"),
    ):
        if not (r := lin.get(key)) or not r["full"].get("ratio"):
            continue
        theirs = r["full"]["authors_median_ms"]
        ours = ", ".join(f"{_ms(r[p]['iclab_median_ms'])} ({names[p]})" for p in names)
        ratios = ", ".join(_x(r[p]["ratio"]) for p in names)
        rows.append(
            f"| Ahn et al. 2023: L = 3, d = 5, n = 20, {what}, AdamW + per-matrix clip, the whole trainer step |"
            f" {_ms(theirs)} | {ours} | {ratios} | {when} |"
        )
    if (z := lin.get("zhang2025_fig3")) and z["moments"].get("ratio"):
        mom, per = z["moments"], z["samples"]
        rows.append(
            "| Zhang et al. 2025: Fig. 3 full-batch GD epoch, P = 80 000 (ATTN_S, N = 31, H = 5, d = 4): the moment"
            " route the preset runs (its one-off moments charged over 10 001 epochs), and per sequence |"
            f" {_ms(mom['authors_median_ms'])} | {_ms(mom['iclab_median_ms'])} (moments), {_ms(per['iclab_median_ms'])}"
            f" (per sequence) | {_x(mom['ratio'])}, {_x(per['ratio'])} | {when} |"
        )
    return rows


#: benchmarks/bench_categorical.py's result files: (file, blocks, the workload in words)
CATEGORICAL_BENCHES = (
    ("bench-categorical-cpu.json", 2, "§6.1, 2 blocks"),
    ("bench-categorical-rbf-1block-cpu.json", 1, "Fig. 2 with RBF attention, 1 block"),
)


def authors_table() -> str:
    """ms per training step of each paper's own configuration: the authors' code and iclab, alternated in one run."""
    rows = _linear_authors_rows()
    for name, labels in (("bench-kernel-attention-cpu.json", "exp"), ("bench-kernel-attention-cpu-relu.json", "relu")):
        data = _load(name)
        if not data:
            continue
        steps = {k[2:]: v for k, v in data.items() if k.startswith("h_") and v.get("ratio")}
        picks = {"softmax_sparse": "softmax h̃, A free"}
        slowest = min(steps, key=lambda k: steps[k]["ratio"])
        act, value = slowest.split("_")
        picks.setdefault(slowest, f"the lowest ratio of {len(steps)} h̃ × value rows ({act}, A {'free' if value == 'sparse' else '≡ 0'})")  # fmt: skip
        for key, what in picks.items():
            r = steps[key]
            rows.append(
                f"| Cheng et al. 2024: L = 3, d = 5, n = 14, batch 30 000, {labels}-kernel labels, {what} |"
                f" {_ms(r['authors_median_ms'])} | {_ms(r['iclab_median_ms'])} | **{_x(r['ratio'])}** |"
                f" {describe(data['provenance'])} |"
            )
    for name, blocks, where in CATEGORICAL_BENCHES:
        cat = _load(name)
        for model, what in (("free", "Trained TF"), ("gd", "GD model")):
            r = cat.get(f"{model}_{blocks}block") if cat else None
            if cat and r and r.get("ratio"):
                rows.append(
                    f"| Wang et al. 2025: {where}, minibatch 512, {what} | {_ms(r['authors_median_ms'])} |"
                    f" {_ms(r['iclab_median_ms'])} | **{_x(r['ratio'])}** | {describe(cat['provenance'])} |"
                )
    if bil := _load("bench-bilinear-cpu.json"):
        rows.append(
            f"| Sun et al. 2025 (no public code): 12 layers, n = 200, batch 4000 | — | {_ms(bil['ms_per_step'])} |"
            f" **{bil['x_memory_bound']}× its memory-traffic bound** ({_ms(bil['memory_bound_ms'])} ms) |"
            f" {describe(bil['provenance'])} |"
        )
    head = ["| workload | authors' code (ms) | iclab (ms) | ratio | measured |", "|---|---|---|---|---|"]
    return "\n".join(head + rows)


def roofline_table() -> str:
    """Every paper's step against its roofline (``iclab bench --roofline``: benchmarks/results/roofline-cpu.json):
    FLOPs and bytes per step, the matmul rate at the step's shapes and the stream bandwidth measured in the same
    run, the bound that applies and the step over it. Without that file, the older per-benchmark rows."""
    if roof := _load("roofline-cpu.json"):
        return _roofline_rows(roof)
    return _legacy_roofline_table()


def _roofline_rows(roof: dict[str, Any]) -> str:
    head = [
        "| step | ms / step | model GFLOP / step | GB / step | matmul peak (GFLOP/s) | at its shapes (GFLOP/s)"
        " | stream (GB/s) | bound (ms) | × bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        f"| {r['label']} | {_ms(r['ms_per_step'])} | {r['gflop_per_step']:.3g} | {r['gb_per_step']:.3g}"
        f" | {r['matmul_peak_gflops']:.3g} | {r['matmul_gflops_at_shape']:.3g} | {r['bandwidth_gbps']:.3g}"
        f" | {_ms(r['bound_ms'])} ({r['bound']}) | **{_x(r['x_bound'])}** |"
        for r in roof["steps"].values()
    ]
    return "\n".join(head + rows) + f"\n\nMeasured {describe(roof['provenance'])}."


def _legacy_roofline_table() -> str:
    """Each training step against the float32 matmul peak measured in the same run: the model's matmul FLOPs
    (``FlopCounterMode``) at that peak is the FLOP-bound time."""
    rows = []

    def row(what: str, ms: float, gflop: float, peak: float, prov: dict, memory: str = "—") -> None:
        bound = gflop / peak * 1e3
        rows.append(
            f"| {what} | {_ms(ms)} | {gflop:.3g} | {gflop / ms * 1e3:.3g} | {peak:.0f} | {_x(ms / bound)} | {memory} |"
            f" {describe(prov)} |"
        )

    if fig1 := _load("bench-cpu.json"):
        for key, what in (("fig1_step_sparse", "eq. (8) pattern"), ("fig1_step_full", "full P, Q")):
            r = fig1[key]
            row(f"Ahn et al. 2023 Fig. 1 step, {what}: 3 layers, d = 5, n = 20, batch 20 000 (moment form)",
                r["ms_per_step"], r["model_gflop_per_step"], fig1["matmul_peak_gflops"], fig1["provenance"])  # fmt: skip
    if bil := _load("bench-bilinear-cpu.json"):
        row("Sun et al. 2025: 12 layers, d̄ = 12, n = 200, batch 4000 (C kernel)", bil["ms_per_step"],
            bil["gflop_per_step"], bil["matmul_peak_gflops"], bil["provenance"], f"{bil['x_memory_bound']}×")  # fmt: skip
    if cat := _load("bench-categorical-cpu.json"):
        for key, what in (("free_2block", "Trained TF"), ("gd_2block", "GD model")):
            if r := cat.get(key):
                row(f"Wang et al. 2025 §6.1, 2 blocks, minibatch 512, {what}", r["ms_per_step"], r["gflop_per_step"],
                    cat["matmul_peak_gflops"], cat["provenance"])  # fmt: skip
    if lang := _load("bench-language-cpu.json"):
        sizes = {"quick": "d' = 64, S = 64, batch 32", "paper": "d' = 512, S = 256, batch 8"}
        models = {"gd": "GD", "gd_ff": "GD + FF", "gpt": "1-layer transformer"}
        for key, r in lang.items():
            if "/" in key:
                size, model = key.split("/")
                row(f"Wang et al. 2025 §6.3 language, {models[model]}, {sizes[size]}", r["ms_per_step"],
                    r["gflop_per_step"], lang["matmul_peak_gflops"], lang["provenance"])  # fmt: skip
    head = [
        "| step | ms / step | model GFLOP / step | GFLOP/s | matmul peak, same run (GFLOP/s) | × FLOP bound"
        " | × memory-traffic bound | measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + rows)


def paths_table() -> str:
    """The library's fast paths against the code they replace, timed in one run."""
    rows = []

    def row(what: str, fast: str, ms: float, slow: str, slow_ms: float, prov: dict) -> None:
        rows.append(
            f"| {what} | {fast} | {_ms(ms)} | {slow} | {_ms(slow_ms)} | {_x(slow_ms / ms)} | {describe(prov)} |"
        )

    if dyn := _load("attention-dynamics-cpu.json"):
        what = f"Zhang et al. 2025 Fig. 3: full-batch GD epoch, P = {_int(dyn['P'])}"
        naive = dyn["naive_ms_per_epoch"]
        row(what, "moments (default)", dyn["moments_ms_per_epoch"], "token level, autograd", naive, dyn["provenance"])
        row(what, "per-sample β", dyn["samples_ms_per_epoch"], "token level, autograd", naive, dyn["provenance"])
    if q := _load("bench-query-attention-cpu.json"):
        for model, r in q["ms_per_step"].items():
            what = f"Zhang et al. 2025 Fig. 5 step, {model}, P = {_int(q['prompts'])}, float64"
            row(what, "C kernel, AVX-512", r["c_avx512"], "torch", r["torch"], q["provenance"])
            row(what, "C kernel, AVX2 build", r["c_avx2"], "torch", r["torch"], q["provenance"])
            if "c_avx512_full_backward" in r:
                full = "C kernel, backward reading the prompts again"
                row(what, "C kernel, AVX-512", r["c_avx512"], full, r["c_avx512_full_backward"], q["provenance"])
    if bil := _load("bench-bilinear-cpu.json"):
        what = "Sun et al. 2025: 12-layer step, batch 4000"
        row(
            what,
            "C kernel",
            bil["ms_per_step"],
            "fused pass in torch",
            bil["torch_fused_ms_per_step"],
            bil["provenance"],
        )
        row(what, "C kernel", bil["ms_per_step"], "token by token", bil["token_ms_per_step"], bil["provenance"])
    if lin := _load("bench-linear-transformer-cpu.json"):
        for key, r in lin.items():
            if key.startswith("L") and isinstance(r, dict):
                what = f"Sun et al. 2025 linear TF (`sun2025.linear_depth`): {key[1:]}-layer step, batch {_int(lin['batch'])}"
                row(what, "moment form, C kernel", r["moment_ms_per_step"], "token by token", r["token_ms_per_step"],
                    lin["provenance"])  # fmt: skip
                row(what, "moment form, C kernel", r["moment_ms_per_step"], "moment form in torch",
                    r["moment_torch_ms_per_step"], lin["provenance"])  # fmt: skip
    if fig1 := _load("bench-cpu.json"):
        for key, what in (("fig1_step_sparse", "eq. (8) pattern"), ("fig1_step_full", "full P, Q")):
            r = fig1[key]
            row(f"Ahn et al. 2023 Fig. 1 step, {what}", "moment form", r["ms_per_step"], "token by token",
                r["token_ms_per_step"], fig1["provenance"])  # fmt: skip
    if gp := _load("bench-gp-cpu.json"):
        for n, r in gp.get("relu_engines_ms", {}).items():
            what = f"Cheng et al. 2024: ReLU-kernel labels, batch {_int(gp['batch'])}, n = {n[1:]}"
            row(what, "batched Jacobi, C", r["jacobi_c"], "torch eigh", r["torch_eigh"], gp["provenance"])
            if "ql_c_y_only" in r:  # a training batch: y alone, no K₊
                row(f"{what}, a training batch (no K₊)", "Householder + QL, C", r["ql_c_y_only"],
                    "batched Jacobi, C (with K₊)", r["jacobi_c"], gp["provenance"])  # fmt: skip
    if lb := _load("bench-lbfgs-cpu.json"):
        step, two = lb["step"]["seconds"], lb["direction"]["seconds"]
        what = f"Ahn et al. 2023 Fig. 3 quick: L-BFGS step, history {lb['history']}"
        row(what, "C two-loop, ring buffers", step["iclab LBFGS"] * 1e3, "torch.optim.LBFGS",
            step["torch.optim.LBFGS"] * 1e3, lb["provenance"])  # fmt: skip
        row(f"L-BFGS two-loop recursion, {lb['history']} pairs, p = {lb['params']}", "C", two["C two-loop"] * 1e3,
            "torch.optim.LBFGS's loop", two["torch two-loop"] * 1e3, lb["provenance"])  # fmt: skip
    for name, blocks, where in CATEGORICAL_BENCHES:
        cat = _load(name)
        fast, general = (cat.get(f"{m}_{blocks}block") for m in ("free", "free_general")) if cat else (None, None)
        if cat and fast and general:
            row(f"Wang et al. 2025 {where}, minibatch 512: Trained TF step", "structured first block",
                fast["iclab_median_ms"], "general blocks", general["iclab_median_ms"], cat["provenance"])  # fmt: skip
    if rf := _load("bench-reduced-flow-cpu.json"):
        for case, what in (("flow", "population-flow step"), ("gd", "moment full-batch GD step")):
            us = rf[case]["us_per_step"]
            row(f"Zhang et al. 2025, separate heads (d = {rf['d']}, H = {rf['heads']}): {what}", "C steps",
                us["C"] / 1e3, "torch loop", us["torch"] / 1e3, rf["provenance"])  # fmt: skip
    head = [
        "| workload | path | ms | replaces | ms | × | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + rows)


def sampling_table() -> str:
    """Drawing a batch of Gaussian-process episodes (Cheng et al. 2024) against one training step on it."""
    gp = _load("bench-gp-cpu.json")
    if not gp:
        return ""
    head = [
        f"| label kernel | ms / batch ({_int(gp['batch'])} prompts, n = {gp['n']}) | episodes / s |"
        f" ÷ one training step ({_ms(gp['train_step_ms'])} ms) |",
        "|---|---|---|---|",
    ]
    rows = [
        f"| {k} | {_ms(r['ms'])} | {_int(r['episodes_per_s'])} | {gp['generation_over_train_step'][k]:.2f} |"
        for k, r in gp["generation"].items()
    ]
    return "\n".join(head + rows) + f"\n\nMeasured {describe(gp['provenance'])}."


def reproduce_table(top: int = 10) -> str:
    """`make reproduce`'s wall time, its experiments' own seconds (the slowest ``top``) and the claims."""
    r = _load("reproduce-quick-cpu.json")
    if not r:
        return ""
    secs = r["experiment_seconds"]
    head = [
        f"| `iclab reproduce --preset {r['preset']}` | wall | workers | the experiments' own seconds, added |"
        " claims passed | measured |",
        "|---|---|---|---|---|---|",
        f"| {r['experiments']} experiments | {r['wall_seconds'] / 60:.1f} min | {r['workers']} |"
        f" {sum(secs.values()) / 60:.1f} min | {r['claims_passed']}/{r['claims_checked']} | {describe(r['provenance'])} |",
        "",
        "| experiment | s |",
        "|---|---|",
    ]
    rows = [f"| {name} | {s:.1f} |" for name, s in list(secs.items())[:top]]
    return "\n".join(head + rows)


TABLES = {
    "reproduce": reproduce_table,
    "authors": authors_table,
    "roofline": roofline_table,
    "paths": paths_table,
    "sampling": sampling_table,
}


def blocks() -> list[tuple[Path, str, str, str]]:
    """Every generated section of docs/performance.md but the paper-preset one: (file, begin, end, body)."""
    return [(PAGE, f"<!-- perf:{k}:begin -->", f"<!-- perf:{k}:end -->", fn()) for k, fn in TABLES.items()]


def main() -> None:
    changed = [p for p, b, e, body in blocks() if presets.replace_block(p, body, b, e)]
    changed += presets.write_tables()
    for path in dict.fromkeys(changed):
        print(f"rewrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
