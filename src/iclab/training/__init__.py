"""The trainer shared by every system: optimisers, schedules, clipping, checkpoints, logging."""

from iclab.training.config import TrainConfig as TrainConfig
from iclab.training.trainer import TrainResult as TrainResult
from iclab.training.trainer import load_history as load_history
from iclab.training.trainer import mse_loss as mse_loss
from iclab.training.trainer import train as train
