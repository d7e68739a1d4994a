"""Plot primitives (matplotlib, Agg): one figure style, curves with ± std bands, heat maps, atomic saving.

A layer beside :mod:`iclab.core`, below the experiments that draw with it; it imports only core.
"""

from iclab.plotting.figures import band as band
from iclab.plotting.figures import heatmap as heatmap
from iclab.plotting.figures import save as save
from iclab.plotting.figures import subplots as subplots

__all__ = [
    "band",
    "heatmap",
    "save",
    "subplots",
]
