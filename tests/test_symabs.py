"""|K| and y = |K|^{1/2} g for a batch of symmetric matrices (iclab.core.symabs; the C kernel ``_sym_abs.c``).

The Jacobi kernel (y and |K|) and the QL kernel (y alone) against torch's eigh in float64: K₊ = |K| and y to 1e-10
where the spectrum stays away from 0
(near a zero eigenvalue the square root amplifies rounding to √eps, for any solver, so there S² = |K| is checked
instead, S = |K|^{1/2} read off column by column); float32 as accurate as torch's float32 eigh; N from 1 to 64,
batches whose last group of lanes is ragged, both builds (AVX-512 where the CPU has it, and AVX2); the same bits on
1 and 2 threads; the torch code where the kernel does not apply; and, for any symmetric K (hypothesis), |K| is
symmetric positive semi-definite with |K|² = K² and K|K| = |K|K.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iclab.core import symabs
from iclab.core.kernels import gram
from iclab.core.seeding import generator
from iclab.tasks import GaussianProcess

F64 = torch.float64
needs_kernel = pytest.mark.skipif(symabs.native() is None, reason="no C compiler or no AVX2 here")


@pytest.fixture(params=["native", "native-avx2"])
def build(request, monkeypatch) -> str:
    """The kernel as built here (AVX-512 where the CPU has it), and its AVX2 build (what a CPU without it runs)."""
    monkeypatch.setattr(symabs, "WIDE", request.param == "native")
    return request.param


def _spectral(B: int, N: int, seed: int, dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric K = U D Uᵀ with |D| in [0.2, 3] and both signs, and g."""
    g = generator(seed)
    U = torch.linalg.qr(torch.randn(B, N, N, generator=g, dtype=F64)).Q
    D = (0.2 + 2.8 * torch.rand(B, N, generator=g, dtype=F64)) * torch.where(torch.rand(B, N, generator=g) < 0.5, -1, 1)
    K = (U * D.unsqueeze(-2)) @ U.transpose(-1, -2)
    K = (K + K.transpose(-1, -2)) / 2
    return K.to(dtype), torch.randn(B, N, generator=g, dtype=F64).to(dtype)


def _relu_gram(B: int, N: int, seed: int, dtype=F64) -> torch.Tensor:
    u = torch.nn.functional.normalize(torch.randn(B, N, 5, generator=generator(seed), dtype=F64), dim=-1)
    return gram("relu", u, u).to(dtype)


def _reference(K: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, written out: K = U D Uᵀ, |K| = U|D|Uᵀ, y = U|D|^{1/2}Uᵀ g (float64)."""
    D, U = torch.linalg.eigh(K.double())
    y = U @ (D.abs().sqrt() * (U.transpose(-1, -2) @ g.double().unsqueeze(-1)).squeeze(-1)).unsqueeze(-1)
    return y.squeeze(-1), (U * D.abs().unsqueeze(-2)) @ U.transpose(-1, -2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@needs_kernel
@pytest.mark.parametrize(("B", "N"), [(1, 1), (7, 2), (37, 5), (40, 31), (9, 64)])
def test_native_float64_matches_the_definition(build, B, N):
    K, g = _spectral(B, N, seed=N)
    y, Kp = symabs.abs_sample(K, g, engine="native")
    y_ref, Kp_ref = _reference(K, g)
    assert _rel(Kp, Kp_ref) < 1e-10
    assert _rel(y, y_ref) < 1e-10


@needs_kernel
def test_native_float64_on_relu_grams_square_root_squares_to_abs(build):
    """Indefinite, near-singular Gram matrices (Cheng et al.'s K^relu, n = 30): |K| to 1e-10; S = |K|^{1/2} (its
    columns are y for g = e_j) is symmetric and S² = |K| to 1e-10."""
    N = 31
    K = _relu_gram(6, N, seed=3)
    _, Kp = symabs.abs_sample(K, torch.zeros(6, N, dtype=F64), engine="native")
    assert _rel(Kp, _reference(K, torch.zeros(6, N, dtype=F64))[1]) < 1e-10
    eye = torch.eye(N, dtype=F64)
    S = torch.stack([symabs.abs_sample(K[b].expand(N, N, N).contiguous(), eye, engine="native")[0] for b in range(6)])
    assert _rel(S, S.transpose(-1, -2)) < 1e-10
    assert _rel(S @ S, Kp) < 1e-10


@needs_kernel
@pytest.mark.parametrize("kind", ["spectral", "relu"])
def test_native_float32_as_accurate_as_torch_float32(build, kind):
    if kind == "spectral":
        K, g = _spectral(45, 31, seed=5, dtype=torch.float32)
    else:
        K = _relu_gram(45, 31, seed=5, dtype=torch.float32)
        g = torch.randn(45, 31, generator=generator(6))
    y_ref, Kp_ref = _reference(K, g)
    y, Kp = symabs.abs_sample(K, g)  # auto: the kernel in float32
    y_t, Kp_t = symabs.abs_sample(K, g, engine="torch")
    assert y.dtype == Kp.dtype == torch.float32
    assert _rel(Kp, Kp_ref) <= max(3 * _rel(Kp_t, Kp_ref), 1e-6)
    assert _rel(y, y_ref) <= max(3 * _rel(y_t, y_ref), 1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("with_abs", [True, False])  # Jacobi (y and |K|), QL (y alone)
def test_same_bits_on_one_and_two_threads(monkeypatch, dtype, with_abs):
    monkeypatch.setattr(symabs, "PART", 64)  # several parts
    K, g = _spectral(300, 9, seed=7, dtype=dtype)
    old = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append(symabs.abs_sample(K, g, with_abs=with_abs, engine="native"))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out[0][0], out[1][0]) and (not with_abs or torch.equal(out[0][1], out[1][1]))


def test_without_the_kernel_torch_gives_the_same(monkeypatch):
    K, g = _spectral(20, 6, seed=8)
    monkeypatch.setattr(symabs, "NATIVE", False)
    y, Kp = symabs.abs_sample(K, g, engine="native")  # asked for, not available: torch
    y_ref, Kp_ref = _reference(K, g)
    assert _rel(y, y_ref) < 1e-10 and _rel(Kp, Kp_ref) < 1e-10
    K70, g70 = _spectral(2, 70, seed=9)  # over the kernel's 64 x 64: torch
    monkeypatch.setattr(symabs, "NATIVE", True)
    assert _rel(symabs.abs_sample(K70, g70, engine="native")[1], _reference(K70, g70)[1]) < 1e-10
    y_only, none = symabs.abs_sample(K, g, with_abs=False, engine="torch")
    assert none is None and _rel(y_only, y_ref) < 1e-10


@needs_kernel
def test_without_abs_the_kernel_gives_y_alone(build):
    K, g = _spectral(19, 12, seed=10)
    y, none = symabs.abs_sample(K, g, with_abs=False, engine="native")
    assert none is None and _rel(y, _reference(K, g)[0]) < 1e-10


# --- y alone: Householder tridiagonalisation + implicit QL, the lanes' sweeps in step ------------------------------


@needs_kernel
@pytest.mark.parametrize(("B", "N"), [(1, 1), (7, 2), (3, 3), (37, 5), (33, 15), (40, 31), (9, 64)])
def test_ql_float64_matches_the_definition(build, B, N):
    K, g = _spectral(B, N, seed=20 + N)
    y, _ = symabs.abs_sample(K, g, with_abs=False, engine="native")
    assert _rel(y, _reference(K, g)[0]) < 1e-10


@needs_kernel
def test_ql_float64_on_relu_grams_square_root_squares_to_abs(build):
    """S = |K|^{1/2}, its columns y for g = e_j by QL, is symmetric and S² = |K| to 1e-10 (K^relu, n = 30)."""
    N = 31
    K = _relu_gram(4, N, seed=21)
    Kp = _reference(K, torch.zeros(4, N, dtype=F64))[1]
    eye = torch.eye(N, dtype=F64)
    S = torch.stack(
        [
            symabs.abs_sample(K[b].expand(N, N, N).contiguous(), eye, with_abs=False, engine="native")[0]
            for b in range(4)
        ]
    )
    assert _rel(S, S.transpose(-1, -2)) < 1e-10
    assert _rel(S @ S, Kp) < 1e-10


@needs_kernel
@pytest.mark.parametrize("kind", ["zero", "identity", "repeated", "rank one"])
def test_ql_on_structured_spectra(build, kind):
    """Split points everywhere (zero, identity, a diagonal with repeated eigenvalues of both signs) and a rank-one
    K (its other eigenvalues are rounding: their square roots ≈ √eps, for any solver, so S² = |K| is checked)."""
    N, B = 6, 21
    g = torch.randn(B, N, generator=generator(22), dtype=F64)
    if kind == "zero":
        K = torch.zeros(B, N, N, dtype=F64)
    elif kind == "identity":
        K = torch.eye(N, dtype=F64).expand(B, N, N).contiguous()
    elif kind == "repeated":
        K = torch.diag_embed(torch.tensor([1.0, 1.0, -2.0, -2.0, 3.0, 0.0], dtype=F64).expand(B, N)).contiguous()
    else:
        v = torch.randn(B, N, 1, generator=generator(23), dtype=F64)
        K = v @ v.transpose(-1, -2)
    y, _ = symabs.abs_sample(K, g, with_abs=False, engine="native")
    if kind != "rank one":
        assert _rel(y, _reference(K, g)[0]) < 1e-12
        return
    eye = torch.eye(N, dtype=F64)
    S = torch.stack([symabs.abs_sample(K[b].expand(N, N, N).contiguous(), eye, with_abs=False)[0] for b in range(B)])
    assert _rel(S @ S, _reference(K, g)[1]) < 1e-10


@needs_kernel
@pytest.mark.parametrize("kind", ["spectral", "relu"])
def test_ql_float32_near_torch_float32(build, kind):
    """Within 10x torch's float32 eigh and 3e-5 of the float64 definition: on near-singular K^relu grams QL's
    float32 rounding is up to ~6x torch's (1.3e-5 relative at worst of 45 here, Jacobi 3.5e-6), far below a label
    draw's Monte-Carlo noise; on well-separated spectra it is as accurate."""
    if kind == "spectral":
        K, g = _spectral(45, 31, seed=24, dtype=torch.float32)
    else:
        K = _relu_gram(45, 31, seed=24, dtype=torch.float32)
        g = torch.randn(45, 31, generator=generator(25))
    y_ref = _reference(K, g)[0]
    y, _ = symabs.abs_sample(K, g, with_abs=False)
    y_t, _ = symabs.abs_sample(K, g, with_abs=False, engine="torch")
    assert y.dtype == torch.float32 and _rel(y, y_ref) <= min(max(10 * _rel(y_t, y_ref), 1e-5), 3e-5)


def test_bad_input_is_refused():
    K, g = _spectral(3, 4, seed=11)
    with pytest.raises(ValueError, match=r"K must be \(B, N, N\)"):
        symabs.abs_sample(K[0], g)
    with pytest.raises(ValueError, match="g \\(B, N\\)"):
        symabs.abs_sample(K, g[:, :3])
    with pytest.raises(ValueError, match="engine must be one of"):
        symabs.abs_sample(K, g, engine="lapack")  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 12), B=st.integers(1, 20), seed=st.integers(0, 10_000), scale=st.floats(1e-3, 1e3))
def test_abs_is_psd_squares_to_k_squared_and_commutes(N, B, seed, scale):
    A = scale * torch.randn(B, N, N, generator=generator(seed), dtype=F64)
    K = (A + A.transpose(-1, -2)) / 2
    _, Kp = symabs.abs_sample(K, torch.zeros(B, N, dtype=F64), engine="native")
    if symabs.native() is not None:  # the C kernel mirrors one triangle; torch's U|D|Uᵀ is symmetric to rounding
        assert torch.equal(Kp, Kp.transpose(-1, -2))
    assert _rel(Kp, Kp.transpose(-1, -2)) < 1e-14
    assert float(torch.linalg.eigvalsh(Kp).min()) >= -1e-12 * float(K.abs().max()) * N
    assert _rel(Kp @ Kp, K @ K) < 1e-10
    assert _rel(K @ Kp, Kp @ K) < 1e-10


@needs_kernel
@pytest.mark.parametrize("with_K_plus", [True, False])
def test_relu_gp_labels_have_covariance_k_plus(with_K_plus):
    """The GP task's ReLU labels (float32, the kernel: Jacobi with K₊, QL without): E[y_q²] = K₊[q, q] and
    E[y_0 y_q] = K₊[0, q] (MC, 4σ; K₊ of the same prompts from the draw that forms it)."""
    task = GaussianProcess.random_rotation(generator=generator(12), kernel="relu")
    ep = task.sample(40_000, 6, generator=generator(13), with_K_plus=with_K_plus)
    Kp = task.sample(40_000, 6, generator=generator(13)).task["K_plus"].double()
    for v in (ep.y_query.double() ** 2 - Kp[:, 6, 6], ep.y[:, 0].double() * ep.y_query.double() - Kp[:, 0, 6]):
        assert abs(float(v.mean())) < 4 * float(v.std()) / v.numel() ** 0.5


def _psd(B: int, N: int, seed: int, dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    u = torch.nn.functional.normalize(torch.randn(B, N, 5, generator=generator(seed), dtype=F64), dim=-1)
    return gram("exp", u, u).to(dtype), torch.randn(B, N, generator=generator(seed + 1), dtype=F64).to(dtype)


@needs_kernel
@pytest.mark.parametrize(("B", "N"), [(1, 1), (7, 2), (37, 15), (40, 31), (9, 64)])
def test_cholesky_float64_matches_lapack(build, B, N):
    K, g = _psd(B, N, seed=N)
    K = K + 0.1 * torch.eye(N, dtype=F64)  # well conditioned at every N
    y, bad = symabs.cholesky_sample(K, g, engine="native")
    y_ref, bad_ref = symabs.cholesky_sample(K, g, engine="torch")
    assert not bad.any() and not bad_ref.any()
    assert _rel(y, y_ref) < 1e-10


@needs_kernel
def test_cholesky_flags_what_is_not_positive_definite(build):
    K, g = _psd(12, 6, seed=20)
    K[3] = gram("exp", torch.ones(1, 6, 2, dtype=F64), torch.ones(1, 6, 2, dtype=F64))[0]  # rank 1
    K[5] = -K[5]
    K[8, 2, 2] = float("nan")
    y, bad = symabs.cholesky_sample(K, g, engine="native")
    assert bad.tolist() == [i in (3, 5, 8) for i in range(12)]
    good = ~bad
    assert _rel(y[good], symabs.cholesky_sample(K[good], g[good], engine="torch")[0]) < 1e-10


@needs_kernel
def test_cholesky_float32_as_accurate_as_torch_float32(build):
    K, g = _psd(45, 31, seed=21, dtype=torch.float32)
    y_ref = symabs.cholesky_sample(K.double(), g.double(), engine="torch")[0]
    y, _ = symabs.cholesky_sample(K, g)
    y_t, _ = symabs.cholesky_sample(K, g, engine="torch")
    assert y.dtype == torch.float32
    assert _rel(y, y_ref) <= max(3 * _rel(y_t, y_ref), 1e-5)


def test_cholesky_refuses_bad_input_and_runs_torch_without_the_kernel(monkeypatch):
    K, g = _psd(5, 4, seed=22)
    with pytest.raises(ValueError, match=r"K must be \(B, N, N\)"):
        symabs.cholesky_sample(K[0], g)
    with pytest.raises(ValueError, match="engine must be one of"):
        symabs.cholesky_sample(K, g, engine="lapack")  # type: ignore[arg-type]
    monkeypatch.setattr(symabs, "NATIVE", False)
    y, bad = symabs.cholesky_sample(K, g)
    L = torch.linalg.cholesky(K)
    assert not bad.any() and _rel(y, (L @ g.unsqueeze(-1)).squeeze(-1)) < 1e-12
