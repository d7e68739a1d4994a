"""algorithms.CategoricalFunctionalGD: functional GD on the softmax cross-entropy (Wang et al. 2025, eq. 2-3).

Every check compares two independent computations in float64 (1e-12 unless stated): explicit gradient
descent on the parameters (A, b) of f(x) = A x + b by autograd (App. B eq. 10-12) against the functional
iterates; the squared-loss reduction against Cheng et al.'s FunctionalGD (App. G); the softmax mean
against a direct formula.
"""

from __future__ import annotations

import pytest
import torch

import iclab
from conftest import F64, assert_close
from iclab import algorithms
from iclab.algorithms.functional_gd import softmax_expectation
from iclab.core.episode import Episode
from iclab.core.errors import ConfigError
from iclab.tasks.categorical import QuadrantCategorical, RBFMixtureCategorical, expand_queries

KERNELS = ("linear", "rbf", "exp", "laplacian", "softmax")


def _episode(batch: int = 3, n: int = 40, seed: int = 0) -> Episode:
    task = RBFMixtureCategorical.draw(generator=iclab.generator(100 + seed))
    return task.sample(batch, n, generator=iclab.generator(seed), dtype=F64)


def _parametric_gd(ep: Episode, W: torch.Tensor, alphas: torch.Tensor, bias: bool) -> list[torch.Tensor]:
    """f_k at (context, query) by GD on L(A, b) = −(1/N) Σ log softmax(W_eᵀ(A x_i + b))_{y_i}, A_{k+1} = A_k − diag(α_k)∇_A L."""
    B, n, d = ep.x.shape
    dp = W.shape[0]
    A = torch.zeros(B, dp, d, dtype=F64, requires_grad=True)
    b = torch.zeros(B, dp, dtype=F64, requires_grad=True)
    pts = torch.cat([ep.x, ep.x_query.unsqueeze(1)], dim=1)
    out = []
    for k in range(len(alphas) + 1):
        f = pts @ A.transpose(1, 2) + (b.unsqueeze(1) if bias else 0 * b.unsqueeze(1))  # (B, n+1, d')
        out.append(f.detach().clone())
        if k == len(alphas):
            break
        logp = torch.log_softmax(f[:, :n] @ W, -1)
        loss = -logp.gather(2, ep.labels.unsqueeze(-1)).sum() / n  # sum over contexts: per-context gradients
        gA, gb = torch.autograd.grad(loss, [A, b])
        with torch.no_grad():
            A -= alphas[k].reshape(1, dp, 1) * gA
            b -= alphas[k].reshape(1, dp) * gb
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_linear_kernel_equals_parametric_gd(bias: bool) -> None:
    """Eq. (3) (and eq. 13 with κ + 1 for the bias) is GD on (A, b): linear κ, per-coordinate steps (preconditioner)."""
    ep = _episode()
    W = ep.task["W_e"]
    steps = torch.tensor([0.8, 1.5, 0.6, 1.1], dtype=F64)
    pre = torch.rand(4, W.shape[0], generator=iclab.generator(5), dtype=F64) + 0.5
    alg = algorithms.CategoricalFunctionalGD("linear", steps, preconditioner=pre, bias=bias)
    lat = alg.latents(ep)  # (L+1, B, n+1, d')
    ref = _parametric_gd(ep, W, steps.unsqueeze(-1) * pre, bias)
    for k, f in enumerate(ref):
        assert_close(lat[k], f, rtol=1e-12, atol=1e-12)
    assert_close(alg.predict(ep), lat[-1][:, -1] @ W)
    assert lat[-1].abs().max() > 0.1  # not a trivial zero comparison


def test_transform_is_gd_on_mapped_features() -> None:
    """κ(T x, T x') with the linear kernel is GD on f(x) = A T x: the kernel handling is FunctionalGD's."""
    ep = _episode(seed=1)
    T = torch.randn(4, 10, generator=iclab.generator(3), dtype=F64) / 3
    steps = torch.tensor([1.0, 2.0, 0.5], dtype=F64)
    alg = algorithms.CategoricalFunctionalGD("linear", steps, transform=T)
    mapped = Episode(x=ep.x @ T.T, x_query=ep.x_query @ T.T, labels=ep.labels, task=ep.task)
    ref = _parametric_gd(mapped, ep.task["W_e"], steps.unsqueeze(-1).expand(-1, 5), bias=False)
    assert_close(alg.latents(ep)[-1], ref[-1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_squared_loss_reduction_is_cheng2024_functional_gd(kernel: str) -> None:
    """App. G (§2.3, eq. 46-48): w_{e,y} → y and E(w_e)|_f → f give Cheng et al.'s FGD (eq. 9), coordinate by
    coordinate."""
    ep = _episode(seed=2)
    W = ep.task["W_e"]
    steps = torch.tensor([0.3, 0.2, 0.25], dtype=F64)
    alg = algorithms.CategoricalFunctionalGD(kernel, steps, sigma=1.3, loss="squared", divide_by_n=False)
    traj = alg.trajectory(ep)  # (L+1, B, d')
    for c in range(W.shape[0]):
        y = W[c][ep.labels]  # (B, n) real labels y_i = W_e[c, y_i]
        reg = Episode(x=ep.x, x_query=ep.x_query, y=y)
        fgd = algorithms.FunctionalGD(kernel, steps, sigma=1.3)
        assert_close(traj[:, :, c], fgd.trajectory(reg), rtol=1e-12, atol=1e-12)
        assert_close(alg.residuals(ep)[:, :, :, c], fgd.residuals(reg), rtol=1e-12, atol=1e-12)


def test_softmax_expectation() -> None:
    """E(w_e)|_f = Σ_c w_c exp(w_cᵀf)/Σ exp: a direct formula; E|_{f=0} = w̄_e; the one-hot limit for huge ‖f‖."""
    W = torch.randn(5, 25, generator=iclab.generator(0), dtype=F64)
    f = torch.randn(7, 5, generator=iclab.generator(1), dtype=F64)
    logits = f @ W
    direct = (torch.exp(logits - torch.logsumexp(logits, -1, keepdim=True)).unsqueeze(1) * W).sum(-1)
    assert_close(softmax_expectation(f, W), direct, rtol=1e-13, atol=1e-13)
    assert_close(softmax_expectation(torch.zeros(1, 5, dtype=F64), W)[0], W.mean(1), rtol=1e-15, atol=1e-15)
    big = 1e4 * f
    E = softmax_expectation(big, W)
    assert bool(torch.isfinite(E).all())
    assert_close(E, W.T[(big @ W).argmax(-1)], rtol=1e-12, atol=1e-12)


def test_shift_invariance_of_the_model() -> None:
    """Eq. (1) and the GD iterates' probabilities are invariant to w_{e,c} → w_{e,c} + v (as softmax is)."""
    ep = _episode(seed=3)
    W = ep.task["W_e"]
    v = torch.randn(5, 1, generator=iclab.generator(4), dtype=F64)
    steps = torch.tensor([2.0, 1.0], dtype=F64)
    p = torch.softmax(algorithms.CategoricalFunctionalGD("rbf", steps, embeddings=W).predict(ep), -1)
    q = torch.softmax(algorithms.CategoricalFunctionalGD("rbf", steps, embeddings=W + v).predict(ep), -1)
    assert_close(p, q, rtol=1e-13, atol=1e-15)
    f = torch.randn(4, 5, generator=iclab.generator(6), dtype=F64)
    assert_close(torch.softmax(f @ W, -1), torch.softmax(f @ (W + v), -1), rtol=1e-15, atol=1e-15)


def test_values_equal_separate_queries() -> None:
    """Many query points in one pass (queries never sources) = one episode per point (claim 17)."""
    task = QuadrantCategorical.draw(generator=iclab.generator(0))
    ep = task.sample(2, 30, generator=iclab.generator(1), dtype=F64)
    pts = torch.rand(9, 2, generator=iclab.generator(2), dtype=F64) * 2 - 1
    alg = algorithms.CategoricalFunctionalGD("softmax", torch.tensor([3.0, 2.0], dtype=F64))
    many = alg.logits_at(ep, pts.expand(2, 9, 2))  # (B, m, C)
    single = alg.predict(expand_queries(ep, pts)).reshape(2, 9, -1)
    assert_close(many, single, rtol=1e-13, atol=1e-13)


def test_bad_input_is_rejected() -> None:
    ep = _episode(batch=2, n=5)
    steps = torch.tensor([1.0])
    with pytest.raises(ConfigError, match=r"CategoricalFunctionalGD.labels must be in \[0, C = 3\)"):
        algorithms.CategoricalFunctionalGD("rbf", steps, embeddings=torch.randn(5, 3, dtype=F64)).predict(ep)
    with pytest.raises(ConfigError, match="CategoricalFunctionalGD.embeddings must be a .* C >= 2"):
        algorithms.CategoricalFunctionalGD("rbf", steps, embeddings=torch.randn(5, 1, dtype=F64))
    with pytest.raises(ConfigError, match="CategoricalFunctionalGD.preconditioner"):
        algorithms.CategoricalFunctionalGD("rbf", steps, preconditioner=torch.ones(3, 5))
    with pytest.raises(ConfigError, match="CategoricalFunctionalGD.loss"):
        algorithms.CategoricalFunctionalGD("rbf", steps, loss="hinge")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="CategoricalFunctionalGD.kernel"):
        algorithms.CategoricalFunctionalGD("cosine", steps)  # type: ignore[arg-type]
    reg = Episode(x=ep.x, x_query=ep.x_query, y=torch.zeros(2, 5, dtype=F64))
    with pytest.raises(ValueError, match="needs a classification episode"):
        algorithms.CategoricalFunctionalGD("rbf", steps).predict(reg)
    no_w = Episode(x=ep.x, x_query=ep.x_query, labels=ep.labels)
    with pytest.raises(ValueError, match="needs class embeddings"):
        algorithms.CategoricalFunctionalGD("rbf", steps).predict(no_w)
