"""What the trainer reads its batches from: a sampler it seeds, or a source it tells the step.

:func:`iclab.training.train` takes either of two kinds of data source:

* a **sampler** ``sample(batch, *, generator, dtype) -> Episode`` (e.g. ``functools.partial(task.sample, n=20)``):
  the trainer draws the batch of step t itself, from a generator seeded by ``(config.seed, "data", t0)`` with t0
  the last resampling step, so the batches are a function of the seed and the step;
* a **step source** (:class:`StepSource`): an object the trainer asks for the batch of each step,
  ``source.at(step, config)``, so the batches are whatever the source says. :class:`GivenBatches` is the one
  iclab provides: a list of batches given by the user (e.g. the batches another code base trained on).

Either way the batch of a step depends on the step alone, so a resumed run reads the same batches as an
uninterrupted one: a checkpoint stores no data state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from iclab.core.episode import Episode
from iclab.core.errors import ConfigError
from iclab.training.config import TrainConfig

__all__ = ["GivenBatches", "StepSource"]


@runtime_checkable
class StepSource(Protocol):
    """A data source told the step: the protocol :func:`iclab.training.train` recognises besides a sampler.

    ``check(config)`` is called once, before any work, and raises :class:`~iclab.core.errors.ConfigError` for a
    config the source cannot serve; ``at(step, config)`` is the training batch of ``step`` (0-based; the trainer
    casts it to ``config.dtype`` and its device, once per distinct object returned, so return the same object for
    the steps that share a batch); ``test(config)`` is the held-out episode of ``test_loss`` when
    :func:`~iclab.training.train` is given no ``test_episode``. ``at`` must depend on ``step`` alone (not on the
    calls before it), so that a resumed run reads the batches an uninterrupted one reads.
    """

    def check(self, config: TrainConfig) -> None:
        """Raise a :class:`~iclab.core.ConfigError` when the source cannot serve ``config``."""
        ...

    def at(self, step: int, config: TrainConfig) -> Episode:
        """The training batch of step ``step`` (0-based); a function of ``step`` alone."""
        ...

    def test(self, config: TrainConfig) -> Episode:
        """The held-out episode for ``test_loss``."""
        ...


class GivenBatches:
    """Train on the batches you give: step t reads ``episodes[t // config.resample_every]``.

        result = train(model, GivenBatches(batches), TrainConfig(steps=len(batches), batch_size=64, ...))

    With ``resample_every = 1`` (the default) one batch per step; with k, each batch serves k consecutive steps
    (as a sampler's batch would); with 0 the first batch serves every step. ``config.batch_size`` must equal the
    batches' size and ``config.train_size`` must be null (the batches are the training data). The batches need
    not be in ``config.dtype``: the trainer casts each once. ``test``: the held-out episode of ``test_loss``
    (default: the first batch, so ``test_loss`` is then a training loss; pass ``train(..., test_episode=...)`` or
    ``test`` for a held-out one).

    Unused trailing batches are allowed. A resumed run reads the same batches (they are indexed by the step), but
    the checkpoint does not record them: resume a run only with the batches it started with.
    """

    def __init__(self, episodes: Sequence[Episode], *, test: Episode | None = None) -> None:
        if isinstance(episodes, Episode | str | bytes) or not isinstance(episodes, Sequence):
            raise ConfigError(f"GivenBatches.episodes must be a sequence of Episodes; got {type(episodes).__name__}")
        if not episodes:
            raise ConfigError("GivenBatches.episodes must hold at least one Episode; got an empty sequence")
        bad = next((i for i, e in enumerate(episodes) if not isinstance(e, Episode)), None)
        if bad is not None:
            raise ConfigError(f"GivenBatches.episodes[{bad}] must be an Episode; got {type(episodes[bad]).__name__}")
        first = episodes[0]
        for i, e in enumerate(episodes):
            if tuple(e.x.shape) != tuple(first.x.shape) or (e.y is None) != (first.y is None):
                raise ConfigError(
                    f"GivenBatches.episodes[{i}] must have the shape of episodes[0], x (B, n, d) = "
                    f"{tuple(first.x.shape)}; got {tuple(e.x.shape)}"
                )
        if test is not None and not isinstance(test, Episode):
            raise ConfigError(f"GivenBatches.test must be an Episode or None; got {type(test).__name__}")
        self.episodes: tuple[Episode, ...] = tuple(episodes)
        self._test = test

    def __len__(self) -> int:
        return len(self.episodes)

    def __repr__(self) -> str:
        return f"GivenBatches({len(self.episodes)} batches of x {tuple(self.episodes[0].x.shape)})"

    @staticmethod
    def needed(config: TrainConfig) -> int:
        """How many batches ``config`` reads: ⌈steps / resample_every⌉ (1 with ``resample_every = 0``)."""
        return 1 if config.resample_every == 0 else math.ceil(config.steps / config.resample_every)

    def check(self, config: TrainConfig) -> None:
        """Refuse, before any work, a config these batches cannot serve (too few, wrong size, a fixed set)."""
        if config.train_size is not None:
            raise ConfigError(
                f"TrainConfig.train_size must be null with GivenBatches (the batches are the training data); "
                f"got {config.train_size}"
            )
        size = self.episodes[0].batch_size
        if config.batch_size != size:
            raise ConfigError(
                f"TrainConfig.batch_size must equal the given batches' size {size}; got {config.batch_size}"
            )
        need = self.needed(config)
        if len(self.episodes) < need:
            every = "" if config.resample_every == 1 else f", a new one every resample_every = {config.resample_every}"
            raise ConfigError(
                f"GivenBatches holds {len(self.episodes)} batches; TrainConfig(steps={config.steps}{every}) reads "
                f"{need}: give more batches or train fewer steps"
            )

    def at(self, step: int, config: TrainConfig) -> Episode:
        """The batch of ``step``: ``episodes[step // resample_every]`` (``episodes[0]`` with ``resample_every = 0``)."""
        return self.episodes[0 if config.resample_every == 0 else step // config.resample_every]

    def test(self, config: TrainConfig) -> Episode:
        """The episode of ``test_loss``: ``test`` when given, else the first batch."""
        return self._test if self._test is not None else self.episodes[0]

    def __call__(self, batch: int, *, generator: torch.Generator | None = None, dtype: object = None) -> Episode:
        """Not a sampler: :func:`~iclab.training.train` tells it the step (it is callable so that a
        :class:`~iclab.training.TrainingRun` accepts it as its ``task``)."""
        raise TypeError(
            "GivenBatches is read by step (source.at(step, config)) by iclab.training.train; it cannot draw a batch"
        )
