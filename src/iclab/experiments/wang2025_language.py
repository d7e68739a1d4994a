"""Wang et al. 2025 §6.3 (Tables 1–2, Fig. 5, App. J/K): GD, GD + FF and a 1-layer transformer on stories.

Offline substitute (spec 004 §4.5): the paper's TinyStories + Children-Stories corpus, GPT-2 tokenizer and
GPT-4o grader are replaced by the package's generated story corpus (:mod:`iclab.tasks.language`), a BPE
tokenizer trained on it, and measured quantities: held-out next-token NLL / perplexity, next-token
accuracy, and the repetition (fraction of repeated 3-grams) of beam-search continuations of held-out
story beginnings — the failure mode the paper's qualitative tables show. A unigram model (train-split
token frequencies, add-one smoothed) is the no-context reference.

Training follows the authors' language code (AdamW lr 1e-3, weight decay 1e-2, global grad-norm clip 1,
batch 64, dropout 0.1 at paper size), through :func:`iclab.training.train` with a thin adapter that
carries token windows in an :class:`~iclab.core.episode.Episode` (inputs as ``labels``, next tokens in
``task["targets"]``). Every window lies inside one story (:meth:`StoryLanguageData.batch`), right-padded,
with the targets past the story's end set to ``IGNORE_INDEX`` so the loss and every metric skip them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.core.io import atomic_torch_save
from iclab.core.seeding import derive_seed
from iclab.experiments.registry import ClaimResult, Experiment, RunContext, check, register
from iclab.models.language import LanguageGD, LanguageGPT, generate, next_token_nll, repeated_ngram_fraction
from iclab.plotting import save, subplots
from iclab.tasks.language import IGNORE_INDEX, StoryLanguageData, story_consistency
from iclab.theory.categorical import language_parameter_counts
from iclab.training import TrainConfig, train

MODELS: tuple[str, ...] = ("gd", "gd_ff", "gpt")
LABELS = {"gd": "GD", "gd_ff": "GD + FF", "gpt": "Transformer (1 layer)"}


@dataclass(frozen=True, kw_only=True)
class LanguageConfig:
    """Defaults: the paper's model sizes (d' = 512, 8 heads, 256 positions, 1 layer, dropout 0.1) and
    optimiser, on the generated corpus (its BPE vocabulary saturates at ~790 ids: every word merged)."""

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
    steps: int = 5000
    batch_size: int = 64
    lr: float = 1e-3
    schedule: Literal["constant", "cosine"] = "constant"  # the authors' lr is constant
    warmup_steps: int = 0
    weight_decay: float = 1e-2
    clip: float = 1.0
    eval_every: int = 250  # validation NLL every this many steps; the reported model is the best one (early stopping)
    eval_windows: int = 512  # held-out windows for the validation curve and the test metrics (cap)
    prompts: int = 200  # held-out stories continued (the paper grades 200)
    prompt_tokens: int = 128  # the model gets the first min(prompt_tokens, len/2) tokens (the paper's rule)
    new_tokens: int = 100
    beams: int = 3
    ngram: int = 3
    # claim tolerances
    ff_nll_rtol: float = 0.05  # GD + FF test NLL within 5 % of the transformer's (spec §5 item 19)
    order_atol: float = 0.0  # GD's NLL >= the others' − order_atol
    repetition_atol: float = 0.05
    consistency_atol: float = 0.15  # GD + FF's consistency >= the transformer's − this ("GD + FF ≈ Transformer")
    consistency_margin: float = 0.0  # the transformer's consistency >= GD's + this ("the Transformer scores better")
    unigram_margin: float = 0.0  # each model's test NLL <= the unigram NLL + margin

    def __post_init__(self) -> None:
        owner = "LanguageConfig"
        require(
            owner,
            "models",
            len(self.models) >= 1 and all(m in MODELS for m in self.models),
            f"a non-empty subset of {MODELS}",
            self.models,
        )
        for name in (
            "seeds",
            "stories",
            "seq_len",
            "d_embed",
            "heads",
            "n_layers",
            "steps",
            "batch_size",
            "eval_windows",
            "prompts",
            "prompt_tokens",
            "beams",
            "ngram",
        ):
            v = getattr(self, name)
            require(owner, name, isinstance(v, int) and v >= 1, "an int >= 1", v)
        require(owner, "schedule", self.schedule in ("constant", "cosine"), "'constant' or 'cosine'", self.schedule)
        require(owner, "warmup_steps", isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps < self.steps,
                f"an int in [0, steps = {self.steps})", self.warmup_steps)  # fmt: skip
        require(
            owner,
            "new_tokens",
            isinstance(self.new_tokens, int) and self.new_tokens >= 1,
            "an int >= 1",
            self.new_tokens,
        )


def token_episode(inputs: Tensor, targets: Tensor, dtype: torch.dtype = torch.float32) -> Episode:
    """Token windows (B, T) as an Episode for the trainer: ``labels`` = inputs, ``task['targets']`` = next tokens.

    x / x_query are (B, T, 1) / (B, 1) zeros (an Episode needs covariates; the models use positions)."""
    B, T = inputs.shape
    return Episode(
        x=torch.zeros(B, T, 1, dtype=dtype, device=inputs.device),
        labels=inputs,
        x_query=torch.zeros(B, 1, dtype=dtype, device=inputs.device),
        label_query=targets[:, -1],
        task={"targets": targets},
        batched=("targets",),
    )


def token_loss(model: nn.Module, ep: Episode) -> Tensor:
    """Mean next-token cross-entropy of a token Episode (see :func:`token_episode`)."""
    return next_token_nll(model(ep.labels), ep.task["targets"])


def build_model(name: str, cfg: LanguageConfig, vocab: int) -> nn.Module:
    if name == "gpt":
        return LanguageGPT(vocab, cfg.d_embed, cfg.heads, cfg.seq_len, n_layers=cfg.n_layers, dropout=cfg.dropout)
    return LanguageGD(
        vocab,
        cfg.d_embed,
        cfg.heads,
        cfg.seq_len,
        n_layers=cfg.n_layers,
        kernel=cfg.kernel,
        ff=name == "gd_ff",
        dropout=cfg.dropout,
    )


@torch.no_grad()
def evaluate_tokens(model: nn.Module, inputs: Tensor, targets: Tensor, batch: int = 64) -> dict[str, float]:
    """Token-averaged NLL, perplexity and next-token (argmax) accuracy over (N, T) windows (eval mode)."""
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for s in range(0, inputs.shape[0], batch):
        logits = model(inputs[s : s + batch])
        t = targets[s : s + batch]
        nll += float(next_token_nll(logits, t, reduction="sum"))
        correct += int((logits.argmax(-1) == t).sum())
        count += int((t != IGNORE_INDEX).sum())
    return {"nll": nll / count, "perplexity": math.exp(nll / count), "accuracy": correct / count}


class BestCheckpoint:
    """Early stopping (spec 004 §4.0: reported numbers are those at the best validation NLL) as a trainer snapshot
    function: every call measures the validation windows in eval mode and, when the NLL is the lowest so far, writes
    the parameters to ``path`` (atomically; an interrupted run resumes with the best model it had found)."""

    def __init__(self, path: Path, inputs: Tensor, targets: Tensor) -> None:
        self.path, self.inputs, self.targets = path, inputs, targets
        self.best = float(torch.load(path, weights_only=True)["val_nll"]) if path.exists() else math.inf

    def __call__(self, model: nn.Module) -> dict[str, Tensor]:
        training = model.training
        m = evaluate_tokens(model, self.inputs, self.targets)
        model.train(training)
        if m["nll"] < self.best:
            self.best = m["nll"]
            atomic_torch_save(self.path, {"val_nll": m["nll"], "model": model.state_dict()})
        return {"val_nll": torch.tensor(m["nll"]), "val_accuracy": torch.tensor(m["accuracy"])}

    def load_best(self, model: nn.Module) -> nn.Module:
        """``model`` with the best parameters written so far."""
        model.load_state_dict(torch.load(self.path, weights_only=True)["model"])
        return model


def unigram_nll(data: StoryLanguageData, targets: Tensor) -> float:
    """NLL of add-one-smoothed train-split token frequencies: the no-context reference."""
    counts = torch.bincount(data.streams["train"], minlength=data.vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    targets = targets.flatten()
    return float(-logp[targets[targets != IGNORE_INDEX]].mean())


def continuations(model: nn.Module, data: StoryLanguageData, cfg: LanguageConfig) -> dict[str, Any]:
    """Beam-search continuations of the first ``cfg.prompts`` test stories, and their repetition."""
    docs = data.documents["test"][: cfg.prompts]
    reps, true_reps, consistent, true_consistent, examples = [], [], [], [], []
    errors: dict[str, int] = {}
    device = next(model.parameters()).device
    for doc in docs:
        p = max(1, min(cfg.prompt_tokens, doc.numel() // 2, cfg.seq_len))
        cont = generate(model, doc[:p].to(device), cfg.new_tokens, beams=cfg.beams, eot_id=data.eot_id)
        reps.append(repeated_ngram_fraction(cont, cfg.ngram))
        true_reps.append(repeated_ngram_fraction(doc[p : p + cfg.new_tokens], cfg.ngram))
        prompt = data.decode(doc[:p])
        e = story_consistency(prompt, data.decode(cont))
        consistent.append(not any(e.values()))
        true_consistent.append(not any(story_consistency(prompt, data.decode(doc[p : p + cfg.new_tokens])).values()))
        for k, v in e.items():
            errors[k] = errors.get(k, 0) + v
        if len(examples) < 3:
            examples.append({"prompt": prompt, "continuation": data.decode(cont)})
    return {
        "repetition": sum(reps) / len(reps),
        "true_repetition": sum(true_reps) / len(true_reps),
        "consistency": sum(consistent) / len(consistent),
        "true_consistency": sum(true_consistent) / len(true_consistent),
        "consistency_errors": errors,
        "examples": examples,
    }


def run(cfg: LanguageConfig, ctx: RunContext) -> dict[str, Any]:
    data = StoryLanguageData.build(stories=cfg.stories, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    V = data.vocab_size
    val_in, val_tg = (t[: cfg.eval_windows] for t in data.windows("validation"))
    test_in, test_tg = (t[: cfg.eval_windows] for t in data.windows("test"))
    val_in, val_tg = val_in.to(ctx.device), val_tg.to(ctx.device)
    val_ep = token_episode(val_in, val_tg)

    def sample(batch: int, *, generator: torch.Generator, dtype: torch.dtype) -> Episode:
        inputs, targets = data.batch("train", batch, generator=generator)
        return token_episode(inputs, targets, dtype)

    out: dict[str, Any] = {"vocab": V, "unigram_nll": unigram_nll(data, test_tg), "runs": []}
    for name in cfg.models:
        for seed in range(cfg.seeds):
            torch.manual_seed(derive_seed(seed, "wang2025.language", name))  # parameter init
            model = build_model(name, cfg, V)
            tc = TrainConfig(
                steps=cfg.steps,
                batch_size=cfg.batch_size,
                optimizer="adamw",
                lr=cfg.lr,
                schedule=cfg.schedule,
                warmup_steps=cfg.warmup_steps,
                betas=(0.9, 0.95),
                weight_decay=cfg.weight_decay,
                clip=cfg.clip,
                clip_mode="global",
                eval_every=0,  # the validation curve is the early-stopping snapshot's (eval mode)
                snapshot_every=cfg.eval_every,
                eval_batch=1,
                checkpoint_every=max(1, cfg.steps // 5),
                log_every=max(1, cfg.eval_every // 5),
                seed=derive_seed(seed, "data"),
                progress=True,
            )
            run_dir = ctx.subdir(name, f"seed{seed}")
            best = BestCheckpoint(run_dir / "best_model.pt", val_in, val_tg)
            res = train(
                model,
                sample,
                tc,
                out_dir=run_dir,
                device=ctx.device,
                loss_fn=token_loss,
                test_episode=val_ep,
                snapshot_fn=best,
                progress=ctx.progress,
                description=f"wang2025.language {name} seed {seed}",
            )
            model = best.load_best(res.model.to(ctx.device))
            metrics = evaluate_tokens(model, test_in.to(ctx.device), test_tg.to(ctx.device))
            gen = continuations(model, data, cfg)
            steps, val = res.snapshot_steps, res.snapshots["val_nll"].tolist()
            out["runs"].append(
                {
                    "model": name,
                    "seed": seed,
                    **metrics,
                    **gen,
                    "parameters": model.num_parameters(),
                    "attention_parameters": (model.q_diag if name != "gpt" else model.w_qkv).numel(),  # type: ignore[union-attr]
                    "train_seconds": res.seconds,
                    "best_step": steps[val.index(min(val))],
                    "best_val_nll": min(val),
                    "curve_steps": steps,
                    "curve_val_nll": val,
                }
            )
    out["paper_counts"] = language_parameter_counts()
    with torch.device("meta"):  # the paper's sizes, counted from the modules themselves
        out["paper_module_counts"] = {
            "gd": LanguageGD(50_258, 512, 8, 256).num_parameters(),
            "gd_ff": LanguageGD(50_258, 512, 8, 256, ff=True).num_parameters(),
            "gpt": LanguageGPT(50_258, 512, 8, 256).num_parameters(),
        }
    return out


def _mean(results: dict[str, Any], model: str, key: str) -> float:
    vals = [r[key] for r in results["runs"] if r["model"] == model]
    return sum(vals) / len(vals) if vals else float("nan")


def plot(results: dict[str, Any], cfg: LanguageConfig, out: Path) -> list[Path]:
    fig, ax = subplots(1, 3, size=(3.6, 2.8))
    for name in cfg.models:
        runs = [r for r in results["runs"] if r["model"] == name]
        for i, r in enumerate(runs):
            ax[0, 0].plot(
                r["curve_steps"],
                r["curve_val_nll"],
                color=f"C{MODELS.index(name)}",
                label=LABELS[name] if i == 0 else None,
            )
    ax[0, 0].axhline(results["unigram_nll"], color="gray", ls=":", label="unigram")
    ax[0, 0].set(xlabel="step", ylabel="validation NLL (nats/token)", title="training")
    ax[0, 0].set_ylim(0, 1.5 * results["unigram_nll"])  # the GD models start high: LN'd embeddings in the logits
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


def claims(results: dict[str, Any], cfg: LanguageConfig) -> list[ClaimResult]:
    pc, mc = results["paper_counts"], results["paper_module_counts"]
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
                hi=results["unigram_nll"] + cfg.unigram_margin,
                detail=f"test NLL vs unigram {results['unigram_nll']:.3f}: the model uses the context",
            )
        )
    if {"gd_ff", "gpt"} <= have:
        ratio = _mean(results, "gd_ff", "nll") / _mean(results, "gpt", "nll")
        out.append(
            check(
                "gd_ff_nll_close_to_transformer",
                ratio,
                hi=1 + cfg.ff_nll_rtol,
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
                lo=-cfg.order_atol,
                detail="Fig. 5: the transformer scores better than GD",
            )
        )
        out.append(
            check(
                "gd_repeats_at_least_as_much_as_transformer",
                _mean(results, "gd", "repetition") - _mean(results, "gpt", "repetition"),
                lo=-cfg.repetition_atol,
                detail=f"repeated {cfg.ngram}-grams of beam-{cfg.beams} continuations; GD "
                f"{_mean(results, 'gd', 'repetition'):.3f}, TF {_mean(results, 'gpt', 'repetition'):.3f}, "
                f"true endings {_mean(results, 'gd', 'true_repetition'):.3f}",
            )
        )
        out.append(
            check(
                "transformer_more_consistent_than_gd",
                _mean(results, "gpt", "consistency") - _mean(results, "gd", "consistency"),
                lo=cfg.consistency_margin,
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
                hi=cfg.consistency_atol,
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
                lo=-cfg.order_atol,
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
    eval_every=100,
    eval_windows=128,
    prompts=48,  # the consistency fraction's resolution (16 gave 1/16 steps and flipped claims between runs)
    prompt_tokens=32,
    new_tokens=40,
)

LANGUAGE = register(
    Experiment(
        name="wang2025.language",
        title="§6.3 / Fig. 5: GD, GD + FF and a 1-layer transformer as language models (offline story corpus)",
        config=LanguageConfig,
        presets={
            "smoke": dict(
                seeds=1,
                stories=300,
                vocab_size=300,
                seq_len=32,
                d_embed=16,
                heads=2,
                dropout=0.0,
                steps=15,
                batch_size=16,
                eval_every=5,
                eval_windows=16,
                prompts=2,
                prompt_tokens=8,
                new_tokens=6,
                beams=2,
                ff_nll_rtol=10.0,
                order_atol=10.0,
                repetition_atol=1.0,
                consistency_atol=1.0,
                consistency_margin=-1.0,
                unigram_margin=10.0,
            ),
            "quick": _QUICK,
            "paper": dict(),
        },
        run=run,
        plot=plot,
        claims=claims,
        description="Generated children's stories, byte-level BPE; d' = 512, 8 heads, 256 positions, 1 layer "
        "(paper) or d' = 64, 4 heads, 64 positions (quick). Test NLL/perplexity, next-token accuracy, repetition "
        "of beam-search continuations in place of the GPT-4o grades of Fig. 5.",
    )
)
