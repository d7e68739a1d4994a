"""core.kernels: PSD-ness, K₊, softmax normalisation, invariances, the arc-cosine kernel.

Cheng, Chen, Sra 2024: Def. 3.3 (K₊), eq. (11)-(12) (kernels and scores), Remark 3.2 (exp = e^{1/σ²}·rbf
on the sphere), Asm. 4.2 (rotation invariance), Asm. 4.3 (h̃(SᵀU, S⁻¹W) = h̃(U, W)), Ex. 8 (arc-cosine).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from conftest import F32, F64, assert_close
from iclab.core.errors import ConfigError, ShapeError
from iclab.core.kernels import (
    INNER_PRODUCT_KERNELS,
    KERNELS,
    PSD_KERNELS,
    CompositeKernel,
    Kernel,
    as_kernel,
    gram,
    positive_part,
)
from iclab.core.numerics import haar_orthogonal


def _sphere(*shape: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    g = torch.randn(*shape, generator=iclab.generator(seed), dtype=dtype)
    return g / g.norm(dim=-1, keepdim=True)


def _gauss(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=iclab.generator(seed), dtype=F64)


@pytest.mark.parametrize("name", PSD_KERNELS)
def test_psd_kernels_have_psd_gram_matrices(name: str) -> None:
    """linear, exp, rbf, laplacian, arccos: min eigenvalue >= −1e-10·scale on random points (sphere and Gaussian)."""
    for pts in (_sphere(20, 15, 5, seed=1), 0.7 * _gauss(20, 15, 5, seed=2)):
        K = gram(name, pts, pts)
        assert_close(K, K.transpose(-1, -2), rtol=1e-12, atol=1e-12)
        evals = torch.linalg.eigvalsh(K)
        assert float(evals.min()) >= -1e-10 * float(evals.abs().max())


def test_relu_kernel_is_indefinite() -> None:
    """Why K₊ is formed before partitioning: the relu Gram matrix of 15 points on S⁴ has a negative eigenvalue
    (every draw of 200)."""
    K = gram("relu", _sphere(200, 15, 5, seed=3), _sphere(200, 15, 5, seed=3))
    lam_min = torch.linalg.eigvalsh(K)[:, 0]
    assert bool((lam_min < -1e-3).all())
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(K)


def test_positive_part() -> None:
    """K₊ = K for PSD K; K₊ is PSD with the |eigenvalues| of K and the same eigenvectors (Def. 3.3)."""
    pts = _sphere(30, 15, 5, seed=4)
    K_exp = gram("exp", pts, pts)
    assert_close(positive_part(K_exp), K_exp, rtol=1e-10, atol=1e-10)
    K = gram("relu", pts, pts)
    Kp = positive_part(K)
    assert_close(Kp, Kp.transpose(-1, -2), rtol=1e-12, atol=1e-12)
    assert_close(torch.linalg.eigvalsh(Kp), torch.linalg.eigvalsh(K).abs().sort(dim=-1).values)
    assert float(torch.linalg.eigvalsh(Kp).min()) >= -1e-12
    assert_close(Kp @ Kp, K @ K)  # K₊² = U D² Uᵀ = K²
    assert not torch.allclose(Kp, K, atol=1e-3)  # relu really is changed
    with pytest.raises(ShapeError):
        positive_part(torch.zeros(3, 4, dtype=F64))


def test_softmax_normalises_over_sources_and_masks() -> None:
    src, tgt = _gauss(4, 7, 3, seed=5), _gauss(4, 6, 3, seed=6)
    h = gram("softmax", src, tgt, sigma=0.8)
    assert_close(h.sum(dim=-2), torch.ones(4, 6, dtype=F64))
    assert_close(
        h,
        torch.exp(src @ tgt.transpose(1, 2) / 0.64) / torch.exp(src @ tgt.transpose(1, 2) / 0.64).sum(-2, keepdim=True),
    )
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[:, -1] = False
    hm = gram("softmax", src, tgt, sigma=0.8, source_mask=mask)
    assert bool((hm[:, -1] == 0).all())
    assert_close(hm.sum(dim=-2), torch.ones(4, 6, dtype=F64))
    assert_close(hm[:, :-1], gram("softmax", src[:, :-1], tgt, sigma=0.8))
    for name in ("exp", "linear", "rbf"):
        assert bool((gram(name, src, tgt, source_mask=mask)[:, -1] == 0).all())


def test_remark_3_2_exp_is_scaled_rbf_on_the_sphere() -> None:
    """‖x‖ = 1: exp(⟨x, x'⟩/σ²) = e^{1/σ²} · exp(−‖x − x'‖²/(2σ²)) (Cheng et al. Remark 3.2)."""
    a, b = _sphere(3, 8, 5, seed=7), _sphere(3, 9, 5, seed=8)
    for sigma in (0.7, 1.0, 1.6):
        assert_close(gram("exp", a, b, sigma=sigma), math.exp(1 / sigma**2) * gram("rbf", a, b, sigma=sigma))


def test_formulas_against_elementwise_definitions() -> None:
    a, b = _gauss(5, 3, seed=9), _gauss(4, 3, seed=10)
    for i in range(5):
        for j in range(4):
            s, t = a[i], b[j]
            assert_close(gram("linear", a, b)[i, j], s @ t)
            assert_close(gram("relu", a, b)[i, j], torch.relu(s @ t))
            assert_close(gram("exp", a, b, sigma=1.3)[i, j], torch.exp(s @ t / 1.69))
            assert_close(gram("rbf", a, b, sigma=1.3)[i, j], torch.exp(-((s - t) ** 2).sum() / (2 * 1.69)))
            assert_close(gram("laplacian", a, b, sigma=1.3)[i, j], torch.exp(-(s - t).abs().sum() / 1.3))


def test_arccos_matches_monte_carlo_over_theta1() -> None:
    """Ex. 8: E_w[relu(wᵀx) relu(wᵀx')] (w ~ N(0, I)) = the arc-cosine formula, within 3 standard errors."""
    pts = 1.3 * _gauss(6, 5, seed=11)
    exact = gram("arccos", pts, pts)  # (6, 6)
    w = torch.randn(400_000, 5, generator=iclab.generator(12), dtype=F64)
    feats = torch.relu(w @ pts.T)  # (S, 6)
    prods = feats.unsqueeze(-1) * feats.unsqueeze(-2)  # (S, 6, 6)
    mc, se = prods.mean(0), prods.std(0) / math.sqrt(w.shape[0])
    assert bool(((mc - exact).abs() <= 3 * se + 1e-12).all()), (mc - exact).abs().max()
    assert_close(torch.diagonal(exact), (pts**2).sum(-1) / 2)  # φ = 0: ‖x‖²/2
    zero = torch.zeros(1, 5, dtype=F64)
    assert float(gram("arccos", zero, pts).abs().max()) == 0.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), sigma=st.floats(0.5, 2.0))
def test_rotation_invariance(seed: int, sigma: float) -> None:
    """K(Uu, Uw) = K(u, w) for orthogonal U (Asm. 4.2) for every kernel but the ℓ₁ laplacian."""
    U = haar_orthogonal(5, generator=iclab.generator(seed))
    a, b = _gauss(6, 5, seed=seed + 1), _gauss(4, 5, seed=seed + 2)
    for name in KERNELS:
        if name == "laplacian":
            continue
        assert_close(gram(name, a @ U.T, b @ U.T, sigma=sigma), gram(name, a, b, sigma=sigma))


def test_laplacian_is_not_rotation_invariant() -> None:
    U = haar_orthogonal(5, generator=iclab.generator(0))
    a = _gauss(6, 5, seed=1)
    assert not torch.allclose(gram("laplacian", a @ U.T, a @ U.T), gram("laplacian", a, a), atol=1e-3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_asm_4_3_inner_product_scores(seed: int) -> None:
    """h̃(SᵀU, S⁻¹W) = h̃(U, W) for invertible S (Asm. 4.3; rows: u ↦ Sᵀu is u S, w ↦ S⁻¹w is w S⁻ᵀ)."""
    S = torch.eye(5, dtype=F64) + 0.3 * _gauss(5, 5, seed=seed)
    a, b = 0.6 * _gauss(7, 5, seed=seed + 1), 0.6 * _gauss(6, 5, seed=seed + 2)
    Sinv = torch.linalg.inv(S)
    for name in INNER_PRODUCT_KERNELS:
        assert_close(gram(name, a @ S, b @ Sinv.T), gram(name, a, b), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(gram("rbf", a @ S, b @ Sinv.T), gram("rbf", a, b), atol=1e-4)


def test_kernel_and_composite() -> None:
    """Kernel = weight · gram(name, G·, G·); CompositeKernel = Σ of terms (Prop. D.1 K◇, Fig. 4(c))."""
    a, b = _gauss(2, 6, 5, seed=13), _gauss(2, 4, 5, seed=14)
    G1 = torch.diag(torch.tensor([1.0, 1, 0, 0, 0], dtype=F64))
    G2 = torch.diag(torch.tensor([0.0, 0, 1, 1, 1], dtype=F64))
    k1 = Kernel("linear", weight=0.5, transform=G1)
    k2 = Kernel("exp", weight=0.5, sigma=1.2, transform=G2)
    comp = CompositeKernel((k1, k2))
    expect = 0.5 * (a[..., :2] @ b[..., :2].transpose(1, 2)) + 0.5 * torch.exp(
        a[..., 2:] @ b[..., 2:].transpose(1, 2) / 1.44
    )
    assert_close(comp(a, b), expect)
    assert comp.is_psd and not CompositeKernel((Kernel("relu"), k1)).is_psd
    assert not Kernel("linear", weight=-1.0).is_psd
    pts = _sphere(10, 12, 5, seed=15)
    assert float(torch.linalg.eigvalsh(comp(pts, pts)).min()) >= -1e-10
    assert as_kernel("x", [k1, k2]) == comp
    assert as_kernel("x", "rbf", 2.0) == Kernel("rbf", sigma=2.0)
    assert Kernel("exp")(a.float(), b.float()).dtype == F32


def test_bad_input_is_rejected() -> None:
    a = _gauss(3, 2, seed=0)
    with pytest.raises(ConfigError, match="gram.kernel must be one of"):
        gram("cosine", a, a)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="gram.sigma"):
        gram("exp", a, a, sigma=0.0)
    with pytest.raises(ShapeError, match="gram.targets"):
        gram("exp", a, _gauss(3, 4, seed=1))
    with pytest.raises(ConfigError, match="Kernel.name"):
        Kernel("gauss")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Kernel.transform"):
        Kernel("exp", transform=torch.eye(3, dtype=F64))(a, a)
    with pytest.raises(ConfigError, match="CompositeKernel.terms"):
        CompositeKernel(())
    with pytest.raises(ConfigError, match="owner.kernel"):
        as_kernel("owner", 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "sigma", "cap"), [("relu", 1.0, None), ("exp", 1.0, None), ("exp", 1.7, None), ("exp", 0.8, 2.0)]
)
def test_gram_scores_in_place_are_the_bits_of_the_shared_scores(name: str, sigma: float, cap: float | None) -> None:
    """Without autograd :func:`gram` scores relu and exp over its fresh inner products in place: the same bits as
    :func:`inner_product_scores` (which the attention layers use); with autograd it takes that function, and its
    gradient is the elementwise one."""
    from iclab.core.kernels import inner_product_scores

    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(4, 9, 5, generator=g, dtype=F64), torch.randn(4, 6, 5, generator=g, dtype=F64)
    ref = inner_product_scores(name, s @ t.mT, sigma=sigma, logit_cap=cap, source_dim=-2)
    assert torch.equal(gram(name, s, t, sigma=sigma, logit_cap=cap), ref)
    if cap is None:  # a Kernel has no cap
        assert torch.equal(Kernel(name, sigma=sigma, weight=0.3)(s, t), 0.3 * ref)
    s.requires_grad_(True)
    out = gram(name, s, t, sigma=sigma, logit_cap=cap)
    assert torch.equal(out.detach(), ref)
    (grad,) = torch.autograd.grad(out.sum(), s)
    inner = (s @ t.mT).detach()
    dscore = (inner > 0).to(F64) if name == "relu" else ref * (inner / sigma**2 < (cap if cap else math.inf)) / sigma**2
    torch.testing.assert_close(grad, dscore @ t, rtol=1e-12, atol=1e-12)
