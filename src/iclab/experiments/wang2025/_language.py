"""The set-up of the ``wang2025.language`` card (§6.3): its config (the paper's model sizes, the authors' training),
token windows as trainer Episodes, the token-level loss, the models, early stopping on the validation NLL, and the
evaluation after training (test NLL / perplexity / accuracy, the unigram reference, beam-search continuations with
their repetition and story consistency).

The trainer sees token windows through a thin adapter: an :class:`~iclab.core.episode.Episode` with the inputs as
``labels`` and the next tokens in ``task["targets"]`` (:func:`token_episode`). Every window lies inside one story
(:meth:`StoryLanguageData.batch`), right-padded, with the targets past the story's end set to ``IGNORE_INDEX`` so
the loss and every metric skip them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.io import atomic_torch_save
from iclab.models.language import LanguageGD, LanguageGPT, generate, next_token_nll, repeated_ngram_fraction
from iclab.tasks.language import IGNORE_INDEX, StoryLanguageData, story_consistency
from iclab.training import TrainConfig

MODELS: tuple[str, ...] = ("gd", "gd_ff", "gpt")
LABELS = {"gd": "GD", "gd_ff": "GD + FF", "gpt": "Transformer (1 layer)"}


@dataclass(frozen=True, kw_only=True)
class LanguageTolerances:
    ff_nll_rtol: float = 0.05  # GD + FF test NLL within 5 % of the transformer's (Fig. 5: GD + FF ≈ Transformer)
    order_atol: float = 0.0  # GD's NLL >= the others' − order_atol
    repetition_atol: float = 0.05
    consistency_atol: float = 0.15  # GD + FF's consistency >= the transformer's − this ("GD + FF ≈ Transformer")
    consistency_margin: float = 0.0  # the transformer's consistency >= GD's + this ("the Transformer scores better")
    unigram_margin: float = 0.0  # each model's test NLL <= the unigram NLL + margin


def _paper_train() -> TrainConfig:
    """The authors' language training (their code for §6.3): AdamW lr 1e-3 constant, β = (0.9, 0.95), weight decay 1e-2,
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

    seeds: int = 5  # the authors' 5 seeds, error bars = std over seeds
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
        for name in ("seeds", "stories", "seq_len", "d_embed", "heads", "n_layers", "eval_windows", "prompts",
                     "prompt_tokens", "new_tokens", "beams", "ngram"):  # fmt: skip
            require_int(self, name, getattr(self, name), 1)
        tc = self.train
        require(self, "train.schedule", tc.schedule in ("constant", "cosine"), "'constant' or 'cosine'", tc.schedule)
        require(self, "train.warmup_steps", 0 <= tc.warmup_steps < tc.steps,
                f"an int in [0, train.steps = {tc.steps})", tc.warmup_steps)  # fmt: skip


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


def train_windows(data: StoryLanguageData, batch: int, *, generator: torch.Generator, dtype: torch.dtype) -> Episode:
    """The training sampler: ``batch`` story-bounded windows of the train split as a token Episode
    (``functools.partial(train_windows, data)`` is the run's task)."""
    inputs, targets = data.batch("train", batch, generator=generator)
    return token_episode(inputs, targets, dtype)


def token_loss(model: nn.Module, ep: Episode) -> Tensor:
    """Mean next-token cross-entropy of a token Episode (see :func:`token_episode`)."""
    return next_token_nll(model(ep.labels), ep.task["targets"])


def build_model(name: str, cfg: LanguageConfig, vocab: int) -> nn.Module:
    """The card's model ``name`` ("gd", "gd_ff" or "gpt"), initialised from torch's global generator."""
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
    """Early stopping (the authors' protocol: reported numbers are those at the best validation NLL) as a trainer
    snapshot function: every call measures the validation windows in eval mode and, when the NLL is the lowest so
    far, writes the parameters to ``path`` (atomically; an interrupted run resumes with the best model it had found).

    A picklable callable (a module-level class holding a path and two tensors), so it travels inside a
    :class:`~iclab.training.TrainingRun` as its ``snapshot``; the best parameters live in the file, not the object.
    """

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


@dataclass
class Example:
    """One held-out story beginning and the model's continuation (decoded text)."""

    prompt: str
    continuation: str


@dataclass
class Continuations:
    """Beam-search continuations of held-out story beginnings: their mean repetition (fraction of repeated
    n-grams) and consistency (fraction with no story-grammar error), and the same for the true endings."""

    repetition: float
    true_repetition: float
    consistency: float
    true_consistency: float
    consistency_errors: dict[str, int]  # error kind -> count over the continuations
    examples: list[Example]  # the first three


def continuations(model: nn.Module, data: StoryLanguageData, cfg: LanguageConfig) -> Continuations:
    """Beam-search continuations of the first ``cfg.prompts`` test stories, and their repetition."""
    docs = data.documents["test"][: cfg.prompts]
    reps, true_reps, consistent, true_consistent = [], [], [], []
    examples: list[Example] = []
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
            examples.append(Example(prompt, data.decode(cont)))
    return Continuations(
        repetition=sum(reps) / len(reps),
        true_repetition=sum(true_reps) / len(true_reps),
        consistency=sum(consistent) / len(consistent),
        true_consistency=sum(true_consistent) / len(true_consistent),
        consistency_errors=errors,
        examples=examples,
    )
