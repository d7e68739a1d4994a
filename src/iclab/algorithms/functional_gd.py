"""Kernel learners: functional gradient descent (squared and categorical loss), kernel ridge, the GP posterior mean.

Cheng, Chen, Sra 2024. Functional GD on L(f) = Σ_i (f(x_i) − y_i)² in the RKHS of κ, from f_0 = 0
(eq. 9 = eq. 21; the step r'_ℓ absorbs the constant of Lemma G.3):

    f_{ℓ+1}(x) = f_ℓ(x) + r'_ℓ Σ_{i≤n} (y_i − f_ℓ(x_i)) h̃_i(x),       h̃_i(x) = κ(T x_i, T' x)      (9)

with T = T' = I in Prop. 3.1, T = T' = Σ^{-1/2} at the Thm 4.5 point (κ̃(u, w) = κ(Σ^{-1/2}u, Σ^{-1/2}w)),
or any B, C: h̃_i(x) = κ(B x_i, C x). ``normalized`` divides h̃_i(x) by Σ_j h̃_j(x) per evaluation
point (eq. 10; exp normalised is softmax), and a non-kernel score (relu, softmax) gives the update
of eq. (17). Every learner here follows the transformer exactly: it carries the label row of the
prompt, Y_ℓ = (y_1 − f_ℓ(x_1), …, y_n − f_ℓ(x_n), −f_ℓ(x_q)), updated as Y_{ℓ+1} = Y_ℓ − r'_ℓ Y_ℓ M h̃
(eq. 3 with V_ℓ = [[0, 0], [0, −r'_ℓ]]; invariant (22)), so the query-slot value is −f_ℓ(x_q) and
:meth:`FunctionalGD.predict` returns +f_L(x_q).

Wang, Convertino, Cheng, Henao, Carin 2025 run the same loop on the softmax cross-entropy of a categorical
model p(y = c | x) = softmax_c(W_eᵀ f(x)) (eq. 1-3): the value y_i becomes the class embedding w_{e,y_i}
and the "expectation" f_ℓ(x_i) becomes E(w_e)|_{f_ℓ(x_i)}, the softmax mean of the embeddings
(:class:`CategoricalFunctionalGD`). Both use :meth:`FunctionalGD._steps`, the one step loop here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require
from iclab.core.kernels import CompositeKernel, Kernel, KernelLike, as_kernel, positive_part, uses_softmax
from iclab.core.numerics import as_vector


def _regression(owner: str, episode: Episode) -> tuple[Tensor, Tensor]:
    if episode.y is None:
        raise ValueError(f"{owner} needs a regression episode (float labels y); got a classification episode")
    return episode.x, episode.y


def _check_map(owner: str, field: str, T: Tensor | None, layers: int | None = None) -> None:
    """T is None, a (d', d) matrix, or (when ``layers`` is given) one matrix per layer, (L, d', d)."""
    if T is None:
        return
    if layers is None:
        ok = isinstance(T, Tensor) and T.dim() == 2
        require(owner, field, ok, "a (d', d) matrix or None", tuple(T.shape) if isinstance(T, Tensor) else T)
        return
    ok = isinstance(T, Tensor) and (T.dim() == 2 or (T.dim() == 3 and T.shape[0] == layers))
    got = tuple(T.shape) if isinstance(T, Tensor) else T
    require(owner, field, ok, f"a (d', d) matrix, one per layer ({layers}, d', d), or None", got)


def _apply(owner: str, field: str, T: Tensor | None, points: Tensor) -> Tensor:
    """(…, m, d) rows mapped by T: rows x ↦ (T x)ᵀ."""
    if T is None:
        return points
    require(
        owner,
        field,
        T.shape[-1] == points.shape[-1],
        f"(d', {points.shape[-1]}) to match the episode's d",
        tuple(T.shape),
    )
    return points @ T.to(points).T


@dataclass(frozen=True)
class FunctionalGD:
    """L steps of functional GD in the RKHS of ``kernel`` (Cheng, Chen, Sra 2024, eq. 9; module docstring).

    ``step_sizes`` (L,) are r'_ℓ. ``kernel``: a name from :data:`iclab.core.kernels.KERNELS`, a
    :class:`~iclab.core.kernels.Kernel` or a :class:`~iclab.core.kernels.CompositeKernel` (Prop. D.1;
    one term per head). ``transform`` T (d', d) maps the points before the kernel (both sides, or the
    sources only when ``target_transform`` is given): h̃_i(x) = κ(T x_i, T' x); an (L, d', d) stack gives
    one map per step (the b_ℓ, c_ℓ of Thm 4.5's points). ``normalized`` is the
    softmax-attention update (10). The Prop. 3.1 construction computes exactly this.
    """

    kernel: KernelLike = "exp"
    step_sizes: Tensor | None = None  # (L,) r'_ℓ
    sigma: float = 1.0  # bandwidth when ``kernel`` is a name
    normalized: bool = False
    transform: Tensor | None = None  # (d', d) or (L, d', d) T: sources (and targets unless target_transform)
    target_transform: Tensor | None = None  # (d', d) or (L, d', d) T' for the targets; None: T

    def __post_init__(self) -> None:
        name = type(self).__name__
        require(self, "step_sizes", self.step_sizes is not None, "a (L,) tensor of step sizes r'_ℓ", None)
        object.__setattr__(self, "step_sizes", as_vector(name, "step_sizes", self.step_sizes))  # type: ignore[arg-type]  # not None: required above
        object.__setattr__(self, "_kernel", as_kernel(name, self.kernel, self.sigma))
        require(self, "normalized", isinstance(self.normalized, bool), "a bool")
        L = len(self.step_sizes)  # type: ignore[arg-type]  # a (L,) Tensor from here on
        _check_map(name, "transform", self.transform, L)
        _check_map(name, "target_transform", self.target_transform, L)

    @property
    def kernel_fn(self) -> Kernel | CompositeKernel:
        """The kernel the functional-GD steps use."""
        return self._kernel  # type: ignore[attr-defined]  # set by __post_init__ (frozen: object.__setattr__)

    @property
    def per_layer(self) -> bool:
        """Whether the maps (hence the scores) change from layer to layer."""
        return any(T is not None and T.dim() == 3 for T in (self.transform, self.target_transform))

    def scores(self, sources: Tensor, targets: Tensor, layer: int = 0) -> Tensor:
        """h̃ (B, n, m) of step ``layer``: weight of source i in the update at target j (normalised per target
        if asked)."""
        name = type(self).__name__

        def pick(T: Tensor | None) -> Tensor | None:
            return T[layer] if T is not None and T.dim() == 3 else T

        T_s = pick(self.transform)
        T_t = T_s if self.target_transform is None else pick(self.target_transform)
        src = _apply(name, "transform", T_s, sources)
        tgt = _apply(name, "target_transform" if self.target_transform is not None else "transform", T_t, targets)
        h = self.kernel_fn(src, tgt)  # (B, n, m)
        return h / h.sum(dim=-2, keepdim=True) if self.normalized else h

    def _steps(
        self,
        sources: Tensor,
        targets: Tensor,
        values: Tensor,
        expectation: Callable[[Tensor], Tensor] | None = None,
        rates: Tensor | None = None,
    ) -> Tensor:
        """f_0 … f_L at ``targets``, (L+1, B, T, k): the one functional-GD loop of this module.

        f_0 = 0 and f_{ℓ+1}(t_j) = f_ℓ(t_j) + r_ℓ Σ_{i≤n} [v_i − E(f_ℓ(x_i))] h̃_ℓ(x_i, t_j), with
        ``values`` v_i (B, n, k) and the first n ``targets`` the sources themselves (so f_ℓ(x_i) is
        read off the state). ``expectation`` E: None is the identity (squared loss, Cheng et al. eq. 9);
        the softmax mean over class embeddings gives the categorical update (Wang et al. 2025, eq. 3).
        ``rates`` (L,) or (L, k) replaces ``step_sizes`` (a per-coordinate step: a diagonal
        preconditioner).
        """
        n = sources.shape[1]
        steps = (self.step_sizes if rates is None else rates).to(sources)  # type: ignore[union-attr]  # a Tensor
        h = self.scores(sources, targets)  # (B, n, T)
        F = values.new_zeros(values.shape[0], targets.shape[1], values.shape[-1])  # (B, T, k) f_0 = 0
        states = [F]
        for ell, r in enumerate(steps):
            if ell > 0 and self.per_layer:
                h = self.scores(sources, targets, ell)
            fx = F[:, :n]
            resid = values - (fx if expectation is None else expectation(fx))  # (B, n, k)
            F = F + r * torch.einsum("bik,bij->bjk", resid, h)
            states.append(F)
        return torch.stack(states)

    def _label_rows(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """Y_0 … Y_L, (L+1, B, n+1+m): the label row over context, query and optional extra points."""
        x, y = _regression(type(self).__name__, episode)
        pts = [x, episode.x_query.unsqueeze(1)] + ([points.to(x)] if points is not None else [])
        targets = torch.cat(pts, dim=1)  # (B, n+1+m, d)
        F = self._steps(x, targets, y.unsqueeze(-1))[..., 0]  # (L+1, B, n+1+m) f_ℓ at every token
        row0 = torch.cat([y, torch.zeros_like(targets[..., 0])[:, episode.n :]], dim=1)  # Y_0 = (y, 0)
        return row0 - F  # Y_ℓ = (y_i − f_ℓ(x_i), −f_ℓ(x_q), …): invariant (22)

    def trajectory(self, episode: Episode) -> Tensor:
        """f_0(x_q) … f_L(x_q), (L+1, B)."""
        return -self._label_rows(episode)[:, :, episode.n]

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the functional-GD steps (B, C logits for the categorical loss)."""
        return self.trajectory(episode)[-1]

    def residuals(self, episode: Episode) -> Tensor:
        """The context label rows y_i − f_ℓ(x_i), (L+1, B, n) (Cheng et al. eq. 22)."""
        return self._label_rows(episode)[:, :, : episode.n]

    def values(self, episode: Episode, points: Tensor) -> Tensor:
        """f_0 … f_L at extra points (B, m, d), each evaluated as a query would be: (L+1, B, m)."""
        require(
            type(self).__name__,
            "points",
            points.dim() == 3 and points.shape[0] == episode.batch_size and points.shape[2] == episode.d,
            f"a ({episode.batch_size}, m, {episode.d}) tensor",
            tuple(points.shape),
        )
        return -self._label_rows(episode, points)[:, :, episode.n + 1 :]


def softmax_expectation(f: Tensor, embeddings: Tensor) -> Tensor:
    """E(w_e)|_f = Σ_c w_{e,c} softmax_c(W_eᵀ f): (…, d') latents, (d', C) embeddings -> (…, d').

    Wang et al. 2025, eq. (6) / App. B; the softmax is the stable one (max-subtracted), so any ‖f‖ is
    fine. E(w_e)|_{f=0} = w̄_e, the mean column.
    """
    return torch.softmax(f @ embeddings, dim=-1) @ embeddings.T


def _classification_labels(owner: str, episode: Episode, num_classes: int) -> Tensor:
    if episode.labels is None:
        raise ValueError(f"{owner} needs a classification episode (integer labels); got a regression episode")
    labels = episode.labels
    if labels.numel():
        lo, hi = int(labels.min()), int(labels.max())
        require(owner, "labels", lo >= 0 and hi < num_classes, f"in [0, C = {num_classes})", f"values in [{lo}, {hi}]")
    return labels


@dataclass(frozen=True)
class CategoricalFunctionalGD(FunctionalGD):
    """Functional GD on the softmax cross-entropy of the context (Wang et al. 2025, eq. (2)-(3), App. B).

    Observation model (1): p(y = c | x) = softmax_c(W_eᵀ f(x)), W_e = [w_{e,1} … w_{e,C}] ∈ R^{d'×C}.
    From f_0 ≡ 0, with α_ℓ = ``step_sizes[ℓ]`` (times ``preconditioner``, a per-coordinate step):

        f_{ℓ+1}(x_j) = f_ℓ(x_j) + (α_ℓ/N) Σ_{i≤N} [w_{e,y_i} − E(w_e)|_{f_ℓ(x_i)}] κ(x_i, x_j)       (3)

    E(w_e)|_f = Σ_c w_{e,c} softmax_c(W_eᵀf) (:func:`softmax_expectation`). Kernel handling (names, σ,
    :class:`~iclab.core.kernels.Kernel` / ``CompositeKernel``, ``transform`` T for κ(T·, T'·), per-step
    maps, ``normalized``) and the step loop are :class:`FunctionalGD`'s; this class only changes the
    values (w_{e,y_i} instead of y_i) and the expectation. Options:

    * ``embeddings`` (d', C): W_e; None reads ``episode.task['W_e']`` (the generators of
      :mod:`iclab.tasks.categorical` store it).
    * ``divide_by_n``: the paper's α/N (True) or Cheng et al.'s bare r_ℓ (False).
    * ``bias``: f = Aψ + b; GD on (A, b) replaces κ by κ + 1 (App. B eq. 13).
    * ``loss='squared'``: E(w_e)|_f → f, the Gaussian model of App. G eq. (46)-(48) with targets
      w_{e,y_i}; with d' = 1 and ``divide_by_n=False`` this is exactly :class:`FunctionalGD` on y_i =
      W_e[0, y_i] (Wang et al. 2025, §2.3).

    ``predict`` returns the (B, C) logits W_eᵀ f_L(x_q).
    """

    embeddings: Tensor | None = None  # (d', C) W_e; None: episode.task["W_e"]
    preconditioner: Tensor | None = None  # (d',) or (L, d') per-coordinate factor on α_ℓ
    divide_by_n: bool = True  # α/N of eq. (3)
    bias: bool = False  # κ + 1 (eq. 13)
    loss: Literal["cross_entropy", "squared"] = "cross_entropy"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embeddings is not None:
            W = self.embeddings
            ok = isinstance(W, Tensor) and W.dim() == 2 and W.is_floating_point()
            require(self, "embeddings", ok, "a float (d', C) matrix W_e or None", getattr(W, "shape", W))
            require(self, "embeddings", W.shape[1] >= 2, "a (d', C) matrix with C >= 2 classes", f"C = {W.shape[1]}")
        if self.preconditioner is not None:
            P, L = self.preconditioner, len(self.step_sizes)  # type: ignore[arg-type]  # a Tensor by now
            ok = isinstance(P, Tensor) and (P.dim() == 1 or (P.dim() == 2 and P.shape[0] == L))
            require(self, "preconditioner", ok, f"a (d',) or ({L}, d') tensor or None", getattr(P, "shape", P))
        require(self, "divide_by_n", isinstance(self.divide_by_n, bool), "a bool")
        require(self, "bias", isinstance(self.bias, bool), "a bool")
        require(self, "loss", self.loss in ("cross_entropy", "squared"), "'cross_entropy' or 'squared'")

    def embedding(self, episode: Episode) -> Tensor:
        """W_e (d', C) in the episode's dtype: ``embeddings`` or ``episode.task['W_e']``."""
        W = self.embeddings if self.embeddings is not None else episode.task.get("W_e")
        if W is None:
            raise ValueError(
                "CategoricalFunctionalGD needs class embeddings: pass embeddings=W_e (d', C) or an episode whose task has 'W_e'"
            )
        require(self, "embeddings", W.dim() == 2 and W.shape[1] >= 2, "a (d', C) matrix with C >= 2", tuple(W.shape))
        return W.to(episode.x)

    def scores(self, sources: Tensor, targets: Tensor, layer: int = 0) -> Tensor:
        """h̃ of :class:`FunctionalGD`, plus 1 with ``bias`` (eq. 13)."""
        h = super().scores(sources, targets, layer)
        return h + 1 if self.bias else h

    def latents(self, episode: Episode, points: Tensor | None = None) -> Tensor:
        """f_0 … f_L at the context, the query and optional extra ``points`` (B, m, d): (L+1, B, n+1+m, d')."""
        name = type(self).__name__
        if episode.labels is None:
            raise ValueError(f"{name} needs a classification episode (integer labels); got a regression episode")
        W = self.embedding(episode)
        labels = _classification_labels(name, episode, W.shape[1])
        x = episode.x
        pts = [x, episode.x_query.unsqueeze(1)]
        if points is not None:
            require(
                name,
                "points",
                points.dim() == 3 and points.shape[0] == episode.batch_size and points.shape[2] == episode.d,
                f"a ({episode.batch_size}, m, {episode.d}) tensor",
                tuple(points.shape),
            )
            pts.append(points.to(x))
        targets = torch.cat(pts, dim=1)  # (B, n+1+m, d)
        values = W.T[labels]  # (B, n, d') w_{e,y_i}
        rates = self.step_sizes.to(x)  # type: ignore[union-attr]  # a (L,) Tensor after __post_init__
        if self.divide_by_n:
            rates = rates / episode.n
        rates = rates.unsqueeze(-1)  # (L, 1)
        if self.preconditioner is not None:
            rates = rates * self.preconditioner.to(x)  # (L, d')
        expectation = None if self.loss == "squared" else (lambda f: softmax_expectation(f, W))
        return self._steps(x, targets, values, expectation, rates)

    def trajectory(self, episode: Episode) -> Tensor:
        """f_0(x_q) … f_L(x_q), (L+1, B, d')."""
        return self.latents(episode)[:, :, episode.n]

    def predict(self, episode: Episode) -> Tensor:
        """Logits W_eᵀ f_L(x_q), (B, C): p(y_q = c) = softmax of them (eq. 1)."""
        return self.trajectory(episode)[-1] @ self.embedding(episode)

    def residuals(self, episode: Episode) -> Tensor:
        """w_{e,y_i} − E(w_e)|_{f_ℓ(x_i)} at the context after 0 … L steps, (L+1, B, n, d')."""
        W = self.embedding(episode)
        F = self.latents(episode)[:, :, : episode.n]
        E = F if self.loss == "squared" else softmax_expectation(F, W)
        return W.T[episode.labels] - E

    def values(self, episode: Episode, points: Tensor) -> Tensor:
        """f_0 … f_L at extra points (B, m, d), each evaluated as a query would be: (L+1, B, m, d')."""
        return self.latents(episode, points)[:, :, episode.n + 1 :]

    def logits_at(self, episode: Episode, points: Tensor) -> Tensor:
        """Logits W_eᵀ f_L at many query points (B, m, d) in one pass: (B, m, C) (App. F, Fig. 7)."""
        return self.values(episode, points)[-1] @ self.embedding(episode)


@dataclass(frozen=True)
class FunctionalGDPlusPlus:
    """Functional GD that also moves the covariates: the algorithm at Thm 4.6's points (eq. 58).

    With A_ℓ = a_ℓ I, B_ℓ = b_ℓ Σ^{-1/2}, C_ℓ = c_ℓ Σ^{-1/2} the eq.-(20) transformer computes, for all
    n + 1 tokens at once (M: the query is never a source),

        X_{ℓ+1} = X_ℓ + a_ℓ X_ℓ M h̃_ℓ,   Y_{ℓ+1} = Y_ℓ − r'_ℓ Y_ℓ M h̃_ℓ,   h̃_ℓ = h̃(T X_ℓ, T' X_ℓ)

    (the paper's V has r_ℓ = −r'_ℓ), prediction −[Y_L]_{n+1}. ``covariate_steps`` a_ℓ ≡ 0 is
    :class:`FunctionalGD`; with the linear kernel it is GD++ (:class:`iclab.algorithms.GDPlusPlus` with
    η_ℓ = n r'_ℓ, γ_ℓ = −n a_ℓ, Γ = TᵀT). T = √(b c) Σ^{-1/2} for exp/softmax scores (b c > 0).
    """

    kernel: KernelLike = "exp"
    step_sizes: Tensor | None = None  # (L,) r'_ℓ
    covariate_steps: Tensor | None = None  # (L,) a_ℓ
    sigma: float = 1.0
    normalized: bool = False
    transform: Tensor | None = None
    target_transform: Tensor | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        require(self, "step_sizes", self.step_sizes is not None, "a (L,) tensor of step sizes r'_ℓ", None)
        require(self, "covariate_steps", self.covariate_steps is not None, "a (L,) tensor of covariate steps a_ℓ", None)
        steps = as_vector(name, "step_sizes", self.step_sizes)  # type: ignore[arg-type]  # not None: required above
        cov = as_vector(name, "covariate_steps", self.covariate_steps)  # type: ignore[arg-type]  # not None: required
        require(
            self,
            "covariate_steps",
            cov.shape == steps.shape,
            f"shape {tuple(steps.shape)} like step_sizes",
            tuple(cov.shape),
        )
        object.__setattr__(self, "step_sizes", steps)
        object.__setattr__(self, "covariate_steps", cov)
        fgd = FunctionalGD(
            self.kernel,
            steps,
            sigma=self.sigma,
            normalized=self.normalized,
            transform=self.transform,
            target_transform=self.target_transform,
        )
        object.__setattr__(self, "_fgd", fgd)

    def trajectory(self, episode: Episode) -> Tensor:
        """Predictions after 0 … L steps, (L+1, B)."""
        x, y = _regression(type(self).__name__, episode)
        n = episode.n
        feats = torch.cat([x, episode.x_query.unsqueeze(1)], dim=1)  # (B, n+1, d) X_0
        row = torch.cat([y, torch.zeros_like(y[:, :1])], dim=1)  # (B, n+1) Y_0
        preds = [-row[:, n]]
        fgd: FunctionalGD = self._fgd  # type: ignore[attr-defined]  # set by __post_init__
        steps = zip(self.step_sizes.to(x), self.covariate_steps.to(x), strict=True)  # type: ignore[union-attr]  # Tensors after __post_init__
        for ell, (r, a) in enumerate(steps):
            h = fgd.scores(feats[:, :n], feats, ell)  # (B, n, n+1) from X_ℓ
            row = row - r * torch.einsum("bi,bij->bj", row[:, :n], h)
            feats = feats + a * h.transpose(1, 2) @ feats[:, :n]  # X ← X + a X M h̃
            preds.append(-row[:, n])
        return torch.stack(preds)

    def predict(self, episode: Episode) -> Tensor:
        """The query prediction (B,) after the FGD++ steps."""
        return self.trajectory(episode)[-1]


def _psd_kernel(owner: object, kernel: KernelLike, sigma: float) -> Kernel | CompositeKernel:
    kern = as_kernel(type(owner).__name__, kernel, sigma)
    require(
        owner,
        "kernel",
        kern.is_psd and not uses_softmax(kern),
        "a PSD kernel (linear, exp, rbf, laplacian, arccos, or a non-negative sum of them)",
        kernel,
    )
    return kern


@dataclass(frozen=True)
class KernelRidge:
    """Kernel ridge regression f = argmin (1/n) Σ (f(x_i) − y_i)² + λ ‖f‖²_H: f(x) = k(x)ᵀ(K̂ + nλI)⁻¹ y.

    λ is per example, as in :class:`iclab.algorithms.Ridge` (the linear kernel gives exactly Ridge).
    ``transform`` T maps the points first (κ(T u, T w)). It is the λ → 0 limit of FGD's iterates in
    the span of the data; FGD with L steps is the spectral filter 1 − (1 − r'λ_i)^L instead.
    """

    kernel: KernelLike = "exp"
    lam: float = 1e-3
    sigma: float = 1.0
    transform: Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_kernel", _psd_kernel(self, self.kernel, self.sigma))
        require(self, "lam", float(self.lam) > 0, "a float > 0 (use GaussianProcessPosterior for λ = 0)")
        _check_map(type(self).__name__, "transform", self.transform)

    def predict(self, episode: Episode) -> Tensor:
        """The kernel ridge regression prediction (B,) at the query."""
        x, y = _regression(type(self).__name__, episode)
        n = episode.n
        pts = _apply("KernelRidge", "transform", self.transform, torch.cat([x, episode.x_query.unsqueeze(1)], dim=1))
        K = self._kernel(pts[:, :n], pts)  # type: ignore[attr-defined]  # set by __post_init__; (B, n, n+1)
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        alpha = torch.linalg.solve(K[:, :, :n] + n * float(self.lam) * eye, y.unsqueeze(-1))  # (B, n, 1)
        return (K[:, :, n].unsqueeze(1) @ alpha).reshape(-1)


@dataclass(frozen=True)
class GaussianProcessPosterior:
    """The Bayes predictor of a K-GP task: E[y_q | context] = νᵀ K̂⁻¹ Ŷ (Cheng, Chen, Sra 2024, eq. 13).

    K₊ is formed on all n + 1 points (context and query) and then partitioned as [[K̂, ν], [νᵀ, μ]]
    (for relu, K₊ of a subset is not the subset of K₊). Two modes:

    * oracle (``kernel=None``): reads the exact label covariance ``task['K_plus'] (B, N+1, N+1)`` that
      :class:`iclab.tasks.GaussianProcess` stores (query last); an episode cut to n ≤ N pairs by
      :meth:`Episode.with_context` uses the rows of its first n pairs and the query;
    * prior: K₊ = positive_part(κ(T x_i, T x_j)) with the given kernel and map T (pass
      ``task['Sigma_inv_sqrt']`` for the whitened kernel of Ex. 7).

    K̂⁻¹ is the pseudo-inverse (eigh, relative cutoff ``rcond``; K̂ has rank ≤ d for the linear kernel),
    or a solve with K̂ + jitter·I when ``jitter`` > 0 (the authors' code uses 1e-4).
    """

    kernel: KernelLike | None = None
    sigma: float = 1.0
    transform: Tensor | None = None
    jitter: float = 0.0
    rcond: float | None = None  # pinv cutoff relative to λ_max(K̂); None: n · eps(dtype)

    def __post_init__(self) -> None:
        if self.kernel is not None:
            kern = as_kernel(type(self).__name__, self.kernel, self.sigma)
            require(self, "kernel", not uses_softmax(kern), "a kernel or None (softmax is not a kernel)")
            object.__setattr__(self, "_kernel", kern)
        require(self, "jitter", float(self.jitter) >= 0, "a float >= 0")
        require(self, "rcond", self.rcond is None or float(self.rcond) >= 0, "a float >= 0 or None")
        _check_map(type(self).__name__, "transform", self.transform)

    def covariance(self, episode: Episode) -> Tensor:
        """K₊ on (x_1, …, x_n, x_q), (B, n+1, n+1)."""
        x, _ = _regression(type(self).__name__, episode)
        n = episode.n
        if self.kernel is None:
            K = episode.task.get("K_plus")
            if K is None:
                raise ValueError(
                    "GaussianProcessPosterior(kernel=None) is an oracle and needs an episode whose task has 'K_plus' (tasks.GaussianProcess); pass a kernel for the prior mode"
                )
            N = K.shape[-1] - 1
            require(
                "GaussianProcessPosterior",
                "task['K_plus']",
                n <= N and K.shape[0] == episode.batch_size,
                f"shape ({episode.batch_size}, N+1, N+1) with N >= n = {n}",
                tuple(K.shape),
            )
            if n != N:
                idx = torch.cat([torch.arange(n, device=K.device), torch.tensor([N], device=K.device)])
                K = K[:, idx][:, :, idx]
            return K.to(x)
        pts = _apply(
            "GaussianProcessPosterior", "transform", self.transform, torch.cat([x, episode.x_query.unsqueeze(1)], dim=1)
        )
        return positive_part(self._kernel(pts, pts))  # type: ignore[attr-defined]  # set by __post_init__

    def _blocks(self, episode: Episode) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """K̂⁻¹ (pinv or jittered inverse applied later), ν, μ and K̂: the eq.-(13) partition."""
        K = self.covariance(episode)
        n = episode.n
        return K[:, :n, :n], K[:, :n, n], K[:, n, n], K

    def _solve(self, Khat: Tensor, rhs: Tensor) -> Tensor:
        """K̂⁻¹ rhs for rhs (B, n, k)."""
        if self.jitter > 0:
            eye = torch.eye(Khat.shape[-1], dtype=Khat.dtype, device=Khat.device)
            return torch.linalg.solve(Khat + self.jitter * eye, rhs)
        evals, evecs = torch.linalg.eigh((Khat + Khat.transpose(-1, -2)) / 2)
        rcond = self.rcond if self.rcond is not None else Khat.shape[-1] * torch.finfo(Khat.dtype).eps
        cut = rcond * evals.abs().amax(dim=-1, keepdim=True)
        inv = torch.where(evals.abs() > cut, 1 / evals, torch.zeros_like(evals))
        return evecs @ (inv.unsqueeze(-1) * (evecs.transpose(-1, -2) @ rhs))

    def predict(self, episode: Episode) -> Tensor:
        """The GP posterior mean (B,) at the query."""
        _, y = _regression(type(self).__name__, episode)
        Khat, nu, _, _ = self._blocks(episode)
        return (nu.unsqueeze(1) @ self._solve(Khat, y.unsqueeze(-1))).reshape(-1)

    def posterior_variance(self, episode: Episode) -> Tensor:
        """Var[y_q | context] = μ − νᵀK̂⁻¹ν, (B,): the Bayes risk of the prompt (Cheng et al. 2024, eq. 13)."""
        _regression(type(self).__name__, episode)
        Khat, nu, mu, _ = self._blocks(episode)
        return mu - (nu.unsqueeze(1) @ self._solve(Khat, nu.unsqueeze(-1))).reshape(-1)
