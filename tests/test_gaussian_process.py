"""tasks.GaussianProcess and tasks.TwoLayerReLUNetwork (Cheng, Chen, Sra 2024, Def. 3.3, Ex. 5-8, App. H.1).

Statistical checks are seeded Monte Carlo with 3-standard-error (or stated) tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch

import iclab
from conftest import F32, F64, assert_close
from iclab import tasks
from iclab.core.errors import ConfigError
from iclab.core.kernels import CompositeKernel, Kernel, gram, positive_part
from iclab.core.numerics import sym_inv_sqrt


def _task(kernel: object = "exp", **kw: object) -> tasks.GaussianProcess:
    return tasks.GaussianProcess.random_rotation(generator=iclab.generator(7), kernel=kernel, **kw)


def _whitened(ep: iclab.Episode) -> torch.Tensor:
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    return pts @ ep.task["Sigma_inv_sqrt"].T  # (B, n+1, d)


def test_shapes_task_dict_and_protocol() -> None:
    task = _task("exp")
    assert isinstance(task, tasks.Task)
    ep = task.sample(8, 14, generator=iclab.generator(0))
    assert (
        ep.x.shape == (8, 14, 5) and ep.y.shape == (8, 14) and ep.x_query.shape == (8, 5) and ep.y_query.shape == (8,)
    )
    assert ep.dtype == F32 and ep.task["K_plus"].shape == (8, 15, 15) and ep.task["K_plus"].dtype == F32
    assert set(ep.task) == {"Sigma", "Sigma_inv_sqrt", "K_plus"} and ep.batched == ("K_plus",)
    assert_close(ep.task["Sigma"].double(), task.Sigma, rtol=1e-6, atol=1e-6)
    assert ep[2:4].task["K_plus"].shape == (2, 15, 15)
    evals = torch.linalg.eigvalsh(task.Sigma)
    assert_close(evals, torch.tensor(sorted(tasks.CHENG2024_SPECTRUM), dtype=F64))  # Σ = UᵀDU, App. H.1


@pytest.mark.parametrize("covariates", ["sphere", "gaussian", "clustered"])
def test_covariates_are_sigma_half_times_whitened_points(covariates: str) -> None:
    ep = _task("exp", covariates=covariates).sample(500, 6, generator=iclab.generator(1), dtype=F64)
    u = _whitened(ep)
    if covariates == "sphere":
        assert_close(u.norm(dim=-1), torch.ones(500, 7, dtype=F64))  # ‖ξ‖ = 1
    else:
        assert float((u.norm(dim=-1) - 1).abs().max()) > 0.5
    assert_close(ep.task["K_plus"], gram("exp", u, u), rtol=1e-9, atol=1e-9)  # kernel on the whitened points (Ex. 7)


def test_clustered_covariates_share_a_centre() -> None:
    """Ex. 5: u_i = μ + ξ_i with μ ~ N(0, I) per prompt: Cov(u_i, u_j) = I for i ≠ j, Var(u_i) = 2I."""
    ep = tasks.GaussianProcess(d=3, covariates="clustered").sample(20_000, 2, generator=iclab.generator(2), dtype=F64)
    u = _whitened(ep)
    cross = (u[:, 0].unsqueeze(-1) * u[:, 1].unsqueeze(-2)).mean(0)
    var = (u[:, 0].unsqueeze(-1) * u[:, 0].unsqueeze(-2)).mean(0)
    assert_close(cross, torch.eye(3, dtype=F64), atol=0.05, rtol=0)  # se ≈ √2/√20000 ≈ 0.01
    assert_close(var, 2 * torch.eye(3, dtype=F64), atol=0.08, rtol=0)
    two = tasks.GaussianProcess(d=3, covariates="clustered", n_clusters=2).sample(
        20_000, 2, generator=iclab.generator(3), dtype=F64
    )
    cross2 = (_whitened(two)[:, 0].unsqueeze(-1) * _whitened(two)[:, 1].unsqueeze(-2)).mean(0)
    assert_close(cross2, 0.5 * torch.eye(3, dtype=F64), atol=0.05, rtol=0)  # same cluster w.p. 1/2


def test_seeding_reproducible_and_streams_differ() -> None:
    task = _task("relu")
    a = task.sample(16, 10, generator=iclab.generator(5))
    b = task.sample(16, 10, generator=iclab.generator(5))
    c = task.sample(16, 10, generator=iclab.generator(6))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.y_query, b.y_query)
    assert not torch.equal(a.y, c.y)
    assert not torch.equal(
        _task("exp").Sigma, tasks.GaussianProcess.random_rotation(generator=iclab.generator(8)).Sigma
    )


@pytest.mark.parametrize(
    "kernel",
    [
        "linear",
        "relu",
        "exp",
        "rbf",
        "arccos",
        CompositeKernel((Kernel("linear", weight=0.5), Kernel("exp", weight=0.5, sigma=1.3))),
    ],
    ids=str,
)
def test_label_covariance_is_k_plus(kernel: object) -> None:
    """Cov(y | X) = K₊(X) (Def. 3.3): whiten the labels by the task's K₊ — (K₊^{-1/2} y) must be N(0, I) on the
    range of K₊: its second moment is the identity within 3 standard errors per entry (seeded MC)."""
    task = tasks.GaussianProcess(
        d=5, kernel=kernel, covariance=torch.diag(torch.tensor(tasks.CHENG2024_SPECTRUM, dtype=F64))
    )
    ep = task.sample(20_000, 7, generator=iclab.generator(9), dtype=F64)
    y = torch.cat([ep.y, ep.y_query.unsqueeze(1)], dim=1)  # (B, 8)
    K = ep.task["K_plus"]
    u = _whitened(ep)
    assert_close(K, positive_part(task.kernel_fn(u, u)), rtol=1e-9, atol=1e-9)
    evals, evecs = torch.linalg.eigh(K)
    keep = evals > 1e-9 * evals[..., -1:]
    z = torch.where(keep, (evecs.transpose(1, 2) @ y.unsqueeze(-1)).squeeze(-1) / evals.clamp_min(1e-300).sqrt(), 0.0)
    keep_f = keep.to(F64)
    m2 = (z.unsqueeze(-1) * z.unsqueeze(-2)).sum(0) / (keep_f.unsqueeze(-1) * keep_f.unsqueeze(-2)).sum(0).clamp_min(1)
    eye = torch.diag((keep_f.sum(0) > 0).to(F64))
    se = math.sqrt(2 / keep_f.sum(0).min().clamp_min(1))
    assert float((m2 - eye).abs().max()) < 3.5 * se, (m2 - eye).abs().max()
    null = torch.where(~keep, (evecs.transpose(1, 2) @ y.unsqueeze(-1)).squeeze(-1), 0.0)
    assert float(null.abs().max()) < 1e-6  # nothing outside the range of K₊ (linear kernel: rank d)


def test_relu_labels_need_the_positive_part() -> None:
    """For relu the stored covariance is K₊ ≠ K and the eigen-sampler is used; Var(y) matches diag(K₊)."""
    ep = _task("relu").sample(8_000, 14, generator=iclab.generator(10), dtype=F64)
    u = _whitened(ep)
    K = gram("relu", u, u)
    assert float((ep.task["K_plus"] - K).abs().max()) > 1e-2
    var = ep.y_query**2
    expect = ep.task["K_plus"][:, 14, 14]
    se = float((var - expect).std()) / math.sqrt(var.numel())
    assert abs(float((var - expect).mean())) < 3 * se
    assert float(expect.mean()) > 1.0  # E[K₊(n+1, n+1)] drifts above K = 1 (K₊ is not K)


def test_prior_variance_and_linear_weights() -> None:
    """Var(y) = 1 (linear, relu kernels on the sphere), e (exp, σ = 1), e^{1/2} (the code's σ² = 2); the linear
    task's labels are exactly ⟨w, x⟩ with the stored w (Ex. 6)."""
    g = iclab.generator(11)
    for kernel, sigma, expect in (
        ("linear", 1.0, 1.0),
        ("exp", 1.0, math.e),
        ("exp", tasks.CODE_EXP_SIGMA, math.exp(0.5)),
    ):
        ep = _task(kernel, sigma=sigma).sample(40_000, 1, generator=g, dtype=F64)
        v = ep.y_query**2
        assert abs(float(v.mean()) - expect) < 3 * float(v.std()) / math.sqrt(v.numel())
    ep = _task("linear").sample(50, 7, generator=g, dtype=F64)
    assert_close(ep.y, torch.einsum("bnd,bd->bn", ep.x, ep.task["w"]))
    assert_close(ep.y_query, torch.einsum("bd,bd->b", ep.x_query, ep.task["w"]))


def test_eigh_method_gives_the_same_distribution_and_fallback() -> None:
    """method='eigh' for a PSD kernel gives the same K₊ and labels with the same law (second moment)."""
    a = _task("exp", method="eigh").sample(20_000, 3, generator=iclab.generator(12), dtype=F64)
    b = _task("exp").sample(20_000, 3, generator=iclab.generator(12), dtype=F64)
    assert_close(a.task["K_plus"], b.task["K_plus"], rtol=1e-9, atol=1e-9)
    assert not torch.equal(a.y, b.y)
    for ep in (a, b):
        v = ep.y_query**2 - ep.task["K_plus"][:, 3, 3]
        assert abs(float(v.mean())) < 3 * float(v.std()) / math.sqrt(v.numel())
    K = gram("exp", torch.ones(2, 3, 2, dtype=F64), torch.ones(2, 3, 2, dtype=F64))  # rank 1: Cholesky fails
    y, Kp = tasks.GaussianProcess._factor_sample(K, torch.ones(2, 3, dtype=F64), psd=True)
    assert torch.isfinite(y).all() and torch.allclose(Kp, K)


def test_jitter_adds_label_noise() -> None:
    ep = _task("exp", jitter=0.25).sample(20_000, 2, generator=iclab.generator(13), dtype=F64)
    assert_close(torch.diagonal(ep.task["K_plus"], dim1=1, dim2=2), math.e + 0.25 * torch.ones(20_000, 3, dtype=F64))
    v = ep.y_query**2 - ep.task["K_plus"][:, 2, 2]
    assert abs(float(v.mean())) < 3 * float(v.std()) / math.sqrt(v.numel())


def test_two_layer_relu_network() -> None:
    """Ex. 8: y_i = ⟨θ₂, relu(θ₁ u_i)⟩ exactly from the stored θ; E[y_i y_j | X] = m·arccos(u_i, u_j) (MC 3σ)."""
    task = tasks.TwoLayerReLUNetwork(
        d=5, width=3, covariance=torch.diag(torch.tensor(tasks.CHENG2024_SPECTRUM, dtype=F64))
    )
    ep = task.sample(40_000, 2, generator=iclab.generator(14), dtype=F64)
    u = _whitened(ep)
    y = torch.cat([ep.y, ep.y_query.unsqueeze(1)], dim=1)
    assert_close(y, torch.einsum("btm,bm->bt", torch.relu(u @ ep.task["theta1"].transpose(1, 2)), ep.task["theta2"]))
    prods = y.unsqueeze(-1) * y.unsqueeze(-2) - task.label_kernel(u, u)  # (B, 3, 3) zero-mean given X
    se = prods.std(0) / math.sqrt(prods.shape[0])
    assert bool((prods.mean(0).abs() < 3.5 * se).all()), prods.mean(0) / se
    assert ep.task["theta1"].shape == (40_000, 3, 5)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ConfigError, match="GaussianProcess.kernel"):
        tasks.GaussianProcess(kernel="softmax")
    with pytest.raises(ConfigError, match="GaussianProcess.kernel must be one of"):
        tasks.GaussianProcess(kernel="gauss")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="GaussianProcess.covariance"):
        tasks.GaussianProcess(d=3, covariance=torch.eye(4, dtype=F64))
    with pytest.raises(ConfigError, match="GaussianProcess.covariance must be symmetric positive definite"):
        tasks.GaussianProcess(d=2, covariance=torch.tensor([[1.0, 0], [0, -1]], dtype=F64))
    with pytest.raises(ConfigError, match="GaussianProcess.covariates"):
        tasks.GaussianProcess(covariates="cube")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="GaussianProcess.jitter"):
        tasks.GaussianProcess(jitter=-1.0)
    with pytest.raises(ConfigError, match="GaussianProcess.n"):
        tasks.GaussianProcess().sample(4, 0, generator=iclab.generator(0))
    with pytest.raises(ConfigError, match="TwoLayerReLUNetwork.width"):
        tasks.TwoLayerReLUNetwork(width=0)
    assert_close(sym_inv_sqrt(_task().Sigma) @ _task().Sigma @ sym_inv_sqrt(_task().Sigma), torch.eye(5, dtype=F64))


@pytest.mark.parametrize(
    ("kernel", "kw"),
    [("relu", {}), ("exp", {}), ("linear", {}), ("relu", {"jitter": 0.1}), ("exp", {"method": "eigh"})],
)
def test_a_draw_without_K_plus_has_the_same_labels(kernel: str, kw: dict) -> None:
    """``with_K_plus=False`` (a training batch): the same x, the same y (bits where no eigendecomposition runs; else
    y alone by QL, to 1e-10 in float64 and 1e-4 in float32 against the Jacobi draw that forms K₊), no K_plus in the
    task or its batched keys; the Bayes oracle then says what it needs."""
    task = _task(kernel, **kw)
    eigh = kernel == "relu" or kw.get("method") == "eigh"
    for dtype in (torch.float32, F64):
        a = task.sample(257, 6, generator=iclab.generator(3), dtype=dtype)
        b = task.sample(257, 6, generator=iclab.generator(3), dtype=dtype, with_K_plus=False)
        assert torch.equal(a.x, b.x)
        if eigh:
            tol = 1e-10 if dtype == F64 else 1e-4
            assert_close(b.y, a.y, rtol=0, atol=tol * float(a.y.abs().max()))
        else:
            assert torch.equal(a.y, b.y) and torch.equal(a.y_query, b.y_query)
        assert "K_plus" in a.task and "K_plus" not in b.task and "K_plus" not in b.batched
        assert set(a.task) - {"K_plus"} == set(b.task) and b[:5].x.shape[0] == 5  # slicing follows its batched keys
    with pytest.raises(ValueError, match="needs an episode whose task has 'K_plus'"):
        iclab.algorithms.GaussianProcessPosterior(kernel=None).predict(b)


def test_cheng2024_training_batches_carry_no_K_plus() -> None:
    from iclab.experiments.cheng2024._setup import model_job
    from iclab.experiments.cheng2024.fig4 import Fig4Config

    job = model_job(Fig4Config(), seed=0, kernel="linear", activations=("linear",), n=14, n_layers=1, name="m")
    assert "K_plus" not in job.run.task(8, generator=iclab.generator(0)).task


@pytest.mark.parametrize(
    ("kernel", "kw"),
    [
        ("relu", {}),
        ("exp", {}),
        ("linear", {}),
        (Kernel("exp", sigma=1.3, weight=0.5), {}),
        (CompositeKernel((Kernel("linear", weight=0.5), Kernel("relu", weight=0.5))), {}),
        ("relu", {"jitter": 0.1}),
        ("exp", {"method": "eigh"}),
    ],
)
def test_a_draw_in_parts_has_the_same_bits(kernel: object, kw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw without K₊ makes and factors its Gram matrices ``LABEL_PART`` prompts per thread at a time: every
    prompt's K and y are its own, so the labels are the same bits as in one part (the parts here are 7 prompts, the
    last one short), in float32 and float64, at one and two torch threads."""
    from iclab.tasks import gaussian_process

    task = _task(kernel, **kw)
    threads = torch.get_num_threads()
    try:
        for dtype in (torch.float32, F64):
            monkeypatch.setattr(gaussian_process, "LABEL_PART", 10**6)
            whole = task.sample(61, 8, generator=iclab.generator(4), dtype=dtype, with_K_plus=False)
            monkeypatch.setattr(gaussian_process, "LABEL_PART", 7)
            for t in (1, 2):
                torch.set_num_threads(t)
                parts = task.sample(61, 8, generator=iclab.generator(4), dtype=dtype, with_K_plus=False)
                assert torch.equal(whole.y, parts.y) and torch.equal(whole.y_query, parts.y_query)
                assert torch.equal(whole.x, parts.x)
    finally:
        torch.set_num_threads(threads)
