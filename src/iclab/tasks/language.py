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
* :class:`StoryLanguageData`: the corpus split by story (seeded) into train / validation / test token
  streams, and next-token windows ``(B, T)`` inputs with ``(B, T)`` targets shifted by one.

>>> data = StoryLanguageData.build(stories=4000, vocab_size=1024, seq_len=64)
>>> inputs, targets = data.batch("train", 64, generator=iclab.generator(0))   # (64, 64) int64 each
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from iclab.core.errors import require
from iclab.core.io import atomic_write_text
from iclab.core.seeding import derive_seed, generator

EOT = "<|endoftext|>"
PAD = "<|pad|>"
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


def story_corpus(count: int = 4000, *, seed: int = 0) -> list[str]:
    """``count`` templated children's stories, a deterministic function of ``seed`` (no download).

    Uses an explicitly seeded ``random.Random`` (per-word draws through a torch generator would be
    far slower; the stream is equally reproducible across platforms).
    """
    require("story_corpus", "count", isinstance(count, int) and count >= 1, "an int >= 1", count)
    r = random.Random(derive_seed(seed, "story-corpus"))
    return [_story(r) for _ in range(count)]


# ---- tokenizer -----------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$ICLAB_CACHE`` if set, else ``~/.cache/iclab``."""
    return Path(os.environ.get("ICLAB_CACHE", Path.home() / ".cache" / "iclab"))


def train_tokenizer(texts: list[str], vocab_size: int = 1024, *, cache_dir: str | Path | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` with ``vocab_size`` ids (special tokens included).

    Cached as ``<cache_dir>/tokenizers/bpe-<hash>.json``, the hash covering the texts, ``vocab_size``
    and the ``tokenizers`` version; the file is written atomically, so concurrent builders are safe.
    """
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    require("train_tokenizer", "texts", len(texts) >= 1, "a non-empty list of strings", f"{len(texts)} texts")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    require(
        "train_tokenizer",
        "vocab_size",
        isinstance(vocab_size, int) and vocab_size >= len(alphabet) + 2,
        f"an int >= {len(alphabet) + 2} (256 byte symbols + 2 special tokens)",
        vocab_size,
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
    """Token streams of a story corpus split by story, and next-token windows of ``seq_len`` tokens.

    Build with :meth:`build` (the generated corpus) or :meth:`from_texts` (any list of documents).
    ``streams[split]`` is the 1-D int64 concatenation of that split's stories, each followed by EOT;
    ``documents[split]`` the per-story token ids (EOT included), e.g. for prompting generation.
    """

    tokenizer: object  # tokenizers.Tokenizer
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

        Raises ``ConfigError`` naming ``seq_len`` if a split holds fewer than seq_len + 1 tokens.
        """
        owner = "StoryLanguageData"
        require(owner, "seq_len", isinstance(seq_len, int) and seq_len >= 1, "an int >= 1", seq_len)
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
        return self.tokenizer.token_to_id(EOT)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id(PAD)

    def encode(self, text: str) -> Tensor:
        """Token ids of ``text``, (len,) int64."""
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def _stream(self, split: str) -> Tensor:
        require("StoryLanguageData", "split", split in SPLITS, f"one of {SPLITS}", split)
        return self.streams[split]

    def batch(self, split: Split, batch: int, *, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``batch`` windows at uniform random offsets: inputs (B, T) and next-token targets (B, T), on the
        generator's device. ``targets[:, t] = inputs[:, t+1]`` for t < T − 1 (T = seq_len)."""
        require("StoryLanguageData", "batch", isinstance(batch, int) and batch >= 1, "an int >= 1", batch)
        s = self._stream(split).to(generator.device)
        T = self.seq_len
        start = torch.randint(0, s.numel() - T, (batch,), generator=generator, device=generator.device)  # (B,)
        win = s[start.unsqueeze(1) + torch.arange(T + 1, device=s.device)]  # (B, T+1)
        return win[:, :-1], win[:, 1:]

    def windows(self, split: Split) -> tuple[Tensor, Tensor]:
        """Every non-overlapping window of the split, in order: inputs and targets (num, T), for a full pass."""
        s, T = self._stream(split), self.seq_len
        num = (s.numel() - 1) // T
        win = s[: num * T + 1]
        return win[:-1].reshape(num, T), win[1:].reshape(num, T)
