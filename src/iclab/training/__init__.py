"""The trainer shared by every system: optimisers, schedules, clipping, checkpoints, logging."""

from iclab.training.config import TrainConfig as TrainConfig
from iclab.training.data import GivenBatches as GivenBatches
from iclab.training.data import StepSource as StepSource
from iclab.training.population import full_batch_gd as full_batch_gd
from iclab.training.population import online_sgd as online_sgd
from iclab.training.population import population_flow as population_flow
from iclab.training.results import StepTiming as StepTiming
from iclab.training.results import TrainResult as TrainResult
from iclab.training.results import Trajectory as Trajectory
from iclab.training.run import ModelSpec as ModelSpec
from iclab.training.run import TrainingRun as TrainingRun
from iclab.training.run import execute_all as execute_all
from iclab.training.stop import Stopped as Stopped
from iclab.training.trainer import load_history as load_history
from iclab.training.trainer import mse_loss as mse_loss
from iclab.training.trainer import train as train

__all__ = [
    "GivenBatches",
    "ModelSpec",
    "StepSource",
    "StepTiming",
    "Stopped",
    "TrainConfig",
    "TrainResult",
    "TrainingRun",
    "Trajectory",
    "execute_all",
    "full_batch_gd",
    "load_history",
    "mse_loss",
    "online_sgd",
    "population_flow",
    "train",
]
