"""Learner-battery entries for Sun, Jadbabaie, Azizan 2025: polynomial-feature algorithms, the
bilinear transformer and its constructions, on the battery's d = 4 episodes (the [1; x; 0; y] prompt has
d̄ = 12 for the trained models, C(6, 2) = 15 for the Thm-2 block and 2d + 1 = 9 for the BCD construction)."""

from __future__ import annotations

import torch

import iclab
from iclab import algorithms, constructions, models
from iclab.constructions.bilinear import bcd_block_gram, quadratic_lambda

D = 4
F64 = torch.float64


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


def _bilinear(**kw: object) -> models.BilinearTransformer:
    cfg = models.BilinearTransformerConfig(**{"d": D, "d_bar": 12, "n_blocks": 2, "init_std": 0.3, **kw})
    return models.BilinearTransformer(cfg, generator=iclab.generator(21)).to(F64)


def _bcd_preconditioners(L: int) -> torch.Tensor:
    return torch.stack([0.5 * torch.linalg.inv(bcd_block_gram(D, ell)) for ell in range(1, L + 1)])


LEARNERS = {
    "KernelGD-quadratic": lambda: algorithms.KernelGD(
        torch.linalg.inv(quadratic_lambda(D)) + 0.05 * _randn(15, 15, seed=1)
    ),
    "KernelGD-linear": lambda: algorithms.KernelGD(
        torch.eye(D + 1, dtype=F64) + 0.1 * _randn(5, 5, seed=2), kind="linear"
    ),
    "BlockCoordinateDescent": lambda: algorithms.BlockCoordinateDescent(_bcd_preconditioners(5)),
    "FeatureLeastSquares": algorithms.FeatureLeastSquares,
    "FeatureLeastSquares-ridge-cubic": lambda: algorithms.FeatureLeastSquares("sparse_cubic", ridge=0.1),
    **{f"bilinear-{f}": (lambda f=f: _bilinear(ffn=f)) for f in ("dense", "sparse", "sparse_strict", "none")},
    "bilinear-attention_first": lambda: _bilinear(order="attention_first"),
    "construction-kernel_gd_block": lambda: constructions.kernel_gd_block(
        D, -0.5 * torch.linalg.inv(quadratic_lambda(D))
    ),
    "construction-bcd": lambda: constructions.bcd(D, -_bcd_preconditioners(5).transpose(-1, -2)),
}
