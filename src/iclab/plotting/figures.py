"""Figure helpers (matplotlib, Agg): the one figure style, curves with ± std bands, heat maps, atomic saving.

Importing this module applies :data:`STYLE` to matplotlib's ``rcParams``: every card draws in it, none restyles.
:func:`save` writes each figure twice, ``<stem>.png`` (the report's) and ``<stem>.svg`` beside it (for the HTML
report and for papers); the SVG is deterministic: same figure, same bytes (fixed hash salt, no date, text as text).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: The one figure style: small type for 3.6 x 2.8 inch panels, light grid, no top/right spines, frameless legends.
STYLE: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.5,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "svg.fonttype": "none",  # text stays text: small, searchable SVGs
    "svg.hashsalt": "iclab",  # fixed element ids: the same figure gives the same SVG bytes
}
matplotlib.rcParams.update(STYLE)


def subplots(nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (3.6, 2.8)) -> tuple[Figure, np.ndarray]:
    """A ``nrows × ncols`` figure in the library's style with ``size`` inches per panel: ``(fig, axes)``, axes always 2-D."""
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, constrained_layout=True
    )
    return fig, axes


def band(
    ax: Axes,
    x: Sequence[float] | np.ndarray,
    ys: np.ndarray | torch.Tensor,
    *,
    label: str | None = None,
    color: str | None = None,
    log: bool = False,
    **kw: Any,
) -> None:
    """Mean ± 1 std over the first axis of ``ys`` (runs × points), optionally of log(ys)."""
    arr = np.asarray(ys.detach().cpu() if isinstance(ys, torch.Tensor) else ys, dtype=float)
    if arr.ndim == 1:
        arr = arr[None]
    if log:
        arr = np.log(arr)
    mean, std = arr.mean(0), arr.std(0)
    (line,) = ax.plot(x, mean, label=label, color=color, **kw)
    if arr.shape[0] > 1:
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.25, linewidth=0)


def heatmap(ax: Axes, m: torch.Tensor | np.ndarray, *, title: str = "", annotate: bool = True) -> None:
    """A matrix as the paper shows it: gray_r map with 2-decimal annotations."""
    arr = np.asarray(m.detach().cpu() if isinstance(m, torch.Tensor) else m, dtype=float)
    lim = float(np.abs(arr).max()) or 1.0
    ax.imshow(arr, cmap="RdBu_r", vmin=-lim, vmax=lim)
    if annotate and arr.shape[0] <= 8:
        for (i, j), v in np.ndenumerate(arr):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="black")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)


def _file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (mkstemp's own is 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_savefig(fig: Figure, path: Path, **kw: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.fchmod(fd, _file_mode())
    os.close(fd)
    try:
        fig.savefig(tmp, format=path.suffix[1:], **kw)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def save(fig: Figure, path: str | Path, *, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG and, beside it, as SVG (same stem), each atomically; close it; return the PNG's path.

    The SVG keeps the layout the PNG's draw computed: three draws of the figure, not four (the PNG is unchanged).
    Image panels (``imshow``) lose the style's grid, which would be drawn over the pixels.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for ax in fig.axes:
        if ax.images:
            ax.grid(False)
    try:
        _atomic_savefig(fig, path, dpi=dpi)
        # the PNG's draw placed the axes (constrained layout): the SVG keeps them. With a layout engine set, every
        # savefig draws the figure twice (once to lay it out, once to write it); without one (None: STYLE turns on
        # neither figure.autolayout nor figure.constrained_layout.use) the SVG is drawn once
        fig.set_layout_engine(None)
        _atomic_savefig(fig, path.with_suffix(".svg"), metadata={"Date": None})
    finally:
        plt.close(fig)
    return path
