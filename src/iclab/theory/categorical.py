"""Closed-form bookkeeping for Wang et al. 2025: parameter counts of the §6.3 language models.

The paper's Fig. 5 contrasts the attention parameters of the 1-layer GD model ("W_qkv" = 8,192) with
those of a 1-layer GPT-style transformer (6,291,456) at d' = 512, H = 8, vocabulary 50,258 (GPT-2 +
pad), 256 positions. The counts follow the authors' language code:

* shared: token embedding wte (V × d'), tied to the output; LayerNorms without bias (d' each).
* GD model: S + 1 learned positions (one extra for the last query); per layer and head a diagonal
  query/key scaling D_h ∈ R^{d'} with W_q ≡ W_k (one Parameter, H·d' numbers, which the authors'
  ``get_num_params_formatted`` counts twice: 8,192 = 2·4,096); an output map W_o ∈ R^{H·d'×d'};
  LayerNorms on tokens, positions and the output (3·d'). Optional FF per layer: LN → d'→4d' → d'
  (no biases), 8d'² + d'.
* GPT: S positions; per layer Q, K, V ∈ R^{d'×d'} per head (head width d', not d'/H, as in their
  code): 3·H·d'²; W_o ∈ R^{H·d'×d'}; FF as above; LayerNorms at the input, before attention and at the
  output (3·d').

For more than one layer, the per-layer pieces (D_h, W_o, FF; Q/K/V, W_o, FF) are repeated; the
spec only fixes the 1-layer numbers, which :func:`language_parameter_counts` reproduces exactly.
"""

from __future__ import annotations

from iclab.core.errors import require_int


def language_parameter_counts(
    *,
    vocab: int = 50_258,
    d_embed: int = 512,
    heads: int = 8,
    seq_len: int = 256,
    n_layers: int = 1,
    ff_mult: int = 4,
) -> dict[str, dict[str, int]]:
    """Parameter counts of the GD, GD + FF and GPT language models of §6.3, per component and in total.

    Returns ``{"gd": {...}, "gd_ff": {...}, "gpt": {...}}``; each holds ``wte``, ``wpe``, ``qkv`` (the
    true count), ``qkv_reported`` (what the authors report: the GD diagonal counted for both W_q and
    W_k), ``w_o``, ``ff``, ``ln`` and ``total``. Defaults are the paper's settings: gd total 27,966,464,
    gd_ff 30,064,128, gpt 36,350,976; qkv_reported 8,192 vs 6,291,456 (0.13%).
    """
    for name, v in (("vocab", vocab), ("d_embed", d_embed), ("heads", heads), ("seq_len", seq_len),
                    ("n_layers", n_layers), ("ff_mult", ff_mult)):  # fmt: skip
        require_int("language_parameter_counts", name, v, 1)
    d, H, L = d_embed, heads, n_layers
    wte = vocab * d
    w_o = L * H * d * d
    ff = L * (2 * ff_mult * d * d + d)  # Linear(d, 4d), Linear(4d, d), no biases; its LayerNorm weight
    gd_qk = L * H * d
    gd = {"wte": wte, "wpe": (seq_len + 1) * d, "qkv": gd_qk, "qkv_reported": 2 * gd_qk, "w_o": w_o, "ff": 0,
          "ln": 3 * d}  # fmt: skip
    gd_ff = {**gd, "ff": ff}
    gpt_qkv = L * 3 * H * d * d
    gpt = {"wte": wte, "wpe": seq_len * d, "qkv": gpt_qkv, "qkv_reported": gpt_qkv, "w_o": w_o, "ff": ff,
           "ln": (L + 2) * d}  # fmt: skip
    out = {}
    for key, parts in (("gd", gd), ("gd_ff", gd_ff), ("gpt", gpt)):
        parts["total"] = sum(v for k, v in parts.items() if k != "qkv_reported")
        out[key] = parts
    return out
