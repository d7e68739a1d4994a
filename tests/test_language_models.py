"""The §6.3 language models of Wang et al. 2025: GD model (eq. 49) and the 1-layer GPT baseline."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from iclab.core.errors import ConfigError, ShapeError
from iclab.models.language import (
    LanguageGD,
    LanguageGPT,
    generate,
    next_token_nll,
    repeated_ngram_fraction,
)
from iclab.theory.categorical import language_parameter_counts

F64 = torch.float64
V, D, H, S = 11, 6, 3, 9


def _models(dtype=F64, **gd_kw):
    torch.manual_seed(0)
    out = {
        "gd_softmax": LanguageGD(V, D, H, S, **gd_kw),
        "gd_linear_ff": LanguageGD(V, D, H, S, kernel="linear", ff=True, n_layers=2),
        "gd_rbf": LanguageGD(V, D, H, S, kernel="rbf", n_layers=2),
        "gpt": LanguageGPT(V, D, H, S, n_layers=2),
    }
    for m in out.values():
        m.to(dtype).eval()
        with torch.no_grad():  # move the layer norms and diagonals off their init so they matter
            for name, p in m.named_parameters():
                if p.dim() == 1 or name == "q_diag":
                    p.add_(0.3 * torch.randn_like(p))
    return out


@pytest.mark.parametrize("name", ["gd_softmax", "gd_linear_ff", "gd_rbf", "gpt"])
def test_shapes_and_causality_exact(name: str) -> None:
    model = _models()[name]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (3, S), generator=g)
    logits = model(tokens)
    assert logits.shape == (3, S, V) and logits.dtype == F64
    for t in (0, 4, S - 1):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.arange(3)) % V
        other = model(changed)
        assert torch.equal(other[:, :t], logits[:, :t]), f"{name}: logits before {t} changed"
        assert not torch.allclose(other[:, t], logits[:, t]), f"{name}: token {t} has no effect on its own logits"
    # a prefix is evaluated as the same model: logits of the first T tokens do not depend on the length
    assert torch.allclose(model(tokens[:, :4]), logits[:, :4], rtol=0, atol=1e-12)


def _reference_gd(model: LanguageGD, tokens: torch.Tensor) -> torch.Tensor:
    """Eq. (49) + (3) written out per sequence b, query j, head h and key i, as plain loops."""
    d, Hh = model.d, model.heads
    W = F.layer_norm(model.wte, (d,), model.ln_tok.weight)  # (V, d) ŵ
    P = F.layer_norm(model.wpe, (d,), model.ln_pos.weight)  # (S+1, d)
    B, T = tokens.shape
    out = torch.zeros(B, T, model.vocab, dtype=W.dtype)

    def kappa(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if model.kernel == "rbf":
            return torch.exp(-((q - k) ** 2).sum() / math.sqrt(d))
        return (q @ k) / math.sqrt(d)  # linear; softmax normalised below

    for b in range(B):
        f = [torch.zeros(d, dtype=W.dtype) for _ in range(T + 1)]  # f(p_0..p_T)
        for layer in range(model.n_layers):
            new = [f[0]]
            for j in range(T):  # query p_{j+1}, keys p_0..p_j
                delta = torch.zeros(d, dtype=W.dtype)
                for h in range(Hh):
                    Dh = model.q_diag[layer, h]
                    q = Dh * P[j + 1]
                    a = torch.stack([kappa(q, Dh * P[i]) for i in range(j + 1)])
                    if model.kernel == "softmax":
                        a = torch.exp(a - a.max()) / torch.exp(a - a.max()).sum()
                    if model.count_normalise:
                        a = a / (j + 1)
                    acc = torch.zeros(d, dtype=W.dtype)
                    for i in range(j + 1):
                        E = torch.softmax(W @ f[i], 0) @ W
                        acc = acc + a[i] * (W[tokens[b, i]] - E)
                    delta = delta + acc @ model.w_o[layer, h * d : (h + 1) * d]
                fj = f[j + 1] + delta
                if model.ffs is not None:
                    fj = fj + model.ffs[layer](fj)
                new.append(fj)
            f = new
        for j in range(T):
            out[b, j] = F.layer_norm(f[j + 1], (d,), model.ln_out.weight) @ W.T
    return out


@pytest.mark.parametrize("name", ["gd_softmax", "gd_linear_ff", "gd_rbf"])
def test_gd_model_equals_explicit_functional_gd(name: str) -> None:
    model = _models()[name]
    tokens = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), _reference_gd(model, tokens), rtol=1e-10, atol=1e-10)


def test_gd_scores_are_causal_and_count_normalised() -> None:
    m = _models()["gd_rbf"]
    A = m.scores(5)  # (H, 5, 5)
    assert torch.equal(A.triu(1), torch.zeros_like(A))
    soft = LanguageGD(V, D, H, S).double()
    assert torch.allclose(soft.scores(5).sum(-1), torch.ones(H, 5, dtype=F64), atol=1e-12)  # softmax: once
    twice = LanguageGD(V, D, H, S, count_normalise=True).double()  # the authors' double normalisation
    assert torch.allclose(twice.scores(5).sum(-1), 1 / torch.arange(1, 6, dtype=F64).expand(H, 5), atol=1e-12)


@pytest.mark.parametrize("layers", [1, 2])
def test_parameter_counts_match_theory(layers: int) -> None:
    for vocab, d, heads, seq in ((50_258, 512, 8, 256), (97, 16, 4, 12)):
        ref = language_parameter_counts(vocab=vocab, d_embed=d, heads=heads, seq_len=seq, n_layers=layers)
        with torch.device("meta"):
            gd = LanguageGD(vocab, d, heads, seq, n_layers=layers)
            gd_ff = LanguageGD(vocab, d, heads, seq, n_layers=layers, ff=True)
            gpt = LanguageGPT(vocab, d, heads, seq, n_layers=layers)
        assert gd.num_parameters() == ref["gd"]["total"]
        assert gd_ff.num_parameters() == ref["gd_ff"]["total"]
        assert gpt.num_parameters() == ref["gpt"]["total"]
        assert gd.q_diag.numel() == ref["gd"]["qkv"] and gpt.w_qkv.numel() == ref["gpt"]["qkv"]
    paper = language_parameter_counts()
    assert (paper["gd"]["total"], paper["gd_ff"]["total"], paper["gpt"]["total"]) == (
        27_966_464,
        30_064_128,
        36_350_976,
    )


def _greedy_reference(model, prompt: torch.Tensor, n: int) -> list[int]:
    seq = prompt.tolist()
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq[-model.max_len :]]))[0, -1].argmax()))
    return seq[prompt.numel() :]


@pytest.mark.parametrize("name", ["gd_softmax", "gpt"])
def test_generation_greedy_and_deterministic(name: str) -> None:
    model = _models()[name]
    prompt = torch.tensor([1, 4, 2, 7])
    a = generate(model, prompt, 12, beams=1)
    assert a.tolist() == _greedy_reference(model, prompt, 12)  # also runs past max_len = 9 (sliding window)
    assert torch.equal(generate(model, prompt, 12, beams=3), generate(model, prompt, 12, beams=3))
    b = generate(model, prompt, 12, beams=2, no_repeat_ngram=2)
    assert repeated_ngram_fraction(torch.cat([prompt, b]), 2) == 0.0
    stop = int(a[2])
    c = generate(model, prompt, 12, eot_id=stop)
    first = a.tolist().index(stop)
    assert c.tolist() == a[: first + 1].tolist()  # greedy stops at (and keeps) the first end-of-text token


def test_exhaustive_beam_search_finds_the_most_likely_continuation() -> None:
    torch.manual_seed(3)
    model = LanguageGPT(3, 4, 2, 8).double().eval()
    prompt = torch.tensor([0, 2])
    best, best_score = None, -math.inf
    for cont in itertools.product(range(3), repeat=3):
        seq = torch.tensor([[*prompt.tolist(), *cont]])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq[:, :-1]), -1)[0]
        score = sum(float(logp[1 + t, c]) for t, c in enumerate(cont))
        if score > best_score:
            best, best_score = list(cont), score
    assert generate(model, prompt, 3, beams=9).tolist() == best  # 9 = 3² beams: no pruning


def test_repeated_ngram_fraction_by_hand() -> None:
    assert repeated_ngram_fraction([1, 2, 3, 1, 2, 3], 3) == pytest.approx(1 / 4)
    assert repeated_ngram_fraction([5, 5, 5, 5, 5], 1) == pytest.approx(4 / 5)
    assert repeated_ngram_fraction([5, 5, 5, 5, 5], 2) == pytest.approx(3 / 4)
    assert repeated_ngram_fraction(torch.arange(10), 2) == 0.0
    assert repeated_ngram_fraction([1, 2], 3) == 0.0
    with pytest.raises(ConfigError, match="n must be"):
        repeated_ngram_fraction([1, 2, 3], 0)


def test_next_token_nll_ignores_pad() -> None:
    logits = torch.randn(2, 3, 5, dtype=F64, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 4, 4], [0, 2, 4]])
    got = next_token_nll(logits, targets, ignore_index=4)
    keep = targets != 4
    want = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)[keep].mean()
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("cls", [LanguageGD, LanguageGPT])
def test_bad_input_names_the_field(cls) -> None:
    model = cls(V, D, H, S)
    with pytest.raises(ConfigError, match=r"tokens.*max_len.*length 10"):
        model(torch.zeros(1, S + 1, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"tokens.*\[0, 11\) \(vocab\); got 'ids in \[11, 11\]'"):
        model(torch.full((1, 3), V))
    with pytest.raises(ConfigError, match=r"tokens.*vocab"):
        model(torch.tensor([[0, -1]]))
    with pytest.raises(ShapeError, match="tokens must be an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ConfigError, match="heads must be"):
        cls(V, D, 0, S)
    with pytest.raises(ConfigError, match="dropout must be"):
        cls(V, D, H, S, dropout=1.5)
    with pytest.raises(ConfigError, match="new_tokens must be"):
        generate(model, torch.tensor([1]), -1)


def test_gd_rejects_unknown_kernel() -> None:
    with pytest.raises(ConfigError, match=r"LanguageGD.kernel must be one of.*got 'exp'"):
        LanguageGD(V, D, H, S, kernel="exp")  # type: ignore[arg-type]
