"""Core: Episode, errors, seeding, devices, numerics."""

from iclab.core.devices import resolve_device as resolve_device
from iclab.core.episode import Episode as Episode
from iclab.core.errors import ConfigError as ConfigError
from iclab.core.errors import IclabError as IclabError
from iclab.core.errors import ShapeError as ShapeError
from iclab.core.errors import require as require
from iclab.core.learner import Learner as Learner
from iclab.core.numerics import congruence_dist_to_identity as congruence_dist_to_identity
from iclab.core.numerics import dist_to_identity as dist_to_identity
from iclab.core.seeding import derive_seed as derive_seed
from iclab.core.seeding import generator as generator

__all__ = [
    "ConfigError",
    "Episode",
    "IclabError",
    "Learner",
    "ShapeError",
    "congruence_dist_to_identity",
    "derive_seed",
    "dist_to_identity",
    "generator",
    "require",
    "resolve_device",
]
