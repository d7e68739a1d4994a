"""Wang et al. 2025, §6.3 (Tables 1-2, Fig. 5, App. J/K): GD, GD + FF and a 1-layer transformer as language models.

What the paper shows: on TinyStories + Children-Stories, a 1-layer model whose attention is the GD construction
(eq. (49): W_Q ≡ W_K diagonal, 8,192 attention numbers, 0.13 % of the transformer's 6,291,456) generates stories
graded by GPT-4o almost as well as a 1-layer transformer once a feed-forward layer is added: "GD + FF ≈ Transformer
> GD" (Fig. 5), while plain GD repeats itself (Tables 1-2).

Offline substitute (spec 004 §4.5): the paper's corpus, GPT-2 tokenizer and GPT-4o grader are replaced by the
package's generated story corpus (:mod:`iclab.tasks.language`), a BPE tokenizer trained on it, and measured
quantities: held-out next-token NLL / perplexity, next-token accuracy, the repetition (fraction of repeated 3-grams)
and the story-grammar consistency (:func:`iclab.tasks.language.story_consistency`) of beam-search continuations of
held-out story beginnings. A unigram model (train-split token frequencies, add-one smoothed) is the no-context
reference. Training follows the authors' language code (AdamW lr 1e-3, β = (0.9, 0.95), weight decay 1e-2, global
grad-norm clip 1, batch 64, dropout 0.1 at paper size); every model is one :class:`~iclab.training.TrainingRun`
(token-level loss, early stopping on the validation NLL: set-up in ``_language.py``).

Command: ``iclab run wang2025.language --preset quick`` (``--preset paper``: d' = 512, 8 heads, 256 positions,
5 seeds × 3 models × 5000 steps of batch 64).

Claims:
- gd_attention_params_8192_reported: the GD model's reported W_qkv count is 8,192 (the diagonal counted twice).
- attention_param_ratio_0.13pct: 8,192 / 6,291,456 (3·H·d'², d' = 512, H = 8), exactly.
- module_counts_match_spec: the modules' parameter counts at paper size equal the spec's 27,966,464 / 30,064,128 /
  36,350,976 (GD / GD + FF / transformer), exactly.
- gd_beats_unigram: GD's test NLL <= the unigram NLL + ``tol.unigram_margin`` (it uses the context).
- gd_ff_beats_unigram: the same for GD + FF.
- gpt_beats_unigram: the same for the transformer.
- gd_ff_nll_close_to_transformer: NLL(GD + FF) / NLL(transformer) <= 1 + ``tol.ff_nll_rtol`` (spec §5 item 19).
- gd_not_better_than_transformer: NLL(GD) − NLL(transformer) >= −``tol.order_atol`` (Fig. 5, read as NLL).
- gd_repeats_at_least_as_much_as_transformer: repeated 3-grams of GD − the transformer's >= −``tol.repetition_atol``.
- transformer_more_consistent_than_gd: consistency(transformer) − consistency(GD) >= ``tol.consistency_margin``.
- gd_ff_consistency_close_to_transformer: consistency(transformer) − consistency(GD + FF) <= ``tol.consistency_atol``.
- true_endings_are_consistent: the held-out stories' own endings have consistency 1 (a check of the grader).
- ff_helps_gd: NLL(GD) − NLL(GD + FF) >= −``tol.order_atol`` (Fig. 5: GD + FF > GD).

Time on the 2-core CPU: smoke ≈ 5-10 s (53 s at load ≈ 9); quick (d' = 64, 4 heads, 64 positions, 1 seed,
1500 steps at lr 1e-2 cosine, 48 continuations) 114 s in session 6's ``make reproduce`` under ≈ 2× load, 270 s
under load ≈ 4; paper: 159 core-hours probed (session 11; GD ≈ 8 h, GD + FF ≈ 10 h, transformer ≈ 13-15 h per
seed at 1 thread), a GPU job. A reduced run at the paper's model size (1 seed, 100 steps of 8, 8 continuations) gives
8/13 in 5.5 min (session 15): the transformer learns first there, GD starting at a training NLL of 72 (the authors'
read-out LN_out(f)·LN(wte)ᵀ gives logits of std √d' at init; the transformer starts at ln V; docs/papers/wang2025.md).

What did not match (docs/papers/wang2025.md "Language models", docs/errata.md "Language models" row 8): 11/13 claims
pass at quick. In held-out NLL the GD models beat the 1-layer transformer in every run and seed on the generated
corpus, so ``gd_not_better_than_transformer`` fails at every budget tried; in the consistency of the generated text
(what the paper graded) the transformer wins by far, as the paper says. ``gd_ff_consistency_close_to_transformer``
fails at quick (GD + FF learns the content look-up later: 0.06 at 1500 steps, 0.44-0.94 at 4000).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from iclab.core.errors import require, require_int
from iclab.core.seeding import derive_seed
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.experiments.wang2025._language import (
    LABELS,
    MODELS,
    BestCheckpoint,
    Example,
    build_model,
    continuations,
    evaluate_tokens,
    token_episode,
    token_loss,
    train_windows,
    unigram_nll,
)
from iclab.models.language import LanguageGD, LanguageGPT
from iclab.plotting import save, subplots
from iclab.tasks.language import StoryLanguageData
from iclab.theory.categorical import language_parameter_counts
from iclab.training import TrainConfig, TrainingRun

__all__ = [
    "BestCheckpoint",
    "LanguageConfig",
    "LanguageResults",
    "LanguageRun",
    "LanguageTolerances",
    "evaluate_tokens",
]


@dataclass(frozen=True, kw_only=True)
class LanguageTolerances:
    ff_nll_rtol: float = 0.05  # GD + FF test NLL within 5 % of the transformer's (spec §5 item 19)
    order_atol: float = 0.0  # GD's NLL >= the others' − order_atol
    repetition_atol: float = 0.05
    consistency_atol: float = 0.15  # GD + FF's consistency >= the transformer's − this ("GD + FF ≈ Transformer")
    consistency_margin: float = 0.0  # the transformer's consistency >= GD's + this ("the Transformer scores better")
    unigram_margin: float = 0.0  # each model's test NLL <= the unigram NLL + margin


def _paper_train() -> TrainConfig:
    """The authors' language training (spec 004 §4.3): AdamW lr 1e-3 constant, β = (0.9, 0.95), weight decay 1e-2,
    global grad-norm clip 1, batch 64, 5000 steps. ``snapshot_every``: the validation NLL (eval mode, the early-
    stopping snapshot :class:`BestCheckpoint`) every this many steps; the trainer's own test loss is off
    (``eval_every = 0``: only at the end, on the validation windows)."""
    return TrainConfig(
        steps=5000,
        batch_size=64,
        optimizer="adamw",
        lr=1e-3,
        schedule="constant",  # the authors' lr is constant
        warmup_steps=0,
        betas=(0.9, 0.95),
        weight_decay=1e-2,
        clip=1.0,
        clip_mode="global",
        eval_every=0,
        snapshot_every=250,
        eval_batch=1,
    )


@dataclass(frozen=True, kw_only=True)
class LanguageConfig:
    """Defaults: the paper's model sizes (d' = 512, 8 heads, 256 positions, 1 layer, dropout 0.1) and
    optimiser, on the generated corpus (its BPE vocabulary saturates at ~790 ids: every word merged).

    ``train.checkpoint_every`` (steps // 5), ``train.log_every`` (snapshot_every // 5) and ``train.seed``
    (derive_seed(seed, "data")) are set per run."""

    seeds: int = 5  # spec §4.0: 5 seeds, error bars = std over seeds
    stories: int = 20_000
    vocab_size: int = 4096
    seq_len: int = 256
    d_embed: int = 512
    heads: int = 8
    n_layers: int = 1
    kernel: Literal["softmax", "linear", "rbf"] = "softmax"
    dropout: float = 0.1
    models: tuple[str, ...] = MODELS
    train: TrainConfig = field(default_factory=_paper_train)
    eval_windows: int = 512  # held-out windows for the validation curve and the test metrics (cap)
    prompts: int = 200  # held-out stories continued (the paper grades 200)
    prompt_tokens: int = 128  # the model gets the first min(prompt_tokens, len/2) tokens (the paper's rule)
    new_tokens: int = 100
    beams: int = 3
    ngram: int = 3
    tol: LanguageTolerances = field(default_factory=LanguageTolerances)

    def __post_init__(self) -> None:
        require(
            self,
            "models",
            len(self.models) >= 1 and all(m in MODELS for m in self.models),
            f"a non-empty subset of {MODELS}",
        )
        for name in (
            "seeds",
            "stories",
            "seq_len",
            "d_embed",
            "heads",
            "n_layers",
            "eval_windows",
            "prompts",
            "prompt_tokens",
            "new_tokens",
            "beams",
            "ngram",
        ):
            require_int(self, name, getattr(self, name), 1)
        tc = self.train
        require(self, "train.schedule", tc.schedule in ("constant", "cosine"), "'constant' or 'cosine'", tc.schedule)
        require(self, "train.warmup_steps", 0 <= tc.warmup_steps < tc.steps,
                f"an int in [0, train.steps = {tc.steps})", tc.warmup_steps)  # fmt: skip


@dataclass
class LanguageRun:
    """One model and seed: test metrics of the early-stopped parameters, its continuations, its validation curve."""

    model: str
    seed: int
    nll: float  # test windows, nats/token
    perplexity: float
    accuracy: float
    repetition: float
    true_repetition: float
    consistency: float
    true_consistency: float
    consistency_errors: dict[str, int]
    examples: list[Example]
    parameters: int
    attention_parameters: int
    train_seconds: float
    best_step: int
    best_val_nll: float
    curve_steps: list[int]
    curve_val_nll: list[float]


@dataclass
class LanguageResults:
    vocab: int
    unigram_nll: float  # test NLL of the add-one-smoothed unigram model
    runs: list[LanguageRun] = field(default_factory=list)
    paper_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # theory.language_parameter_counts()
    paper_module_counts: dict[str, int] = field(default_factory=dict)  # the modules at paper size, counted


def run(cfg: LanguageConfig, ctx: RunContext) -> LanguageResults:
    data = StoryLanguageData.build(stories=cfg.stories, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    V = data.vocab_size
    val_in, val_tg = (t[: cfg.eval_windows] for t in data.windows("validation"))
    test_in, test_tg = (t[: cfg.eval_windows] for t in data.windows("test"))
    val_in, val_tg = val_in.to(ctx.device), val_tg.to(ctx.device)
    val_ep = token_episode(val_in, val_tg)
    task = functools.partial(train_windows, data)
    tc = dataclasses.replace(
        cfg.train, checkpoint_every=max(1, cfg.train.steps // 5), log_every=max(1, cfg.train.snapshot_every // 5)
    )

    out = LanguageResults(vocab=V, unigram_nll=unigram_nll(data, test_tg))
    for name in cfg.models:
        for seed in range(cfg.seeds):
            # one run at a time: the models take no generator, so the init (and the dropout masks after it) come
            # from torch's global generator, seeded here as before the move
            torch.manual_seed(derive_seed(seed, "wang2025.language", name))  # parameter init
            run_dir = ctx.subdir(name, f"seed{seed}")
            best = BestCheckpoint(run_dir / "best_model.pt", val_in, val_tg)
            res = ctx.train(
                TrainingRun(
                    name=f"{name}/seed{seed}",
                    model=build_model(name, cfg, V),
                    task=task,
                    train=tc,
                    seed=derive_seed(seed, "data"),
                    loss=token_loss,
                    snapshot=best,
                    test_episode=val_ep,
                    out_dir=run_dir,
                )
            )
            model = best.load_best(res.model.to(ctx.device))
            metrics = evaluate_tokens(model, test_in.to(ctx.device), test_tg.to(ctx.device))
            gen = continuations(model, data, cfg)
            steps, val = res.snapshot_steps, res.snapshots["val_nll"].tolist()
            attention = model.q_diag if name != "gpt" else model.w_qkv  # the GD diagonals D_h | W_qkv
            out.runs.append(
                LanguageRun(
                    model=name,
                    seed=seed,
                    **metrics,
                    **vars(gen),
                    parameters=model.num_parameters(),  # type: ignore[operator]
                    attention_parameters=attention.numel(),
                    train_seconds=res.seconds,
                    best_step=steps[val.index(min(val))],
                    best_val_nll=min(val),
                    curve_steps=steps,
                    curve_val_nll=val,
                )
            )
    out.paper_counts = language_parameter_counts()
    with torch.device("meta"):  # the paper's sizes, counted from the modules themselves
        out.paper_module_counts = {
            "gd": LanguageGD(50_258, 512, 8, 256).num_parameters(),
            "gd_ff": LanguageGD(50_258, 512, 8, 256, ff=True).num_parameters(),
            "gpt": LanguageGPT(50_258, 512, 8, 256).num_parameters(),
        }
    return out


def _mean(results: LanguageResults, model: str, key: str) -> float:
    vals = [getattr(r, key) for r in results.runs if r.model == model]
    return sum(vals) / len(vals) if vals else float("nan")


def plot(results: LanguageResults, cfg: LanguageConfig, out: Path) -> list[Path]:
    fig, ax = subplots(1, 3, size=(3.6, 2.8))
    for name in cfg.models:
        runs = [r for r in results.runs if r.model == name]
        for i, r in enumerate(runs):
            ax[0, 0].plot(
                r.curve_steps,
                r.curve_val_nll,
                color=f"C{MODELS.index(name)}",
                label=LABELS[name] if i == 0 else None,
            )
    ax[0, 0].axhline(results.unigram_nll, color="gray", ls=":", label="unigram")
    ax[0, 0].set(xlabel="step", ylabel="validation NLL (nats/token)", title="training")
    ax[0, 0].set_ylim(0, 1.5 * results.unigram_nll)  # the GD models start high: LN'd embeddings in the logits
    ax[0, 0].legend(fontsize=7)
    names = list(cfg.models)
    xs = range(len(names))
    ax[0, 1].bar(xs, [_mean(results, n, "perplexity") for n in names], color=[f"C{MODELS.index(n)}" for n in names])
    ax[0, 1].set(xticks=list(xs), xticklabels=[LABELS[n].split(" (")[0] for n in names], ylabel="test perplexity")
    ax[0, 2].bar(xs, [_mean(results, n, "repetition") for n in names], color=[f"C{MODELS.index(n)}" for n in names])
    ax[0, 2].axhline(_mean(results, names[0], "true_repetition"), color="gray", ls=":", label="true ending")
    ax[0, 2].set(
        xticks=list(xs),
        xticklabels=[LABELS[n].split(" (")[0] for n in names],
        ylabel=f"repeated {cfg.ngram}-gram fraction",
        title=f"beam {cfg.beams} continuations",
    )
    ax[0, 2].legend(fontsize=7)
    return [save(fig, out / "wang2025_language.png")]


def claims(results: LanguageResults, cfg: LanguageConfig) -> list[ClaimResult]:
    pc, mc, tol = results.paper_counts, results.paper_module_counts, cfg.tol
    out = [
        check(
            "gd_attention_params_8192_reported",
            pc["gd"]["qkv_reported"],
            expected=8192,
            atol=0,
            detail=f"GD W_q ≡ W_k diagonals: {pc['gd']['qkv']} numbers, reported ×2",
        ),
        check(
            "attention_param_ratio_0.13pct",
            pc["gd"]["qkv_reported"] / pc["gpt"]["qkv"],
            expected=8192 / 6291456,
            rtol=1e-12,
            detail="8,192 vs 6,291,456 (3·H·d'²), d' = 512, H = 8",
        ),
        check(
            "module_counts_match_spec",
            max(abs(mc[k] - pc[k]["total"]) for k in mc),
            expected=0,
            atol=0,
            detail=f"modules {mc} vs spec totals 27,966,464 / 30,064,128 / 36,350,976",
        ),
    ]
    have = set(cfg.models)
    for name in cfg.models:
        out.append(
            check(
                f"{name}_beats_unigram",
                _mean(results, name, "nll"),
                hi=results.unigram_nll + tol.unigram_margin,
                detail=f"test NLL vs unigram {results.unigram_nll:.3f}: the model uses the context",
            )
        )
    if {"gd_ff", "gpt"} <= have:
        ratio = _mean(results, "gd_ff", "nll") / _mean(results, "gpt", "nll")
        out.append(
            check(
                "gd_ff_nll_close_to_transformer",
                ratio,
                hi=1 + tol.ff_nll_rtol,
                detail=f"NLL(GD+FF)/NLL(TF); perplexities {_mean(results, 'gd_ff', 'perplexity'):.3f} vs "
                f"{_mean(results, 'gpt', 'perplexity'):.3f} with "
                f"{_mean(results, 'gd_ff', 'attention_parameters'):.0f} vs "
                f"{_mean(results, 'gpt', 'attention_parameters'):.0f} attention parameters",
            )
        )
    if {"gd", "gpt"} <= have:
        out.append(
            check(
                "gd_not_better_than_transformer",
                _mean(results, "gd", "nll") - _mean(results, "gpt", "nll"),
                lo=-tol.order_atol,
                detail="Fig. 5: the transformer scores better than GD",
            )
        )
        out.append(
            check(
                "gd_repeats_at_least_as_much_as_transformer",
                _mean(results, "gd", "repetition") - _mean(results, "gpt", "repetition"),
                lo=-tol.repetition_atol,
                detail=f"repeated {cfg.ngram}-grams of beam-{cfg.beams} continuations; GD "
                f"{_mean(results, 'gd', 'repetition'):.3f}, TF {_mean(results, 'gpt', 'repetition'):.3f}, "
                f"true endings {_mean(results, 'gd', 'true_repetition'):.3f}",
            )
        )
        out.append(
            check(
                "transformer_more_consistent_than_gd",
                _mean(results, "gpt", "consistency") - _mean(results, "gd", "consistency"),
                lo=tol.consistency_margin,
                detail=f"Fig. 5 (the paper's GPT-4o grades; here the story grammar's consistency check): fraction of "
                f"beam-{cfg.beams} continuations with no name, character or object error, transformer "
                f"{_mean(results, 'gpt', 'consistency'):.3f} vs GD {_mean(results, 'gd', 'consistency'):.3f}",
            )
        )
    if {"gd_ff", "gpt"} <= have:
        out.append(
            check(
                "gd_ff_consistency_close_to_transformer",
                _mean(results, "gpt", "consistency") - _mean(results, "gd_ff", "consistency"),
                hi=tol.consistency_atol,
                detail=f"Fig. 5: GD + FF ≈ Transformer; consistency {_mean(results, 'gd_ff', 'consistency'):.3f} vs "
                f"{_mean(results, 'gpt', 'consistency'):.3f}",
            )
        )
    out.append(
        check(
            "true_endings_are_consistent",
            _mean(results, cfg.models[0], "true_consistency"),
            expected=1.0,
            atol=0.0,
            detail="the consistency check on the held-out stories' own endings (a check of the grader)",
        )
    )
    if {"gd", "gd_ff"} <= have:
        out.append(
            check(
                "ff_helps_gd",
                _mean(results, "gd", "nll") - _mean(results, "gd_ff", "nll"),
                lo=-tol.order_atol,
                detail="Fig. 5: GD + FF ≈ Transformer > GD",
            )
        )
    return out


#: quick: d' = 64, 1 seed, 1500 steps at lr 1e-2 with warm-up and cosine decay (the authors' constant 1e-3 is for
#: d' = 512; at 400 steps of it the 1-layer transformer was under-trained, NLL 1.03, and looped when generating)
_QUICK = dict(
    seeds=1,
    stories=4000,
    vocab_size=1024,
    seq_len=64,
    d_embed=64,
    heads=4,
    dropout=0.0,
    steps=1500,
    lr=1e-2,
    schedule="cosine",
    warmup_steps=100,
    batch_size=32,
    snapshot_every=100,
    eval_windows=128,
    prompts=48,  # the consistency fraction's resolution (16 gave 1/16 steps and flipped claims between runs)
    prompt_tokens=32,
    new_tokens=40,
)

_SMOKE = dict(
    seeds=1,
    stories=300,
    vocab_size=300,
    seq_len=32,
    d_embed=16,
    heads=2,
    dropout=0.0,
    steps=15,
    batch_size=16,
    snapshot_every=5,
    eval_windows=16,
    prompts=2,
    prompt_tokens=8,
    new_tokens=6,
    beams=2,
)

_UNTRAINED = "15 steps of a 16-wide model: its test NLL is still above the unigram model's"
_NOISE_NLL = "15 training steps: the NLL order of three barely trained models is noise"
_NOISE_TEXT = "2 continuations of 6 tokens from barely trained models: the fraction is noise"

LANGUAGE = register(
    Experiment(
        name="wang2025.language",
        title="§6.3 / Fig. 5: GD, GD + FF and a 1-layer transformer as language models (offline story corpus)",
        config=LanguageConfig,
        presets={"smoke": _SMOKE, "quick": _QUICK, "paper": dict()},
        run=run,
        plot=plot,
        claims=claims,
        description="Generated children's stories, byte-level BPE; d' = 512, 8 heads, 256 positions, 1 layer "
        "(paper) or d' = 64, 4 heads, 64 positions (quick). Test NLL/perplexity, next-token accuracy, repetition "
        "of beam-search continuations in place of the GPT-4o grades of Fig. 5.",
        smoke_unchecked={
            "gd_beats_unigram": _UNTRAINED,
            "gd_ff_beats_unigram": _UNTRAINED,
            "gpt_beats_unigram": _UNTRAINED,
            "gd_ff_nll_close_to_transformer": _NOISE_NLL,
            "gd_not_better_than_transformer": _NOISE_NLL,
            "ff_helps_gd": _NOISE_NLL,
            "gd_repeats_at_least_as_much_as_transformer": _NOISE_TEXT,
            "transformer_more_consistent_than_gd": _NOISE_TEXT,
            "gd_ff_consistency_close_to_transformer": _NOISE_TEXT,
        },
    )
)
