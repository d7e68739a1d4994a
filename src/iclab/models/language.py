"""Causal next-token language models of Wang et al. 2025, §6.3 (the GD model and the 1-layer GPT baseline).

Both map tokens (B, T) to next-token logits (B, T, V); logits at position t depend on tokens 0..t only.

**GD model** (:class:`LanguageGD`; Wang et al. 2025 §3.6, App. H eq. (49)). In-context
learning as functional gradient descent on a categorical likelihood, with the *positions* as covariates
and the *tokens* as labels: the context is {(p_i, y_i)}_{i ≤ j}, the query for the token at j + 1 is
p_{j+1}. With ŵ_c = LN(w_{e,c}) the (layer-normed, tied) token embeddings, f_0 ≡ 0 and H heads with
diagonal kernels κ_h(p, p') = κ(D_h p, D_h p') (eq. 49), one GD step (a layer) is

    Δf_k(p_{j+1}) = Σ_h [ (1/(j+1)) Σ_{i ≤ j} κ_h(p_i, p_{j+1}) (ŵ_{y_i} − E(ŵ)|_{f_k(p_i)}) ] W_o^{(h)}     (3),(49)
    E(ŵ)|_f = Σ_c ŵ_c softmax_c(Ŵ f)                                                                      (6)

(the per-head step sizes generalised to the output matrices W_o^{(h)} ∈ R^{d'×d'}, merged as in standard
multi-head attention, as the paper does), optionally followed by f ← f + FF(f) ("GD + FF"). The read-out
is p(y_{j+1} = c) = softmax_c(LN_out(f(p_{j+1})) · Ŵᵀ). Attention depends on positions only (W_Q ≡ W_K = D_h,
one diagonal per head: H·d' numbers per layer). The factor 1/(j+1) is the 1/N of functional GD; for the
softmax score (already normalised over keys) it is not applied by default (the authors' code applies it
to every kernel: docs/errata.md). f at key position i is the iterate computed from keys before i, so
f(p_0) stays 0 (causality).

**GPT baseline** (:class:`LanguageGPT`; "following Radford et al. 2019", the authors' ``gpt.py``): x =
LN(wte[y] + wpe[t]); x += W_o concat_h softmax(causal Q_h K_hᵀ/√d') V_h with Q, K, V = LN(x) W_{q,k,v}^{(h)},
W ∈ R^{d'×d'} per head (head dimension d', not d'/H, as the authors do); x += FF(x); logits =
LN_out(x) wteᵀ. No biases anywhere, layer norms without bias.

``num_parameters()`` of both equals :func:`iclab.theory.categorical.language_parameter_counts` (total).

Also here: :func:`generate` (greedy / beam search, optionally banning repeated n-grams, as the authors'
``evaluation.py``), :func:`repeated_ngram_fraction` (the repetition metric replacing the GPT-4o grader),
and :func:`next_token_nll` (mean cross-entropy ignoring a pad id).
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from iclab.core.errors import ShapeError, require, require_int
from iclab.core.kernels import gram

LanguageKernel = Literal["softmax", "linear", "rbf"]
LANGUAGE_KERNELS: tuple[str, ...] = ("softmax", "linear", "rbf")


def _check_common(
    owner: str, vocab: int, d_embed: int, heads: int, max_len: int, n_layers: int, dropout: float
) -> None:
    for name, v in (("vocab", vocab), ("d_embed", d_embed), ("heads", heads), ("max_len", max_len),
                    ("n_layers", n_layers)):  # fmt: skip
        require_int(owner, name, v, 1)
    require_int(owner, "vocab", vocab, 2)
    require(owner, "dropout", 0.0 <= float(dropout) < 1.0, "a float in [0, 1)", dropout)


def _check_tokens(owner: str, tokens: Tensor, vocab: int, max_len: int) -> None:
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point:
        raise ShapeError(
            f"{owner}.tokens must be an integer tensor (B, T); got "
            f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}"
            f"{'' if not isinstance(tokens, Tensor) else ' ' + str(tokens.dtype)}"
        )
    T = tokens.shape[1]
    require(owner, "tokens", 1 <= T <= max_len, f"a sequence of 1..{max_len} tokens (max_len)", f"length {T}")
    if tokens.numel() and not tokens.is_meta:
        lo, hi = int(tokens.min()), int(tokens.max())
        require(owner, "tokens", lo >= 0 and hi < vocab, f"token ids in [0, {vocab}) (vocab)", f"ids in [{lo}, {hi}]")


class FeedForward(nn.Module):
    """x ↦ Dropout(W₂ GELU(W₁ LN(x))), W₁ ∈ R^{d×md}, W₂ ∈ R^{md×d}, no biases (the authors' FF; its LN has
    a weight and no bias). Returns the increment, the caller adds the residual."""

    def __init__(self, d: int, mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, bias=False)
        self.up = nn.Linear(d, mult * d, bias=False)
        self.down = nn.Linear(mult * d, d, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.drop(self.down(F.gelu(self.up(self.ln(x)))))
        return out


class _LanguageModel(nn.Module):
    vocab: int
    max_len: int

    def num_parameters(self) -> int:
        """Number of scalar parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    def _init(self) -> None:
        """GPT-2 style: N(0, 0.02) for every matrix and embedding; layer norms at weight 1."""
        for name, p in self.named_parameters():
            if p.dim() >= 2 and not name.endswith("q_diag"):
                nn.init.normal_(p, std=0.02)


class LanguageGD(_LanguageModel):
    """The GD language model (Wang et al. 2025 §6.3, eq. (49)): see the module docstring.

    Parameters: wte (V, d'), wpe (max_len + 1, d') (one extra position: the query of the last token),
    q_diag (n_layers, H, d') the diagonals D_h (W_Q ≡ W_K), w_o (n_layers, H·d', d'), three bias-free layer
    norms (tokens, positions, output) and, with ``ff``, one FeedForward per layer.

    ``kernel``: softmax (scores softmax_i(q_jᵀk_i/√d') over the causal keys), linear (q_jᵀk_i/√d') or rbf
    (exp(−‖q_j − k_i‖²/√d'); a learned bandwidth would be redundant with D_h). ``count_normalise``: divide
    by the number of keys j + 1 (the 1/N of GD); None = for linear and rbf only.
    """

    def __init__(
        self,
        vocab: int,
        d_embed: int = 512,
        heads: int = 8,
        max_len: int = 256,
        *,
        n_layers: int = 1,
        kernel: LanguageKernel = "softmax",
        ff: bool = False,
        ff_mult: int = 4,
        dropout: float = 0.0,
        count_normalise: bool | None = None,
    ) -> None:
        super().__init__()
        owner = "LanguageGD"
        _check_common(owner, vocab, d_embed, heads, max_len, n_layers, dropout)
        require(owner, "kernel", kernel in LANGUAGE_KERNELS, f"one of {LANGUAGE_KERNELS}", kernel)
        require_int(owner, "ff_mult", ff_mult, 1)
        self.vocab, self.d, self.heads, self.max_len, self.n_layers = vocab, d_embed, heads, max_len, n_layers
        self.kernel = kernel
        self.count_normalise = (kernel != "softmax") if count_normalise is None else bool(count_normalise)
        self.wte = nn.Parameter(torch.empty(vocab, d_embed))
        self.wpe = nn.Parameter(torch.empty(max_len + 1, d_embed))
        self.q_diag = nn.Parameter(torch.ones(n_layers, heads, d_embed))
        self.w_o = nn.Parameter(torch.empty(n_layers, heads * d_embed, d_embed))
        self.ln_tok = nn.LayerNorm(d_embed, bias=False)
        self.ln_pos = nn.LayerNorm(d_embed, bias=False)
        self.ln_out = nn.LayerNorm(d_embed, bias=False)
        self.ffs = nn.ModuleList([FeedForward(d_embed, ff_mult, dropout) for _ in range(n_layers)]) if ff else None
        self.drop = nn.Dropout(dropout)
        self._init()

    def scores(self, T: int, layer: int = 0) -> Tensor:
        """The causal attention weights A_h (H, T, T): row j (query p_{j+1}) over keys i (p_i), zero for i > j,
        1/(j+1) included when ``count_normalise``. Scores come from :func:`iclab.core.kernels.gram`."""
        p = self.ln_pos(self.wpe[: T + 1])  # (T+1, d)
        D = self.q_diag[layer].unsqueeze(1)  # (H, 1, d)
        k, q = p[:-1] * D, p[1:] * D  # (H, T, d) keys p_0..p_{T-1}, queries p_1..p_T
        causal = torch.ones(T, T, dtype=torch.bool, device=p.device).tril()  # [j, i]: key i visible to query j
        root = math.sqrt(self.d)
        if self.kernel == "rbf":  # gram's rbf is exp(−‖s−t‖²/(2σ²)); 2σ² = √d'
            A = gram("rbf", k, q, sigma=math.sqrt(root / 2)).transpose(-1, -2)  # (H, T_q, T_k)
            A = A * causal
        else:
            A = gram("linear", k, q).transpose(-1, -2) / root  # (H, T_q, T_k) q_jᵀk_i/√d'
            if self.kernel == "softmax":
                A = torch.softmax(A.masked_fill(~causal, float("-inf")), dim=-1)
            else:
                A = A * causal
        if self.count_normalise:
            A = A / torch.arange(1, T + 1, device=p.device, dtype=A.dtype).unsqueeze(-1)
        return A

    def expectation(self, f: Tensor, emb: Tensor) -> Tensor:
        """E(ŵ)|_f = softmax(f Ŵᵀ) Ŵ for f (…, d'), Ŵ (V, d') (eq. 6)."""
        return torch.softmax(f @ emb.T, dim=-1) @ emb

    def forward(self, tokens: Tensor) -> Tensor:
        _check_tokens("LanguageGD", tokens, self.vocab, self.max_len)
        B, T = tokens.shape
        emb: Tensor = self.ln_tok(self.wte)  # (V, d) Ŵ, tied: values, E and read-out
        e = emb[tokens]  # (B, T, d) ŵ_{y_i}
        f = torch.zeros(B, T, self.d, dtype=emb.dtype, device=emb.device)  # f(p_{j+1}), j = 0..T-1
        for layer in range(self.n_layers):
            A = self.scores(T, layer)  # (H, T, T)
            f_keys = torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], dim=1)  # (B, T, d) f(p_i), f(p_0) = 0
            # (B, T, d) ŵ_{y_i} − E(ŵ)|_{f(p_i)}; at f ≡ 0 (first step) the softmax is uniform, so E is the mean
            # embedding w̄
            v = e - (emb.mean(0) if layer == 0 else self.expectation(f_keys, emb))
            heads = torch.einsum("hji,bid->bjhd", A, v).reshape(B, T, self.heads * self.d)  # (B, T, H·d)
            f = f + self.drop(heads @ self.w_o[layer])
            if self.ffs is not None:
                f = f + self.ffs[layer](f)
        final: Tensor = self.ln_out(f)
        return final @ emb.T  # (B, T, V)


class LanguageGPT(_LanguageModel):
    """The GPT-style baseline of Wang et al. 2025 §6.3 (the authors' ``gpt.py``): see the module docstring.

    Attention through ``torch.nn.functional.scaled_dot_product_attention`` (causal, scale 1/√d').
    """

    def __init__(
        self,
        vocab: int,
        d_embed: int = 512,
        heads: int = 8,
        max_len: int = 256,
        *,
        n_layers: int = 1,
        ff_mult: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _check_common("LanguageGPT", vocab, d_embed, heads, max_len, n_layers, dropout)
        require_int("LanguageGPT", "ff_mult", ff_mult, 1)
        self.vocab, self.d, self.heads, self.max_len, self.n_layers = vocab, d_embed, heads, max_len, n_layers
        self.dropout = float(dropout)
        self.wte = nn.Parameter(torch.empty(vocab, d_embed))
        self.wpe = nn.Parameter(torch.empty(max_len, d_embed))
        self.ln_in = nn.LayerNorm(d_embed, bias=False)
        self.ln_att = nn.ModuleList([nn.LayerNorm(d_embed, bias=False) for _ in range(n_layers)])
        self.w_qkv = nn.Parameter(torch.empty(n_layers, d_embed, 3 * heads * d_embed))
        self.w_o = nn.Parameter(torch.empty(n_layers, heads * d_embed, d_embed))
        self.ffs = nn.ModuleList([FeedForward(d_embed, ff_mult, dropout) for _ in range(n_layers)])
        self.ln_out = nn.LayerNorm(d_embed, bias=False)
        self.drop = nn.Dropout(dropout)
        self._init()

    def forward(self, tokens: Tensor) -> Tensor:
        _check_tokens("LanguageGPT", tokens, self.vocab, self.max_len)
        B, T = tokens.shape
        H, d = self.heads, self.d
        x = self.ln_in(self.drop(self.wte[tokens]) + self.drop(self.wpe[:T]))  # (B, T, d)
        for layer in range(self.n_layers):
            qkv = self.ln_att[layer](x) @ self.w_qkv[layer]  # (B, T, 3·H·d)
            q, k, v = qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, T, d)
            att = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )  # (B, H, T, d)
            x = x + self.drop(att.transpose(1, 2).reshape(B, T, H * d) @ self.w_o[layer])
            x = x + self.ffs[layer](x)
        final: Tensor = self.ln_out(x)
        return final @ self.wte.T  # (B, T, V)


# ---- loss, generation, repetition ------------------------------------------------------------------------


def next_token_nll(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Cross-entropy of (B, T, V) logits against (B, T) targets, targets equal to ``ignore_index`` left out."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index, reduction=reduction)


def _banned(seq: list[int], n: int) -> set[int]:
    """Tokens that would complete an n-gram already present in ``seq``."""
    if n <= 0 or len(seq) < n:
        return set()
    prefix = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i : i + n - 1]) == prefix}


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Tensor,
    new_tokens: int,
    *,
    beams: int = 1,
    no_repeat_ngram: int = 0,
    eot_id: int | None = None,
) -> Tensor:
    """Continue ``prompt`` (P,) by up to ``new_tokens`` tokens by beam search (``beams`` = 1: greedy).

    Deterministic (no sampling; ties broken by the lower token id). The score of a beam is its summed
    log-probability; with ``no_repeat_ngram`` = n > 0 a token that would repeat an n-gram of the beam
    (prompt included) is banned, as the authors' evaluation optionally does with n = 3. A beam that emits
    ``eot_id`` is finished. Returns the continuation (≤ new_tokens,) of the best beam, without the prompt.
    The model sees the last ``model.max_len`` tokens. The model is put in eval mode.
    """
    require("generate", "prompt", prompt.dim() == 1 and prompt.numel() >= 1, "a non-empty 1-D token tensor",
            tuple(prompt.shape))  # fmt: skip
    require_int("generate", "new_tokens", new_tokens, 0)
    require_int("generate", "beams", beams, 1)
    require_int("generate", "no_repeat_ngram", no_repeat_ngram, 0)
    model.eval()
    max_len = int(cast(_LanguageModel, model).max_len)  # LanguageGD or LanguageGPT
    P = prompt.numel()
    alive: list[tuple[float, list[int]]] = [(0.0, prompt.tolist())]
    done: list[tuple[float, list[int]]] = []
    for _ in range(new_tokens):
        if not alive:
            break
        ctx = torch.tensor([s[-max_len:] for _, s in alive], device=prompt.device)  # (beams, ≤ max_len)
        logp = torch.log_softmax(model(ctx)[:, -1].double(), dim=-1).cpu()  # (beams, V)
        for b, (_, seq) in enumerate(alive):
            ban = _banned(seq, no_repeat_ngram)
            if ban:
                logp[b, list(ban)] = float("-inf")
        total = torch.tensor([s for s, _ in alive], dtype=torch.float64).unsqueeze(1) + logp  # (beams, V)
        flat = total.flatten()
        order = torch.sort(flat, descending=True, stable=True).indices[:beams].tolist()  # ties: lower id first
        nxt: list[tuple[float, list[int]]] = []
        V = logp.shape[1]
        for i in order:
            score = float(flat[i])
            if score == float("-inf"):
                continue
            seq = alive[i // V][1] + [i % V]
            (done if eot_id is not None and i % V == eot_id else nxt).append((score, seq))
        alive = nxt
        if len(done) >= beams:
            break
    best = max(done + alive, key=lambda t: t[0]) if done + alive else (0.0, prompt.tolist())
    return torch.tensor(best[1][P:], dtype=torch.long)


def repeated_ngram_fraction(tokens: Tensor | list[int], n: int = 3) -> float:
    """Fraction of the n-grams of ``tokens`` that repeat an earlier n-gram of it: 1 − distinct/total.

    0 for a sequence without repeated n-grams (or shorter than n), → 1 for a loop. Replaces the paper's
    GPT-4o grader's view of the failure mode the paper reports (repetitive loops, Tables 1–2, App. K).
    """
    require_int("repeated_ngram_fraction", "n", n, 1)
    seq = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)
