"""iclab: in-context learning in transformers.

ep = tasks.LinearRegression(d=5).sample(64, 20, generator=iclab.generator(0))
y_hat = algorithms.gd([0.5, 0.5], d=5).predict(ep)
"""

from iclab import algorithms as algorithms
from iclab import constructions as constructions
from iclab import models as models
from iclab import tasks as tasks
from iclab.core import ConfigError as ConfigError
from iclab.core import Episode as Episode
from iclab.core import Learner as Learner
from iclab.core import ShapeError as ShapeError
from iclab.core import dist_to_identity as dist_to_identity
from iclab.core import generator as generator

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Episode",
    "Learner",
    "ShapeError",
    "algorithms",
    "constructions",
    "dist_to_identity",
    "generator",
    "models",
    "tasks",
]
