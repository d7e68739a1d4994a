"""The experiment registry: one package per paper, one reproduction card (module) per figure.

``run_experiment("ahn2023.fig1", "smoke")`` runs a card and checks its claims; ``run_sweep(spec)`` runs a grid of
overrides of one card; ``card(...)`` registers a new card (docs/architecture.md, "Add an experiment").
"""

from iclab.experiments.registry import ClaimResult as ClaimResult
from iclab.experiments.registry import Experiment as Experiment
from iclab.experiments.registry import RunContext as RunContext
from iclab.experiments.registry import all_experiments as all_experiments
from iclab.experiments.registry import card as card
from iclab.experiments.registry import check as check
from iclab.experiments.registry import get as get
from iclab.experiments.runner import ExperimentResult as ExperimentResult
from iclab.experiments.runner import run_experiment as run_experiment
from iclab.experiments.sweep import SweepResult as SweepResult
from iclab.experiments.sweep import SweepSpec as SweepSpec
from iclab.experiments.sweep import load_sweep_spec as load_sweep_spec
from iclab.experiments.sweep import run_sweep as run_sweep

__all__ = [
    "ClaimResult",
    "Experiment",
    "ExperimentResult",
    "RunContext",
    "SweepResult",
    "SweepSpec",
    "all_experiments",
    "card",
    "check",
    "get",
    "load_sweep_spec",
    "run_experiment",
    "run_sweep",
]
