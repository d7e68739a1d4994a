"""The offline language data (Wang et al. 2025 §6.3 substitute) and the §2.4 parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from iclab.core.errors import ConfigError
from iclab.tasks.language import EOT, StoryLanguageData, story_corpus, train_tokenizer
from iclab.theory.categorical import language_parameter_counts


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iclab-cache")


@pytest.fixture(scope="module")
def data(cache) -> StoryLanguageData:
    return StoryLanguageData.build(stories=300, vocab_size=400, seq_len=32, cache_dir=cache)


def test_corpus_is_seeded() -> None:
    a, b, c = story_corpus(50, seed=1), story_corpus(50, seed=1), story_corpus(50, seed=2)
    assert a == b and a != c and len(a) == 50
    assert all(s.endswith(".") or s.endswith('"') for s in a)
    assert sum(map(len, story_corpus(400))) > 200_000  # ~600 characters a story: 4000 stories ≈ 2.5 MB


def test_splits_are_disjoint_documents_with_eot(data) -> None:
    docs = {k: [tuple(d.tolist()) for d in v] for k, v in data.documents.items()}
    assert [len(docs[k]) for k in ("train", "validation", "test")] == [270, 15, 15]
    assert not set(docs["train"]) & set(docs["test"]) and not set(docs["train"]) & set(docs["validation"])
    eot = data.eot_id
    for split, ds in data.documents.items():
        assert all(int(d[-1]) == eot and int((d == eot).sum()) == 1 for d in ds)
        assert torch.equal(data.streams[split], torch.cat(ds))
    assert data.pad_id != eot and data.vocab_size <= 400


def test_tokenizer_round_trip(data) -> None:
    for story in story_corpus(20, seed=9):
        assert data.decode(data.encode(story)) == story
    assert data.decode(data.documents["test"][0]).endswith(EOT)


@settings(max_examples=15, deadline=None)
@given(text=st.text(max_size=60))
def test_tokenizer_round_trips_any_text(data, text: str) -> None:
    """Byte-level BPE: every string, unseen symbols included, survives encode → decode."""
    assert data.decode(data.encode(text)) == text


def test_tokenizer_is_cached_atomically(cache) -> None:
    texts = story_corpus(40, seed=3)
    before = set((cache / "tokenizers").glob("*")) if (cache / "tokenizers").exists() else set()
    tok = train_tokenizer(texts, 300, cache_dir=cache)
    files = set((cache / "tokenizers").glob("*")) - before
    assert len(files) == 1 and next(iter(files)).suffix == ".json"  # one file, no temporary left behind
    again = train_tokenizer(texts, 300, cache_dir=cache)
    assert again.get_vocab() == tok.get_vocab()
    assert set((cache / "tokenizers").glob("*")) - before == files
    other = train_tokenizer(texts, 290, cache_dir=cache)  # different settings: a different cache entry
    assert other.get_vocab_size() <= 290 and len(set((cache / "tokenizers").glob("*")) - before) == 2


def test_next_token_batches(data) -> None:
    g = iclab.generator(0)
    x, y = data.batch("train", 16, generator=g)
    assert x.shape == (16, 32) and y.shape == (16, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    all_windows = data.streams["train"].unfold(0, 33, 1)  # (M, 33): every contiguous slice of the stream
    for b in range(16):
        assert bool((all_windows == torch.cat([x[b], y[b, -1:]])).all(-1).any())
    x2, _ = data.batch("train", 16, generator=iclab.generator(0))
    assert torch.equal(x, x2)
    wx, wy = data.windows("validation")
    assert wx.shape[1] == 32 and torch.equal(wx.reshape(-1), data.streams["validation"][: wx.numel()])
    assert torch.equal(wy.reshape(-1), data.streams["validation"][1 : wx.numel() + 1])


def test_bad_input_is_named(cache) -> None:
    with pytest.raises(
        ConfigError,
        match=r"StoryLanguageData\.seq_len must be an int <= \d+ \(the (validation|test) split holds \d+ tokens",
    ):
        StoryLanguageData.build(stories=20, vocab_size=300, seq_len=2000, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"StoryLanguageData\.seq_len must be an int >= 1; got 0"):
        StoryLanguageData.build(stories=20, vocab_size=300, seq_len=0, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"StoryLanguageData\.fractions"):
        StoryLanguageData.build(stories=20, fractions=(0.5, 0.5, 0.5), cache_dir=cache)
    with pytest.raises(ConfigError, match=r"train_tokenizer\.vocab_size must be an int >= 258"):
        train_tokenizer(["a b"], 100, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"StoryLanguageData\.split must be one of"):
        StoryLanguageData.build(stories=30, vocab_size=300, seq_len=8, cache_dir=cache).batch(
            "dev", 2, generator=iclab.generator(0)
        )
    with pytest.raises(ConfigError, match=r"story_corpus\.count must be an int >= 1; got 0"):
        story_corpus(0)


def test_language_parameter_counts_reproduce_the_spec() -> None:
    """Spec 004 §2.4 table (V = 50258, d' = 512, H = 8, S = 256) and the Fig. 5 caption's 8K vs 6.3M."""
    c = language_parameter_counts()
    assert c["gd"]["total"] == 27_966_464
    assert c["gd_ff"]["total"] == 30_064_128
    assert c["gpt"]["total"] == 36_350_976
    assert c["gd"]["wte"] == 25_732_096 and c["gd"]["wpe"] == 257 * 512 and c["gpt"]["wpe"] == 256 * 512
    assert c["gd"]["qkv"] == 4_096 and c["gd"]["qkv_reported"] == 8_192 and c["gpt"]["qkv"] == 6_291_456
    assert c["gd"]["w_o"] == 2_097_152 and c["gd_ff"]["ff"] == 2_097_664
    assert round(100 * c["gd"]["qkv_reported"] / c["gpt"]["qkv"], 2) == 0.13
    small = language_parameter_counts(vocab=100, d_embed=8, heads=2, seq_len=16, n_layers=2)
    assert small["gpt"]["qkv"] == 2 * 3 * 2 * 64 and small["gd"]["w_o"] == 2 * 2 * 64
    with pytest.raises(ConfigError, match=r"language_parameter_counts\.heads must be an int >= 1; got 0"):
        language_parameter_counts(heads=0)
