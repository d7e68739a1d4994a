"""The learner contract: one call for every model, algorithm and construction."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from iclab.core.episode import Episode


@runtime_checkable
class Learner(Protocol):
    """Anything that predicts the query label of an episode.

    ``predict`` returns ``(B,)`` for regression or ``(B, C)`` class logits, always +ŷ whatever
    sign convention the paper's read-out uses.
    """

    def predict(self, episode: Episode) -> Tensor:
        """The prediction for each prompt's query: ``(B,)`` for regression, ``(B, C)`` class logits."""
        ...
