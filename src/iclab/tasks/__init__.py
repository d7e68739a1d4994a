"""Episode samplers: seeded, batched, on-device."""

from iclab.tasks.base import Task as Task
from iclab.tasks.categorical import FixedEpisodes as FixedEpisodes
from iclab.tasks.categorical import QuadrantCategorical as QuadrantCategorical
from iclab.tasks.categorical import RBFMixtureCategorical as RBFMixtureCategorical
from iclab.tasks.gaussian_process import CHENG2024_SPECTRUM as CHENG2024_SPECTRUM
from iclab.tasks.gaussian_process import CODE_EXP_SIGMA as CODE_EXP_SIGMA
from iclab.tasks.gaussian_process import GaussianProcess as GaussianProcess
from iclab.tasks.gaussian_process import TwoLayerReLUNetwork as TwoLayerReLUNetwork
from iclab.tasks.image_episodes import FeatureEpisodes as FeatureEpisodes
from iclab.tasks.image_episodes import digits_episodes as digits_episodes
from iclab.tasks.image_episodes import feature_file_episodes as feature_file_episodes
from iclab.tasks.language import StoryLanguageData as StoryLanguageData
from iclab.tasks.linear_regression import AHN2023_SPECTRUM as AHN2023_SPECTRUM
from iclab.tasks.linear_regression import LinearRegression as LinearRegression
from iclab.tasks.linear_regression import rotated_covariance as rotated_covariance
from iclab.tasks.polynomial import PolynomialRegression as PolynomialRegression
from iclab.tasks.polynomial import quadratic as quadratic
from iclab.tasks.polynomial import sparse_cubic as sparse_cubic

__all__ = [
    "AHN2023_SPECTRUM",
    "CHENG2024_SPECTRUM",
    "CODE_EXP_SIGMA",
    "FeatureEpisodes",
    "FixedEpisodes",
    "GaussianProcess",
    "LinearRegression",
    "PolynomialRegression",
    "QuadrantCategorical",
    "RBFMixtureCategorical",
    "StoryLanguageData",
    "Task",
    "TwoLayerReLUNetwork",
    "digits_episodes",
    "feature_file_episodes",
    "quadratic",
    "rotated_covariance",
    "sparse_cubic",
]
