"""The in-context / in-weight mixture task of Zhang et al. 2025, Fig. 14 (iclab.tasks.linear_regression_mixture)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import F64, assert_close
from iclab.core.errors import ConfigError
from iclab.core.seeding import generator
from iclab.tasks.linear_regression_mixture import InWeightMixture, fixed_weight


def test_fixed_weight_has_norm_sqrt_d() -> None:
    w = fixed_weight(4, generator(0))
    assert w.norm().item() == pytest.approx(2.0)
    assert torch.equal(w, fixed_weight(4, generator(0)))


def test_mixture_labels_and_fraction() -> None:
    w_fix = fixed_weight(3, generator(1))
    Lam = torch.diag(torch.tensor([0.5, 0.3, 0.2], dtype=F64))
    ep = InWeightMixture(w_fix=w_fix, fixed_fraction=0.3, covariance=Lam).sample(
        20_000, 7, generator=generator(2), dtype=F64
    )
    fixed = ep.task["fixed"].bool()
    assert abs(fixed.double().mean().item() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 20_000)
    assert_close(ep.task["w"][fixed], w_fix.expand(int(fixed.sum()), 3))
    assert_close(ep.y, torch.einsum("bnd,bd->bn", ep.x, ep.task["w"]))
    assert_close(ep.y_query, torch.einsum("bd,bd->b", ep.x_query, ep.task["w"]))
    cov = ep.x.reshape(-1, 3).T @ ep.x.reshape(-1, 3) / ep.x.reshape(-1, 3).shape[0]
    assert (cov - Lam).abs().max() < 0.01
    # the random part is N(0, I): its second moment is I
    wr = ep.task["w"][~fixed]
    assert (wr.T @ wr / wr.shape[0] - torch.eye(3, dtype=F64)).abs().max() < 0.05


def test_noise_context_for_the_in_weight_test_set() -> None:
    w_fix = fixed_weight(4, generator(3))
    ep = InWeightMixture(w_fix=w_fix, fixed_fraction=1.0, context="noise").sample(
        5000, 9, generator=generator(4), dtype=F64
    )
    assert_close(ep.y_query, ep.x_query @ w_fix)
    # context labels are independent of x: their correlation with wᵀx is ~0, their variance 1
    corr = torch.corrcoef(torch.stack([ep.y.reshape(-1), torch.einsum("bnd,d->bn", ep.x, w_fix).reshape(-1)]))[0, 1]
    assert abs(corr.item()) < 0.02 and abs(ep.y.var().item() - 1) < 0.03


def test_validation() -> None:
    w = fixed_weight(2, generator(0))
    with pytest.raises(ConfigError, match="InWeightMixture.fixed_fraction"):
        InWeightMixture(w_fix=w, fixed_fraction=1.5)
    with pytest.raises(ConfigError, match="InWeightMixture.context"):
        InWeightMixture(w_fix=w, context="zeros")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="InWeightMixture.covariance"):
        InWeightMixture(w_fix=w, covariance=torch.eye(3, dtype=F64))
