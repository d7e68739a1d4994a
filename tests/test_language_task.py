"""The offline language data (Wang et al. 2025 §6.3 substitute) and the §2.4 parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import iclab
from iclab.core.errors import ConfigError
from iclab.tasks.language import (
    EOT,
    IGNORE_INDEX,
    StoryLanguageData,
    story_consistency,
    story_corpus,
    train_tokenizer,
)
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


def _story_of(data: StoryLanguageData, split: str, x: Tensor, y: Tensor) -> list[tuple[int, int]]:
    """For each row, a (story, start) whose tokens the row's real positions are, with the padding exactly
    where that story ends; fails if there is none. (Found by a byte search; templated stories may repeat
    a short slice, then any consistent occurrence is returned.)"""
    docs = [d.to(torch.int32).numpy().tobytes() for d in data.documents[split]]
    T = data.seq_len
    out = []
    for xb, yb in zip(x, y, strict=True):
        real = int((yb != IGNORE_INDEX).sum())  # inputs 0..real-1 and targets 0..real-1 are story tokens
        assert real >= 1 and bool((yb[:real] != IGNORE_INDEX).all()), "targets must be a real prefix"
        if real < T:  # the story ended: its EOT is the next input (with no target), then padding
            assert int(xb[real]) == data.eot_id and bool((xb[real + 1 :] == data.pad_id).all())
        seq = torch.cat([xb[:real], yb[real - 1 : real]]).to(torch.int32).numpy().tobytes()  # t_s..t_{s+real}
        found = None
        for k, d in enumerate(docs):
            at = d.find(seq)
            while at >= 0 and found is None:
                s, L = at // 4, len(d) // 4
                if at % 4 == 0 and real == min(T, L - 1 - s):
                    found = (k, s)
                at = d.find(seq, at + 1)
            if found:
                break
        assert found is not None, "a row is not a slice of one story ending where the story or the window ends"
        out.append(found)
    return out


def test_batches_stay_inside_one_story(data) -> None:
    """Every row is a slice of one story: right-padded with pad_id, targets IGNORE_INDEX past the story's
    last token (its EOT predicts nothing), so no input and no target comes from a second story."""
    x, y = data.batch("train", 48, generator=iclab.generator(0))
    assert x.shape == (48, 32) and y.shape == (48, 32) and x.dtype == torch.int64 == y.dtype
    mask = y != IGNORE_INDEX
    assert torch.equal(x[:, 1:][mask[:, :-1]], y[:, :-1][mask[:, :-1]])  # targets are the next inputs
    assert not bool((x[:, 1:][mask[:, :-1]] == data.eot_id).any())  # EOT only ever closes a row's story
    rows = _story_of(data, "train", x, y)
    assert len({k for k, _ in rows}) > 40  # 48 draws from 270 stories: mostly distinct
    assert {s for _, s in rows} != {0}  # stories are longer than T + 1: random starts inside them


def test_long_windows_are_whole_padded_stories(cache) -> None:
    """With seq_len >= the longest story (the paper's regime: one story per row from its start, padded),
    every row is a whole story, EOT its last real target, and windows() has one row per story."""
    data = StoryLanguageData.build(stories=200, vocab_size=800, seq_len=400, cache_dir=cache)
    assert max(d.numel() for ds in data.documents.values() for d in ds) <= 401
    x, y = data.batch("train", 16, generator=iclab.generator(1))
    for (k, s), yb in zip(_story_of(data, "train", x, y), y, strict=True):
        doc = data.documents["train"][k]
        assert s == 0 and int(yb[doc.numel() - 2]) == data.eot_id
    wx, wy = data.windows("test")
    assert wx.shape == (len(data.documents["test"]), 400)
    for doc, xb, yb in zip(data.documents["test"], wx, wy, strict=True):
        assert torch.equal(xb[: doc.numel()], doc) and torch.equal(yb[: doc.numel() - 1], doc[1:])


def test_windows_cover_every_next_token_pair_once(data) -> None:
    """windows(): each story cut at 0, T, 2T, ...; the real targets, in order, are every story's tokens
    after its first, so a pass over them is the split's token-averaged loss."""
    wx, wy = data.windows("validation")
    T = data.seq_len
    rows_x, rows_y = [], []
    for d in data.documents["validation"]:
        for s in range(0, d.numel() - 1, T):
            inp, tgt = d[s : s + T], d[s + 1 : s + T + 1]
            rows_x.append(torch.cat([inp, torch.full((T - inp.numel(),), data.pad_id)]))
            rows_y.append(torch.cat([tgt, torch.full((T - tgt.numel(),), IGNORE_INDEX)]))
    assert torch.equal(wx, torch.stack(rows_x)) and torch.equal(wy, torch.stack(rows_y))
    assert torch.equal(wy[wy != IGNORE_INDEX], torch.cat([d[1:] for d in data.documents["validation"]]))


def test_batches_are_seeded(data) -> None:
    """Same generator seed, same windows; another seed, other windows; windows() is deterministic."""
    a = data.batch("train", 16, generator=iclab.generator(3))
    b = data.batch("train", 16, generator=iclab.generator(3))
    c = data.batch("train", 16, generator=iclab.generator(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert all(torch.equal(u, v) for u, v in zip(data.windows("test"), data.windows("test"), strict=True))


def test_batch_draws_stories_in_proportion_to_their_windows(cache) -> None:
    """Seeded MC: a story with k = ⌈(L − 1)/T⌉ windows is drawn with probability k / Σk (4σ band)."""
    words = ["apple", "bird", "cat", "dog", "egg", "fish", "goat", "hat"]
    texts = [" ".join([w] * m) for w, m in zip(words, (60, 20, 40, 17, 25, 30, 18, 33), strict=True)]
    data = StoryLanguageData.from_texts(texts, vocab_size=300, seq_len=16, cache_dir=cache)
    docs = data.documents["train"]
    special = {data.eot_id, data.pad_id}
    ids = [set(d.tolist()) - special for d in docs]  # one word per story: disjoint token sets
    assert len(docs) == 6 and all(not (a & b) for i, a in enumerate(ids) for b in ids[i + 1 :])
    k = torch.tensor([-(-(d.numel() - 1) // 16) for d in docs], dtype=torch.float64)
    assert len(set(k.tolist())) >= 2  # proportional, not uniform, is checked
    x, _ = data.batch("train", 20_000, generator=iclab.generator(2))
    which = [next(i for i, s in enumerate(ids) if set(r.tolist()) - special <= s) for r in x]
    freq = torch.bincount(torch.tensor(which), minlength=6).double() / 20_000
    p = k / k.sum()
    assert bool(((freq - p).abs() < 4 * (p * (1 - p) / 20_000).sqrt()).all()), (freq, p)


def test_padding_does_not_change_causal_logits(data) -> None:
    """Right padding is exact for a causal model: logits at real positions equal those of the unpadded row."""
    from iclab.models.language import LanguageGPT, next_token_nll

    torch.manual_seed(0)
    model = LanguageGPT(data.vocab_size, 16, 2, data.seq_len).eval()
    wx, wy = data.windows("validation")
    short = int((wy != IGNORE_INDEX).sum(1).argmin())
    real = int((wy[short] != IGNORE_INDEX).sum())
    assert real < data.seq_len  # a padded row
    with torch.no_grad():
        full = model(wx[short : short + 1])[0, :real]
        alone = model(wx[short : short + 1, :real])[0]
        torch.testing.assert_close(full, alone, rtol=1e-5, atol=1e-5)
        masked = next_token_nll(model(wx[short : short + 1]), wy[short : short + 1])
        torch.testing.assert_close(masked, next_token_nll(alone.unsqueeze(0), wy[short : short + 1, :real]))


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
    with pytest.raises(ConfigError, match=r"StoryLanguageData\.texts must be documents with text in every split"):
        StoryLanguageData.from_texts(["a b c", "", "", ""], vocab_size=300, seq_len=1, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"StoryLanguageData\.batch must be an int >= 1; got 0"):
        StoryLanguageData.build(stories=30, vocab_size=300, seq_len=8, cache_dir=cache).batch(
            "train", 0, generator=iclab.generator(0)
        )


def test_language_parameter_counts_reproduce_fig5() -> None:
    """The authors' language models (V = 50258, d' = 512, H = 8, S = 256) and the Fig. 5 caption's 8K vs 6.3M."""
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


@settings(max_examples=200, deadline=None)
@given(story=st.integers(0, 499), cut=st.floats(0.0, 1.0))
def test_every_true_ending_is_consistent(story: int, cut: float) -> None:
    """The grader finds no error in the corpus' own text, wherever the story is cut (mid-word too: a name or a
    "named X" may straddle the cut)."""
    text = story_corpus(500, seed=7)[story]
    k = int(cut * len(text))
    assert story_consistency(text[:k], text[k:]) == {
        "unknown_name": 0,
        "extra_character": 0,
        "self_reference": 0,
        "object_switch": 0,
    }


@pytest.mark.parametrize(
    ("continuation", "error"),
    [
        (" Tim found the kite.", "unknown_name"),  # a third name, never introduced
        (" Zoe showed the kite to Zoe.", "self_reference"),
        (' "Thank you, Zoe!" said Zoe.', "self_reference"),
        (" Zoe and Zoe liked to sing songs together.", "self_reference"),
        (" But then the wind blew the ball away.", "object_switch"),
    ],
)
def test_consistency_errors_are_named(continuation: str, error: str) -> None:
    prompt = "Once upon a time, there was a kind fox named Zoe. Zoe had a friend named Max. Zoe found a green kite."
    errors = story_consistency(prompt, continuation)
    assert errors[error] >= 1 and sum(errors.values()) == errors[error] + errors["extra_character"]
    assert story_consistency(prompt, ' Max said, "What a nice kite!" Zoe was happy.') == dict.fromkeys(errors, 0)


def test_a_character_introduced_in_the_continuation_is_known() -> None:
    """The friend may first appear after the prompt ("a friend named Max"); a third character is an extra one."""
    prompt = "Once upon a time, there was a kind fox named Zoe."
    assert sum(story_consistency(prompt, " Zoe had a friend named Max. Max was shy.").values()) == 0
    e = story_consistency(prompt, " Zoe had a friend named Max. Zoe had a friend named Tim.")
    assert e["extra_character"] == 1 and e["unknown_name"] == 0
