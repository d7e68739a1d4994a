"""A roofline for every paper's training step: FLOPs and bytes per step, the bounds they give, the step measured.

``iclab bench --roofline`` (:func:`run_roofline`) takes, for each step of :func:`cases` at the paper preset's shapes,

* the model's FLOPs per step: ``torch.utils.flop_counter`` on the token-level pass (forward + backward; the forward
  alone for an evaluation pass), counted on a slice of the batch and scaled to the whole batch (every FLOP of these
  models is per prompt), so that a shortcut that does less work is credited with the time it saves;
* the bytes a step moves, by the model of :func:`step_bytes` (activations, attention probabilities or logits where
  the model has them, parameters, their gradients and the optimiser's state);
* the machine's square-matmul peak (:func:`~iclab.bench.matmul_peak`), its matmul rate at the step's own shapes
  (:func:`~iclab.bench.token_matmul_peak`, reported) and its streaming bandwidth
  (:func:`~iclab.bench.stream_bandwidth`), all measured in the same run, in turn with the step
  (:func:`~iclab.bench.alternate`) so that they see the same load;
* the bound: max(FLOPs / peak, bytes / bandwidth), and the measured step over it.

Results go to ``benchmarks/results/roofline-<device>.json`` with the measurement's provenance
(:func:`~iclab.core.provenance.provenance`); ``scripts/perf_tables.py`` writes docs/performance.md's roofline table
from it. ``smoke=True`` runs every case at tiny shapes (seconds; tests/test_roofline.py).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from iclab.bench import alternate, matmul_peak, stream_bandwidth, token_matmul_peak
from iclab.core.devices import resolve_device, tune_cpu_allocator
from iclab.core.io import atomic_write_json
from iclab.core.provenance import provenance
from iclab.core.seeding import generator

#: optimiser-state passes per parameter and step: Adam / AdamW read p, g, m, v and write p, m, v; SGD reads p, g
#: and writes p; an evaluation pass has none
OPTIMISER_PASSES = {"adam": 7, "sgd": 3, "none": 0}


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What :func:`step_bytes` and :func:`~iclab.bench.token_matmul_peak` need of a step: ``batch`` prompts of
    ``tokens`` tokens ``width`` wide through ``sublayers`` residual sub-layers, ``itemsize`` bytes a number,
    ``params`` parameters, the ``optimiser`` (a key of :data:`OPTIMISER_PASSES`), ``scores``: numbers per prompt of
    each attention sub-layer's probabilities (T·K for softmax attention; 0 where the model has none), ``logits``:
    numbers per prompt of the read-out's logits (T·V of a language model; 0 for a scalar read-out)."""

    batch: int
    tokens: int
    width: int
    sublayers: int
    itemsize: int = 4
    params: int = 0
    optimiser: str = "adam"
    scores: int = 0
    score_layers: int = 0
    logits: int = 0
    train: bool = True


def step_bytes(s: Shape) -> dict[str, int]:
    """Bytes one step must move, by part, and their ``total``.

    With A = batch · tokens · width · itemsize one (B, T, D) activation and S sub-layers:

    * ``activations``: training, (5S − 2)·A (:func:`~iclab.bench.activation_traffic`: per sub-layer the forward
      reads its input and writes its output, the backward reads the output gradient and the saved input and writes
      the input gradient; less the read-out's query-only last output and the data's missing input gradient);
      evaluation, 2S·A (the prompt written once, per sub-layer one read and one write, the last output at the
      query alone);
    * ``scores``: per attention sub-layer with probabilities (softmax), batch · scores · itemsize written once by
      the forward and read once by its value product, read again and its gradient written and read once by the
      backward: 5 passes (training) or 2 (evaluation);
    * ``logits``: the read-out's batch · logits · itemsize, written and read by the loss, its gradient written and
      read by the head's backward: 4 passes (training) or 2 (evaluation);
    * ``parameters``: read by the forward, again by the backward, the gradient written (3 passes), and the
      optimiser's :data:`OPTIMISER_PASSES`: (3 + k)·params·itemsize (training) or params · itemsize (evaluation).

    A lower bound for a layer-by-layer program whose activations do not fit in cache; one that keeps a chunk of
    prompts in cache through several layers moves less and can beat it (the ratio is then below 1).
    """
    act = s.batch * s.tokens * s.width * s.itemsize
    S = s.sublayers
    parts = {
        "activations": ((5 * S - 2) if s.train else 2 * S) * act,
        "scores": (5 if s.train else 2) * s.score_layers * s.batch * s.scores * s.itemsize,
        "logits": (4 if s.train else 2) * s.batch * s.logits * s.itemsize,
        "parameters": ((3 + OPTIMISER_PASSES[s.optimiser]) if s.train else 1) * s.params * s.itemsize,
    }
    return {**parts, "total": sum(parts.values())}


@dataclass(kw_only=True)
class Case:
    """One step: ``step()`` runs it as the library trains (``per_call`` steps a call, less ``overhead()``'s time, the
    one-off work a call repeats); ``count()`` runs the token-level pass on ``1 / scale`` of the batch."""

    label: str
    shape: Shape
    step: Callable[[], object]
    count: Callable[[], object]
    scale: float
    dtype: torch.dtype = torch.float32
    per_call: int = 1
    overhead: Callable[[], object] | None = None


def count_flops(case: Case) -> float:
    """The model's FLOPs per step: the token-level pass's matmul FLOPs on its slice, times ``scale``."""
    with FlopCounterMode(display=False) as fc:
        case.count()
    return fc.get_total_flops() * case.scale


def measure(case: Case, device: torch.device, *, rounds: int, mib: int, square: int = 2048) -> dict[str, Any]:
    """One case's roofline row: FLOPs, bytes, the rates, bounds and the step, the probes alternated with it.

    The FLOP roof is the square ``square``² matmul rate (:func:`~iclab.bench.matmul_peak`, in the step's dtype): no
    program of these products runs faster. The rate of the step's own narrow shapes
    (:func:`~iclab.bench.token_matmul_peak`) is reported beside it, not used as a roof: a fused batch-last pass
    beats it (Sun et al.'s C kernel runs at 3× it), so it bounds a token-by-token program only."""
    s = case.shape
    flops = count_flops(case)
    traffic = step_bytes(s)
    seen: dict[str, list[float]] = {"square": [], "shape": [], "stream": []}

    def probes() -> None:  # the three rates at this moment's load
        seen["square"].append(matmul_peak(device, size=square, dtype=case.dtype, repeats=1))
        seen["shape"].append(
            token_matmul_peak(device, batch=s.batch, tokens=s.tokens, width=s.width, dtype=case.dtype, repeats=1)
        )
        seen["stream"].append(stream_bandwidth(device, mib=mib, repeats=1)["best"])

    runs: dict[str, Callable[[], object]] = {"step": case.step, "probes": probes}
    if case.overhead is not None:
        runs["overhead"] = case.overhead
    sec = alternate(runs, device=device, rounds=rounds)
    net = sec["step"] - sec.get("overhead", 0.0)
    subtracted = net > 0  # a one-off cost larger than the steps' time (noise at tiny shapes): charged, not subtracted
    step_s = (net if subtracted else sec["step"]) / case.per_call
    peak, shape, bw = (statistics.median(seen[k]) * 1e9 for k in ("square", "shape", "stream"))
    flop_s, byte_s = flops / peak, traffic["total"] / bw
    bound = max(flop_s, byte_s)
    return {
        "label": case.label,
        "shape": dataclasses.asdict(s),
        "dtype": str(case.dtype).removeprefix("torch."),
        "gflop_per_step": flops / 1e9,
        "gb_per_step": traffic["total"] / 1e9,
        "bytes": traffic,
        "matmul_peak_gflops": peak / 1e9,
        "matmul_gflops_at_shape": shape / 1e9,
        "bandwidth_gbps": bw / 1e9,
        "flop_bound_ms": flop_s * 1e3,
        "memory_bound_ms": byte_s * 1e3,
        "bound": "FLOPs" if flop_s >= byte_s else "bytes",
        "bound_ms": bound * 1e3,
        "ms_per_step": step_s * 1e3,
        "x_bound": step_s / bound,
        "x_shape_flop_bound": step_s / (flops / shape),
        "overhead_subtracted": subtracted and case.overhead is not None,
    }


def run_roofline(
    out: str | Path | None, *, device: str = "cpu", smoke: bool = False, rounds: int = 3, only: str | None = None
) -> dict[str, Any]:
    """Measure every case of :func:`cases` (``only``: those whose key contains it); write
    ``<out>/roofline-<device>[-smoke][-partial].json`` unless ``out`` is None (only the full, non-smoke file feeds
    docs/performance.md)."""
    dev = resolve_device(device)
    tuned = dev.type == "cpu" and tune_cpu_allocator()  # as the ``iclab`` CLI trains: freed activations kept
    report: dict[str, Any] = {"provenance": provenance(dev), "allocator_tuned": tuned, "smoke": smoke,
                              "rounds": rounds, "steps": {}}  # fmt: skip
    for key, build in cases(smoke).items():
        if only is not None and only not in key:
            continue
        report["steps"][key] = measure(
            build(dev), dev, rounds=1 if smoke else rounds, mib=1 if smoke else 256, square=64 if smoke else 2048
        )
    if out is not None:
        name = f"roofline-{dev.type}{'-smoke' if smoke else ''}{'-partial' if only else ''}.json"
        atomic_write_json(Path(out) / name, report)
    return report


def _train_step(
    loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer, *, clip: float | None, mode: str = "global"
) -> Callable[[], None]:
    """zero grads, ``loss().backward()``, clipping (``clip`` None: none), the optimiser's update."""
    from iclab.training.optim import clip_gradients

    params = [p for group in opt.param_groups for p in group["params"]]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        if clip is not None:
            clip_gradients(params, clip, mode)
        opt.step()

    return step


def _backward(loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    return lambda: loss().backward()


def _n(k: int) -> str:
    """20 000: an integer with thin groups, as the docs write them."""
    return f"{k:,}".replace(",", " ")


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _ahn(pattern: str, n_layers: int, batch: int, n: int, what: str) -> Callable[[torch.device], Case]:
    """Ahn et al. 2023: an AdamW step of the L-layer linear transformer (d = 5, the paper's Σ), by the moment form
    the library trains with; FLOPs of the token pass (eq. (3)-(4))."""

    def build(device: torch.device) -> Case:
        from iclab.models.linear_attention import LinearTransformer, LinearTransformerConfig
        from iclab.tasks.linear_regression import AHN2023_SPECTRUM, LinearRegression
        from iclab.training.trainer import mse_loss

        task = LinearRegression.random_rotation(AHN2023_SPECTRUM, generator=generator(0))
        cfg = LinearTransformerConfig(d=5, n_layers=n_layers, pattern=pattern)  # type: ignore[arg-type]
        model = LinearTransformer(cfg, generator=generator(1)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ep = task.sample(batch, n, generator=generator(2, device))
        part = ep[: min(batch, 256)]
        assert part.y_query is not None
        y = part.y_query
        return Case(
            label=f"Ahn et al. 2023 {what}: {n_layers} layers, d = 5, n = {n}, batch {_n(batch)} (moment form)",
            shape=Shape(batch=batch, tokens=n + 1, width=6, sublayers=n_layers, params=_n_params(model)),
            step=_train_step(lambda: mse_loss(model, ep), opt, clip=0.01, mode="per_matrix"),
            count=_backward(lambda: (model.forward_tokens(part) - y).square().mean()),
            scale=batch / part.batch_size,
        )

    return build


def _zhang_fig3(prompts: int, epochs: int) -> Callable[[torch.device], Case]:
    """Zhang et al. 2025 Fig. 3: one full-batch GD epoch of ATTN_S (d = 4, H = 5, rank 1, N = 31) by its moments
    (``full_batch_gd``, the statistics of the data set subtracted: computed once per data set); FLOPs of the same
    model token by token (one softmax-free attention layer read at the query)."""

    def build(device: torch.device) -> Case:
        from iclab.experiments.zhang2025._setup import token_spec
        from iclab.models import SeparateAttention
        from iclab.models.linear_attention import LinearTransformer
        from iclab.tasks import LinearRegression
        from iclab.training import full_batch_gd

        ep = LinearRegression(d=4).sample(prompts, 31, generator=generator(0, device))
        model = SeparateAttention(4, 5, w_init=0.5, generator=generator(1)).to(device)
        tokens = token_spec(4, 5, key_query="separate", activation="linear", init_std=0.01).build().float()
        assert isinstance(tokens, LinearTransformer)
        part = ep[: min(prompts, 256)]
        assert part.y_query is not None
        y = part.y_query
        return Case(
            label=f"Zhang et al. 2025 Fig. 3: full-batch GD epoch of ATTN_S, P = {_n(prompts)} (moments)",
            shape=Shape(batch=prompts, tokens=32, width=5, sublayers=1, params=_n_params(model), optimiser="sgd"),
            step=lambda: full_batch_gd(model, ep, lr=1e-4, steps=epochs, record_every=epochs),
            overhead=lambda: full_batch_gd(model, ep, lr=1e-4, steps=0),
            per_call=epochs,
            count=_backward(lambda: (tokens.forward_tokens(part) - y).square().mean()),
            scale=prompts / part.batch_size,
        )

    return build


def _zhang_fig5(prompts: int) -> Callable[[torch.device], Case]:
    """Zhang et al. 2025 Fig. 5: a full-batch SGD step of the paper preset's longest run, softmax ATTN_S (5 heads of
    rank-one key and query, d = 4, N = 31, init 0.01, lr 0.02, float32 as the card and the authors' code train) read
    at the query (its C kernel on a CPU); FLOPs of the torch pass."""

    def build(device: torch.device) -> Case:
        from iclab.experiments.zhang2025._setup import token_spec
        from iclab.models import _query_fast
        from iclab.tasks.linear_regression import LinearRegression

        f32 = torch.float32
        ep = (
            LinearRegression(d=4).sample(prompts, 31, generator=generator(0, device), dtype=torch.float64).to(dtype=f32)
        )
        spec = token_spec(4, 5, key_query="separate", activation="softmax", init_std=0.01, dtype="float32")
        model = spec.build(generator(1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.02)
        part = ep[: min(prompts, 256)]
        assert ep.y_query is not None and part.y_query is not None
        y, yp = ep.y_query, part.y_query

        def torch_pass() -> None:
            native, _query_fast.NATIVE = _query_fast.NATIVE, False
            try:
                (model(part) - yp).pow(2).mean().backward()
            finally:
                _query_fast.NATIVE = native

        return Case(
            label=f"Zhang et al. 2025 Fig. 5: softmax ATTN_S step, P = {_n(prompts)}, float32",
            shape=Shape(
                batch=prompts,
                tokens=32,
                width=5,
                sublayers=1,
                itemsize=4,
                params=_n_params(model),
                optimiser="sgd",
                scores=5 * 32,
                score_layers=1,
            ),
            step=_train_step(lambda: (model(ep) - y).pow(2).mean(), opt, clip=None),
            count=torch_pass,
            scale=prompts / part.batch_size,
            dtype=f32,
        )

    return build


def _cheng(act: str, batch: int) -> Callable[[torch.device], Case]:
    """Cheng et al. 2024 Fig. 1: an AdamW step of the 3-layer kernel transformer (d = 5, n = 14, A free, one head
    of activation ``act``) on exp-kernel GP labels, by the fused batch-last pass; FLOPs of the token pass."""

    def build(device: torch.device) -> Case:
        from iclab.models import KernelTransformer, KernelTransformerConfig
        from iclab.tasks.gaussian_process import GaussianProcess

        task = GaussianProcess.random_rotation(generator=generator(0), kernel="exp")
        cfg = KernelTransformerConfig(d=5, n_layers=3, activations=(act,), value="sparse",
                                      divide_by_n=act != "softmax")  # fmt: skip
        model = KernelTransformer(cfg, generator=generator(1)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        ep = task.sample(batch, 14, generator=generator(2, device))
        part = ep[: min(batch, 256)]
        assert ep.y_query is not None and part.y_query is not None
        y, yp = ep.y_query, part.y_query

        def token_pass() -> None:
            model.fast = False
            try:
                (model.predict(part) - yp).pow(2).mean().backward()
            finally:
                model.fast = True

        probs = 15 * 14 if act == "softmax" else 0
        return Case(
            label=f"Cheng et al. 2024 Fig. 1: 3 layers, d = 5, n = 14, batch {_n(batch)}, {act} attention",
            shape=Shape(
                batch=batch, tokens=15, width=6, sublayers=3, params=_n_params(model), scores=probs, score_layers=3
            ),
            step=_train_step(lambda: (model.predict(ep) - y).pow(2).mean(), opt, clip=1.0, mode="per_matrix"),
            count=token_pass,
            scale=batch / part.batch_size,
        )

    return build


def _sun_model(device: torch.device, blocks: int) -> tuple[Any, Any]:
    from iclab.experiments.sun2025._setup import BilinearSetup, make_task, model_base
    from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig

    setup = BilinearSetup()
    cfg = BilinearTransformerConfig(n_blocks=blocks, **model_base(setup, setup.d))
    return BilinearTransformer(cfg, generator=generator(0)).to(device), make_task(setup)


def _sun(batch: int, n: int, blocks: int) -> Callable[[torch.device], Case]:
    """Sun et al. 2025: an Adam step of the 2L-layer bilinear transformer (App. I: d = 3, d̄ = 12, quadratic task),
    by the fused pass (its C kernel on a CPU); FLOPs of ``forward_tokens``."""

    def build(device: torch.device) -> Case:
        model, task = _sun_model(device, blocks)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        ep = task.sample(batch, n, generator=generator(1, device))
        part = ep[: min(batch, 64)]
        assert ep.y_query is not None and part.y_query is not None
        y, yp = ep.y_query, part.y_query
        return Case(
            label=f"Sun et al. 2025: {2 * blocks} layers, d̄ = 12, n = {n}, batch {_n(batch)} (fused pass)",
            shape=Shape(batch=batch, tokens=n + 1, width=13, sublayers=2 * blocks, params=_n_params(model)),
            step=_train_step(lambda: (model(ep) - y).square().mean(), opt, clip=1.0),
            count=_backward(lambda: (model.forward_tokens(part) - yp).square().mean()),
            scale=batch / part.batch_size,
        )

    return build


def _sun_eval(prompts: int, n: int, blocks: int) -> Callable[[torch.device], Case]:
    """Sun et al. 2025's test-length evaluation at one length: ``prompts`` float64 Monte-Carlo prompts drawn and
    predicted without autograd (:func:`~iclab.experiments.sun2025._setup.loss_vs_length`'s pass, its chunking);
    FLOPs of ``forward_tokens`` (forward only)."""

    def build(device: torch.device) -> Case:
        from iclab.theory import mc_loss

        model, task = _sun_model(device, blocks)
        model = model.double()
        part = task.sample(min(prompts, 64), n, generator=generator(1, device), dtype=torch.float64)
        chunks = max(1, prompts * n // 2_000_000)

        def count() -> None:
            with torch.no_grad():
                model.forward_tokens(part)

        return Case(
            label=f"Sun et al. 2025 evaluation: {2 * blocks} layers, n = {n}, {_n(prompts)} prompts, float64",
            shape=Shape(
                batch=prompts,
                tokens=n + 1,
                width=13,
                sublayers=2 * blocks,
                itemsize=8,
                params=_n_params(model),
                train=False,
            ),
            step=lambda: mc_loss(model, task, n, prompts, generator=generator(2, device), chunks=chunks),
            count=count,
            scale=prompts / part.batch_size,
            dtype=torch.float64,
        )

    return build


def _wang_cat(
    mode: str, batch: int, n: int = 125, *, kernel: str = "softmax", blocks: int = 2
) -> Callable[[torch.device], Case]:
    """Wang et al. 2025 §6.1: an Adam step of the ``blocks``-block categorical model with ``kernel`` attention
    (d = 10, C = 25, d' = 5, N = ``n``; ``mode`` 'gd': the GD model, 'free': the Trained TF and its fast path) on a
    minibatch; FLOPs of the general block pass in torch."""

    def build(device: torch.device) -> Case:
        from iclab.models import CategoricalTransformer, CategoricalTransformerConfig, _categorical_fast
        from iclab.tasks.categorical import RBFMixtureCategorical

        task = RBFMixtureCategorical.draw(generator=generator(0))
        cfg = CategoricalTransformerConfig(n_blocks=blocks, kernel=kernel, mode=mode)  # type: ignore[arg-type]
        model = CategoricalTransformer(cfg, generator=generator(1)).to(device)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        ep = task.sample(batch, n, generator=generator(2, device))
        part = ep[: min(batch, 64)]
        assert ep.label_query is not None and part.label_query is not None
        labels, part_labels = ep.label_query, part.label_query
        ce = torch.nn.functional.cross_entropy

        def general() -> None:
            native, _categorical_fast.NATIVE = _categorical_fast.NATIVE, False
            model.fast = False
            try:
                ce(model.predict(part), part_labels).backward()
            finally:
                _categorical_fast.NATIVE, model.fast = native, True

        what = {"gd": "GD model", "free": "Trained TF"}[mode]
        where = "§6.1" if kernel == "softmax" else f"Fig. 2, {kernel} attention"
        return Case(
            label=f"Wang et al. 2025 {where}: {blocks} block{'s' * (blocks > 1)}, N = {n}, minibatch {batch}, {what}",
            shape=Shape(
                batch=batch,
                tokens=n + 1,
                width=15,
                sublayers=blocks,
                params=_n_params(model),
                scores=(n + 1) * n,
                score_layers=blocks,
                logits=25,
            ),
            step=_train_step(lambda: ce(model.predict(ep), labels), opt, clip=1.0),
            count=general,
            scale=batch / part.batch_size,
        )

    return build


#: the BPE vocabulary of the generated story corpus at the paper's settings (every word merged: 789 ids)
STORY_VOCAB = 789


def _wang_language(name: str, batch: int, seq_len: int, d_embed: int, heads: int) -> Callable[[torch.device], Case]:
    """Wang et al. 2025 §6.3: an AdamW step (β = (0.9, 0.95), weight decay 0.01, clip 1) of the language model
    ``name`` ('gd', 'gd_ff', 'gpt') on ``batch`` windows of ``seq_len`` token ids (uniform over the story corpus's
    :data:`STORY_VOCAB` ids: the step's cost does not depend on which); dropout 0.1 as the paper; FLOPs of the same
    pass (these models have no shortcut)."""

    def build(device: torch.device) -> Case:
        from iclab.models.language import LanguageGD, LanguageGPT

        torch.manual_seed(0)
        V = STORY_VOCAB
        model: torch.nn.Module
        if name == "gpt":
            model = LanguageGPT(V, d_embed, heads, seq_len, dropout=0.1)
        else:
            model = LanguageGD(V, d_embed, heads, seq_len, ff=name == "gd_ff", dropout=0.1)
        model = model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=1e-2)
        g = generator(1, device)
        inputs = torch.randint(V, (batch, seq_len), generator=g, device=device)
        targets = torch.randint(V, (batch, seq_len), generator=g, device=device)
        k = max(1, batch // 8)

        def loss(b: int = batch) -> torch.Tensor:
            logits = model(inputs[:b])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[:b].flatten())

        what = {"gd": "GD", "gd_ff": "GD + FF", "gpt": "1-layer transformer"}[name]
        sub = 4 if name == "gpt" else 2 + 2 * (name == "gd_ff")  # attention (+ feed-forward) with their norms
        return Case(
            label=f"Wang et al. 2025 §6.3 language, {what}: d' = {d_embed}, S = {seq_len}, batch {batch}",
            shape=Shape(
                batch=batch,
                tokens=seq_len,
                width=d_embed,
                sublayers=sub,
                params=_n_params(model),
                scores=seq_len * seq_len,
                score_layers=1,
                logits=seq_len * V,
            ),
            step=_train_step(loss, opt, clip=1.0),
            count=_backward(lambda: loss(k)),
            scale=batch / k,
        )

    return build


def cases(smoke: bool = False) -> dict[str, Callable[[torch.device], Case]]:
    """Every paper's training step at its paper preset's shapes (``smoke``: tiny shapes, the same code), by key."""
    s = smoke
    ahn_b, ahn_n = (16, 5) if s else (20_000, 20)
    out: dict[str, Callable[[torch.device], Case]] = {
        "ahn2023.fig1.sparse": _ahn("sparse", 3, ahn_b, ahn_n, "Fig. 1, eq. (8) pattern"),
        "ahn2023.fig1.full": _ahn("full", 3, ahn_b, ahn_n, "Fig. 1, full P, Q"),
        "ahn2023.fig6": _ahn("pattern11", 3, 2 * ahn_b, ahn_n, "Fig. 6, pattern (11)"),
        "ahn2023.fig7": _ahn("pattern11", 4, 2 * ahn_b, ahn_n, "Fig. 7, pattern (11)"),
        "zhang2025.fig3": _zhang_fig3(64 if s else 80_000, 200 if s else 2000),
        "zhang2025.fig5": _zhang_fig5(64 if s else 80_000),
    }
    for act in ("relu", "exp", "softmax"):
        out[f"cheng2024.fig1.{act}"] = _cheng(act, 32 if s else 30_000)
    out["sun2025.train"] = _sun(8 if s else 4000, 5 if s else 200, 1 if s else 6)
    out["sun2025.eval"] = _sun_eval(64 if s else 100_000, 5 if s else 200, 1 if s else 6)
    for mode in ("free", "gd"):
        out[f"wang2025.s61.{mode}"] = _wang_cat(mode, 4 if s else 512, 8 if s else 125)
    out["wang2025.fig2_rbf.free"] = _wang_cat("free", 4 if s else 512, 8 if s else 125, kernel="rbf", blocks=1)
    size = dict(seq_len=8, d_embed=16, heads=2, batch=2) if s else dict(seq_len=256, d_embed=512, heads=8, batch=64)
    for name in ("gd", "gd_ff", "gpt"):
        out[f"wang2025.language.{name}"] = _wang_language(name, **size)
    return out
