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
from iclab.core.safe_parse import load_json_text
from iclab.core.seeding import derive_seed, generator
from iclab.training import stop
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
NEWEST = "checkpoint.new.pt"  # a checkpoint written in full, before the rotation renames it checkpoint.pt
CANDIDATES = (CHECKPOINT, NEWEST, PREVIOUS)  # where a checkpoint may be after a crash at any point of a rotation
METRICS = "metrics.jsonl"
PENDING_LOSSES = 1000  # at most this many steps' losses are held on the device before their finiteness check

log = logging.getLogger("iclab")


#: what a DivergenceError advises (:func:`_divergence`)
ADVICE = (
    "lower lr or enable clip, or set skip_nonfinite where a rare batch overflows (a run in the same directory then "
    "resumes from the checkpoint kept)"
)


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
    stop_when: Callable[[int], bool] | None = None,
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

    A run asked to stop (:mod:`iclab.training.stop`: the ``--time-limit`` deadline, SIGTERM, SIGUSR1, SIGINT; or
    ``stop_when(steps done)`` returning True, a test's hook) checkpoints at its next step boundary and raises
    :class:`~iclab.training.stop.Stopped`; the same call then continues it bit for bit.

    The steps are the methods of :class:`_Run`, in this order: set up, resume, the step loop, finish.
    """
    run = _Run(model, sample, config, out_dir, device, loss_fn, test_episode, snapshot_fn, description)
    finished = run.resume()
    if finished is not None:
        return finished
    if stop.should_stop():  # asked to stop before this run began (a queued run, a later stage)
        why = stop.requested() or "requested"
        if run.start == 0:
            raise stop.Stopped(f"{description} not started", why, not_started=1)
        raise stop.Stopped(f"{description} at step {run.start}/{config.steps}", why)
    run.open_tensorboard()
    t0 = time.perf_counter()
    run.loop(progress, t0, stop_when)
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
        self.skipped = (
            0  # steps skipped for a non-finite loss or gradient (cfg.skip_nonfinite), carried across a resume
        )
        self.streak = 0  # of them, the ones in a row up to the last step (cfg.skip_limit), carried across a resume
        self.step_times: list[float] = []
        self.eval_times: list[float] = []
        self.draw_times: list[float] = []
        self.pending: list[tuple[int, Tensor]] = []  # (step, loss) not yet checked finite (checked in one host sync)
        self.last_finite: tuple[int, Tensor] | None = None  # the newest loss checked finite

    def resume(self) -> TrainResult | None:
        """Resume from the last checkpoint in ``out_dir`` written under the same config: the model, the optimiser, the
        history and the snapshots, and the step to go on from. The batches need no saved state (they are a function
        of the seed and the step), so the run goes on bit for bit. The checkpoint is the newest one that verifies and
        fits this model and optimiser (:func:`_load_checkpoint`); ``metrics.jsonl`` is brought up to its history
        (:meth:`repair_metrics`). Returns the result of a run that had finished, else None (train from
        ``self.start``)."""
        if self.out is None:
            return None
        ck = _load_checkpoint(
            self.out, self.device, self.cfg_dict, lambda c: _checkpoint_problem(c, self.model, self.opt, self.cfg.steps)
        )
        if ck is None:
            return None
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.history, self.snap_steps, self.start = ck["history"], ck["snapshot_steps"], ck["step"]
        self.snaps = {k: list(v.unbind(0)) for k, v in ck["snapshots"].items()}
        self.resumed = self.start
        # the skip count of the checkpoint's own step (a skip after the last metrics row counts too); a checkpoint
        # written before the count was stored carries it in its last row
        self.skipped = int(ck.get("skipped", self.history[-1].get("skipped_steps", 0) if self.history else 0))
        self.streak = int(ck.get("streak", 0))
        self.repair_metrics()
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

    def loop(self, progress: Progress | None, t0: float, stop_when: Callable[[int], bool] | None = None) -> None:
        """The step loop from ``self.start`` to ``cfg.steps``: each step an optimiser step (:meth:`step`), then on their
        schedules the metrics row (:meth:`log`), a snapshot and a checkpoint (:meth:`save`; ``t0`` dates its
        seconds). Under ``progress`` when a caller shares its bar, else a bar of its own when ``cfg.progress``.

        After each step but the last, :func:`iclab.training.stop.should_stop` (or ``stop_when(steps done)``) may stop
        the run: it checkpoints that step (the state :meth:`resume` goes on from) and raises
        :class:`~iclab.training.stop.Stopped`."""
        cfg = self.cfg
        if self.start == 0:
            if cfg.projection == "start_and_after_step":
                self.project()
            self.record_snapshot(0)
        with _progress_bar(cfg.progress, progress) as bar:
            task_id = bar.add_task(self.description, total=cfg.steps, completed=self.start) if bar is not None else None
            try:
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
                    saved = bool(cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps)
                    if saved:
                        self.save(done, False, time.perf_counter() - t0)
                    if done < cfg.steps and (stop.should_stop() or (stop_when is not None and stop_when(done))):
                        if not saved:
                            self.save(done, False, time.perf_counter() - t0)
                        if self.writer is not None:
                            self.writer.close()
                        where = f"{self.description} at step {done}/{cfg.steps}"
                        where += "" if self.out is not None else " (kept in memory only: it starts again)"
                        raise stop.Stopped(where, stop.requested() or "requested")
            finally:
                if bar is not None and task_id is not None and progress is not None:
                    bar.remove_task(task_id)

    def step(self, step: int) -> tuple[Tensor, float, bool]:
        """One optimiser step on ``step``'s batch at ``step``'s learning rate, the gradients clipped when ``cfg.clip``
        or ``cfg.clip_thresholds`` is set (:meth:`clip`) and the masked entries re-zeroed after the update when
        ``cfg.projection`` asks (:meth:`project`); with ``cfg.skip_nonfinite`` a non-finite loss or gradient skips the
        update (and the projection), and the ``cfg.skip_limit``-th step skipped in a row raises DivergenceError. The
        loss of every step that was not skipped is held, on the device, for :meth:`log`'s finiteness check. Returns
        (the loss before the update, the learning rate, whether the update was skipped). Its host time goes to ``step_times``, and the drawing of a
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
            # a float32 loss can overflow (one prompt's error² > 3.4e38) with every gradient finite: skipped too
            if cfg.skip_nonfinite and not (_all_finite([loss.detach()]) and _finite_gradients(params)):
                opt.zero_grad(set_to_none=True)  # one bad batch does not poison the weights
                self.skipped += 1
                self.streak += 1
                skipped_now = True
                if self.streak >= cfg.skip_limit:
                    raise self.diverged(
                        step,
                        f"{self.streak} steps in a row skipped for a non-finite loss or gradient (skip_limit)",
                        "every batch overflows: the weights, not a rare batch; lower lr or add warmup_steps",
                    )
            else:
                self.streak = 0
                self.clip()
                opt.step()
                if cfg.projection != "none":
                    self.project()
        if not skipped_now:
            self.pending.append((step, loss.detach()))  # checked finite in :meth:`log`, with no host sync here
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
        gradient check when skipping). Every step's loss is checked finite, not only the logged ones: the losses held
        since the last row are checked together at the row (:meth:`check_losses`, at least every ``PENDING_LOSSES``
        steps); the row's test loss and the parameters are checked too. A non-finite one raises DivergenceError naming
        the first step that had one (a non-finite test loss only warns under ``skip_nonfinite``). The row is appended
        to the history and written to TensorBoard."""
        cfg = self.cfg
        done = step + 1
        log_now = step % cfg.log_every == 0 or done == cfg.steps
        eval_now = bool(cfg.eval_every and step % cfg.eval_every == 0) or done == cfg.steps
        if not (log_now or eval_now):
            if len(self.pending) >= PENDING_LOSSES:
                self.check_losses()
            return None
        self.check_losses()
        row = {"step": float(step), "train_loss": float(loss.detach()), "lr": lr}
        if cfg.skip_nonfinite:
            row["skipped_steps"] = float(self.skipped)
        if eval_now:
            t_eval = time.perf_counter()
            row["test_loss"] = self.evaluate()
            self.eval_times.append(time.perf_counter() - t_eval)
        bad_param = _first_nonfinite(self.model)
        if bad_param is not None:
            raise self.diverged(step, f"parameter {bad_param!r} became non-finite")
        if not math.isfinite(row.get("test_loss", 0.0)):
            if not cfg.skip_nonfinite:
                raise self.diverged(step, f"non-finite test loss ({row['test_loss']})")
            # the weights are finite: a rare test prompt overflows, as a rare batch does (a run whose every batch
            # overflows ends at skip_limit); the row keeps the value
            log.warning("%s: non-finite test loss (%s) at step %d, kept in the curve", self.description,
                        row["test_loss"], step)  # fmt: skip
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

    def check_losses(self) -> None:
        """Check the losses held since the last check finite, in one host sync; a non-finite one raises
        DivergenceError naming the first step that had one."""
        if not self.pending:
            return
        first = _first_nonfinite_loss([loss for _, loss in self.pending])
        if first is None:
            self.last_finite, self.pending = self.pending[-1], []
            return
        if first > 0:
            self.last_finite = self.pending[first - 1]
        step, loss = self.pending[first]
        self.pending = []
        raise self.diverged(step, f"non-finite loss ({float(loss)})")

    def check_state(self, step: int) -> None:
        """Before the checkpoint of ``step`` (steps done): every loss since the last check, the parameters and the
        optimiser state finite, else DivergenceError; a diverged state is never written."""
        self.check_losses()
        bad_param = _first_nonfinite(self.model)
        if bad_param is not None:
            raise self.diverged(step - 1, f"parameter {bad_param!r} became non-finite")
        if not _all_finite(_state_tensors(self.opt.state_dict()["state"])):
            raise self.diverged(step - 1, "the optimiser state became non-finite")

    def diverged(self, step: int, what: str, advice: str = ADVICE) -> DivergenceError:
        """The DivergenceError of ``what`` at ``step``, with the newest finite loss and the checkpoints kept."""
        last: tuple[int, float] | None = None
        if self.last_finite is not None:
            last = (self.last_finite[0], float(self.last_finite[1]))
        else:
            row = next((r for r in reversed(self.history) if math.isfinite(r.get("train_loss", math.nan))), None)
            last = (int(row["step"]), row["train_loss"]) if row is not None else None
        return _divergence(self.description, step, what, last, self.out, advice)

    def repair_metrics(self) -> None:
        """Bring ``metrics.jsonl`` up to the resumed checkpoint's history: a file behind it (a write the disk refused),
        damaged or missing is rewritten from it, so no acknowledged row is lost; rows ahead of it (a newer checkpoint
        set aside) are left, and the run writes them again, identical."""
        assert self.out is not None
        path = self.out / METRICS
        rows = _read_rows(path)
        if rows is not None and rows[: len(self.history)] == self.history:
            return
        try:
            atomic_write_text(path, _rows_text(self.history))
        except OSError as e:
            raise OutputError(
                f"{self.description}: could not rewrite {path} from the checkpoint of step {self.start} "
                f"({e.strerror or e}); the checkpoint is kept: free space and run the same command again"
            ) from e

    def save(self, step: int, finished: bool, seconds: float) -> None:
        """Checkpoint the run at ``step`` in ``out_dir`` (nothing without one), once its state is checked finite
        (:meth:`check_state`: a diverged state is never written), then rewrite ``metrics.jsonl`` from the history.

        The checkpoint is written in full as ``checkpoint.new.pt`` (temporary file, fsync, rename), then the rotation
        renames ``checkpoint.pt`` to ``checkpoint.prev.pt`` and the new one to ``checkpoint.pt``: a crash between any
        two steps leaves the newest checkpoint under a name :func:`_load_checkpoint` tries. A failed write raises
        OutputError saying what was written and what is kept."""
        out = self.out
        if out is None:
            return
        self.check_state(step)
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
            "skipped": self.skipped,
            "streak": self.streak,
        }
        try:
            atomic_torch_save(out / NEWEST, state)
            if (out / CHECKPOINT).is_file():
                rotate(out / CHECKPOINT, out / PREVIOUS)
            rotate(out / NEWEST, out / CHECKPOINT)
        except OSError as e:
            raise OutputError(
                f"{self.description}: could not write the checkpoint of step {step} in {out} ({e.strerror or e}); "
                f"{_kept(out)}; free space and run the same command again"
            ) from e
        try:
            atomic_write_text(out / METRICS, _rows_text(self.history))
        except OSError as e:
            raise OutputError(
                f"{self.description}: the checkpoint of step {step} is written ({out / CHECKPOINT}) but {METRICS} "
                f"could not be ({e.strerror or e}); free space and run the same command again: it rewrites {METRICS} "
                "from the checkpoint's history"
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


def _load_checkpoint(
    out: Path, device: torch.device, config: dict[str, Any], problem: Callable[[dict[str, Any]], str | None]
) -> dict[str, Any] | None:
    """The newest checkpoint of this run in ``out``: of ``checkpoint.pt``, ``checkpoint.new.pt`` (a rotation cut
    short) and ``checkpoint.prev.pt``, the one of the highest step that was written under ``config`` and verifies.
    ``checkpoint.prev.pt`` is read only when neither of the others is good: the rotation (:meth:`_Run.save`) never
    leaves it newer than a ``checkpoint.pt`` or ``checkpoint.new.pt`` beside it.

    A damaged file is set aside (:func:`~iclab.core.io.quarantine`, numbered names) with one warning line naming it
    and saying what the run does instead: torn, failing its checksum, a pickle asking for code (nothing in it is
    executed), or one that ``problem`` refuses (:func:`_checkpoint_problem`: tensors not the model's, a step out of
    range, a non-finite state). A checkpoint of another config (:func:`resumes_under`) is left alone: this run starts
    afresh over it."""
    best: tuple[str, dict[str, Any]] | None = None
    damaged: list[tuple[CorruptFileError, Path]] = []
    for name in CANDIDATES:
        path = out / name
        if not path.is_file() or (name == PREVIOUS and best is not None):
            continue
        try:
            ck = safe_torch_load(path, map_location=device)
            if not isinstance(ck, dict) or not {"config", "model", "optimizer", "step"} <= ck.keys():
                raise CorruptFileError(path, "not an iclab checkpoint")
            if not resumes_under(ck["config"], config):
                continue
            why = problem(ck)
            if why is not None:
                raise CorruptFileError(path, why)
        except CorruptFileError as e:
            damaged.append((e, quarantine(path)))
            continue
        if best is None or ck["step"] > best[1]["step"]:
            best = (name, ck)
    then = f"falling back to {best[0]} (step {best[1]['step']})" if best else "restarting this training run"
    for err, dest in damaged:
        log.warning("damaged checkpoint %s; moved to %s, %s", err, dest.name, then)
    return best[1] if best else None


def resumes_under(stored: object, config: dict[str, Any]) -> bool:
    """Whether a checkpoint written under the train config ``stored`` continues a run under ``config``: the same
    config, or the same but for ``skip_nonfinite`` turned on since. A run that could not skip and still checkpointed
    met no non-finite loss or gradient (every loss is checked before a checkpoint, and a non-finite gradient leaves a
    non-finite state, which :func:`_checkpoint_problem` refuses), so its steps are those the run that skips would have
    taken: a run that diverged on one rare batch goes on from its last checkpoint with the option on, instead of
    from step 0."""
    if stored == config:
        return True
    if not isinstance(stored, dict) or stored.get("skip_nonfinite") is not False or not config.get("skip_nonfinite"):
        return False
    return {**stored, "skip_nonfinite": config["skip_nonfinite"]} == config


def _checkpoint_problem(ck: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> str | None:
    """Why a checkpoint that loads cannot be resumed by ``model`` and ``opt``, or None: its step not an int in
    [0, ``steps``] (``steps`` when finished), its tensors not the model's (names, shapes, dtypes), its optimiser state
    not ``opt``'s, its history or snapshots malformed, or a non-finite tensor in the model or the optimiser state."""
    step = ck["step"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= steps:
        return f"its step {step!r} is not an int in [0, {steps}]"
    if ck.get("finished") and step != steps:
        return f"it says finished at step {step} of {steps}"
    for key, what in (("skipped", "skipped-step count"), ("streak", "count of steps skipped in a row")):
        count = ck.get(key, 0)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= step:
            return f"its {what} {count!r} is not an int in [0, {step}]"
    want, got = model.state_dict(), ck["model"]
    if not isinstance(got, dict) or set(got) != set(want):
        names = sorted(set(got) ^ set(want)) if isinstance(got, dict) else []
        return f"its tensors are not the model's ({', '.join(map(str, names[:4])) or type(got).__name__})"
    for key, w in want.items():
        g = got[key]
        if not isinstance(g, Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            seen = f"{tuple(g.shape)} {g.dtype}" if isinstance(g, Tensor) else type(g).__name__
            return f"its tensor {key!r} is {seen}; the model's is {tuple(w.shape)} {w.dtype}"
    why = _optimizer_problem(ck["optimizer"], opt)
    if why is not None:
        return why
    history, snaps, snap_steps = ck.get("history"), ck.get("snapshots"), ck.get("snapshot_steps")
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        return "its history is not a list of rows"
    if not isinstance(snap_steps, list) or not isinstance(snaps, dict):
        return "its snapshots are malformed"
    if any(not isinstance(v, Tensor) or v.ndim == 0 or len(v) != len(snap_steps) for v in snaps.values()):
        return "its snapshots do not match their steps"
    if not _all_finite(list(got.values()) + _state_tensors(ck["optimizer"]["state"])):
        return "it holds non-finite values (a diverged state)"
    return None


def _optimizer_problem(sd: object, opt: torch.optim.Optimizer) -> str | None:
    """Why ``sd`` is not a state of ``opt`` (its groups, and each state tensor's shape and dtype), or None."""
    if (
        not isinstance(sd, dict)
        or not isinstance(sd.get("state"), dict)
        or not isinstance(sd.get("param_groups"), list)
    ):
        return "its optimiser state is not one"
    groups = opt.param_groups
    theirs = sd["param_groups"]
    if len(theirs) != len(groups) or any(
        not isinstance(g, dict) or not isinstance(g.get("params"), list) or len(g["params"]) != len(h["params"])
        for g, h in zip(theirs, groups, strict=False)
    ):
        return "its optimiser groups are not the model's parameters"
    params = [p for h in groups for p in h["params"]]
    index = {i: p for g, h in zip(theirs, groups, strict=True) for i, p in zip(g["params"], h["params"], strict=True)}
    flat = (sum(p.numel() for p in params),)  # L-BFGS keeps flat vectors of all parameters
    for key, state in sd["state"].items():
        p = index.get(key)
        if p is None or not isinstance(state, dict):
            return f"its optimiser state names no parameter ({key!r})"
        lbfgs = isinstance(opt, torch.optim.LBFGS)
        shape = flat if lbfgs else p.shape
        for name, t in ((n, t) for n, v in state.items() for t in (v if isinstance(v, list | tuple) else [v])):
            if not isinstance(t, Tensor) or t.ndim == 0:
                continue
            fits = t.shape == shape
            if lbfgs and name in ("S", "Y", "rho"):  # iclab's LBFGS: the pairs as (cap, p) rows, ρ as a (cap,) vector
                fits = t.ndim == 1 if name == "rho" else t.ndim == 2 and t.shape[1:] == shape
            if not fits or t.dtype != p.dtype:
                return f"its optimiser state {name!r} is {tuple(t.shape)} {t.dtype}; want {tuple(shape)} {p.dtype}"
    return None


def _state_tensors(state: dict[Any, Any]) -> list[Tensor]:
    """The tensors of an optimiser's ``state_dict()['state']`` (L-BFGS keeps some in lists)."""
    out: list[Tensor] = []
    for st in state.values():
        for v in st.values() if isinstance(st, dict) else ():
            out.extend(t for t in (v if isinstance(v, list | tuple) else [v]) if isinstance(t, Tensor))
    return out


def _step_of(path: Path) -> object:
    try:
        ck = safe_torch_load(path)
    except CorruptFileError:
        return "unreadable"
    return ck.get("step", "?") if isinstance(ck, dict) else "?"


def _kept(out: Path | None) -> str:
    """What a failed write or a divergence leaves on disk to resume from: the checkpoints by step, newest first."""
    found = []
    for name in CANDIDATES if out is not None else ():
        assert out is not None
        step = _step_of(out / name) if (out / name).is_file() else None
        if isinstance(step, int):
            found.append((step, out / name))
    if not found:
        return "no checkpoint is kept: the same command restarts this training run"
    found.sort(key=lambda f: -f[0])
    others = "".join(f", and {path} (step {step})" for step, path in found[1:])
    newest = found[0][0]
    return f"the last good checkpoint is kept: {found[0][1]} (step {newest}){others}; the same command resumes from step {newest}"


def _first_nonfinite_loss(losses: list[Tensor], in_place: bool | None = None) -> int | None:
    """The index of the first non-finite scalar of ``losses``, or None. On a GPU (``in_place`` False) in one host sync
    (a stack); CPU scalars (``in_place`` None: by their device) are read in place, cheaper than a stack
    (benchmarks/bench_finite_check.py)."""
    if in_place if in_place is not None else losses[0].device.type == "cpu":
        finite = [math.isfinite(v.item()) for v in losses]
    else:
        finite = torch.isfinite(torch.stack(losses)).tolist()
    return None if all(finite) else finite.index(False)


def _first_nonfinite(model: nn.Module) -> str | None:
    """The name of the first parameter holding an inf/NaN, or None (one host sync when all are finite)."""
    if _all_finite(list(model.parameters())):
        return None
    return next(n for n, p in model.named_parameters() if not _all_finite([p]))


def _divergence(
    description: str, step: int, what: str, last: tuple[int, float] | None, out: Path | None, advice: str = ADVICE
) -> DivergenceError:
    """The DivergenceError of ``what`` (a non-finite loss, parameter or optimiser state) at ``step``: the newest
    finite train loss, the checkpoints kept (:func:`_kept`; none is ever a diverged state) and what to change."""
    last_text = f"last finite train loss {last[1]:.6g} at step {last[0]}" if last else "no finite loss"
    kept = f"; {_kept(out)}" if out is not None else ""
    return DivergenceError(f"{description}: {what} at step {step} ({last_text}){kept}; {advice}", step=step)


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
    """Rows of a run's ``metrics.jsonl``; a damaged file raises ``CorruptFileError`` naming it."""
    path = Path(out_dir) / METRICS
    try:
        return [load_json_text(line, what=METRICS) for line in path.read_text().splitlines() if line.strip()]
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptFileError(path, f"not JSON lines ({e})") from e


def _read_rows(path: Path) -> list[dict[str, Any]] | None:
    """The rows of a ``metrics.jsonl``, or None when it is missing or damaged."""
    try:
        rows = load_history(path.parent)
    except (OSError, CorruptFileError):
        return None
    return rows if all(isinstance(r, dict) for r in rows) else None


def _rows_text(history: list[dict[str, float]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in history)
