"""The experiment registry: one module per paper, one spec per figure."""

from iclab.experiments.registry import ClaimResult as ClaimResult
from iclab.experiments.registry import Experiment as Experiment
from iclab.experiments.registry import all_experiments as all_experiments
from iclab.experiments.registry import get as get
from iclab.experiments.runner import run_experiment as run_experiment
