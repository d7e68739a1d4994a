"""Classification learners and metrics for episodes with integer labels (Wang et al. 2025 baselines).

Every learner maps an episode with ``labels (B, n)`` in [0, C) to ``(B, C)`` class *log-probabilities*
(normalised logits: ``logsumexp = 0`` per row), so :func:`accuracy`, :func:`nll` and any softmax read
them directly:

* :class:`LinearProbe`: per-episode multinomial logistic regression fit on the context (§6.2
  "linear probing"), all B episodes at once in torch.
* :class:`BayesClassifier`: the oracle log p(c | x_query) of the generators in
  :mod:`iclab.tasks.categorical` (reads ``episode.task``); its accuracy is the Bayes rate.
* :class:`NearestClassMean` and :class:`LabelFrequency`: cheap reference points (prototype
  classifier; the context's label histogram, which ignores x).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, is_int, require, require_int
from iclab.tasks.categorical import check_labels, log_probabilities

# ---- metrics -------------------------------------------------------------------------------------------------


def _check_logits(owner: str, logits: Tensor, labels: Tensor) -> None:
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ShapeError(
            f"{owner}: logits must be (B, C) and labels (B,); got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    check_labels(owner, "labels", labels, logits.shape[1])


def accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Top-1 accuracy, mean over the batch: ``logits (B, C)``, ``labels (B,)`` → ``()``."""
    _check_logits("accuracy", logits, labels)
    return (logits.argmax(-1) == labels).to(logits.dtype).mean()


def top_k_accuracy(logits: Tensor, labels: Tensor, k: int) -> Tensor:
    """How often the label is among the k most probable classes (the authors' code reports top-3; top-2 for images)."""
    _check_logits("top_k_accuracy", logits, labels)
    require("top_k_accuracy", "k", is_int(k, 1) and k <= logits.shape[1], "an int in [1, C]", k)
    top = logits.topk(k, dim=-1).indices  # (B, k)
    return (top == labels.unsqueeze(-1)).any(-1).to(logits.dtype).mean()


def nll(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean negative log-likelihood −log softmax(logits)_y (cross-entropy, nats) → ``()``."""
    _check_logits("nll", logits, labels)
    return -torch.log_softmax(logits, -1).gather(1, labels.unsqueeze(1)).mean()


def probability_mse(logits: Tensor, p_true: Tensor) -> Tensor:
    """½ · mean over the batch of Σ_c (p̂_c − p_c)²: squared error of the predicted class probabilities.

    The authors' code logs "MSE on category probabilities"; here it is summed over classes
    (their exact reduction is not recoverable from the code).
    """
    if logits.shape != p_true.shape:
        raise ShapeError(
            f"probability_mse: logits and p_true must match; got {tuple(logits.shape)}, {tuple(p_true.shape)}"
        )
    return 0.5 * (torch.softmax(logits, -1) - p_true).square().sum(-1).mean()


def _classification(owner: str, episode: Episode, num_classes: int) -> Tensor:
    if episode.labels is None:
        raise ShapeError(f"{owner} needs a classification episode (integer labels); got a regression episode")
    check_labels(owner, "labels", episode.labels, num_classes)
    return episode.labels


# ---- learners -------------------------------------------------------------------------------------------------


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-episode Frobenius inner product of ``(B, …)`` tensors, ``(B,)``."""
    return (a * b).flatten(1).sum(1)


def _data_term(z: Tensor, onehot: Tensor) -> Tensor:
    """(1/n) Σ_i −log softmax(z_i)_{y_i} per episode, ``(B,)``, from logits ``z (B, n, C)``."""
    return (torch.logsumexp(z, -1) - (z * onehot).sum(-1)).mean(1)


class ProbeConvergenceWarning(UserWarning):
    """A :class:`LinearProbe` fit stopped with some episode's gradient norm above ``tol``."""


@dataclass(frozen=True)
class LinearProbe:
    """Per-episode multinomial logistic regression on the context, returned at the query (§6.2 baseline).

    For each episode minimise, over W ∈ R^{d×C} and b ∈ R^C (θ = [W; bᵀ] ∈ R^{(d+1)×C}, x̃ = [x; 1]),

        ℓ(θ) = (1/n) Σ_i −log softmax(θᵀx̃_i)_{y_i} + (l2/2) ‖θ‖_F²,
        ∇ℓ = X̃ᵀ(P − Y)/n + l2 θ,   ∇²ℓ = (1/n) Σ_i (diag p_i − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ + l2 I

    (``bias=False`` drops b, as the authors' probe does). The bias is penalised too: a class absent
    from the context would otherwise push its b_c to −∞ (no minimiser). ℓ is l2-strongly convex, so the
    minimiser is unique.

    **Solver**: batched truncated Newton (Newton-CG) in reduced coordinates, all B episodes at once.
    The minimiser lies in the row space of X̃ (the representer theorem: ∇ℓ = X̃ᵀ(·) + l2 θ), so
    θ = V β with V an orthonormal basis of it and the logits are X̃θ = Φβ, Φ = X̃V, ΦᵀΦ = Λ diagonal:

    * ``"dual"`` (default when n < d + 1, e.g. 256-d features, n = 50): from the n × n Gram matrix
      K = X̃X̃ᵀ = UΛUᵀ (kernelised: only inner products), Φ = UΛ^{1/2}, θ = X̃ᵀUΛ^{-1/2}β, β ∈ R^{n×C}
      (directions with λ ≤ (n + d)·ε·λ_max are dropped, as a pseudo-inverse does);
    * ``"primal"`` (otherwise): from X̃ᵀX̃ = VΛVᵀ, Φ = X̃V, θ = Vβ, β ∈ R^{(d+1)×C}.

    Both are exact reparametrisations of the same ℓ (‖θ‖ = ‖β‖, ‖∇_θ ℓ‖ = ‖∇_β ℓ‖), so they reach the
    same θ. Each Newton step solves ∇²ℓ δ = −∇ℓ by conjugate gradients to a relative residual
    min(½, ‖∇ℓ‖^{1/2}) (superlinear local convergence; Nocedal & Wright 2006, Alg. 7.1), preconditioned
    by the Hessian's diagonal Σ_i Φ_ik² p_ic(1 − p_ic)/n + l2 (in the eigenbasis ΦᵀΦ is diagonal; the
    C × C block-diagonal took 20 % fewer CG steps but 1.6-3× the time, C = 5 and 25), then takes an
    Armijo backtracking step (accepting changes of ℓ within its rounding error). Episodes that stop are
    dropped from the batch. An episode stops once its own ‖∇ℓ‖_F ≤ ``tol`` (so results do not depend on
    the batch), at the rounding floor (no decrease of ℓ, or a Newton decrement below 64 ε ℓ without a
    fall of ‖∇ℓ‖), or after ``max_iter`` Newton steps. Everything is computed in float64 (float32
    episodes too, except on MPS), results are cast back to the episode's dtype.

    Convergence: ``fit`` returns the final gradient norms, recomputed at the returned θ; if any exceeds
    ``tol``, a :class:`ProbeConvergenceWarning` says how many episodes, by how much and why (out of
    ``max_iter``, or at the rounding floor). On the 256-d digits features (5-way 10-shot, l2 = 1e-2)
    the float64 floor of ‖∇ℓ‖ is ≈ 2e-13; the default tol = 1e-8 takes ~15 Newton steps.

    Departure from the authors' probe (500 AdamW steps at lr 1e-3 from a small random init, no
    regularisation): we solve the regularised problem to ``tol``, so the result does not depend on an
    optimiser budget; ``l2`` is the knob (docs/errata.md, Wang et al. 2025, item 6).
    """

    num_classes: int
    l2: float = 1e-2
    bias: bool = True
    max_iter: int = 100  # Newton iterations
    tol: float = 1e-8  # on ‖∇ℓ(θ)‖_F, per episode
    solver: Literal["auto", "primal", "dual"] = "auto"

    def __post_init__(self) -> None:
        require_int(self, "num_classes", self.num_classes, 2)
        require(self, "l2", self.l2 > 0, "a float > 0 (the problem is unbounded on separable contexts without it)")
        require_int(self, "max_iter", self.max_iter, 1)
        require(self, "tol", self.tol >= 0, "a float >= 0")
        require(self, "solver", self.solver in ("auto", "primal", "dual"), "one of 'auto', 'primal', 'dual'")

    def _design(self, x: Tensor) -> Tensor:
        return torch.cat([x, torch.ones_like(x[..., :1])], -1) if self.bias else x

    def loss(self, theta: Tensor, episode: Episode) -> Tensor:
        """ℓ per episode, ``(B,)``, at parameters ``theta (B, d(+1), C)`` (bias in the last row)."""
        assert episode.labels is not None  # a classification episode
        xt = self._design(episode.x)
        logp = torch.log_softmax(xt @ theta, -1)  # (B, n, C)
        data = -logp.gather(2, episode.labels.unsqueeze(-1)).squeeze(-1).mean(1)
        return data + 0.5 * self.l2 * theta.square().sum((1, 2))

    def _reduce(self, xt: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        """Φ (B, n, r) with ΦᵀΦ diagonal and the map β (B, r, C) ↦ θ (B, d~, C) of the class docstring."""
        n, dt = xt.shape[1:]
        if self.solver == "dual" or (self.solver == "auto" and n < dt):
            lam, U = torch.linalg.eigh(xt @ xt.transpose(1, 2))  # (B, n), (B, n, n)
            keep = lam > (n + dt) * torch.finfo(xt.dtype).eps * lam[:, -1:].clamp_min(torch.finfo(xt.dtype).tiny)
            lam = torch.where(keep, lam, 0.0)
            root = lam.sqrt()
            inv = torch.where(keep, 1.0 / torch.where(keep, root, 1.0), 0.0)
            return U * root.unsqueeze(1), lambda beta: xt.transpose(1, 2) @ (U @ (inv.unsqueeze(-1) * beta))
        V = torch.linalg.eigh(xt.transpose(1, 2) @ xt).eigenvectors  # (B, dt, dt)
        return xt @ V, lambda beta: V @ beta

    def fit(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """Parameters ``theta (B, d(+1), C)`` (last row = b when ``bias``) and gradient norms ‖∇ℓ(θ)‖_F ``(B,)``.

        Warns (:class:`ProbeConvergenceWarning`) if some episode ends with a gradient norm above ``tol``.
        """
        labels = _classification("LinearProbe", episode, self.num_classes)
        dtype = episode.x.dtype
        work = dtype if episode.x.device.type == "mps" else torch.float64
        xt = self._design(episode.x.to(work))  # (B, n, d~)
        B, n, _ = xt.shape
        onehot = torch.nn.functional.one_hot(labels, self.num_classes).to(xt)  # (B, n, C)
        phi, to_theta = self._reduce(xt)  # (B, n, r)
        beta = torch.zeros(B, phi.shape[2], self.num_classes, dtype=work, device=xt.device)  # (B, r, C)
        idx = torch.arange(B, device=xt.device)  # episodes still iterating
        last = torch.full((B,), math.inf, dtype=work, device=xt.device)  # ‖∇_β ℓ‖ at the previous step
        floored = torch.zeros(B, dtype=torch.bool, device=xt.device)  # stopped above tol at the rounding floor
        for _ in range(self.max_iter):
            going, step, last[idx], floored[idx] = self._newton_step(phi[idx], onehot[idx], beta[idx], last[idx])
            beta[idx] += step
            idx = idx[going]
            if idx.numel() == 0:
                break

        theta = to_theta(beta)  # (B, d~, C)
        grad = xt.transpose(1, 2) @ (torch.softmax(xt @ theta, -1) - onehot) / n + self.l2 * theta
        gnorm = _dot(grad, grad).sqrt()
        bad = gnorm > self.tol
        if bool(bad.any()):
            floor = int((bad & floored).sum())
            warnings.warn(
                f"LinearProbe: {int(bad.sum())} of {B} episodes ended with ‖∇ℓ‖ > tol = {self.tol:g} "
                f"(largest {float(gnorm.max()):.3g}): {int(bad.sum()) - floor} ran out of max_iter = "
                f"{self.max_iter} Newton steps (raise it), {floor} stopped at the rounding floor of ℓ "
                "(raise tol)",
                ProbeConvergenceWarning,
                stacklevel=2,
            )
        return theta.to(dtype), gnorm.to(dtype)

    def _newton_step(
        self, phi: Tensor, onehot: Tensor, beta: Tensor, last: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One damped Newton-CG step in reduced coordinates for a batch ``phi (B, n, r)``, ``beta (B, r, C)``.

        Returns which episodes go on, the step to add to ``beta`` (zero for the others), ‖∇_β ℓ‖ at
        ``beta`` and which episodes stopped above ``tol`` at the rounding floor: when the line search
        finds no decrease beyond ℓ's rounding error, or when the Newton decrement −∇ℓᵀδ (≈ 2(ℓ − ℓ*))
        is below 64 ε ℓ and ‖∇ℓ‖ did not fall since the previous step (``last``).
        """
        B, n, r = phi.shape
        C, l2 = self.num_classes, self.l2
        phi_t = phi.transpose(1, 2).contiguous()  # (B, r, n)
        z = phi @ beta  # (B, n, C) logits
        p = torch.softmax(z, -1)
        g = torch.baddbmm(beta, phi_t, p - onehot, beta=l2, alpha=1 / n)  # (B, r, C) = ∇_β ℓ
        gnorm = _dot(g, g).sqrt()
        active = gnorm > self.tol
        if not bool(active.any()):
            return active, torch.zeros_like(beta), gnorm, active

        def hess(v: Tensor) -> Tensor:  # ∇²_β ℓ · v = Φᵀ(diag p − ppᵀ)Φv/n + l2 v, (B, r, C)
            pu = p * (phi @ v)  # (B, n, C)
            return torch.baddbmm(
                v, phi_t, torch.addcmul(pu, p, pu.sum(-1, keepdim=True), value=-1), beta=l2, alpha=1 / n
            )

        # Jacobi preconditioner: the Hessian's diagonal Σ_i Φ_ik² p_ic (1 − p_ic)/n + l2, (B, r, C)
        dinv = 1 / (torch.bmm(phi_t.square(), p - p * p) / n + l2)

        # truncated PCG on ∇²ℓ δ = −∇ℓ, per episode to ‖residual‖ <= min(½, √‖g‖)·‖g‖
        target = torch.clamp(gnorm.sqrt(), max=0.5) * gnorm
        step = torch.zeros_like(beta)
        res = torch.where(active.view(B, 1, 1), -g, 0.0)
        direc = dinv * res
        rz = _dot(res, direc)
        on = active
        for _ in range(r * C):  # the exact-arithmetic bound
            on = on & (_dot(res, res).sqrt() > target)
            if not bool(on.any()):
                break
            q = hess(direc)
            alpha = torch.where(on, rz / torch.where(on, _dot(direc, q), 1.0), 0.0).view(B, 1, 1)
            step, res = step + alpha * direc, res - alpha * q
            pres = dinv * res
            rz_new = _dot(res, pres)
            mom = torch.where(on, rz_new / torch.where(on, rz, 1.0), 0.0).view(B, 1, 1)
            direc, rz = pres + mom * direc, torch.where(on, rz_new, rz)

        # Armijo backtracking on ℓ(β + t δ), c = 1e-4 (the logits move along Φδ), up to ℓ's rounding error
        dz = phi @ step
        bb, bd, dd = _dot(beta, beta), _dot(beta, step), _dot(step, step)
        f0 = _data_term(z, onehot) + 0.5 * l2 * bb
        slope = _dot(g, step)
        slack = 16 * torch.finfo(phi.dtype).eps * (f0 + z.abs().amax(-1).mean(1))
        t = torch.ones(B, dtype=phi.dtype, device=phi.device)
        todo = active
        for _ in range(60):
            ft = _data_term(z + t.view(B, 1, 1) * dz, onehot) + 0.5 * l2 * (bb + 2 * t * bd + t * t * dd)
            todo = todo & ~(ft <= f0 + 1e-4 * t * slope + slack)
            if not bool(todo.any()):
                break
            t = torch.where(todo, t / 2, t)
        floor = (-slope <= 64 * torch.finfo(phi.dtype).eps * f0.abs()) & (gnorm >= last)
        going = active & ~todo & ~floor  # todo: no decrease even at t = 2^-60
        return going, torch.where(going, t, 0.0).view(B, 1, 1) * step, gnorm, active & ~going

    def predict(self, episode: Episode) -> Tensor:
        """log p(c | x_query) under each episode's fitted probe, ``(B, C)``."""
        theta, _ = self.fit(episode)
        q = self._design(episode.x_query.unsqueeze(1))  # (B, 1, d~)
        return torch.log_softmax((q @ theta).squeeze(1), -1)


@dataclass(frozen=True)
class BudgetProbe:
    """The authors' linear probe (Wang et al. 2025, §6.2; their ``linear_imagenet.py``): a fixed optimiser budget.

    Per episode, logits θᵀx with θ ∈ R^{d×C} (no bias), the last class's logit fixed at 0 (C − 1 free
    columns), init N(0, ``init_scale``/d) (their Flax VarianceScaling(0.002), fan-in mode; a plain normal
    here, not truncated), then ``steps`` full-batch AdamW steps on the mean context cross-entropy (lr 1e-3, β = (0.9, 0.98),
    weight decay ``weight_decay``). Not run to convergence: at 500 steps the probe is early-stopped, i.e.
    implicitly regularised, which is the baseline the paper's "GD ≈ linear probing" refers to. The
    converged, explicitly regularised problem is :class:`LinearProbe`.

    All B episodes train at once from the same seeded init (``seed``); Adam is elementwise and the summed
    loss separates over episodes, so each episode's trajectory is its own solo run. Float64 inside.
    """

    num_classes: int
    steps: int = 500
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    init_scale: float = 0.002
    seed: int = 0

    def __post_init__(self) -> None:
        require_int(self, "num_classes", self.num_classes, 2)
        require_int(self, "steps", self.steps, 0)
        require(self, "lr", self.lr > 0, "a float > 0")
        require(self, "weight_decay", self.weight_decay >= 0, "a float >= 0")
        require(self, "init_scale", self.init_scale >= 0, "a float >= 0")

    def fit(self, episode: Episode) -> Tensor:
        """θ (B, d, C) after ``steps`` AdamW steps (last column 0)."""
        labels = _classification(type(self).__name__, episode, self.num_classes)
        x = episode.x.to(torch.float64)
        B, _, d = x.shape
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        std = (self.init_scale / d) ** 0.5
        init = torch.randn(d, self.num_classes - 1, generator=g, dtype=torch.float64) * std  # one init for all
        free = init.to(x.device).expand(B, -1, -1).clone().requires_grad_(True)
        opt = torch.optim.AdamW([free], lr=self.lr, betas=self.betas, weight_decay=self.weight_decay)
        with torch.enable_grad():
            for _ in range(self.steps):
                opt.zero_grad(set_to_none=True)
                logits = torch.nn.functional.pad(x @ free, (0, 1))  # (B, n, C), last logit 0
                ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
                ce.view(B, -1).mean(1).sum().backward()  # per-episode means, summed: separable over episodes
                opt.step()
        return torch.nn.functional.pad(free.detach(), (0, 1))

    def predict(self, episode: Episode) -> Tensor:
        """log p(c | x_query) under each episode's probe, ``(B, C)``, in the episode's dtype."""
        theta = self.fit(episode)
        q = episode.x_query.to(torch.float64).unsqueeze(1)
        return torch.log_softmax((q @ theta).squeeze(1), -1).to(episode.dtype)


@dataclass(frozen=True)
class BayesClassifier:
    """The Bayes-optimal classifier: log p(c | x_query) = log softmax(W_eᵀ f(x_query)), an oracle.

    Reads the episode's task dict (W_e and the context's true f, see
    :func:`iclab.tasks.categorical.log_probabilities`); works for every generator there. Its expected
    accuracy is the Bayes rate E[max_c p(c | x)], the ceiling for every other learner.
    """

    def predict(self, episode: Episode) -> Tensor:
        """Log-probabilities (B, C) of each class at the query under the task's true class densities."""
        return log_probabilities(episode.task, episode.x_query.unsqueeze(1)).squeeze(1)


@dataclass(frozen=True)
class NearestClassMean:
    """Prototype classifier: log-probabilities ∝ −‖x_q − m_c‖² / (2τ), m_c the mean of class c's context inputs.

    Classes absent from the context get probability ``eps``/C via the mixture
    p = (1 − eps)·softmax over present classes + eps·uniform, so the NLL stays finite.
    """

    num_classes: int
    temperature: float = 1.0
    eps: float = 1e-3

    def __post_init__(self) -> None:
        require_int(self, "num_classes", self.num_classes, 2)
        require(self, "temperature", self.temperature > 0, "a float > 0")
        require(self, "eps", 0 < self.eps < 1, "a float in (0, 1)")

    def predict(self, episode: Episode) -> Tensor:
        """Logits (B, C) from the query's distances to the context's class means."""
        labels = _classification("NearestClassMean", episode, self.num_classes)
        onehot = torch.nn.functional.one_hot(labels, self.num_classes).to(episode.x)  # (B, n, C)
        counts = onehot.sum(1)  # (B, C)
        means = onehot.transpose(1, 2) @ episode.x / counts.clamp_min(1).unsqueeze(-1)  # (B, C, d)
        sq = (episode.x_query.unsqueeze(1) - means).square().sum(-1)  # (B, C)
        logits = (-sq / (2 * self.temperature)).masked_fill(counts == 0, -math.inf)
        p = (1 - self.eps) * torch.softmax(logits, -1) + self.eps / self.num_classes
        return p.log()


@dataclass(frozen=True)
class LabelFrequency:
    """The context's label histogram with add-``smoothing`` counts: p(c) ∝ #{i : y_i = c} + smoothing.

    Ignores x entirely: how much accuracy the label marginal alone gives (in the §6.1 data only k = 5
    of the C categories are active per context, so this is far above 1/C).
    """

    num_classes: int
    smoothing: float = 1.0

    def __post_init__(self) -> None:
        require_int(self, "num_classes", self.num_classes, 2)
        require(self, "smoothing", self.smoothing > 0, "a float > 0")

    def predict(self, episode: Episode) -> Tensor:
        """Log-frequencies (B, C) of the labels in the context (the query ignored)."""
        labels = _classification("LabelFrequency", episode, self.num_classes)
        counts = torch.nn.functional.one_hot(labels, self.num_classes).sum(1).to(episode.x) + self.smoothing
        return (counts / counts.sum(-1, keepdim=True)).log()  # (B, C)
