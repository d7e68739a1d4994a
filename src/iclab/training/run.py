"""One training run: the unit of work of every experiment (DESIGN: "an experiment's seed x config").

    spec = TrainingRun(
        name="seed0",
        model=ModelSpec(LinearTransformer, LinearTransformerConfig(d=5, n_layers=3)),
        task=functools.partial(task.sample, n=20),
        train=TrainConfig(steps=2000, lr=0.02),
        seed=0,
        out_dir=Path("runs/ahn2023.fig1/quick-1a2b3c/seed0"),
    )
    result = spec.execute()                 # a TrainResult: final model, metric curves, snapshots

A :class:`TrainingRun` is a frozen, picklable value (module-level functions and ``functools.partial`` of
bound methods of picklable tasks pickle by reference), so a backend can ship it to another process or
machine: :func:`execute_all` runs a list of them and is the one place that decides where they run.

Three regimes share the spec:

* ``"sampled"`` (default): the shared trainer (:func:`iclab.training.train`) on batches drawn from
  ``task``, a sampler ``sample(batch, *, generator, dtype) -> Episode``; checkpointed and resumable in
  ``out_dir``.
* ``"full_batch"``: plain GD on fixed training sets (:func:`iclab.training.full_batch_gd`, Zhang et al.
  2025's regime), ``task`` being the training :class:`Episode` or one per seed of a batched model; a token-level
  model (trained by autograd, an hour or more at a paper's epochs) checkpoints and resumes in ``out_dir`` as a sampled
  run does, a reduced model (its moment route: seconds) does not.
* ``"population"``: GD on the exact population loss (:func:`iclab.training.population_flow`), ``task``
  being the covariance Λ; no data at all.

A sampled run may be given ``retry_lr``: when its training ends in a
:class:`~iclab.core.errors.DivergenceError` (every batch overflowing, say), it trains once more from the same initial
weights at ``lr × retry_lr`` in ``out_dir/retry``, with ``diverged.json`` there saying at which lr and step the first
attempt diverged (and the hash of its train config); a later call of the same config goes straight to the retry, and ``TrainResult.retry`` says it happened.

The two reduced regimes record every ``train.eval_every`` steps and put the :class:`Trajectory` on the
result (``TrainResult.trajectory``); their learning rate and step count are ``train.lr`` and ``train.steps``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from rich.progress import Progress
from torch import Tensor, nn

from iclab.core.config import config_hash
from iclab.core.episode import Episode
from iclab.core.errors import ConfigError, CorruptFileError, DivergenceError, require
from iclab.core.io import atomic_write_json, read_json
from iclab.core.safe_parse import is_finite_number
from iclab.core.seeding import derive_seed, generator
from iclab.models.reduced_attention import _ReducedAttention
from iclab.training import stop
from iclab.training.config import TrainConfig
from iclab.training.population import Trajectory, full_batch_gd, population_flow
from iclab.training.trainer import CHECKPOINT, LossFn, SnapshotFn, TrainResult, mse_loss, train

Regime = Literal["sampled", "full_batch", "population"]
REGIMES = ("sampled", "full_batch", "population")
RETRY = "retry"  # the directory, under a run's own, of its second attempt at a lower lr (``TrainingRun.retry_lr``)
DIVERGED = "diverged.json"  # in it: {"lr", "step", "retry_lr"} of the first attempt's divergence

log = logging.getLogger("iclab")


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model: its class, its config (passed first) and/or keyword arguments.

    ``build(generator)`` calls ``cls(config, **kwargs, generator=generator)`` (``config`` left out when
    None), so the run's seed decides the initialisation. ``dtype`` casts the built model ("float64" for the
    reduced regimes, which do not cast; the sampled trainer casts to ``train.dtype`` itself).
    """

    cls: type[nn.Module]
    config: Any = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    dtype: Literal["float32", "float64"] | None = None

    def build(self, generator: torch.Generator | None = None) -> nn.Module:
        """A fresh model of this spec, its initial weights drawn with ``generator``."""
        args = () if self.config is None else (self.config,)
        model = self.cls(*args, **self.kwargs, generator=generator)
        return model.to(getattr(torch, self.dtype)) if self.dtype is not None else model


@dataclass(frozen=True, kw_only=True)
class TrainingRun:
    """One model trained on one task for one seed: everything a worker needs, and nothing it cannot pickle.

    ``model``: a :class:`ModelSpec` (built with ``generator(derive_seed(seed, *init_key))``) or an already
    built ``nn.Module`` (e.g. one loaded with a construction's weights), trained in place.
    ``train.seed`` is replaced by ``seed``. ``out_dir``: where a run that :attr:`checkpoints` writes its checkpoints
    and logs (None: in memory only). ``loss``/``snapshot``: module-level functions or partials of them.
    """

    name: str
    model: ModelSpec | nn.Module
    task: Any
    train: TrainConfig
    seed: int = 0
    init_key: tuple[str | int, ...] = ("init",)
    regime: Regime = "sampled"
    loss: LossFn = mse_loss
    snapshot: SnapshotFn | None = None
    test_episode: Episode | None = None
    out_dir: Path | None = None
    # the reduced regimes (Zhang et al. 2025): exact population loss of the iterates with Λ, 1/N or E(1/N)
    Lambda: Tensor | None = None
    inv_n: float | None = None
    next_token: bool = False
    #: a sampled run that diverges (DivergenceError) trains once more from its initial weights at lr × this; None: the
    #: error is raised
    retry_lr: float | None = None

    def __post_init__(self) -> None:
        owner = f"TrainingRun({self.name!r})"
        require(owner, "name", isinstance(self.name, str) and bool(self.name), "a non-empty string", self.name)
        require(owner, "regime", self.regime in REGIMES, f"one of {REGIMES}", self.regime)
        require(
            owner, "model", isinstance(self.model, ModelSpec | nn.Module), "a ModelSpec or an nn.Module", self.model
        )
        require(owner, "train", isinstance(self.train, TrainConfig), "a TrainConfig", type(self.train).__name__)
        if self.regime == "sampled" and not callable(self.task):
            raise ConfigError(f"{owner}.task must be a sampler sample(batch, *, generator, dtype) -> Episode")
        if self.regime == "full_batch" and not (
            isinstance(self.task, Episode)
            or (isinstance(self.task, Sequence) and all(isinstance(e, Episode) for e in self.task))
        ):
            raise ConfigError(f"{owner}.task must be an Episode or a sequence of Episodes (one per seed)")
        if self.regime == "population" and not isinstance(self.task, Tensor):
            raise ConfigError(f"{owner}.task must be the covariance Λ (a (d, d) tensor) in the population regime")
        if self.regime == "population" and self.inv_n is None:
            raise ConfigError(f"{owner}.inv_n must be set in the population regime (1/N, or E(1/N) for next-token)")
        if self.retry_lr is not None:
            ok = (
                isinstance(self.retry_lr, float | int) and not isinstance(self.retry_lr, bool) and 0 < self.retry_lr < 1
            )
            require(owner, "retry_lr", ok, "null or a float in (0, 1)", self.retry_lr)
            require(owner, "retry_lr", self.regime == "sampled", "null outside the sampled regime", self.retry_lr)
            # a module given whole is trained in place: its initial weights are gone once the first attempt diverged
            require(owner, "model", isinstance(self.model, ModelSpec), "a ModelSpec with retry_lr", self.model)

    @property
    def checkpoints(self) -> bool:
        """Whether this run checkpoints in ``out_dir`` (and so can stop and continue): a sampled run, and a full-batch
        run of a token-level model; the reduced models' moment route and the population flow keep none."""
        if self.regime == "sampled":
            return True
        cls = self.model.cls if isinstance(self.model, ModelSpec) else type(self.model)
        return self.regime == "full_batch" and not issubclass(cls, _ReducedAttention)

    def build_model(self) -> nn.Module:
        """The model this run trains: the given module, or a new one built from its spec."""
        if isinstance(self.model, nn.Module):
            return self.model
        return self.model.build(generator(derive_seed(self.seed, *self.init_key)))

    def execute(self, *, device: torch.device | str = "cpu", progress: Progress | None = None) -> TrainResult:
        """Train and return the :class:`TrainResult` (the trained model, its curves and snapshots)."""
        model = self.build_model()
        cfg = dataclasses.replace(self.train, seed=self.seed)
        if not self.checkpoints and stop.should_stop():  # nothing to continue from: start none
            raise stop.Stopped(f"{self.name} not started", stop.requested() or "requested", not_started=1)
        if self.regime == "sampled":
            retry = self._retried(cfg)
            if retry is None:
                try:
                    result = self._train(model, cfg, self.out_dir, device, progress)
                except DivergenceError as e:
                    if self.retry_lr is None:
                        raise
                    retry = self._diverged(cfg, e)
                    model = self.build_model()  # the same initial weights
            if retry is not None:
                out = None if self.out_dir is None else Path(self.out_dir) / RETRY
                result = self._train(model, dataclasses.replace(cfg, lr=retry["retry_lr"]), out, device, progress)
                result.retry = retry
        else:
            traj = self._reduced(model, cfg)
            result = TrainResult(model, [], trajectory=traj, timing=traj.timing)
        result.name, result.seed = self.name, self.seed
        return result

    def _train(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        out: Path | None,
        device: torch.device | str,
        progress: Progress | None,
    ) -> TrainResult:
        return train(
            model,
            self.task,
            cfg,
            out_dir=out,
            device=device,
            loss_fn=self.loss,
            test_episode=self.test_episode,
            snapshot_fn=self.snapshot,
            progress=progress,
            description=self.name,
        )

    def _retried(self, cfg: TrainConfig) -> dict[str, Any] | None:
        """The record of an earlier call's divergence (``retry/diverged.json``) when this run retries; None when there
        is none, it is unreadable (the first attempt then resumes, diverges again and writes it anew) or it was written
        under another train config or ``retry_lr`` (the first attempt trains under this one)."""
        if self.retry_lr is None or self.out_dir is None:
            return None
        path = Path(self.out_dir) / RETRY / DIVERGED
        if not path.is_file():
            return None
        try:
            record = read_json(path)
        except CorruptFileError as e:
            log.warning("%s: %s; the first attempt resumes", self.name, e)
            return None
        keys = {"lr", "step", "retry_lr"}
        if (
            not isinstance(record, dict)
            or set(record) != keys | {"config"}
            or not all(is_finite_number(record[k]) for k in keys)
        ):
            log.warning(
                "%s: %s does not hold %s; the first attempt resumes", self.name, path, sorted(keys | {"config"})
            )
            return None
        if record["config"] != config_hash(cfg) or record["retry_lr"] != cfg.lr * self.retry_lr:
            return None
        return {k: record[k] for k in ("lr", "step", "retry_lr")}

    def _diverged(self, cfg: TrainConfig, error: DivergenceError) -> dict[str, Any]:
        """Record the first attempt's divergence (in ``retry/diverged.json`` under ``out_dir``) and say so."""
        assert self.retry_lr is not None
        record = {
            "lr": cfg.lr,
            "step": error.step if error.step is not None else -1,
            "retry_lr": cfg.lr * self.retry_lr,
        }
        if self.out_dir is not None:  # with the first attempt's config: a record of another config is not this run's
            (Path(self.out_dir) / RETRY).mkdir(parents=True, exist_ok=True)
            atomic_write_json(Path(self.out_dir) / RETRY / DIVERGED, record | {"config": config_hash(cfg)})
        log.warning(
            "%s: diverged at step %s with lr %.6g (%s); training again from its initial weights at lr %.6g (retry_lr)",
            self.name, record["step"], cfg.lr, str(error).splitlines()[0][:200], record["retry_lr"],
        )  # fmt: skip
        return record

    def _reduced(self, model: nn.Module, cfg: TrainConfig) -> Trajectory:
        record = max(1, cfg.eval_every)
        if self.regime == "population":
            assert self.inv_n is not None
            return population_flow(model, self.task, inv_n=self.inv_n, lr=cfg.lr, steps=cfg.steps, record_every=record)
        return full_batch_gd(
            model,
            self.task,
            lr=cfg.lr,
            steps=cfg.steps,
            record_every=record,
            Lambda=self.Lambda,
            inv_n=self.inv_n,
            next_token=self.next_token,
            out_dir=self.out_dir,
            checkpoint_every=cfg.checkpoint_every,
            description=self.name,
        )


def check_names(runs: Sequence[TrainingRun]) -> None:
    """Training runs of one experiment need distinct names (each names its run directory)."""
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"training runs must have distinct names; repeated: {dup}")


def execute_all(
    runs: Sequence[TrainingRun], *, device: torch.device | str = "cpu", progress: Progress | None = None
) -> list[TrainResult]:
    """Execute ``runs`` in this process, one after another, and return their results in the same order.

    A run asked to stop (:mod:`iclab.training.stop`) checkpoints and raises :class:`~iclab.training.stop.Stopped`,
    counting the runs after it that have no checkpoint as not started (one with a checkpoint, from an earlier piece, is
    finished or partial in the progress line already).

    A backend (``iclab.experiments.backends``: a local process pool, Ray) runs each on a worker with
    :func:`execute_on` instead; :meth:`iclab.experiments.registry.RunContext.execute` chooses.
    """
    check_names(runs)
    results = []
    for i, r in enumerate(runs):
        try:
            results.append(r.execute(device=device, progress=progress))
        except stop.Stopped as e:  # the runs after it are not started; a caller's summary counts them
            fresh = sum(not has_checkpoint(q) for q in runs[i + 1 :])
            raise stop.Stopped(e.progress, e.reason, e.not_started + fresh) from None
    return results


def has_checkpoint(run: TrainingRun) -> bool:
    """Whether ``run`` has a checkpoint in its directory: an earlier piece trained it, in part or in full."""
    return run.out_dir is not None and (Path(run.out_dir) / CHECKPOINT).is_file()


def execute_on(run: TrainingRun, *, device: str = "cpu") -> TrainResult:
    """A backend's task: execute ``run`` on ``device`` (resolved on the worker) and return a result whose tensors are
    on the CPU, so that a driver without that device can read it."""
    from iclab.core.devices import resolve_device

    dev = resolve_device(device)
    result = run.execute(device=dev)
    return _to_cpu(result) if dev.type != "cpu" else result


def adopt(run: TrainingRun, result: TrainResult) -> TrainResult:
    """After a run trained on a worker: a run given an ``nn.Module`` finds that module trained in place, as when it
    trains in this process (the result's model is the run's own object)."""
    if isinstance(run.model, nn.Module) and result.model is not run.model:
        src = next(iter(result.model.state_dict().values()), None)
        if src is not None and src.is_floating_point():
            run.model.to(dtype=src.dtype)
        run.model.load_state_dict(result.model.state_dict())
        result.model = run.model
    return result


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.cpu()
    if isinstance(obj, nn.Module):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            object.__setattr__(obj, f.name, _to_cpu(getattr(obj, f.name)))
        return obj
    return obj
