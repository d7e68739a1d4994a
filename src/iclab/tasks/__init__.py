"""Episode samplers: seeded, batched, on-device."""

from iclab.tasks.base import Task as Task
from iclab.tasks.linear_regression import AHN2023_SPECTRUM as AHN2023_SPECTRUM
from iclab.tasks.linear_regression import LinearRegression as LinearRegression
from iclab.tasks.linear_regression import rotated_covariance as rotated_covariance
