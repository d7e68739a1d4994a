"""In-context vs in-weight linear regression: a fraction of prompts share one fixed task vector.

Zhang, Singh, Latham, Saxe 2025, Sec. 7 and App. G (Fig. 14): x ~ N(0, Λ); with probability
``fixed_fraction`` a prompt uses the fixed w_fix (memorisable "in weight"), otherwise a fresh
w ~ N(0, I) (only solvable "in context"). No label noise. ``context='noise'`` replaces the context
labels by N(0, 1) draws while y_q = w_fixᵀ x_q: the in-weight test set of the authors' code
(``--icl 0`` test set), on which in-context learning cannot help.

The authors' code puts the fixed prompts in a fixed block of the training set and draws
w_fix ~ N(0, I) rescaled to ‖w_fix‖ = √d; here each prompt is fixed independently with the given
probability (the same in expectation) and w_fix is an argument (``fixed_weight(d, generator)``
draws the code's kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.numerics import is_psd, sym_sqrt
from iclab.tasks.linear_regression import check_batch_n

Context = Literal["linear", "noise"]


def fixed_weight(d: int, generator: torch.Generator) -> Tensor:
    """w_fix ~ N(0, I_d) rescaled to norm √d, as the authors' code draws it (float64, CPU)."""
    require_int("fixed_weight", "d", d, 1)
    w = torch.randn(d, generator=generator, dtype=torch.float64, device=generator.device).cpu()
    norm: Tensor = w.norm()  # Tensor.norm is unannotated
    return w * math.sqrt(d) / norm


@dataclass(frozen=True, kw_only=True)
class InWeightMixture:
    """Episodes y = wᵀx with w = w_fix for a ``fixed_fraction`` of prompts and w ~ N(0, I) otherwise.

    ``task`` holds ``w (B, d)``, ``fixed (B,)`` (1.0 where w = w_fix), ``Sigma``, ``w_fix``.
    """

    w_fix: Tensor  # (d,)
    fixed_fraction: float = 0.0
    covariance: Tensor | None = None  # (d, d); None means I
    context: Context = "linear"
    _sqrt: dict[str, Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(
            self, "w_fix", self.w_fix.dim() == 1 and self.w_fix.numel() >= 1, "a (d,) vector", tuple(self.w_fix.shape)
        )
        d = self.w_fix.numel()
        require(self, "fixed_fraction", 0.0 <= self.fixed_fraction <= 1.0, "a float in [0, 1]")
        require(self, "context", self.context in ("linear", "noise"), "'linear' or 'noise'")
        cov = torch.eye(d, dtype=torch.float64) if self.covariance is None else self.covariance.to(torch.float64)
        require(
            self,
            "covariance",
            tuple(cov.shape) == (d, d) and is_psd(cov, strict=True),
            f"an SPD ({d}, {d}) matrix",
            tuple(cov.shape),
        )
        object.__setattr__(self, "covariance", cov)
        self._sqrt["x"] = sym_sqrt(cov)

    @property
    def d(self) -> int:
        return self.w_fix.numel()

    @property
    def Sigma(self) -> Tensor:
        assert self.covariance is not None
        return self.covariance

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        check_batch_n(type(self).__name__, batch, n)
        dev, d = generator.device, self.d
        x_all = torch.randn(batch, n + 1, d, generator=generator, device=dev, dtype=dtype) @ self._sqrt["x"].to(
            dev, dtype
        )
        w_rand = torch.randn(batch, d, generator=generator, device=dev, dtype=dtype)
        fixed = (torch.rand(batch, generator=generator, device=dev, dtype=dtype) < self.fixed_fraction).to(dtype)
        w_fix = self.w_fix.to(dev, dtype)
        w = fixed[:, None] * w_fix + (1 - fixed[:, None]) * w_rand  # (B, d)
        y_all = torch.einsum("btd,bd->bt", x_all, w)  # (B, n+1)
        y = y_all[:, :n]
        if self.context == "noise":
            y = torch.randn(batch, n, generator=generator, device=dev, dtype=dtype)
        task = {"w": w, "fixed": fixed, "Sigma": self.Sigma.to(dev, dtype), "w_fix": w_fix}
        return Episode(x=x_all[:, :n], y=y, x_query=x_all[:, n], y_query=y_all[:, n], task=task, batched=("w", "fixed"))
