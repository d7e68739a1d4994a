"""PCR learners (Zhang et al. 2025, eq. 22) for the learner battery in test_learner_contract.py."""

from __future__ import annotations

from conftest import random_spd
from iclab import algorithms

D = 4

LEARNERS = {
    "PCR-fixed_point-oracle": lambda: algorithms.PCR(2),  # reads task['Sigma']
    "PCR-fixed_point-converged": lambda: algorithms.PCR(D, covariance=random_spd(D, seed=21), inv_n=1 / 31),
    "PCR-population_pcs": lambda: algorithms.PCR(2, "population_pcs", covariance=random_spd(D, seed=22)),
    "PCR-sample_pcs": lambda: algorithms.PCR(3, "sample_pcs"),
}
