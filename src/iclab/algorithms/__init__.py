"""Learners that are plain tensor code: the algorithms transformers are proved to implement."""

from iclab.algorithms.classification import BayesClassifier as BayesClassifier
from iclab.algorithms.classification import BudgetProbe as BudgetProbe
from iclab.algorithms.classification import LabelFrequency as LabelFrequency
from iclab.algorithms.classification import LinearProbe as LinearProbe
from iclab.algorithms.classification import NearestClassMean as NearestClassMean
from iclab.algorithms.classification import ProbeConvergenceWarning as ProbeConvergenceWarning
from iclab.algorithms.functional_gd import CategoricalFunctionalGD as CategoricalFunctionalGD
from iclab.algorithms.functional_gd import FunctionalGD as FunctionalGD
from iclab.algorithms.functional_gd import FunctionalGDPlusPlus as FunctionalGDPlusPlus
from iclab.algorithms.functional_gd import GaussianProcessPosterior as GaussianProcessPosterior
from iclab.algorithms.functional_gd import KernelRidge as KernelRidge
from iclab.algorithms.gradient_descent import PGD as PGD
from iclab.algorithms.gradient_descent import GDPlusPlus as GDPlusPlus
from iclab.algorithms.gradient_descent import gd as gd
from iclab.algorithms.gradient_descent import pgd as pgd
from iclab.algorithms.least_squares import BayesPosteriorMean as BayesPosteriorMean
from iclab.algorithms.least_squares import LeastSquares as LeastSquares
from iclab.algorithms.least_squares import Ridge as Ridge
from iclab.algorithms.pcr import PCR as PCR
from iclab.algorithms.polynomial import BlockCoordinateDescent as BlockCoordinateDescent
from iclab.algorithms.polynomial import FeatureLeastSquares as FeatureLeastSquares
from iclab.algorithms.polynomial import KernelGD as KernelGD

__all__ = [
    "PCR",
    "PGD",
    "BayesClassifier",
    "BayesPosteriorMean",
    "BlockCoordinateDescent",
    "BudgetProbe",
    "CategoricalFunctionalGD",
    "FeatureLeastSquares",
    "FunctionalGD",
    "FunctionalGDPlusPlus",
    "GDPlusPlus",
    "GaussianProcessPosterior",
    "KernelGD",
    "KernelRidge",
    "LabelFrequency",
    "LeastSquares",
    "LinearProbe",
    "NearestClassMean",
    "ProbeConvergenceWarning",
    "Ridge",
    "gd",
    "pgd",
]
