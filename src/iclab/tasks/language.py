"""Next-token language data generated offline (Wang et al. 2025, §6.3, offline substitute).

The paper trains 1-layer models on TinyStories + Children-Stories with the GPT-2 tokenizer; both come
from the Hugging Face hub. This module replaces them with things that need no network:

* :func:`story_corpus`: a seeded generator of short templated children's stories (a vocabulary of a
  few hundred words; characters, objects and places are chosen per story and recur later in it, so
  predicting them needs the context: the in-context part of the task). 4000 stories ≈ 2.5 MB.
* :func:`train_tokenizer`: a byte-level BPE tokenizer trained on the corpus with the ``tokenizers``
  library, with the special tokens ``<|endoftext|>`` (appended to every story, as the paper does) and
  ``<|pad|>``. Byte-level BPE round-trips any text exactly. Trained tokenizers are cached on disk
  (written atomically) under ``cache_dir`` (default ``$ICLAB_CACHE`` or ``~/.cache/iclab``), keyed by
  a hash of the corpus and the settings.
* :class:`StoryLanguageData`: the corpus split by story (seeded) into train / validation / test, and
  next-token windows ``(B, T)`` inputs with ``(B, T)`` targets shifted by one. **A window never crosses a
  story boundary**: every row holds tokens of one story only, right-padded with ``<|pad|>`` where the
  story ends, and its targets are :data:`IGNORE_INDEX` wherever there is no next token of the same story
  (the story's closing EOT predicts nothing). The models are causal, so right padding leaves the logits
  at real positions unchanged, and :func:`iclab.models.language.next_token_nll` skips the ignored targets.

>>> data = StoryLanguageData.build(stories=4000, vocab_size=1024, seq_len=64)
>>> inputs, targets = data.batch("train", 64, generator=iclab.generator(0))   # (64, 64) int64 each
>>> loss = next_token_nll(model(inputs), targets)                          # ignores IGNORE_INDEX
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from iclab.core.errors import require, require_int
from iclab.core.io import atomic_write_text
from iclab.core.seeding import derive_seed, generator

if TYPE_CHECKING:
    from tokenizers import Tokenizer

EOT = "<|endoftext|>"
PAD = "<|pad|>"
IGNORE_INDEX = -100  # target of positions without a next token in the same story (torch's cross-entropy default)
Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = ("train", "validation", "test")

# ---- the story grammar -------------------------------------------------------------------------------------

_NAMES = [
    "Lily",
    "Tom",
    "Mia",
    "Ben",
    "Sue",
    "Max",
    "Anna",
    "Sam",
    "Lucy",
    "Jack",
    "Emma",
    "Leo",
    "Zoe",
    "Tim",
    "Ella",
    "Finn",
    "Rosa",
    "Ned",
    "Ivy",
    "Otto",
    "Kim",
    "Bob",
]
_ANIMALS = [
    "cat",
    "dog",
    "bunny",
    "bear",
    "fox",
    "bird",
    "duck",
    "frog",
    "mouse",
    "owl",
    "pig",
    "lamb",
    "puppy",
    "kitten",
    "turtle",
    "squirrel",
]
_ADJS = ["little", "happy", "brave", "shy", "kind", "curious", "sleepy", "silly", "tiny", "gentle", "clever", "busy"]
_COLORS = ["red", "blue", "green", "yellow", "purple", "pink", "orange", "shiny", "golden", "soft"]
_OBJECTS = [
    "ball",
    "kite",
    "hat",
    "box",
    "book",
    "drum",
    "boat",
    "key",
    "shell",
    "cup",
    "flower",
    "balloon",
    "apple",
    "cookie",
    "star",
    "stone",
]
_PLACES = [
    "a small house",
    "a big forest",
    "a quiet village",
    "a green park",
    "a sunny farm",
    "a tall tree",
    "a busy town",
    "a little garden",
]
_SPOTS = [
    "under the bed",
    "near the river",
    "behind a rock",
    "in the grass",
    "on the hill",
    "by the old fence",
    "inside a bush",
]
_ACTIVITIES = [
    "play in the sun",
    "sing songs",
    "run with the wind",
    "look at the clouds",
    "jump in puddles",
    "draw pictures",
    "pick berries",
    "splash in the pond",
    "read books",
    "dance in the rain",
]
_FEELINGS = ["happy", "sad", "scared", "excited", "surprised", "worried", "proud", "glad"]
_PROBLEMS = [
    "the {obj} fell into the water",
    "the wind blew the {obj} away",
    "the {obj} got stuck in a tree",
    "a big dog took the {obj}",
    "the {obj} rolled down the hill",
    "it started to rain on the {obj}",
]
_FIXES = [
    "{friend} used a long stick to get the {obj} back",
    "{friend} climbed up and brought the {obj} down",
    "{friend} asked a kind bird to help",
    "{friend} ran fast and caught the {obj}",
    "{friend} and {hero} worked together and found the {obj}",
]
_MORALS = [
    "friends help each other",
    "sharing makes everyone happy",
    "it is good to be kind",
    "being brave is important",
    "we should never give up",
    "working together is the best",
]


def _story(r: random.Random) -> str:
    hero, friend = r.sample(_NAMES, 2)
    animal, fanimal = r.sample(_ANIMALS, 2)
    obj, color, adj = r.choice(_OBJECTS), r.choice(_COLORS), r.choice(_ADJS)
    place, spot, act = r.choice(_PLACES), r.choice(_SPOTS), r.choice(_ACTIVITIES)
    he = r.choice(["he", "she"])
    his = {"he": "his", "she": "her"}[he]
    opening = r.choice(
        [
            f"Once upon a time, there was a {adj} {animal} named {hero}.",
            f"One day, a {adj} {animal} called {hero} woke up early.",
            f"There once lived a {adj} {animal}. The {animal} was called {hero}.",
        ]
    )
    s = [opening, f"{hero} lived in {place}.", f"Every day, {hero} liked to {act}."]
    if r.random() < 0.6:
        s.append(f"{hero} had a good friend, a {fanimal} named {friend}.")
    else:
        s.append(f"{he.capitalize()} had a friend named {friend}. {friend} was a {r.choice(_ADJS)} {fanimal}.")
    s.append(f"One day, {hero} found a {color} {obj} {spot}.")
    s.append(r.choice([f"{hero} was very {r.choice(_FEELINGS)}.", f'"Look, a {color} {obj}!" said {hero}.']))
    if r.random() < 0.5:
        s.append(f'{hero} showed the {obj} to {friend}. {friend} said, "What a nice {obj}!"')
    s.append(f"But then {r.choice(_PROBLEMS).format(obj=obj)}.")
    s.append(f"{hero} felt {r.choice(['sad', 'scared', 'worried'])}. {he.capitalize()} wanted {his} {obj} back.")
    s.append(f"{r.choice(_FIXES).format(friend=friend, hero=hero, obj=obj)}.")
    s.append(f'"Thank you, {friend}!" said {hero}. {hero} was {r.choice(["happy", "glad", "proud"])} again.')
    if r.random() < 0.5:
        s.append(f"From that day on, {hero} and {friend} liked to {r.choice(_ACTIVITIES)} together.")
    if r.random() < 0.7:
        s.append(f"The moral of the story is that {r.choice(_MORALS)}.")
    return " ".join(s)


_NAME_RE = re.compile(r"\b(" + "|".join(_NAMES) + r")\b")
_OBJECT_RE = re.compile(r"\b(" + "|".join(_OBJECTS) + r")\b")
_INTRO_RE = re.compile(r"\b(?:named|called) (" + "|".join(_NAMES) + r")\b")
_SELF_RES = (  # one character on both sides of a two-character template
    re.compile(r"\b(\w+) showed the \w+ to \1\b"),
    re.compile(r'"Thank you, (\w+)!" said \1\b'),
    re.compile(r"\b(\w+) and \1\b"),
)


def story_consistency(prompt: str, continuation: str) -> dict[str, int]:
    """Consistency errors of a continuation of a generated story (:func:`story_corpus`), the measurable part of the
    "Consistency" grade the paper asks GPT-4o for (Wang et al. 2025 App. J). Every story has exactly two
    characters and one object, so with the grammar known a continuation can be checked mechanically:

    * ``unknown_name``: a name used in the continuation that is neither in the prompt nor introduced in the
      continuation first ("named X" / "called X");
    * ``extra_character``: each distinct name beyond the story's two;
    * ``self_reference``: one character on both sides of a two-character template ("X showed the kite to X",
      '"Thank you, X!" said X', "X and X");
    * ``object_switch``: an object word other than the story's object (the first one in the prompt, else in the
      continuation).

    Returns the four counts (0 everywhere for every true ending of the corpus; tested).
    """
    unknown, text, start = 0, prompt + continuation, len(prompt)
    mentions = list(_NAME_RE.finditer(text))  # on the joined text: a cut may fall inside a word
    known = {m.group(1) for m in mentions if m.end(1) <= start}  # names the prompt holds whole
    introduced = {m.start(1) for m in _INTRO_RE.finditer(text)}  # "named X" may straddle the cut, and so may X
    for m in (m for m in mentions if m.end(1) > start):
        if m.start(1) in introduced:
            known.add(m.group(1))
        elif m.group(1) not in known:
            unknown += 1
            known.add(m.group(1))  # counted once
    objects = list(_OBJECT_RE.finditer(text))
    story_object = objects[0].group(1) if objects else None
    return {
        "unknown_name": unknown,
        "extra_character": max(0, len({m.group(1) for m in mentions}) - 2),
        "self_reference": sum(
            1 for r in _SELF_RES for m in r.finditer(text) if m.end() > start and m.group(1) in _NAMES
        ),
        "object_switch": sum(1 for m in objects if m.end(1) > start and m.group(1) != story_object),
    }


def story_corpus(count: int = 4000, *, seed: int = 0) -> list[str]:
    """``count`` templated children's stories, a deterministic function of ``seed`` (no download).

    Uses an explicitly seeded ``random.Random`` (per-word draws through a torch generator would be
    far slower; the stream is equally reproducible across platforms).
    """
    require_int("story_corpus", "count", count, 1)
    r = random.Random(derive_seed(seed, "story-corpus"))
    return [_story(r) for _ in range(count)]


# ---- tokenizer -----------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$ICLAB_CACHE`` if set, else ``~/.cache/iclab``."""
    return Path(os.environ.get("ICLAB_CACHE", Path.home() / ".cache" / "iclab"))


def train_tokenizer(texts: list[str], vocab_size: int = 1024, *, cache_dir: str | Path | None = None) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` with ``vocab_size`` ids (special tokens included).

    Cached as ``<cache_dir>/tokenizers/bpe-<hash>.json``, the hash covering the texts, ``vocab_size``
    and the ``tokenizers`` version; the file is written atomically, so concurrent builders are safe.
    """
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    require("train_tokenizer", "texts", len(texts) >= 1, "a non-empty list of strings", f"{len(texts)} texts")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    require_int(
        "train_tokenizer", "vocab_size", vocab_size, len(alphabet) + 2, note="256 byte symbols + 2 special tokens"
    )
    h = hashlib.blake2b(digest_size=12)
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    h.update(f"{vocab_size}|{tokenizers.__version__}|{EOT}|{PAD}".encode())
    path = Path(cache_dir or default_cache_dir()) / "tokenizers" / f"bpe-{h.hexdigest()}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT, PAD], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    atomic_write_text(path, tok.to_str())
    return tok


# ---- next-token data -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StoryLanguageData:
    """A story corpus split by story, and next-token windows of ``seq_len`` tokens inside single stories.

    Build with :meth:`build` (the generated corpus) or :meth:`from_texts` (any list of documents).
    ``documents[split]`` holds the per-story token ids (EOT appended, as the paper does), e.g. for
    prompting generation; ``streams[split]`` is their 1-D int64 concatenation (token statistics only:
    windows are never cut from it across stories).

    Windows (Wang et al. 2025 §6.3; the authors' code feeds one story per row, truncated to 256
    tokens, padded, pad ignored by the loss). A story of L tokens (EOT included) has the next-token pairs
    (t_j → t_{j+1}), j < L − 1. A row covers the T + 1 tokens t_s..t_{s+T} of one story (T = ``seq_len``):
    ``inputs[:, i] = t_{s+i}`` and ``targets[:, i] = t_{s+i+1}``; the input t_{L−1} (the story's EOT) has
    target :data:`IGNORE_INDEX`, and positions past it hold ``pad_id`` / :data:`IGNORE_INDEX`, so no
    target is ever a token of another story and no input is ever preceded by one. Position 0 of a row is the story's token s, so
    when every story fits (L ≤ T + 1: the generated stories have ~100-160 tokens at vocab ≈ 790, the
    paper's T = 256) a row is exactly the paper's one padded story from its beginning.

    * :meth:`batch` (training): each row picks a story with probability proportional to its number of
      windows, ⌈(L − 1)/T⌉, then a start s uniform in {0, …, max(0, L − T − 1)}: one padded story per row
      when it fits, a uniformly placed full window inside it otherwise. Departure from the paper: a story
      longer than T + 1 is not truncated to its beginning; any part of it can be drawn. Target tokens are
      drawn at rates within a factor ≈ 2 of each other, except the first and last T of a story longer
      than T + 1, which (as with any random crop) are drawn less often.
    * :meth:`windows` (evaluation): every story cut into consecutive windows starting at s = 0, T, 2T, …,
      so every next-token pair of the split is a target exactly once; a window with s > 0 sees only the
      story from t_s on.

    Mean losses and accuracies must therefore count only targets ``!= IGNORE_INDEX``.
    """

    tokenizer: Tokenizer
    streams: dict[str, Tensor]
    documents: dict[str, list[Tensor]]
    seq_len: int

    @classmethod
    def build(
        cls,
        *,
        stories: int = 4000,
        corpus_seed: int = 0,
        vocab_size: int = 1024,
        seq_len: int = 64,
        fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
        split_seed: int = 0,
        cache_dir: str | Path | None = None,
    ) -> StoryLanguageData:
        """The generated corpus of ``stories`` stories, tokenised and split (train, validation, test)."""
        return cls.from_texts(
            story_corpus(stories, seed=corpus_seed),
            vocab_size=vocab_size,
            seq_len=seq_len,
            fractions=fractions,
            split_seed=split_seed,
            cache_dir=cache_dir,
        )

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        *,
        vocab_size: int = 1024,
        seq_len: int = 64,
        fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
        split_seed: int = 0,
        cache_dir: str | Path | None = None,
    ) -> StoryLanguageData:
        """Split ``texts`` by document with a seeded permutation, train the tokenizer on the train split only.

        Raises ``ConfigError`` naming ``seq_len`` if a split holds fewer than seq_len + 1 tokens in all (a
        window may exceed one story, it is padded, but not the whole split), and naming ``texts`` if a
        split has no document with text (nothing to predict).
        """
        owner = "StoryLanguageData"
        require_int(owner, "seq_len", seq_len, 1)
        require(
            owner,
            "fractions",
            len(fractions) == 3 and all(f > 0 for f in fractions) and abs(sum(fractions) - 1) < 1e-9,
            "three positive fractions (train, validation, test) summing to 1",
            fractions,
        )
        require(owner, "texts", len(texts) >= 3, "at least 3 documents (one per split)", f"{len(texts)} documents")
        perm = torch.randperm(len(texts), generator=generator(derive_seed(split_seed, "story-split"))).tolist()
        n_val = max(1, round(fractions[1] * len(texts)))
        n_test = max(1, round(fractions[2] * len(texts)))
        n_train = len(texts) - n_val - n_test
        require(owner, "texts", n_train >= 1, "enough documents for a non-empty train split", len(texts))
        parts = {
            "train": perm[:n_train],
            "validation": perm[n_train : n_train + n_val],
            "test": perm[n_train + n_val :],
        }
        tok = train_tokenizer([texts[i] for i in parts["train"]], vocab_size, cache_dir=cache_dir)
        eot = tok.token_to_id(EOT)
        documents, streams = {}, {}
        for split, idx in parts.items():
            enc = tok.encode_batch([texts[i] for i in idx])
            documents[split] = [torch.tensor([*e.ids, eot], dtype=torch.long) for e in enc]
            streams[split] = torch.cat(documents[split])
            require(
                owner,
                "texts",
                any(d.numel() >= 2 for d in documents[split]),
                f"documents with text in every split (the {split} split has only empty ones)",
                f"{len(idx)} empty documents",
            )
            require(
                owner,
                "seq_len",
                streams[split].numel() >= seq_len + 1,
                f"an int <= {streams[split].numel() - 1} (the {split} split holds {streams[split].numel()} tokens; "
                "a window needs seq_len + 1), or a longer corpus",
                seq_len,
            )
        return cls(tokenizer=tok, streams=streams, documents=documents, seq_len=seq_len)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return self.tokenizer.get_vocab_size()

    @property
    def eot_id(self) -> int:
        """Token id of the end-of-text token."""
        return self._special_id(EOT)

    @property
    def pad_id(self) -> int:
        """Token id of the padding token."""
        return self._special_id(PAD)

    def _special_id(self, token: str) -> int:
        i = self.tokenizer.token_to_id(token)
        assert i is not None, f"{token} is not in the vocabulary"  # train_tokenizer adds it as a special token
        return i

    def encode(self, text: str) -> Tensor:
        """Token ids of ``text``, (len,) int64."""
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        """The text of token ids ``ids`` (special tokens kept)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def _stream(self, split: str) -> Tensor:
        require("StoryLanguageData", "split", split in SPLITS, f"one of {SPLITS}", split)
        return self.streams[split]

    @cached_property
    def _layout(self) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
        """Per split: story lengths L (D,), their offsets in the stream (D,), windows per story ⌈(L−1)/T⌉ (D,)."""
        out = {}
        for split, docs in self.documents.items():
            length = torch.tensor([d.numel() for d in docs], dtype=torch.long)
            offset = torch.cumsum(length, 0) - length
            out[split] = (length, offset, (length - 1 + self.seq_len - 1) // self.seq_len)
        return out

    def _gather(self, split: str, doc: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """Rows of story ``doc (R,)`` from token ``start (R,)``: padded inputs and masked targets (R, T)."""
        stream = self._stream(split).to(doc.device)
        length, offset, _ = (t.to(doc.device) for t in self._layout[split])
        j = start.unsqueeze(1) + torch.arange(self.seq_len + 1, device=doc.device)  # (R, T+1) index in the story
        inside = j < length[doc].unsqueeze(1)  # (R, T+1)
        tok = stream[(offset[doc].unsqueeze(1) + j).clamp_max(stream.numel() - 1)]  # (R, T+1)
        inputs = torch.where(inside[:, :-1], tok[:, :-1], self.pad_id)
        targets = torch.where(inside[:, 1:], tok[:, 1:], IGNORE_INDEX)
        return inputs, targets

    def batch(self, split: Split, batch: int, *, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``batch`` random windows inside single stories (class docstring): inputs (B, T), right-padded with
        ``pad_id``, and next-token targets (B, T), :data:`IGNORE_INDEX` past the story's last token; on the
        generator's device. ``targets[:, t] = inputs[:, t+1]`` wherever both are inside the story."""
        require_int("StoryLanguageData", "batch", batch, 1)
        self._stream(split)
        dev = generator.device
        length, _, count = (t.to(dev) for t in self._layout[split])
        cum = torch.cumsum(count, 0)  # (D,)
        u = torch.randint(0, int(cum[-1]), (batch,), generator=generator, device=dev)  # (B,) a window number
        doc = torch.searchsorted(cum, u, right=True)  # (B,) story ∝ its number of windows
        top = (length[doc] - self.seq_len - 1).clamp_min(0)  # (B,) last start with a full window
        start = torch.randint(0, 2**62, (batch,), generator=generator, device=dev) % (top + 1)  # (B,) uniform
        return self._gather(split, doc, start)

    def windows(self, split: Split) -> tuple[Tensor, Tensor]:
        """Every story of the split cut into consecutive windows (starts 0, T, 2T, …), stories in order:
        inputs and targets (num, T) as in :meth:`batch`. Each next-token pair of the split is a target
        exactly once, so a full pass over these is the split's token-averaged loss."""
        self._stream(split)
        _, _, count = self._layout[split]
        doc = torch.repeat_interleave(torch.arange(count.numel()), count)  # (num,)
        first = torch.cumsum(count, 0) - count  # (D,) index of each story's first window
        start = (torch.arange(doc.numel()) - first[doc]) * self.seq_len  # (num,)
        return self._gather(split, doc, start)
