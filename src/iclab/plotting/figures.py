"""Figure helpers (matplotlib, Agg): curves with ± std bands, heat maps, atomic PNG saving."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (3.6, 2.8)) -> tuple[Figure, np.ndarray]:
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
    **kw: object,
) -> None:
    """Mean ± 1 std over the first axis of ``ys`` (runs × points), optionally of log(ys)."""
    arr = np.asarray(ys.detach().cpu() if isinstance(ys, torch.Tensor) else ys, dtype=float)
    if arr.ndim == 1:
        arr = arr[None]
    if log:
        arr = np.log(arr)
    mean, std = arr.mean(0), arr.std(0)
    (line,) = ax.plot(x, mean, label=label, color=color, **kw)  # type: ignore[arg-type]
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


def save(fig: Figure, path: str | Path, *, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG atomically and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
        plt.close(fig)
    return path
