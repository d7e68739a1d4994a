"""In-context principal component regression (iclab.algorithms.PCR; Zhang et al. 2025, eq. 22)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import F64, assert_close, random_episode
from iclab import algorithms
from iclab.core.episode import Episode
from iclab.core.errors import ConfigError
from iclab.core.seeding import generator
from iclab.tasks.linear_regression import rotated_covariance
from iclab.theory import attention_dynamics as ad

LAM = (0.4, 0.3, 0.2, 0.1)


def _setup(n: int = 31, batch: int = 16, seed: int = 0) -> tuple[torch.Tensor, Episode]:
    Lam = rotated_covariance(LAM, generator=generator(seed))
    return Lam, random_episode(batch, n, 4, seed=seed + 1, covariance=Lam)


@pytest.mark.parametrize("m", range(5))
def test_fixed_point_variant_is_the_attn_s_model_on_M_m(m: int) -> None:
    """PCR(m) = Σ_i v_i βᵀk_i q_iᵀx_q with the ATTN_S weights constructed on M_m (eq. 20a, 22), 1e-10."""
    Lam, ep = _setup()
    v, k, q = ad.separate_fixed_point(Lam, 1 / ep.n, range(m), n_heads=4)
    beta = torch.einsum("bnd,bn->bd", ep.x, ep.y) / ep.n
    model = torch.einsum("h,bi,hi,hj,bj->b", v, beta, k[:, 0], q[:, 0], ep.x_query)
    assert_close(algorithms.PCR(m).predict(ep), model)
    assert_close(algorithms.PCR(m, covariance=Lam).predict(ep), model)


def test_full_pcr_is_the_converged_algorithm() -> None:
    """m = D: βᵀ(Λ + (Λ + trΛ I)/N)⁻¹x_q, eq. (11); with inv_n = E(1/N) it is eq. (25)."""
    Lam, ep = _setup()
    beta = torch.einsum("bnd,bn->bd", ep.x, ep.y) / ep.n
    for inv_n in (1 / ep.n, ad.expected_inv_n(31)):
        W = ad.converged_matrix(Lam, inv_n)
        assert_close(algorithms.PCR(4, inv_n=inv_n).predict(ep), torch.einsum("bi,ij,bj->b", beta, W, ep.x_query))


@pytest.mark.parametrize("variant", ["population_pcs", "sample_pcs"])
def test_all_components_is_least_squares(variant: str) -> None:
    _, ep = _setup(n=9)
    assert_close(algorithms.PCR(4, variant).predict(ep), algorithms.LeastSquares().predict(ep))


def test_zero_components_predicts_zero() -> None:
    _, ep = _setup()
    for variant in ("fixed_point", "population_pcs", "sample_pcs"):
        assert torch.equal(algorithms.PCR(0, variant).predict(ep), torch.zeros(ep.batch_size, dtype=F64))


def test_population_limit_is_projection_on_top_pcs() -> None:
    """inv_n = 0: βᵀ Σ_{d≤m} λ_d⁻¹ e_d e_dᵀ x_q; as N → ∞ every variant → wᵀ P_m x_q (eq. 22, N → ∞)."""
    Lam, ep = _setup(n=40_000, batch=8)
    lam, E = ad.spectrum(Lam)
    m = 2
    beta = torch.einsum("bnd,bn->bd", ep.x, ep.y) / ep.n
    exact = torch.einsum("bi,ij,bj->b", beta, (E[:, :m] / lam[:m]) @ E[:, :m].T, ep.x_query)
    assert_close(algorithms.PCR(m, inv_n=0.0).predict(ep), exact)
    target = torch.einsum("bi,ij,bj->b", ep.task["w"], E[:, :m] @ E[:, :m].T, ep.x_query)
    scale = float(target.abs().max())
    for variant in ("fixed_point", "population_pcs", "sample_pcs"):
        assert (algorithms.PCR(m, variant).predict(ep) - target).abs().max() < 0.05 * scale, variant


def test_fixed_point_pcr_test_loss_is_the_plateau_level() -> None:
    """E(y_q − PCR_m)² = L(M_m) of eq. (19): Monte Carlo over 100k prompts, 4σ."""
    Lam, ep = _setup(batch=100_000, seed=3)
    levels = ad.plateau_losses(Lam, 1 / ep.n)
    for m in (1, 3):
        err = (ep.y_query - algorithms.PCR(m).predict(ep)) ** 2
        assert abs(err.mean() - levels[m]) <= 4 * err.std() / math.sqrt(err.numel())


def test_matrix_shapes() -> None:
    _, ep = _setup(batch=5)
    assert algorithms.PCR(2).matrix(ep).shape == (4, 4)
    assert algorithms.PCR(2, "sample_pcs").matrix(ep).shape == (5, 4, 4)
    assert algorithms.PCR(2, "population_pcs").matrix(ep).shape == (5, 4, 4)


def test_validation() -> None:
    _, ep = _setup()
    with pytest.raises(ConfigError, match="PCR.variant"):
        algorithms.PCR(2, "pca")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="PCR.n_components"):
        algorithms.PCR(-1)
    with pytest.raises(ConfigError, match="PCR.n_components"):
        algorithms.PCR(5).predict(ep)
    with pytest.raises(ConfigError, match="PCR.inv_n"):
        algorithms.PCR(2, inv_n=1.5)
    with pytest.raises(ConfigError, match="PCR.covariance"):
        algorithms.PCR(2, covariance=torch.eye(3, dtype=F64)).predict(ep)
    no_sigma = dataclasses.replace(ep, task={}, batched=())
    with pytest.raises(ValueError, match="task has 'Sigma'"):
        algorithms.PCR(2).predict(no_sigma)
    algorithms.PCR(2, "sample_pcs").predict(no_sigma)  # needs no oracle
