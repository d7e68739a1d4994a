"""The one data structure every learner reads: an in-context learning episode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

import torch
from torch import Tensor

from iclab.core.errors import ShapeError, require_shape
from iclab.core.private_torch import is_transformed

T = TypeVar("T")


@dataclass(frozen=True)
class Episode:
    """A batch of B prompts, each with n context pairs and one query.

    Regression episodes carry float labels ``y (B, n)`` and ``y_query (B,)``; classification
    episodes carry integer ``labels (B, n)`` and ``label_query (B,)``. ``task`` holds what an
    oracle may use (``w (B, d)``, ``Sigma (d, d)`` or ``(B, d, d)``, ...); learners that are not
    oracles never read it, and no learner reads ``y_query``.

    Shapes are checked on construction (no data-dependent checks, so episodes can be built
    under ``torch.func.vmap``).
    """

    x: Tensor  # (B, n, d)  context inputs
    x_query: Tensor  # (B, d)
    y: Tensor | None = None  # (B, n)     context labels (regression)
    y_query: Tensor | None = None  # (B,)  target; no learner reads it
    labels: Tensor | None = None  # (B, n) int context labels (classification)
    label_query: Tensor | None = None  # (B,) int
    task: dict[str, Tensor] = field(default_factory=dict)
    batched: tuple[str, ...] = ()  # task keys with a leading batch axis (per-prompt), e.g. ("w",)

    def __post_init__(self) -> None:
        if self.x.dim() != 3:
            raise ShapeError(f"Episode.x must have shape (B, n, d); got {tuple(self.x.shape)}")
        B, n, d = self.x.shape
        if n < 1:
            raise ShapeError(f"Episode.x must hold n >= 1 context pairs; got shape {tuple(self.x.shape)}")
        note = f" to match x {tuple(self.x.shape)}"
        require_shape("Episode", "x_query", tuple(self.x_query.shape), (B, d), note)
        if self.y is None and self.labels is None:
            raise ShapeError(
                "Episode needs context labels: pass y (B, n) for regression or labels (B, n) for classification"
            )
        if self.y is not None:
            require_shape("Episode", "y", tuple(self.y.shape), (B, n), note)
            if self.y.dtype != self.x.dtype:
                raise ShapeError(f"Episode.y must have the dtype of x ({self.x.dtype}); got {self.y.dtype}")
        if self.y_query is not None:
            require_shape("Episode", "y_query", tuple(self.y_query.shape), (B,), note)
        if self.labels is not None:
            require_shape("Episode", "labels", tuple(self.labels.shape), (B, n), note)
            if self.labels.dtype.is_floating_point:
                raise ShapeError(f"Episode.labels must be an integer tensor; got {self.labels.dtype}")
        if self.label_query is not None:
            require_shape("Episode", "label_query", tuple(self.label_query.shape), (B,), note)
        for key in self.batched:
            if key not in self.task:
                raise ShapeError(f"Episode.batched names task key {key!r}, which is not in task {sorted(self.task)}")
            if self.task[key].dim() == 0 or self.task[key].shape[0] != B:
                raise ShapeError(
                    f"Episode.task[{key!r}] is per-prompt and must have a leading batch axis of size {B}; got {tuple(self.task[key].shape)}"
                )

    @property
    def batch_size(self) -> int:
        """Number of prompts B."""
        return self.x.shape[0]

    @property
    def n(self) -> int:
        """Number of context pairs."""
        return self.x.shape[1]

    @property
    def d(self) -> int:
        """Covariate dimension d."""
        return self.x.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the covariates."""
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        """Device of the covariates."""
        return self.x.device

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Episode:
        """Move every tensor (task entries included); ``dtype`` applies to floating tensors only."""

        def mv(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if (dtype is not None and t.dtype.is_floating_point) else None)

        def mv_opt(t: Tensor | None) -> Tensor | None:
            return None if t is None else mv(t)

        return replace(
            self,
            x=mv(self.x),
            x_query=mv(self.x_query),
            y=mv_opt(self.y),
            y_query=mv_opt(self.y_query),
            labels=mv_opt(self.labels),
            label_query=mv_opt(self.label_query),
            task={k: mv(v) for k, v in self.task.items()},
        )

    def __getitem__(self, index: slice | Tensor) -> Episode:
        """Select prompts along the batch axis; the per-prompt task entries (``batched``) are sliced too.

        A 1-D integer index is gathered by ``index_select`` (the same copy as ``t[index]``, about twice as fast on a
        CPU: the trainer's minibatches of a fixed training set)."""
        rows = (
            index
            if isinstance(index, Tensor)
            and index.dim() == 1
            and index.dtype in (torch.int64, torch.int32)
            and bool((index >= 0).all())  # t[index] counts negative positions from the end
            else None
        )

        def pick(t: Tensor) -> Tensor:
            return t[index] if rows is None else t.index_select(0, rows)

        def sel(t: Tensor | None) -> Tensor | None:
            return None if t is None else pick(t)

        task = {k: (pick(v) if k in self.batched else v) for k, v in self.task.items()}
        return replace(
            self,
            x=pick(self.x),
            x_query=pick(self.x_query),
            y=sel(self.y),
            y_query=sel(self.y_query),
            labels=sel(self.labels),
            label_query=sel(self.label_query),
            task=task,
        )

    def memo(self, key: str, compute: Callable[[Episode], T]) -> T:
        """``compute(self)``, computed once per episode and reused until one of its tensors changes.

        For statistics of the data that several forward passes read (a model's context moments, the
        trainer reusing a batch for ``resample_every`` steps). The entry is keyed by ``key`` and by the
        version counters of x, x_query, y and labels, so an in-place change to any of them (or to a view
        of them) recomputes it. Nothing is stored when an input requires grad (the statistics must stay
        in that graph), under ``torch.func`` transforms (vmap's tensors are rebuilt every call) or in
        ``torch.inference_mode`` (its tensors could not be used by a later training step).
        """
        tensors = [t for t in (self.x, self.x_query, self.y, self.labels) if t is not None]
        if torch.is_inference_mode_enabled() or any(t.requires_grad for t in tensors) or is_transformed(*tensors):
            return compute(self)  # inference tensors could not enter a later autograd graph
        stamp = tuple(t._version for t in tensors)
        cache = self.__dict__.setdefault("_memo", {})  # not a field: no effect on ==, repr or replace()
        hit = cache.get(key)
        if hit is not None and hit[0] == stamp:
            return cast(T, hit[1])
        value = compute(self)
        cache[key] = (stamp, value)
        return value

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_memo"}  # pickles carry data, not caches

    def with_context(self, n: int) -> Episode:
        """The same prompts with only their first ``n`` context pairs."""
        if not 1 <= n <= self.n:
            raise ShapeError(f"Episode.with_context: n must be in [1, {self.n}]; got {n}")
        return replace(
            self,
            x=self.x[:, :n],
            y=None if self.y is None else self.y[:, :n],
            labels=None if self.labels is None else self.labels[:, :n],
        )
