"""One trainer for every model and task: seeded, resumable, logged.

    result = train(model, functools.partial(task.sample, n=20), TrainConfig(steps=2000), out_dir="runs/x")

Randomness is stateless per step: the batch used at step t comes from
``generator(derive_seed(seed, "data", t0))`` with t0 the last resampling step, so an interrupted
run resumes bit-for-bit from its last checkpoint without saving generator states. A data source
told the step (:class:`~iclab.training.data.StepSource`, e.g. :class:`~iclab.training.GivenBatches`)
is read by step in place of the sampler (:mod:`iclab.training.data`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import Tensor, nn

from iclab.core.config import identity
from iclab.core.episode import Episode
from iclab.core.errors import ConfigError, CorruptFileError, DivergenceError, OutputError
from iclab.core.io import atomic_torch_save, atomic_write_text, quarantine, rotate, safe_torch_load
from iclab.core.learner import Learner
from iclab.core.memory import activation_factor, check_fits
from iclab.core.seeding import derive_seed, generator
from iclab.training.config import TrainConfig
from iclab.training.data import StepSource
from iclab.training.optim import clip_gradients, clip_groups_, lr_factor, make_optimizer
from iclab.training.results import StepTiming as StepTiming
from iclab.training.results import TrainResult as TrainResult

Sampler = Callable[..., Episode]  # sample(batch, *, generator, dtype) -> Episode, e.g. partial(task.sample, n=20)
LossFn = Callable[[nn.Module, Episode], Tensor]
SnapshotFn = Callable[[nn.Module], dict[str, Tensor]]

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the last: the fallback when the last is damaged
METRICS = "metrics.jsonl"

log = logging.getLogger("iclab")


def mse_loss(model: nn.Module, episode: Episode) -> Tensor:
    """Mean squared error of the query prediction, E(ŷ − y_q)² (Ahn et al. 2023, eq. 5/58)."""
    assert episode.y_query is not None  # a regression episode
    return (cast(Learner, model).predict(episode) - episode.y_query).pow(2).mean()


class _Data:
    """The batch for step t, deterministic in (seed, t): drawn from a sampler, or read from a step source."""

    def __init__(
        self, sample: Sampler | StepSource, cfg: TrainConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.source = sample if isinstance(sample, StepSource) else None  # checked by _Run before any work
        self.sample, self.cfg, self.device, self.dtype = cast(Sampler, sample), cfg, device, dtype
        self._key: int | None = None
        self._raw: Episode | None = None  # the step source's last batch, before the cast
        self._batch: Episode | None = None
        self._fixed: Episode | None = None
        self.draws = 0  # training batches (or the fixed set) drawn so far

    @property
    def draw_every(self) -> int:
        """Steps per newly drawn batch; 0 where one set is drawn once."""
        return 0 if self.cfg.train_size is not None else self.cfg.resample_every

    def _draw(self, batch: int, *names: object) -> Episode:
        ep = self.sample(batch, generator=generator(derive_seed(self.cfg.seed, *names), self.device), dtype=self.dtype)
        return ep if ep.dtype == self.dtype else ep.to(dtype=self.dtype)

    def probe(self) -> Episode:
        """One episode (or a sampler's fixed set) whose bytes :func:`_check_memory` measures."""
        if self.source is not None:
            return self.source.at(0, self.cfg)[:1]
        return self._draw(1, "memory-probe")

    def test(self) -> Episode:
        """The test set when :func:`train` is given none: the source's, or drawn from the sampler."""
        if self.source is not None:
            return self.source.test(self.cfg)
        return self._draw(self.cfg.eval_batch, "test")

    def at(self, step: int) -> Episode:
        cfg = self.cfg
        if self.source is not None:
            raw = self.source.at(step, cfg)
            if raw is not self._raw:  # a new batch: cast once
                self._raw, self._batch = raw, raw.to(device=self.device, dtype=self.dtype)
                self.draws += 1
            assert self._batch is not None
            return self._batch
        if cfg.train_size is not None:
            if self._fixed is None:
                self._fixed = self._draw(cfg.train_size, "train-set")
                self.draws += 1
            if cfg.batch_size == cfg.train_size:
                return self._fixed
            g = generator(derive_seed(cfg.seed, "minibatch", step), self.device)
            idx = torch.randperm(cfg.train_size, generator=g, device=self.device)[: cfg.batch_size]
            return self._fixed[idx]
        key = 0 if cfg.resample_every == 0 else (step // cfg.resample_every) * cfg.resample_every
        if key != self._key:
            self._batch, self._key = self._draw(cfg.batch_size, "data", key), key
            self.draws += 1
        assert self._batch is not None
        return self._batch


@contextlib.contextmanager
def _progress_bar(enabled: bool, shared: Progress | None) -> Iterator[Progress | None]:
    if shared is not None or not enabled:
        yield shared
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    )
    with bar:
        yield bar


def train(
    model: nn.Module,
    sample: Sampler | StepSource,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    device: torch.device | str = "cpu",
    loss_fn: LossFn = mse_loss,
    test_episode: Episode | None = None,
    snapshot_fn: SnapshotFn | None = None,
    progress: Progress | None = None,
    description: str = "train",
) -> TrainResult:
    """Train ``model`` in place on batches from ``sample`` and return its history.

    ``sample``: a sampler ``sample(batch, *, generator, dtype)`` the trainer seeds per step, or a source told
    the step (:class:`~iclab.training.data.StepSource`): ``train(model, GivenBatches(batches), config)`` trains
    step t on ``batches[t // config.resample_every]`` (:mod:`iclab.training.data`).

    With ``out_dir`` the run checkpoints there every ``config.checkpoint_every`` steps (atomic
    writes) and resumes from the last checkpoint if one exists for the same config; a finished
    run is loaded, not retrained. Metrics go to ``metrics.jsonl`` (and TensorBoard under ``tb/``
    when ``config.tensorboard``). ``snapshot_fn(model)`` is recorded every
    ``config.snapshot_every`` steps, at step 0 and at the end.

    The steps are the methods of :class:`_Run`, in this order: set up, resume, the step loop, finish.
    """
    run = _Run(model, sample, config, out_dir, device, loss_fn, test_episode, snapshot_fn, description)
    finished = run.resume()
    if finished is not None:
        return finished
    run.open_tensorboard()
    t0 = time.perf_counter()
    run.loop(progress, t0)
    return run.finish(t0)


class _Run:
    """One call of :func:`train`: the model, its optimiser and data, and what the run has recorded so far (history,
    snapshots, host timings). Each stage of the run is a method, called by :func:`train` in order."""

    def __init__(
        self,
        model: nn.Module,
        sample: Sampler | StepSource,
        cfg: TrainConfig,
        out_dir: str | Path | None,
        device: torch.device | str,
        loss_fn: LossFn,
        test_episode: Episode | None,
        snapshot_fn: SnapshotFn | None,
        description: str,
    ) -> None:
        """Set up and validate: the model may refuse the config (e.g. an Ensemble refuses L-BFGS and global clipping),
        and so may a step source (:meth:`~iclab.training.data.StepSource.check`); the model's clip groups and
        projection masks are checked when the config uses them; all before the model is moved to ``device`` in
        ``cfg.dtype``. The optimiser takes its trainable parameters (there must be some);
        a batch that cannot fit in memory is refused before it is drawn; the test set is drawn unless given."""
        check = getattr(model, "check_train_config", None)
        if check is not None:
            check(cfg)
        if isinstance(sample, StepSource):
            sample.check(cfg)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters")
        self.groups = _checked_groups(model, self.params, cfg) if cfg.clip_mode == "per_group" and cfg.clipping else []
        masks = _checked_masks(model, cfg) if cfg.projection != "none" or not cfg.clip_masked else {}
        self.device = torch.device(device)
        dtype = getattr(torch, cfg.dtype)
        model.to(device=self.device, dtype=dtype)  # in place: the parameters, and so the groups' and masks' keys, stay
        self.masks = {p: m.to(self.device) for p, m in masks.items()}
        self.opt = make_optimizer(self.params, cfg)
        self.data = _Data(sample, cfg, self.device, dtype)
        _check_memory(self.data, cfg, self.device, description, _depth(model))
        test = test_episode if test_episode is not None else self.data.test()
        self.test = test.to(device=self.device, dtype=dtype)
        self.model, self.cfg, self.loss_fn, self.snapshot_fn, self.description = (
            model, cfg, loss_fn, snapshot_fn, description
        )  # fmt: skip
        self.out = Path(out_dir) if out_dir is not None else None
        self.cfg_dict = identity(cfg)  # a checkpoint matches the configs of the same run (core.config.identity)
        self.history: list[dict[str, float]] = []
        self.snaps: dict[str, list[Tensor]] = {}
        self.snap_steps: list[int] = []
        self.start = 0
        self.resumed: int | None = None  # the step a checkpoint was resumed from
        self.writer: Any = None
        self.skipped = 0  # steps skipped for a non-finite gradient (cfg.skip_nonfinite), carried across a resume
        self.step_times: list[float] = []
        self.eval_times: list[float] = []
        self.draw_times: list[float] = []

    def resume(self) -> TrainResult | None:
        """Resume from the last checkpoint in ``out_dir`` written under the same config: the model, the optimiser, the
        history and the snapshots, and the step to go on from. The batches need no saved state (they are a function
        of the seed and the step), so the run goes on bit for bit. Returns the result of a run that had finished,
        else None (train from ``self.start``)."""
        ck = _load_checkpoint(self.out, self.device) if self.out is not None else None
        if ck is None or ck.get("config") != self.cfg_dict:
            return None
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.history, self.snap_steps, self.start = ck["history"], ck["snapshot_steps"], ck["step"]
        self.snaps = {k: list(v.unbind(0)) for k, v in ck["snapshots"].items()}
        self.resumed = self.start
        if not ck.get("finished"):
            return None
        return TrainResult(
            self.model, self.history, _stack(self.snaps), self.snap_steps, self.resumed, ck.get("seconds", 0.0)
        )

    def open_tensorboard(self) -> None:
        """With ``cfg.tensorboard``, a writer under ``out_dir/tb`` that drops the events logged after the resumed
        step."""
        if self.out is not None and self.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tb"), purge_step=self.start if self.start else None)

    def loop(self, progress: Progress | None, t0: float) -> None:
        """The step loop from ``self.start`` to ``cfg.steps``: each step an optimiser step (:meth:`step`), then on their
        schedules the metrics row (:meth:`log`), a snapshot and a checkpoint (:meth:`save`; ``t0`` dates its
        seconds). Under ``progress`` when a caller shares its bar, else a bar of its own when ``cfg.progress``."""
        cfg = self.cfg
        if self.start == 0:
            if cfg.projection == "start_and_after_step":
                self.project()
            self.record_snapshot(0)
        with _progress_bar(cfg.progress, progress) as bar:
            task_id = bar.add_task(self.description, total=cfg.steps, completed=self.start) if bar is not None else None
            self.skipped = int(self.history[-1].get("skipped_steps", 0)) if self.history else 0
            for step in range(self.start, cfg.steps):
                loss, lr, skipped_now = self.step(step)
                done = step + 1
                row = self.log(step, loss, lr, skipped_now)
                if row is not None and bar is not None and task_id is not None:
                    bar.update(task_id, description=f"{self.description} loss={row['train_loss']:.4g}")
                if cfg.snapshot_every and done % cfg.snapshot_every == 0:
                    self.record_snapshot(done)
                if bar is not None and task_id is not None:
                    bar.update(task_id, completed=done)
                if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
                    self.save(done, False, time.perf_counter() - t0)
            if bar is not None and task_id is not None and progress is not None:
                bar.remove_task(task_id)

    def step(self, step: int) -> tuple[Tensor, float, bool]:
        """One optimiser step on ``step``'s batch at ``step``'s learning rate, the gradients clipped when ``cfg.clip``
        or ``cfg.clip_thresholds`` is set (:meth:`clip`) and the masked entries re-zeroed after the update when
        ``cfg.projection`` asks (:meth:`project`); with ``cfg.skip_nonfinite`` a non-finite gradient skips the update
        (and the projection). Returns (the loss before the update, the
        learning rate, whether the update was skipped). Its host time goes to ``step_times``, and the drawing of a
        new batch, timed apart, to ``draw_times``."""
        cfg, opt, params, model = self.cfg, self.opt, self.params, self.model
        t_step = time.perf_counter()
        skipped_now = False
        lr = cfg.lr * lr_factor(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        drawn = self.data.draws
        batch = self.data.at(step)
        t_draw = 0.0
        if self.data.draws != drawn:  # a new batch: timed apart from the step
            t_draw = time.perf_counter() - t_step
            self.draw_times.append(t_draw)
        if cfg.optimizer == "lbfgs":

            def closure(batch: Episode = batch) -> Tensor:
                opt.zero_grad(set_to_none=True)
                loss = self.loss_fn(model, batch)
                loss.backward()
                self.clip()
                return loss

            # torch.optim types a closure as returning a float; LBFGS's returns (and step passes on) the Tensor loss
            loss = cast(Tensor, opt.step(closure))  # type: ignore[arg-type]  # the closure returns a Tensor
            if cfg.projection != "none":
                self.project()
        else:
            opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(model, batch)
            loss.backward()
            if cfg.skip_nonfinite and not _finite_gradients(params):
                opt.zero_grad(set_to_none=True)  # one bad batch does not poison the weights
                self.skipped += 1
                skipped_now = True
            else:
                self.clip()
                opt.step()
                if cfg.projection != "none":
                    self.project()
        self.step_times.append(time.perf_counter() - t_step - t_draw)
        return loss, lr, skipped_now

    def clip(self) -> None:
        """Clip the gradients as ``cfg`` says (:class:`~iclab.training.TrainConfig`): per matrix, globally, or per clip
        group (:func:`clip_groups`) to its threshold, with the config's coefficient rule, the masked entries in or out
        of the norms."""
        cfg = self.cfg
        if not cfg.clipping:
            return
        masks = None if cfg.clip_masked else self.masks
        if cfg.clip_mode == "per_group":
            thresholds = cfg.clip_thresholds or (cast(float, cfg.clip),) * len(self.groups)
            clip_groups_(self.groups, thresholds, eps=cfg.clip_eps or 0.0, masks=masks)
        else:
            clip_gradients(self.params, cast(float, cfg.clip), cfg.clip_mode, eps=cfg.clip_eps, masks=masks)

    @torch.no_grad()
    def project(self) -> None:
        """Zero the entries the model holds at zero (its ``projection_masks()``), in place."""
        for p, mask in self.masks.items():
            p.masked_fill_(mask, 0)

    def log(self, step: int, loss: Tensor, lr: float, skipped_now: bool) -> dict[str, float] | None:
        """The metrics row of ``step`` when one is due (every ``log_every`` steps; with the test loss every
        ``eval_every`` steps; both at the last step), else None. The row is the step's only host sync (besides the
        gradient check when skipping); it is checked finite (a non-finite loss or parameter raises DivergenceError),
        appended to the history and written to TensorBoard."""
        cfg = self.cfg
        done = step + 1
        log_now = step % cfg.log_every == 0 or done == cfg.steps
        eval_now = bool(cfg.eval_every and step % cfg.eval_every == 0) or done == cfg.steps
        if not (log_now or eval_now):
            return None
        row = {"step": float(step), "train_loss": float(loss.detach()), "lr": lr}
        if cfg.skip_nonfinite:
            row["skipped_steps"] = float(self.skipped)
        if eval_now:
            t_eval = time.perf_counter()
            row["test_loss"] = self.evaluate()
            self.eval_times.append(time.perf_counter() - t_eval)
        checked = {k: v for k, v in row.items() if not (skipped_now and k == "train_loss")}
        bad_param = _first_nonfinite(self.model)
        if bad_param is not None or not all(math.isfinite(v) for v in checked.values()):
            raise _divergence(self.description, step, row, bad_param, self.history, self.out)
        self.history.append(row)
        if self.writer is not None:
            for k, v in row.items():
                if k != "step":
                    self.writer.add_scalar(k, v, step)
        return row

    @torch.no_grad()
    def evaluate(self) -> float:
        """The loss on the test set, without gradients."""
        return float(self.loss_fn(self.model, self.test))

    def record_snapshot(self, step: int) -> None:
        """Append ``snapshot_fn(model)`` (float64, on the CPU) as the snapshot of ``step``, once per step."""
        if self.snapshot_fn is None or (self.snap_steps and self.snap_steps[-1] == step):
            return
        with torch.no_grad():
            for k, v in self.snapshot_fn(self.model).items():
                self.snaps.setdefault(k, []).append(v.detach().to("cpu", torch.float64).clone())
        self.snap_steps.append(step)

    def save(self, step: int, finished: bool, seconds: float) -> None:
        """Checkpoint the run at ``step`` in ``out_dir`` (nothing without one): the last checkpoint is kept as the
        previous one, the new one written atomically, and ``metrics.jsonl`` rewritten. A failed write raises
        OutputError naming the checkpoint kept."""
        out = self.out
        if out is None:
            return
        state = {
            "config": self.cfg_dict,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "step": step,
            "history": self.history,
            "snapshots": _stack(self.snaps),
            "snapshot_steps": self.snap_steps,
            "finished": finished,
            "seconds": seconds,
        }
        try:
            if (out / CHECKPOINT).is_file():
                rotate(out / CHECKPOINT, out / PREVIOUS)
            atomic_torch_save(out / CHECKPOINT, state)
            atomic_write_text(out / METRICS, "".join(json.dumps(r) + "\n" for r in self.history))
        except OSError as e:
            kept = next(
                (f"{n} (step {_step_of(out / n)})" for n in (CHECKPOINT, PREVIOUS) if (out / n).is_file()), None
            )
            raise OutputError(
                f"{self.description}: could not write the checkpoint of step {step} in {out} ({e.strerror or e}); "
                + (f"the last good checkpoint is kept: {kept}; " if kept else "no checkpoint was kept; ")
                + "free space and run the same command again to resume"
            ) from e

    def finish(self, t0: float) -> TrainResult:
        """Finish: the snapshot of the last step, the final checkpoint (marked finished, with the seconds since ``t0``),
        the TensorBoard writer closed; the result carries this call's :meth:`timing`."""
        self.record_snapshot(self.cfg.steps)
        seconds = time.perf_counter() - t0
        self.save(self.cfg.steps, True, seconds)
        if self.writer is not None:
            self.writer.close()
        return TrainResult(
            self.model, self.history, _stack(self.snaps), self.snap_steps, self.resumed, seconds, timing=self.timing()
        )

    def timing(self) -> StepTiming | None:
        """The host timing of the steps this call ran; None on a GPU (a step's host time is its launch time, not its
        cost) or when no step ran."""
        if not self.step_times or self.device.type != "cpu":
            return None
        return StepTiming(
            statistics.median(self.step_times),
            len(self.step_times),
            sum(self.eval_times) / len(self.eval_times) if self.eval_times else 0.0,
            len(self.eval_times),
            self.cfg.eval_every,
            sum(self.draw_times) / len(self.draw_times) if self.draw_times else 0.0,
            len(self.draw_times),
            self.data.draw_every,
        )


def clip_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The clip groups of ``model`` for ``clip_mode='per_group'``, in threshold order.

    A model declares its own with a ``clip_groups()`` method returning lists of parameters (group i is clipped to
    ``clip_thresholds[i]``). Without one: one group per element of ``model.layers`` (an ``nn.ModuleList``, as
    every iclab stack has: layer i's parameters together, as Cheng et al. 2024 clip layer i), then one group per
    parameter outside the layers; a model without ``layers``: one group per parameter."""
    declared = getattr(model, "clip_groups", None)
    if callable(declared):
        return [list(g) for g in declared()]
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        return [[p] for p in model.parameters()]
    groups = [list(layer.parameters()) for layer in layers]
    inside = {id(p) for g in groups for p in g}
    return groups + [[p] for p in model.parameters() if id(p) not in inside]


def _checked_groups(model: nn.Module, params: list[nn.Parameter], cfg: TrainConfig) -> list[list[nn.Parameter]]:
    """:func:`clip_groups` restricted to the trainable parameters, refused before any work when a trainable
    parameter is in no group or in two, when there are fewer thresholds than groups, or for an Ensemble (one group
    norm would mix its members)."""
    name = type(model).__name__
    if any(getattr(p, "ensemble_axis", False) for p in params):
        raise ConfigError(
            f"TrainConfig.clip_mode 'per_group' cannot train {name}: a group's norm would mix the ensemble's members"
        )
    trainable = {id(p) for p in params}
    groups = [[p for p in g if id(p) in trainable] for g in clip_groups(model)]
    counts: dict[int, int] = {}
    for p in (p for g in groups for p in g):
        counts[id(p)] = counts.get(id(p), 0) + 1
    if any(counts.get(id(p), 0) != 1 for p in params):
        raise ConfigError(f"{name}.clip_groups() must hold every trainable parameter exactly once")
    if cfg.clip_thresholds is not None and len(cfg.clip_thresholds) < len(groups):
        raise ConfigError(
            f"TrainConfig.clip_thresholds must give one threshold per clip group of {name} ({len(groups)}); "
            f"got {len(cfg.clip_thresholds)}"
        )
    return groups


def _checked_masks(model: nn.Module, cfg: TrainConfig) -> dict[nn.Parameter, Tensor]:
    """The model's ``projection_masks()`` ({parameter name: bool mask of its shape}) as {parameter: mask}, refused
    before any work when the model declares none or a name or shape does not match."""
    name = type(model).__name__
    declared = getattr(model, "projection_masks", None)
    why = f"projection {cfg.projection!r}" if cfg.projection != "none" else "clip_masked false"
    if not callable(declared):
        raise ConfigError(f"TrainConfig.{why} needs a model with projection_masks(); {name} has none")
    named = dict(model.named_parameters())
    out: dict[nn.Parameter, Tensor] = {}
    for key, mask in declared().items():
        p = named.get(key)
        if p is None:
            raise ConfigError(f"{name}.projection_masks() names {key!r}, which is not a parameter of {name}")
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != p.shape:
            raise ConfigError(f"{name}.projection_masks()[{key!r}] must be a bool tensor of shape {tuple(p.shape)}")
        out[p] = mask
    return out


def _load_checkpoint(out: Path, device: torch.device) -> dict[str, Any] | None:
    """The newest checkpoint in ``out`` that verifies: ``checkpoint.pt``, else ``checkpoint.prev.pt``, else None.

    A damaged file (torn, failing its checksum, or a pickle asking for code) is moved aside to ``<name>.corrupt``
    with one warning line naming it; nothing in it is executed."""
    for name in (CHECKPOINT, PREVIOUS):
        path = out / name
        if not path.is_file():
            continue
        try:
            ck = safe_torch_load(path, map_location=device)
            if not isinstance(ck, dict) or not {"config", "model", "optimizer", "step"} <= ck.keys():
                raise CorruptFileError(path, "not an iclab checkpoint")
            return ck
        except CorruptFileError as e:
            dest = quarantine(path)
            then = "falling back to the previous checkpoint" if name == CHECKPOINT else "restarting this training run"
            log.warning("damaged checkpoint %s; moved to %s, %s", e, dest.name, then)
    return None


def _step_of(path: Path) -> object:
    try:
        return safe_torch_load(path).get("step", "?")
    except CorruptFileError:
        return "unreadable"


def _first_nonfinite(model: nn.Module) -> str | None:
    """The name of the first parameter holding an inf/NaN, or None (one host sync when all are finite)."""
    if _all_finite(list(model.parameters())):
        return None
    return next(n for n, p in model.named_parameters() if not _all_finite([p]))


def _divergence(
    description: str,
    step: int,
    row: dict[str, float],
    param: str | None,
    history: list[dict[str, float]],
    out: Path | None,
) -> DivergenceError:
    last = next((r for r in reversed(history) if math.isfinite(r.get("train_loss", math.nan))), None)
    where = f"parameter {param!r} became non-finite" if param is not None else "non-finite loss"
    kept = ""
    if out is not None and (out / CHECKPOINT).is_file():
        kept = f"; the last good checkpoint is kept ({out / CHECKPOINT}, step {_step_of(out / CHECKPOINT)})"
    last_text = (
        f"last finite train loss {last['train_loss']:.6g} at step {int(last['step'])}" if last else "no finite loss"
    )
    return DivergenceError(
        f"{description}: {where} at step {step} (train loss {row.get('train_loss')}, {last_text}){kept}; "
        "lower lr or enable clip"
    )


def _depth(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for name in ("n_layers", "n_blocks", "depth", "L"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 1


def _check_memory(data: _Data, cfg: TrainConfig, device: torch.device, description: str, depth: int) -> None:
    """Refuse a batch that cannot fit (``iclab.core.memory``) before it is allocated: one episode is drawn to
    measure its bytes."""
    one = data.probe()  # a sampler over a fixed set may return more than one episode
    per = sum(v.numel() * v.element_size() for v in vars(one).values() if isinstance(v, Tensor)) // one.batch_size
    owner = "train" if description == "train" else f"{description}.train"
    for field_name, n, factor in (
        ("batch_size", cfg.batch_size, activation_factor(depth)),
        ("train_size", cfg.train_size or 0, 1),
        ("eval_batch", cfg.eval_batch, depth + 1),  # no gradients
    ):
        what = f" ({n} episodes of {per} B x {factor})" if factor > 1 else f" ({n} episodes of {per} B)"
        check_fits(owner, field_name, n, per * n * factor, device, what)


def _all_finite(tensors: list[Tensor]) -> bool:
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()) if tensors else True


def _finite_gradients(params: list[nn.Parameter]) -> bool:
    return _all_finite([p.grad for p in params if p.grad is not None])


def _stack(snaps: dict[str, list[Tensor]]) -> dict[str, Tensor]:
    return {k: torch.stack(v) for k, v in snaps.items() if v}


def load_history(out_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of a run's ``metrics.jsonl``."""
    path = Path(out_dir) / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
