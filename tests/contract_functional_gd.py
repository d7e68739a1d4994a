"""Kernel learners of Cheng, Chen, Sra 2024 in the learner battery (tests/test_learner_contract.py).

The battery's episodes are linear-regression prompts with x ~ N(0, Σ), d = 4; the bandwidths and steps
below keep every learner's predictions O(1) on them. The GP posterior runs in prior mode (its oracle
mode needs a GP episode's K₊, see tests/test_functional_gd.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import iclab
from conftest import F64, random_spd
from iclab import algorithms
from iclab.core.kernels import CompositeKernel, Kernel

D = 4
Factory = Callable[[], iclab.Learner]
_STEPS = torch.tensor([0.02, 0.03, 0.02], dtype=F64)
_SIGMA = {"linear": 1.0, "relu": 1.0, "exp": 2.0, "rbf": 1.5, "laplacian": 2.0, "arccos": 1.0, "softmax": 1.5}
_ROOT = torch.linalg.cholesky(random_spd(D, seed=21)).T  # a (d, d) map T

LEARNERS: dict[str, Factory] = {
    **{
        f"FunctionalGD-{k}": (lambda k=k: algorithms.FunctionalGD(k, _STEPS, sigma=_SIGMA[k]))
        for k in ("linear", "relu", "exp", "rbf", "laplacian", "arccos")
    },
    "FunctionalGD-softmax": lambda: algorithms.FunctionalGD(
        "softmax", torch.tensor([0.5, 0.8, 0.6], dtype=F64), sigma=1.5
    ),
    "FunctionalGD-exp-normalized": lambda: algorithms.FunctionalGD(
        "exp", torch.tensor([0.5, 0.8, 0.6], dtype=F64), sigma=2.0, normalized=True
    ),
    "FunctionalGD-exp-transform": lambda: algorithms.FunctionalGD("exp", _STEPS, sigma=2.0, transform=_ROOT),
    "FunctionalGD-composite": lambda: algorithms.FunctionalGD(
        CompositeKernel((Kernel("linear", weight=0.5), Kernel("exp", sigma=2.0, weight=0.5, transform=_ROOT))), _STEPS
    ),
    "FunctionalGDPlusPlus-softmax": lambda: algorithms.FunctionalGDPlusPlus(
        "softmax", torch.tensor([0.5, 0.8, 0.6], dtype=F64), torch.tensor([0.1, -0.1, 0.05], dtype=F64), sigma=1.5
    ),
    "FunctionalGDPlusPlus-linear": lambda: algorithms.FunctionalGDPlusPlus(
        "linear", _STEPS, torch.tensor([0.01, -0.01, 0.005], dtype=F64), transform=_ROOT
    ),
    "KernelRidge-rbf": lambda: algorithms.KernelRidge("rbf", 0.05, sigma=1.5),
    "KernelRidge-exp": lambda: algorithms.KernelRidge("exp", 0.1, sigma=2.0, transform=_ROOT),
    "GaussianProcessPosterior-prior-rbf": lambda: algorithms.GaussianProcessPosterior("rbf", sigma=2.0, jitter=1e-2),
    "GaussianProcessPosterior-prior-relu": lambda: algorithms.GaussianProcessPosterior("relu", jitter=1e-2),
}
KNOWN_LIMITS: dict[tuple[str, str], str] = {}
