"""LinearAttention's query-only last layer gives the same prediction as the full forward pass."""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import F64, random_episode
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.models.linear_attention import ALL_ACTIVATIONS, PATTERNS

CASES = [
    (p, a, s, r)
    for p, a, s, r in itertools.product(PATTERNS, ALL_ACTIVATIONS, ("context", "all"), (True, False))
    # softmax is a full-P/Q option; without the residual, the structured patterns' read-out is 0
    if p == "full" or (a != "softmax" and r)
]


@pytest.mark.parametrize(("pattern", "activation", "sources", "residual"), CASES)
def test_query_only_last_layer_equals_full_forward(pattern: str, activation: str, sources: str, residual: bool) -> None:
    cfg = LinearTransformerConfig(
        d=3,
        n_layers=2,
        n_heads=2,
        pattern=pattern,
        activation=activation,
        sources=sources,
        residual=residual,
        init_std=0.4,
    )
    model = LinearTransformer(cfg, generator=generator(0)).to(F64)
    ep = random_episode(6, 7, 3, seed=1, dtype=F64)
    with torch.no_grad():
        y_fast = model.predict(ep)
        y_full, states = model.trace(ep)
    assert states.shape == (3, 6, 8, 4)
    assert float(y_full.abs().max()) > 1e-3
    torch.testing.assert_close(y_fast, y_full, rtol=1e-12, atol=1e-12)
