"""Learner-battery entries for the multi-head attention of Zhang, Singh, Latham, Saxe 2025 (d = 4).

Reduced ATTN_M / ATTN_S (eq. M, S), the MLP on the cubic feature (eq. 6-7), and token-level layers
with the paper's options (separate rank-R key/query, softmax scores, the query as a source, no
residual, zero-block init, + read-out). Init scales are large so that predictions are O(1).
"""

from __future__ import annotations

import iclab
from iclab import models

D = 4


def _lsa(**options: object) -> models.LinearTransformer:
    cfg = models.LinearTransformerConfig(d=D, n_layers=1, n_heads=2, init_std=0.5, readout="positive", **options)
    return models.LinearTransformer(cfg, generator=iclab.generator(31))


LEARNERS = {
    "attn-merged-reduced": lambda: models.MergedAttention(D, 3, w_init=4.0, generator=iclab.generator(21)),
    "attn-separate-reduced-rank2": lambda: models.SeparateAttention(D, 3, 2, w_init=4.0, generator=iclab.generator(22)),
    "cubic-feature-mlp": lambda: models.CubicFeatureMLP(D, 5, w_init=4.0, generator=iclab.generator(23)),
    "lsa-merged-zero-blocks-all-sources": lambda: _lsa(zero_blocks=True, sources="all"),
    "lsa-separate-rank2-linear": lambda: _lsa(key_query="separate", rank=2, zero_blocks=True),
    "lsa-separate-softmax-no-residual": lambda: _lsa(
        key_query="separate", rank=1, activation="softmax", sources="all", residual=False
    ),
    "lsa-merged-softmax": lambda: _lsa(activation="softmax"),
}
