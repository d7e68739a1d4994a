"""Closed-form weights that make a model implement an algorithm."""

from iclab.constructions.linear_attention import gd_plus_plus as gd_plus_plus
from iclab.constructions.linear_attention import one_layer as one_layer
from iclab.constructions.linear_attention import pgd as pgd
