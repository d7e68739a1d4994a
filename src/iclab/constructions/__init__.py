"""Closed-form weights that make a model implement an algorithm."""

from iclab.constructions.bilinear import bcd as bcd
from iclab.constructions.bilinear import bcd_reference_gammas as bcd_reference_gammas
from iclab.constructions.bilinear import kernel_gd_block as kernel_gd_block
from iclab.constructions.bilinear import prop4_counterexample as prop4_counterexample
from iclab.constructions.bilinear import quadratic_ffn_weights as quadratic_ffn_weights
from iclab.constructions.categorical_attention import categorical_gd as categorical_gd
from iclab.constructions.categorical_attention import gd_algorithm as gd_algorithm
from iclab.constructions.categorical_attention import gd_form as gd_form
from iclab.constructions.categorical_attention import single_step as single_step
from iclab.constructions.kernel_attention import functional_gd as functional_gd
from iclab.constructions.kernel_attention import functional_gd_multihead as functional_gd_multihead
from iclab.constructions.kernel_attention import stationary_point as stationary_point
from iclab.constructions.linear_attention import gd_plus_plus as gd_plus_plus
from iclab.constructions.linear_attention import one_layer as one_layer
from iclab.constructions.linear_attention import pgd as pgd

__all__ = [
    "bcd",
    "bcd_reference_gammas",
    "categorical_gd",
    "functional_gd",
    "functional_gd_multihead",
    "gd_algorithm",
    "gd_form",
    "gd_plus_plus",
    "kernel_gd_block",
    "one_layer",
    "pgd",
    "prop4_counterexample",
    "quadratic_ffn_weights",
    "single_step",
    "stationary_point",
]
