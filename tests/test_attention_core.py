"""The shared multi-head update equals a literal per-head, per-pair sum (float64)."""

from __future__ import annotations

import pytest
import torch

from conftest import F64, assert_close
from iclab import ConfigError, ShapeError
from iclab.core.seeding import generator
from iclab.models.attention_core import attention_update


def _literal(src, tgt, WQ, WV, acts, WK, sigma, scale):
    B, m, _ = src.shape
    T = tgt.shape[1]
    out = torch.zeros(B, T, WV.shape[1], dtype=F64)
    for h, act in enumerate(acts):
        keys = src if WK is None else src @ WK[h].T
        for b in range(B):
            for j in range(T):
                q = WQ[h] @ tgt[b, j]
                raw = torch.stack([keys[b, i] @ q for i in range(m)])
                if act == "linear":
                    w = raw
                elif act == "relu":
                    w = raw.clamp_min(0)
                elif act == "exp":
                    w = torch.exp(raw / sigma**2)
                else:
                    w = torch.softmax(raw / sigma**2, dim=0)
                out[b, j] += sum(w[i] * (WV[h] @ src[b, i]) for i in range(m))
    return scale * out


@pytest.mark.parametrize("with_keys", [False, True])
def test_mixed_heads_equal_the_literal_sum(with_keys: bool) -> None:
    g = generator(0)
    B, m, T, Ds, Dt, e = 2, 5, 6, 4, 3, 2
    acts = ("linear", "softmax", "softmax", "relu", "exp", "linear")
    H, k = len(acts), (3 if with_keys else Ds)
    src = torch.randn(B, m, Ds, generator=g, dtype=F64)
    tgt = torch.randn(B, T, Dt, generator=g, dtype=F64)
    WQ = 0.5 * torch.randn(H, k, Dt, generator=g, dtype=F64)
    WV = torch.randn(H, e, Ds, generator=g, dtype=F64)
    WK = torch.randn(H, k, Ds, generator=g, dtype=F64) if with_keys else None
    got = attention_update(src, tgt, WQ, WV, acts, key_maps=WK, sigma=1.3, scale=0.25)
    want = _literal(src, tgt, WQ, WV, acts, WK, 1.3, 0.25)
    assert float(want.abs().max()) > 1e-2
    assert_close(got, want)


def test_bad_input_names_the_argument() -> None:
    src, tgt = torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)
    WQ, WV = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    with pytest.raises(ConfigError, match="attention_update.activations"):
        attention_update(src, tgt, WQ, WV, ("gelu",))
    with pytest.raises(ShapeError, match="attention_update.query_maps"):
        attention_update(src, tgt, torch.zeros(2, 4, 4), WV, ("linear",))
