"""Experiment specs: one per paper figure or table, with presets and claims.

A card is a module ``iclab.experiments.<paper>.<figure>`` that defines its config, ``run``, ``plot`` and ``claims``
and ends with one call:

    CARD = card(Fig1Config, "Fig. 1-2: ...", smoke=SMOKE_PRESET, quick=QUICK_PRESET)

which takes the name from the module path (``ahn2023.fig1``), ``run``/``plot``/``claims`` from the module and the
description from the module docstring's first paragraph. A preset is a dict of overrides of the config's defaults;
``smoke`` runs in seconds (CI runs it for every experiment), ``quick`` in minutes on a 2-core CPU, ``paper`` with the
paper's settings (the config's defaults unless given). Cards outside this package register the same way and are
found through the ``iclab.cards`` entry-point group (each entry names a module or package of cards).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from iclab.core.errors import ConfigError, did_you_mean
from iclab.experiments.backends import Backend, Outcome
from iclab.training.run import TrainingRun, adopt, check_names, execute_all, execute_on, has_checkpoint
from iclab.training.stop import Stopped
from iclab.training.trainer import TrainResult

PRESETS = ("smoke", "quick", "paper")


@dataclass(frozen=True)
class ClaimResult:
    """A paper statement checked numerically: passed, what was measured, what was expected.

    ``checked=False``: measured but not judged at this preset (the reason is in ``detail``); at ``smoke`` a
    claim whose tolerance a few training steps cannot meet is reported so, never passed by a loose tolerance.
    """

    name: str
    passed: bool
    measured: Any
    expected: str
    detail: str = ""
    checked: bool = True
    #: why a ``smoke`` run cannot judge this claim ("" : it can); :func:`iclab.experiments.runner.judge` reports it
    #: as not checked there with this reason, never as passed by a loose tolerance
    smoke_reason: str = field(default="", compare=False)
    #: the paper's own number for this claim (a value printed in the paper, or its formula evaluated at this config),
    #: None where the paper gives none; the report shows it beside ``measured``
    paper_value: float | str | None = field(default=None, compare=False)
    #: where the paper gives it: "Wang et al. 2025, Fig. 5 caption" ("" with no ``paper_value``)
    where: str = field(default="", compare=False)

    @property
    def status(self) -> str:
        """'passed', 'failed' or 'not checked'."""
        return "not checked" if not self.checked else "passed" if self.passed else "failed"

    def not_checked(self, reason: str) -> ClaimResult:
        """This claim marked not checked, with ``reason`` as its detail."""
        return dataclasses.replace(self, passed=False, checked=False, detail=f"not checked: {reason}")

    def to_dict(self) -> dict[str, Any]:
        """The claim as a JSON-ready dict (the rows of ``claims.json``)."""
        return {
            "name": self.name,
            "passed": bool(self.passed),
            "checked": bool(self.checked),
            "measured": self.measured,
            "expected": self.expected,
            "detail": self.detail,
        } | ({"paper_value": self.paper_value, "where": self.where} if self.paper_value is not None else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClaimResult:
        """The claim read back from a :meth:`to_dict` row."""
        return cls(
            name=str(data["name"]),
            passed=bool(data["passed"]),
            measured=data["measured"],
            expected=str(data["expected"]),
            detail=str(data.get("detail", "")),
            checked=bool(data.get("checked", True)),
            paper_value=data.get("paper_value"),
            where=str(data.get("where", "")),
        )


def check(
    name: str,
    measured: float,
    *,
    expected: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    lo: float | None = None,
    hi: float | None = None,
    detail: str = "",
    allow_inf: bool = False,
    smoke: str = "",
    paper: float | str | None = None,
    where: str = "",
) -> ClaimResult:
    """A numeric claim: ``measured`` within rtol/atol of ``expected``, and/or in [lo, hi].

    A measurement that is not finite fails, unless ``allow_inf``: then ±inf is a measurement judged by the bounds
    (a loss whose mean overflowed float64 has exploded, and ``inf >= lo`` holds); nan fails always. ``smoke``: why
    the ``smoke`` preset's few steps cannot judge it (reported there as not checked with this reason). ``paper``:
    the paper's own value (``where``: the figure, table or equation that gives it), shown beside ours in the report.
    """
    ok, parts = True, []
    m = float(measured)
    if expected is not None:
        tol = (atol or 0.0) + (rtol or 0.0) * abs(expected)
        ok &= abs(m - expected) <= tol
        parts.append(f"{expected:.4g} ± {tol:.2g}")
    if lo is not None:
        ok &= m >= lo
        parts.append(f">= {lo:.4g}")
    if hi is not None:
        ok &= m <= hi
        parts.append(f"<= {hi:.4g}")
    ok &= not math.isnan(m) and (allow_inf or math.isfinite(m))
    return ClaimResult(
        name, bool(ok), round(m, 6), ", ".join(parts), detail, smoke_reason=smoke, paper_value=paper, where=where
    )


@dataclass(frozen=True)
class RunProbe:
    """One training run of a cost probe: the probe trained it ``probed_steps`` of its ``steps`` in ``seconds`` and
    split its cost into a fixed part (model build, data, first and last evaluation) and a cost per step."""

    name: str
    regime: str
    steps: int
    probed_steps: int
    seconds: float
    fixed_seconds: float
    step_seconds: float
    borrowed: bool = False  # True: trained one step, ``step_seconds`` is the mean of the runs probed before

    @property
    def projected_seconds(self) -> float:
        """The whole run's projected wall time: its fixed cost plus the cost of a step times ``steps``."""
        return self.fixed_seconds + self.step_seconds * self.steps


@dataclass
class RunContext:
    """What an experiment's ``run`` may use: where to write, which device, a shared progress bar, and the backend
    that decides where its training runs execute (None: in this process, one after another)."""

    out_dir: Path
    device: torch.device
    preset: str
    progress: Progress | None = None
    experiment: str = ""  # the experiment's name: errors of its runs are prefixed with it
    #: cost probe (:func:`iclab.experiments.estimate.estimate_experiment`): every training run stops after at most
    #: this many steps and its wall time is recorded in ``probes``; None trains in full
    probe_steps: int | None = None
    probe_runs: int = 1_000_000  # runs probed in full; later ones train one step (their step cost: the mean so far)
    probes: list[RunProbe] = field(default_factory=list)
    #: where :meth:`execute` runs a list of two or more training runs (a local process pool or Ray); None or one local
    #: worker: in this process. A single run always trains here (in place, with the card's stateful callbacks).
    backend: Backend | None = None
    #: the device the backend's tasks train on ("cuda" for Ray tasks with GPUs); None: ``device``
    task_device: str | None = None
    #: run name -> (steps skipped for a non-finite loss or gradient, steps) of the runs :meth:`execute` returned that skipped
    skipped: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: run name -> (lr, step it diverged at, lr it trained at instead) of the runs that retried (``TrainingRun.retry_lr``)
    retried: dict[str, tuple[float, int, float]] = field(default_factory=dict)

    def subdir(self, *parts: object) -> Path:
        """The directory ``out_dir/parts...``, created if missing."""
        p = self.out_dir.joinpath(*map(str, parts))
        p.mkdir(parents=True, exist_ok=True)
        return p

    def execute(self, runs: Sequence[TrainingRun]) -> list[TrainResult]:
        """Execute an experiment's training runs on this context's device and return their results in order;
        a run that checkpoints (``TrainingRun.checkpoints``) does so in ``out_dir/<run name>`` unless it names its own
        directory."""
        placed = [
            r if r.out_dir is not None or not r.checkpoints else dataclasses.replace(r, out_dir=self.subdir(r.name))
            for r in runs
        ]
        try:
            if self.probe_steps is not None:
                return [self._probe(r) for r in placed]
            if (
                self.backend is None
                or len(placed) < 2
                or (self.backend.name == "local" and self.backend.parallelism == 1)
            ):
                results = execute_all(placed, device=self.device, progress=self.progress)
            else:
                results = self._fan_out(placed)
        except ConfigError as e:  # a run refused (e.g. a batch too large for memory): say whose run it is
            if not self.experiment:
                raise
            raise ConfigError(f"{self.experiment}: {e}") from None
        for run, res in zip(placed, results, strict=True):
            if res.skipped_steps:
                self.skipped[run.name] = (res.skipped_steps, run.train.steps)
            if res.retry:
                self.retried[run.name] = (res.retry["lr"], res.retry["step"], res.retry["retry_lr"])
        return results

    def execute_groups(self, groups: Sequence[Sequence[TrainingRun]]) -> list[list[TrainResult]]:
        """:meth:`execute` for several groups of runs (one model's seeds, say) in one batch, so that every worker of
        ``--workers`` / Ray stays busy; the results come back grouped as given."""
        done = self.execute([r for g in groups for r in g])
        bounds = list(itertools.accumulate((len(g) for g in groups), initial=0))
        return [done[a:b] for a, b in itertools.pairwise(bounds)]

    def _fan_out(self, runs: list[TrainingRun]) -> list[TrainResult]:
        """Run ``runs`` as tasks of :attr:`backend`; the driver's progress bar counts finished runs. A run given an
        ``nn.Module`` finds it trained in place afterwards, as in this process. The first failed run is raised (with
        its worker's traceback) once all have finished, so that the others' checkpoints are complete."""
        assert self.backend is not None
        check_names(runs)
        label = self.experiment or "runs"
        task = None
        if self.progress is not None:
            task = self.progress.add_task(f"{label}: {len(runs)} runs on {self.backend.name}", total=len(runs))

        def done(_: Outcome) -> None:
            if task is not None and self.progress is not None:
                self.progress.advance(task)

        fn = functools.partial(execute_on, device=self.task_device or str(self.device))
        outcomes = self.backend.map(fn, runs, labels=[f"{label}/{r.name}" for r in runs], on_done=done)
        if task is not None and self.progress is not None:
            self.progress.remove_task(task)
        _recount_not_started(runs, outcomes)
        return [adopt(run, o.unwrap()) for run, o in zip(runs, outcomes, strict=True)]

    def _probe(self, run: TrainingRun) -> TrainResult:
        """Train ``run`` for ``probe_steps`` and split its time into a fixed cost and a cost per step.

        The step cost is the trainer's own in-loop timer where it has one (:class:`~iclab.training.StepTiming`:
        the median step plus the evaluation and the drawing of new batches amortised, robust to a busy machine;
        sampled runs and a token-level module's full-batch runs); otherwise (the reduced models' full-batch GD, the
        population flow) the run is trained again for half as many steps, each in its own directory, and the
        difference of the two times is the cost of a step. Past ``probe_runs`` runs so probed, a run trains one step
        only and its step cost is the mean of the probed runs' (hundreds of runs are probed in minutes)."""
        assert self.probe_steps is not None
        full = min(run.train.steps, self.probe_steps)
        probed = [p for p in self.probes if not p.borrowed]
        borrowed = len(probed) >= self.probe_runs
        times: list[float] = []
        lengths: list[int] = []
        result = None

        def train(steps: int) -> TrainResult:
            spec = dataclasses.replace(run, train=dataclasses.replace(run.train, steps=steps))
            if run.checkpoints and run.out_dir is not None:
                spec = dataclasses.replace(spec, out_dir=self.subdir("probe", steps, run.name))
            t0 = time.perf_counter()
            out = execute_all([spec], device=self.device, progress=self.progress)[0]
            times.append(time.perf_counter() - t0)
            lengths.append(steps)
            return out

        result = train(1 if borrowed else full)
        timing = result.timing
        if borrowed:
            step = sum(p.step_seconds for p in probed) / len(probed)
            fixed = max(times[0] - step, 0.0)
        elif timing is not None and timing.steps == full:
            step = timing.per_step()
            fixed = max(times[0] - timing.accounted_seconds(), 0.0)
        elif full == 1:  # a one-step run: no fixed cost to split off
            step, fixed = times[0], 0.0
        else:
            train(full // 2)  # the result kept is the full probe's
            step = max(times[0] - times[1], 0.0) / (lengths[0] - lengths[1])
            fixed = max(times[0] - step * lengths[0], 0.0)
        self.probes.append(
            RunProbe(run.name, run.regime, run.train.steps, lengths[0], sum(times), fixed, step, borrowed)
        )
        assert result is not None
        return result

    def train(self, run: TrainingRun) -> TrainResult:
        """:meth:`execute` for one run."""
        return self.execute([run])[0]


@dataclass(frozen=True)
class Experiment:
    """A registered reproduction card: its config dataclass and presets, and the run, plot and claims functions (built by :func:`card`)."""

    name: str  # "<paper>.<figure>", e.g. "ahn2023.fig1"
    title: str
    config: type  # a frozen dataclass; its defaults are the paper's settings
    presets: dict[str, dict[str, Any]]
    run: Callable[[Any, RunContext], Any]  # config, context -> the card's results (a dataclass)
    plot: Callable[[Any, Any, Path], list[Path]]  # results, config, out dir -> figure paths
    claims: Callable[[Any, Any], list[ClaimResult]]  # results, config -> claims
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    #: the card's module (set by :func:`register` to the module that registers it)
    module: str = ""

    @property
    def paper(self) -> str:
        """The paper part of the name: ``"ahn2023"`` for ``"ahn2023.fig1"``."""
        return self.name.split(".", 1)[0]


_REGISTRY: dict[str, Experiment] = {}
_CARD_ROOT = "iclab.experiments."


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def card(
    config: type,
    title: str,
    *,
    smoke: dict[str, Any],
    quick: dict[str, Any],
    paper: dict[str, Any] | None = None,
    run: Callable[[Any, RunContext], Any] | None = None,
    plot: Callable[[Any, Any, Path], list[Path]] | None = None,
    claims: Callable[[Any, Any], list[ClaimResult]] | None = None,
    name: str | None = None,
    description: str | None = None,
    tags: tuple[str, ...] = (),
) -> Experiment:
    """Register the calling module as a reproduction card and return its :class:`Experiment`.

    The name is the module path below ``iclab.experiments`` (``iclab.experiments.ahn2023.fig1`` ->
    ``ahn2023.fig1``; a card elsewhere: its last two components); ``run``, ``plot`` and ``claims`` default to the
    module's functions of those names, ``description`` to its docstring's first paragraph and ``paper`` to the
    config's defaults (a config's defaults are the paper's settings).
    """
    module = sys._getframe(1).f_globals
    modname = str(module.get("__name__", ""))
    if name is None:
        name = modname.removeprefix(_CARD_ROOT) if modname.startswith(_CARD_ROOT) else ".".join(modname.split(".")[-2:])

    def own(value: Any, attr: str) -> Any:
        if value is not None:
            return value
        if not callable(module.get(attr)):
            raise ConfigError(f"card {name!r} must define {attr}() in its module or pass {attr}=")
        return module[attr]

    return register(
        Experiment(
            name=name,
            title=title,
            config=config,
            presets={"smoke": smoke, "quick": quick, "paper": {} if paper is None else paper},
            run=own(run, "run"),
            plot=own(plot, "plot"),
            claims=own(claims, "claims"),
            description=_first_paragraph(module.get("__doc__")) if description is None else description,
            tags=tags,
            module=modname,
        )
    )


def register(exp: Experiment) -> Experiment:
    """Add ``exp`` to the registry; its card is the module that calls this (``exp.module``)."""
    if not exp.module:
        exp = dataclasses.replace(exp, module=sys._getframe(1).f_globals.get("__name__", ""))
    missing = [p for p in PRESETS if p not in exp.presets]
    if missing:
        raise ConfigError(f"Experiment {exp.name!r} must define presets {PRESETS}; missing {missing}")
    if exp.name in _REGISTRY and _REGISTRY[exp.name] is not exp:
        raise ConfigError(f"experiment {exp.name!r} is registered twice")
    _REGISTRY[exp.name] = exp
    return exp


_INFRASTRUCTURE = {"registry", "runner", "estimate", "backends", "ray_backend", "sweep", "parallel", "slurm"}
ENTRY_POINT_GROUP = "iclab.cards"
#: the packages whose modules hold cards (and so the dataclasses a run directory's results may hold)
CARD_PACKAGES: set[str] = {"iclab.experiments"}


def load_cards(package: str) -> None:
    """Import ``package`` and, if it is a package, every public module below it (each card registers itself)."""
    import importlib
    import pkgutil

    mod = importlib.import_module(package)
    CARD_PACKAGES.add(package)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=f"{package}."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


@functools.cache
def _load_all() -> None:
    """Import every paper package in ``iclab.experiments`` and every package named in the ``iclab.cards`` entry
    points, with all their public modules (a new card needs no edit outside its own file). Once per process: the
    scan of installed distributions for entry points costs about 12 ms, and the registry is read per override in
    config validation."""
    import pkgutil
    from importlib.metadata import entry_points

    import iclab.experiments as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _INFRASTRUCTURE and not info.name.startswith("_"):
            load_cards(f"iclab.experiments.{info.name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        load_cards(ep.value)


def all_experiments() -> dict[str, Experiment]:
    """Every registered experiment by name, sorted (the cards of every paper package and of entry-point plugins)."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Experiment:
    """The experiment called ``name`` (e.g. ``"ahn2023.fig1"``); a :class:`~iclab.core.ConfigError` naming the closest names otherwise."""
    exps = all_experiments()
    if name not in exps:
        raise ConfigError(f"unknown experiment {name!r}{did_you_mean(name, list(exps))}")
    return exps[name]


def select(pattern: str | None) -> list[Experiment]:
    """Experiments whose name equals ``pattern`` or starts with ``pattern.`` (a paper); all for None."""
    exps = all_experiments()
    if pattern in (None, "", "all"):
        return list(exps.values())
    chosen = [e for n, e in exps.items() if n == pattern or n.startswith(f"{pattern}.")]
    if not chosen:
        papers = sorted({e.paper for e in exps.values()})
        raise ConfigError(f"no experiment or paper named {pattern!r}{did_you_mean(pattern, list(exps) + papers)}")
    return chosen


def _recount_not_started(runs: Sequence[TrainingRun], outcomes: Sequence[Outcome]) -> None:
    """A stopped map's count of runs not started, less those with a checkpoint from an earlier piece (the progress
    line counts them finished or partial already), set on every Stopped outcome."""
    stopped = [o.value for o in outcomes if isinstance(o.value, Stopped)]
    fresh = sum(
        isinstance(o.value, Stopped) and o.value.progress.endswith(" not started") and not has_checkpoint(r)
        for r, o in zip(runs, outcomes, strict=True)
    )
    for e in stopped:
        e.not_started = fresh
