"""Learners that are plain tensor code: the algorithms transformers are proved to implement."""

from iclab.algorithms.gradient_descent import PGD as PGD
from iclab.algorithms.gradient_descent import GDPlusPlus as GDPlusPlus
from iclab.algorithms.gradient_descent import gd as gd
from iclab.algorithms.gradient_descent import pgd as pgd
from iclab.algorithms.least_squares import BayesPosteriorMean as BayesPosteriorMean
from iclab.algorithms.least_squares import LeastSquares as LeastSquares
from iclab.algorithms.least_squares import Ridge as Ridge
