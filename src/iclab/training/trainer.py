"""One trainer for every model and task: seeded, resumable, logged.

    result = train(model, functools.partial(task.sample, n=20), TrainConfig(steps=2000), out_dir="runs/x")

Randomness is stateless per step: the batch used at step t comes from
``generator(derive_seed(seed, "data", t0))`` with t0 the last resampling step, so an interrupted
run resumes bit-for-bit from its last checkpoint without saving generator states.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import Tensor, nn

from iclab.core.config import to_dict
from iclab.core.episode import Episode
from iclab.core.errors import CorruptFileError, DivergenceError, OutputError
from iclab.core.io import atomic_torch_save, atomic_write_text, quarantine, rotate, safe_torch_load
from iclab.core.memory import activation_factor, check_fits
from iclab.core.seeding import derive_seed, generator
from iclab.training.config import TrainConfig
from iclab.training.optim import clip_gradients, lr_factor, make_optimizer

if TYPE_CHECKING:
    from iclab.training.population import Trajectory

Sampler = Callable[..., Episode]  # sample(batch, *, generator, dtype) -> Episode, e.g. partial(task.sample, n=20)
LossFn = Callable[[nn.Module, Episode], Tensor]
SnapshotFn = Callable[[nn.Module], dict[str, Tensor]]

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the last: the fallback when the last is damaged
METRICS = "metrics.jsonl"

log = logging.getLogger("iclab")


def mse_loss(model: nn.Module, episode: Episode) -> Tensor:
    """Mean squared error of the query prediction, E(ŷ − y_q)² (Ahn et al. 2023, eq. 5/58)."""
    return (model.predict(episode) - episode.y_query).pow(2).mean()  # type: ignore[operator]


@dataclass(frozen=True)
class StepTiming:
    """Host-side wall time of a run's steps, measured inside the loop (CPU runs): the median optimiser step (data,
    forward, backward, clip, update), robust to a busy machine's stray slow steps, and the mean evaluation. What
    :func:`iclab.experiments.estimate.estimate_experiment` projects a run's cost from."""

    step_seconds: float  # median over the timed steps, the drawing of a new batch left out
    steps: int  # steps timed
    eval_seconds: float  # mean over the evaluations (0 when none ran)
    evals: int
    eval_every: int  # the config's; 0: only the last step evaluates
    draw_seconds: float = 0.0  # mean over the batches drawn (0 when none was)
    draws: int = 0
    draw_every: int = 0  # steps per new batch (resample_every); 0: drawn once (a fixed set, or resample_every 0)

    def per_step(self) -> float:
        """Seconds per step with the periodic evaluation amortised over ``eval_every`` steps and the drawing of a new
        batch over ``draw_every`` (Cheng et al.'s ReLU-GP batch of 30 000 prompts, drawn every 10 steps, cost as much
        as the step: a median step alone missed it)."""
        return (
            self.step_seconds
            + (self.eval_seconds / self.eval_every if self.eval_every else 0.0)
            + (self.draw_seconds / self.draw_every if self.draw_every else 0.0)
        )

    def accounted_seconds(self) -> float:
        """The part of the run's wall time that :meth:`per_step` stands for: the timed steps, the evaluations and the
        periodic draws (a set drawn once is the run's fixed cost, as its first evaluation is not)."""
        draws = self.draws * self.draw_seconds if self.draw_every else 0.0
        return self.steps * self.step_seconds + self.evals * self.eval_seconds + draws


@dataclass
class TrainResult:
    """What one training run returns: the trained model (its final parameters), the metric history and the
    parameter snapshots; ``name``/``seed`` say which :class:`~iclab.training.TrainingRun` it was, and the
    reduced regimes (full-batch GD, population flow) put their :class:`~iclab.training.Trajectory` here."""

    model: nn.Module
    history: list[dict[str, float]]  # one row per logged step: step, train_loss, lr[, test_loss]
    snapshots: dict[str, Tensor] = field(default_factory=dict)  # name -> (S, ...) on CPU
    snapshot_steps: list[int] = field(default_factory=list)
    resumed_from: int | None = None
    seconds: float = 0.0
    name: str = ""
    seed: int = 0
    trajectory: Trajectory | None = None
    timing: StepTiming | None = None  # the steps this call ran (None on a GPU, or a finished run reloaded)

    @property
    def final_test_loss(self) -> float:
        rows = [r for r in self.history if "test_loss" in r]
        return rows[-1]["test_loss"] if rows else float("nan")

    def curve(self, key: str) -> tuple[list[int], list[float]]:
        rows = [r for r in self.history if key in r]
        return [int(r["step"]) for r in rows], [r[key] for r in rows]

    def curve_tensor(self, key: str = "test_loss") -> tuple[Tensor, Tensor]:
        """The logged curve of ``key`` as (steps (T,) int64, values (T,) float64) tensors."""
        steps, values = self.curve(key)
        return torch.tensor(steps, dtype=torch.int64), torch.tensor(values, dtype=torch.float64)


class _Data:
    """The batch for step t, deterministic in (seed, t)."""

    def __init__(self, sample: Sampler, cfg: TrainConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.sample, self.cfg, self.device, self.dtype = sample, cfg, device, dtype
        self._key: int | None = None
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

    def at(self, step: int) -> Episode:
        cfg = self.cfg
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
    sample: Sampler,
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

    With ``out_dir`` the run checkpoints there every ``config.checkpoint_every`` steps (atomic
    writes) and resumes from the last checkpoint if one exists for the same config; a finished
    run is loaded, not retrained. Metrics go to ``metrics.jsonl`` (and TensorBoard under ``tb/``
    when ``config.tensorboard``). ``snapshot_fn(model)`` is recorded every
    ``config.snapshot_every`` steps, at step 0 and at the end.
    """
    cfg = config
    check = getattr(model, "check_train_config", None)  # e.g. an Ensemble refuses L-BFGS, global clipping
    if check is not None:
        check(cfg)
    device = torch.device(device)
    dtype = getattr(torch, cfg.dtype)
    model.to(device=device, dtype=dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    opt = make_optimizer(params, cfg)
    data = _Data(sample, cfg, device, dtype)
    _check_memory(data, cfg, device, description, _depth(model))
    test = (test_episode if test_episode is not None else data._draw(cfg.eval_batch, "test")).to(
        device=device, dtype=dtype
    )

    out = Path(out_dir) if out_dir is not None else None
    history: list[dict[str, float]] = []
    snaps: dict[str, list[Tensor]] = {}
    snap_steps: list[int] = []
    start, resumed = 0, None
    cfg_dict = to_dict(cfg)
    ck = _load_checkpoint(out, device) if out is not None else None
    if ck is not None and ck.get("config") == cfg_dict:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        history, snap_steps, start = ck["history"], ck["snapshot_steps"], ck["step"]
        snaps = {k: list(v.unbind(0)) for k, v in ck["snapshots"].items()}
        resumed = start
        if ck.get("finished"):
            return TrainResult(model, history, _stack(snaps), snap_steps, resumed, ck.get("seconds", 0.0))

    writer = None
    if out is not None and cfg.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"), purge_step=start if start else None)

    def record_snapshot(step: int) -> None:
        if snapshot_fn is None or (snap_steps and snap_steps[-1] == step):
            return
        with torch.no_grad():
            for k, v in snapshot_fn(model).items():
                snaps.setdefault(k, []).append(v.detach().to("cpu", torch.float64).clone())
        snap_steps.append(step)

    @torch.no_grad()
    def evaluate() -> float:
        return float(loss_fn(model, test))

    def save(step: int, finished: bool, seconds: float) -> None:
        if out is None:
            return
        state = {
            "config": cfg_dict,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "history": history,
            "snapshots": _stack(snaps),
            "snapshot_steps": snap_steps,
            "finished": finished,
            "seconds": seconds,
        }
        try:
            if (out / CHECKPOINT).is_file():
                rotate(out / CHECKPOINT, out / PREVIOUS)
            atomic_torch_save(out / CHECKPOINT, state)
            atomic_write_text(out / METRICS, "".join(json.dumps(r) + "\n" for r in history))
        except OSError as e:
            kept = next(
                (f"{n} (step {_step_of(out / n)})" for n in (CHECKPOINT, PREVIOUS) if (out / n).is_file()), None
            )
            raise OutputError(
                f"{description}: could not write the checkpoint of step {step} in {out} ({e.strerror or e}); "
                + (f"the last good checkpoint is kept: {kept}; " if kept else "no checkpoint was kept; ")
                + "free space and run the same command again to resume"
            ) from e

    t0 = time.perf_counter()
    step_times: list[float] = []
    eval_times: list[float] = []
    draw_times: list[float] = []
    if start == 0:
        record_snapshot(0)
    with _progress_bar(cfg.progress, progress) as bar:
        task_id = bar.add_task(description, total=cfg.steps, completed=start) if bar is not None else None
        skipped = int(history[-1].get("skipped_steps", 0)) if history else 0
        for step in range(start, cfg.steps):
            t_step = time.perf_counter()
            skipped_now = False
            lr = cfg.lr * lr_factor(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            drawn = data.draws
            batch = data.at(step)
            t_draw = 0.0
            if data.draws != drawn:  # a new batch: timed apart from the step
                t_draw = time.perf_counter() - t_step
                draw_times.append(t_draw)
            if cfg.optimizer == "lbfgs":

                def closure(batch: Episode = batch) -> Tensor:
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(model, batch)
                    loss.backward()
                    if cfg.clip is not None:
                        clip_gradients(params, cfg.clip, cfg.clip_mode)
                    return loss

                loss = opt.step(closure)  # type: ignore[arg-type]
            else:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model, batch)
                loss.backward()
                if cfg.skip_nonfinite and not _finite_gradients(params):
                    opt.zero_grad(set_to_none=True)  # one bad batch does not poison the weights
                    skipped += 1
                    skipped_now = True
                else:
                    if cfg.clip is not None:
                        clip_gradients(params, cfg.clip, cfg.clip_mode)
                    opt.step()
            step_times.append(time.perf_counter() - t_step - t_draw)
            done = step + 1
            row: dict[str, float] | None = None
            log_now = step % cfg.log_every == 0 or done == cfg.steps
            eval_now = bool(cfg.eval_every and step % cfg.eval_every == 0) or done == cfg.steps
            if log_now or eval_now:  # the only host sync of a step (plus the gradient check when skipping)
                row = {"step": float(step), "train_loss": float(loss.detach()), "lr": lr}
                if cfg.skip_nonfinite:
                    row["skipped_steps"] = float(skipped)
            if eval_now and row is not None:
                t_eval = time.perf_counter()
                row["test_loss"] = evaluate()
                eval_times.append(time.perf_counter() - t_eval)
            if row is not None:
                checked = {k: v for k, v in row.items() if not (skipped_now and k == "train_loss")}
                bad_param = _first_nonfinite(model)
                if bad_param is not None or not all(math.isfinite(v) for v in checked.values()):
                    raise _divergence(description, step, row, bad_param, history, out)
                history.append(row)
                if writer is not None:
                    for k, v in row.items():
                        if k != "step":
                            writer.add_scalar(k, v, step)
                if bar is not None and task_id is not None:
                    bar.update(task_id, description=f"{description} loss={row['train_loss']:.4g}")
            if cfg.snapshot_every and done % cfg.snapshot_every == 0:
                record_snapshot(done)
            if bar is not None and task_id is not None:
                bar.update(task_id, completed=done)
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
                save(done, False, time.perf_counter() - t0)
        if bar is not None and task_id is not None and progress is not None:
            bar.remove_task(task_id)
    record_snapshot(cfg.steps)
    seconds = time.perf_counter() - t0
    save(cfg.steps, True, seconds)
    if writer is not None:
        writer.close()
    timing = None
    if step_times and device.type == "cpu":  # a GPU step's host time is its launch time, not its cost
        timing = StepTiming(
            statistics.median(step_times),
            len(step_times),
            sum(eval_times) / len(eval_times) if eval_times else 0.0,
            len(eval_times),
            cfg.eval_every,
            sum(draw_times) / len(draw_times) if draw_times else 0.0,
            len(draw_times),
            data.draw_every,
        )
    return TrainResult(model, history, _stack(snaps), snap_steps, resumed, seconds, timing=timing)


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
    one = data._draw(1, "memory-probe")  # a sampler over a fixed set may return more than one episode
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
