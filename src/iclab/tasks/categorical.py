"""In-context classification with a shared class-embedding matrix (Wang, Convertino, Cheng, Henao, Carin 2025).

Observation model, eq. (1): p(y = c | x) = softmax_c(W_eᵀ f(x)), with W_e = [w_{e,1} … w_{e,C}] ∈ R^{d'×C}
drawn once (entries iid N(0, 1)) and shared by every context, and a latent f: R^d → R^{d'} that changes
from context to context. Two generators:

* :class:`RBFMixtureCategorical` (§6.1, App. E eq. (45)): per context pick k = 5 categories c_1..c_k
  without replacement and k anchors μ_j ~ N(0, I_d), and set

      f(x) = λ Σ_j w_{e,c_j} exp(−‖x − μ_j‖² / σ_j²),   σ_j² = −min_{j'≠j} ‖μ_j − μ_{j'}‖² / ln(0.1),

  so that bump j has decayed to 0.1 at the nearest other anchor. x ~ U[−1, 1]^d. Defaults d = 10,
  C = 25, d' = 5, λ = 10 (the authors' torch code; λ = 10 is the value at which the
  paper's GD accuracy ≈ 0.72 (§6.1) is reachable: at λ = 5 the Bayes rate is 0.58-0.63; docs/errata.md).
* :class:`QuadrantCategorical` (App. F): d = 2, C = 20, d' = 5; per context the 4 quadrants of
  [−1, 1]² get 4 distinct categories and f(x) = w_{e,c_q(x)} (piecewise constant).

Episodes carry integer ``labels (B, n)`` and ``label_query (B,)`` in [0, C). The ``task`` dict holds
what the Bayes-optimal classifier needs: ``W_e (d', C)`` (shared), the per-context parameters
(``categories``, ``anchors``, ``sigma2``, or ``quadrant_categories``; listed in ``Episode.batched``),
``scale ()`` and ``p_query (B, C)``, the true class probabilities at the query.
:func:`log_probabilities` evaluates log p(c | x) of a task dict at any points, so the oracle, the
Bayes rate and probability maps over a query grid (App. F, Fig. 7) share one formula.

Training sets: the paper draws L contexts once and makes passes over them (Wang et al. 2025, §6.1). Either pass
``train_size=L`` to :class:`iclab.training.TrainConfig`, or wrap a drawn set in :class:`FixedEpisodes`,
a :class:`~iclab.tasks.base.Task` that serves minibatches from it.

What differs from the authors' code (docs/errata.md): every draw, the labels included, goes through the
caller's generator (their ``HighDimCategorical`` draws context labels from the global RNG); contexts
are drawn in one batched call, not a Python loop; quadrants are numbered 0..3 counter-clockwise from
the top-right (the paper's 1..4; the JAX code uses another order, which changes nothing because the
categories are assigned at random).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, is_int, require, require_int
from iclab.tasks.linear_regression import check_batch_n

_PER_CONTEXT = ("categories", "anchors", "sigma2", "quadrant_categories", "p_query")


def random_embedding(d_embed: int, num_classes: int, *, generator: torch.Generator) -> Tensor:
    """W_e ∈ R^{d'×C} with iid N(0, 1) entries, float64 on CPU (Wang et al. 2025, §6.1: drawn once)."""
    require_int("random_embedding", "d_embed", d_embed, 1)
    require_int("random_embedding", "num_classes", num_classes, 2)
    w = torch.randn(d_embed, num_classes, generator=generator, device=generator.device, dtype=torch.float64)
    return w.cpu()


def check_labels(owner: str, field: str, labels: Tensor, num_classes: int) -> None:
    """Raise ``ConfigError`` unless ``labels`` is an integer tensor with values in [0, num_classes)."""
    require(owner, field, not labels.dtype.is_floating_point, "an integer tensor", labels.dtype)
    if labels.numel():
        lo, hi = int(labels.min()), int(labels.max())
        require(owner, field, lo >= 0 and hi < num_classes, f"in [0, {num_classes})", f"values in [{lo}, {hi}]")


def quadrant(points: Tensor) -> Tensor:
    """Quadrant index of 2-D points, counter-clockwise from the top-right: (+,+)→0, (−,+)→1, (−,−)→2, (+,−)→3.

    A coordinate equal to 0 counts as non-negative. ``points (..., 2)`` → ``(...,)`` int64.
    """
    right = points[..., 0] >= 0
    top = points[..., 1] >= 0
    return torch.where(top, torch.where(right, 0, 1), torch.where(right, 3, 2)).long()


def latent(task: dict[str, Tensor], points: Tensor) -> Tensor:
    """f(x) of each context at ``points (B, m, d)`` → ``(B, m, d')``, for a task dict of either generator.

    RBF mixture (eq. (45)): λ Σ_j w_{e,c_j} exp(−‖x − μ_j‖²/σ_j²). Quadrants (App. F): λ w_{e,c_q(x)}.
    """
    W = task["W_e"].to(points)  # (d', C)
    scale = task["scale"].to(points)
    if "anchors" in task:
        mu = task["anchors"].to(points)  # (B, k, d)
        sq = (points.unsqueeze(2) - mu.unsqueeze(1)).square().sum(-1)  # (B, m, k)
        rbf = torch.exp(-sq / task["sigma2"].to(points).unsqueeze(1))  # (B, m, k)
        return scale * rbf @ W.T[task["categories"]]  # (B, m, k) @ (B, k, d') -> (B, m, d')
    if "quadrant_categories" in task:
        cats = task["quadrant_categories"].gather(1, quadrant(points))  # (B, m)
        return scale * W.T[cats]  # (B, m, d')
    raise ShapeError(
        f"latent: task must hold 'anchors' (RBF mixture) or 'quadrant_categories' (quadrants); got keys {sorted(task)}"
    )


def log_probabilities(task: dict[str, Tensor], points: Tensor) -> Tensor:
    """log p(c | x) = log softmax_c(W_eᵀ f(x)) (eq. (1)) at ``points (B, m, d)`` → ``(B, m, C)``."""
    return torch.log_softmax(latent(task, points) @ task["W_e"].to(points), dim=-1)


def _sample_labels(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw of y ~ Categorical(p) per row of ``probs (..., C)`` → ``(...)`` int64."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


@dataclass(frozen=True)
class MonteCarlo:
    """A Monte-Carlo estimate: ``mean`` ± ``stderr`` (standard error of the mean over ``samples`` iid draws)."""

    mean: float
    stderr: float
    samples: int


@dataclass(frozen=True, kw_only=True)
class _EmbeddingCategorical:
    """Shared part of the two generators: W_e, x ~ U[−r, r]^d, labels from eq. (1)."""

    W_e: Tensor  # (d', C), shared by every context
    d: int
    scale: float
    input_range: float = 1.0

    def __post_init__(self) -> None:
        W = torch.as_tensor(self.W_e)
        require(self, "W_e", W.dim() == 2 and W.is_floating_point(), "a float (d', C) matrix", tuple(W.shape))
        require(self, "W_e", W.shape[1] >= 2, "a (d', C) matrix with C >= 2 classes", f"C = {W.shape[1]}")
        require(self, "W_e", bool(torch.isfinite(W).all()), "finite", "non-finite entries")
        object.__setattr__(self, "W_e", W.detach().to("cpu", torch.float64))
        require_int(self, "d", self.d, 1)
        require(self, "scale", math.isfinite(self.scale), "a finite float")
        require(self, "input_range", self.input_range > 0, "a float > 0")

    @property
    def num_classes(self) -> int:
        """C, the number of categories."""
        return self.W_e.shape[1]

    @property
    def d_embed(self) -> int:
        """d', the embedding dimension."""
        return self.W_e.shape[0]

    def contexts(
        self, batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
    ) -> dict[str, Tensor]:
        """The task dict of ``batch`` fresh contexts (no covariates or labels): what :func:`latent` reads."""
        raise NotImplementedError

    def _covariates(self, batch: int, m: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        u = torch.rand(batch, m, self.d, generator=generator, device=generator.device, dtype=dtype)
        return (2 * u - 1) * self.input_range  # (B, m, d)  U[−r, r]^d

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        """``batch`` contexts of ``n`` pairs (x_i, y_i) plus a query, on ``generator.device``.

        Draw order (fixed, so a seed fixes everything): context parameters, covariates (B, n+1, d),
        labels of all n+1 points. ``task['p_query']`` holds p(· | x_query).
        """
        check_batch_n(type(self).__name__, batch, n)
        task = self.contexts(batch, generator=generator, dtype=dtype)
        x = self._covariates(batch, n + 1, generator, dtype)  # (B, n+1, d)
        logp = log_probabilities(task, x)  # (B, n+1, C)
        labels = _sample_labels(logp.exp(), generator)  # (B, n+1)
        task["p_query"] = logp[:, n].exp()  # (B, C)
        batched = tuple(k for k in _PER_CONTEXT if k in task)
        return Episode(
            x=x[:, :n], x_query=x[:, n], labels=labels[:, :n], label_query=labels[:, n], task=task, batched=batched
        )

    def bayes_rate(
        self,
        *,
        generator: torch.Generator,
        contexts: int = 4096,
        points: int = 64,
        chunk: int = 1024,
        dtype: torch.dtype = torch.float64,
    ) -> MonteCarlo:
        """E[max_c p(c | x)]: the accuracy of the Bayes-optimal classifier for this W_e (top-1 upper bound).

        Expectation over fresh contexts and x ~ U[−r, r]^d ("mean max probability", App. F). Each of
        ``contexts`` contexts is averaged over ``points`` query points; the standard error is taken over
        contexts, which are iid.
        """
        require_int(self, "contexts", contexts, 2)
        require_int(self, "points", points, 1)
        per_context = []
        for start in range(0, contexts, chunk):
            b = min(chunk, contexts - start)
            task = self.contexts(b, generator=generator, dtype=dtype)
            x = self._covariates(b, points, generator, dtype)
            per_context.append(log_probabilities(task, x).exp().amax(-1).mean(-1))  # (b,)
        v = torch.cat(per_context)
        return MonteCarlo(float(v.mean()), float(v.std() / math.sqrt(v.numel())), v.numel())


@dataclass(frozen=True, kw_only=True)
class RBFMixtureCategorical(_EmbeddingCategorical):
    """The §6.1 generator: f = λ Σ_{j≤k} w_{e,c_j} exp(−‖x − μ_j‖²/σ_j²) per context (App. E, eq. (45)).

    Per context: c_1..c_k uniform without replacement from the C categories, μ_j ~ N(0, I_d), and σ_j² =
    −min_{j'≠j}‖μ_j − μ_{j'}‖² / ln(dist) so that bump j equals ``dist`` at its nearest other anchor.
    x ~ U[−r, r]^d, y ~ softmax(W_eᵀ f(x)). Build one with :meth:`draw` (draws W_e) or pass ``W_e``.

    >>> task = RBFMixtureCategorical.draw(generator=iclab.generator(0))      # d=10, C=25, d'=5, λ=10
    >>> ep = task.sample(64, 125, generator=iclab.generator(1))             # labels (64, 125) int64
    """

    d: int = 10
    scale: float = 10.0  # λ of eq. (45)
    n_anchors: int = 5
    dist: float = 0.1  # value of each bump at the nearest other anchor

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self,
            "n_anchors",
            is_int(self.n_anchors, 2) and self.n_anchors <= self.num_classes,
            f"an int in [2, C = {self.num_classes}] (distinct categories; σ_j needs a nearest other anchor)",
        )
        require(self, "dist", 0 < self.dist < 1, "a float in (0, 1)")

    @classmethod
    def draw(
        cls, *, generator: torch.Generator, d: int = 10, num_classes: int = 25, d_embed: int = 5, **kwargs: Any
    ) -> RBFMixtureCategorical:
        """A generator with a fresh W_e ~ N(0, 1)^{d'×C} from ``generator`` (paper defaults)."""
        return cls(W_e=random_embedding(d_embed, num_classes, generator=generator), d=d, **kwargs)

    def contexts(
        self, batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
    ) -> dict[str, Tensor]:
        dev, k, C = generator.device, self.n_anchors, self.num_classes
        keys = torch.rand(batch, C, generator=generator, device=dev, dtype=torch.float64)
        cats = keys.argsort(dim=1)[:, :k]  # (B, k)  uniform without replacement
        mu = torch.randn(batch, k, self.d, generator=generator, device=dev, dtype=dtype)  # (B, k, d)
        sq = (mu.unsqueeze(2) - mu.unsqueeze(1)).square().sum(-1)  # (B, k, k)
        sq = sq + torch.diag(torch.full((k,), math.inf, device=dev, dtype=dtype))
        sigma2 = sq.amin(-1) / -math.log(self.dist)  # (B, k)
        return {
            "W_e": self.W_e.to(dev, dtype),
            "scale": torch.tensor(self.scale, device=dev, dtype=dtype),
            "categories": cats,
            "anchors": mu,
            "sigma2": sigma2,
        }


@dataclass(frozen=True, kw_only=True)
class QuadrantCategorical(_EmbeddingCategorical):
    """The App. F generator: f(x) = λ w_{e,c_q(x)}, one random category per quadrant of [−r, r]² (λ = 1).

    Per context the 4 quadrants (numbered by :func:`quadrant`) get 4 distinct categories uniformly
    without replacement; ``task['quadrant_categories'] (B, 4)``. Defaults d = 2, C = 20, d' = 5.
    """

    d: int = 2
    scale: float = 1.0  # the code has no λ here

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, "d", self.d == 2, "2 (quadrants are defined in the plane)")
        require(self, "W_e", self.num_classes >= 4, "a (d', C) matrix with C >= 4 (one category per quadrant)",
                f"C = {self.num_classes}")  # fmt: skip

    @classmethod
    def draw(
        cls, *, generator: torch.Generator, num_classes: int = 20, d_embed: int = 5, **kwargs: Any
    ) -> QuadrantCategorical:
        """A generator with a fresh W_e ~ N(0, 1)^{d'×C} from ``generator`` (App. F defaults)."""
        return cls(W_e=random_embedding(d_embed, num_classes, generator=generator), **kwargs)

    def contexts(
        self, batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
    ) -> dict[str, Tensor]:
        dev = generator.device
        keys = torch.rand(batch, self.num_classes, generator=generator, device=dev, dtype=torch.float64)
        return {
            "W_e": self.W_e.to(dev, dtype),
            "scale": torch.tensor(self.scale, device=dev, dtype=dtype),
            "quadrant_categories": keys.argsort(dim=1)[:, :4],  # (B, 4)
        }


@dataclass(frozen=True)
class FixedEpisodes:
    """A fixed training set of L contexts (the paper's regime, §6.1) served as a Task.

    ``sample(batch, n, generator=g)`` returns ``batch`` distinct contexts of the set, chosen by ``g``,
    with their first ``n`` context pairs; ``dtype`` converts floating tensors. ``episodes`` keeps the
    whole set (e.g. for a full pass).
    """

    episodes: Episode

    @property
    def size(self) -> int:
        """Number L of stored episodes."""
        return self.episodes.batch_size

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype | None = None) -> Episode:
        """``batch`` of the stored episodes drawn without replacement, cut to their first ``n`` context pairs."""
        check_batch_n("FixedEpisodes", batch, n)
        require("FixedEpisodes", "batch", batch <= self.size, f"an int <= the set size L = {self.size}", batch)
        require("FixedEpisodes", "n", n <= self.episodes.n, f"an int <= the stored context size {self.episodes.n}", n)
        idx = torch.randperm(self.size, generator=generator, device=generator.device)[:batch]
        ep = self.episodes[idx.to(self.episodes.device)]
        return (ep if n == ep.n else ep.with_context(n)).to(dtype=dtype)


def fixed_training_set(
    task: _EmbeddingCategorical, size: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
) -> FixedEpisodes:
    """Draw L = ``size`` contexts once and wrap them in :class:`FixedEpisodes`."""
    return FixedEpisodes(task.sample(size, n, generator=generator, dtype=dtype))


def query_grid(resolution: int = 101, input_range: float = 1.0, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """A ``resolution × resolution`` grid over [−r, r]² → ``(resolution², 2)`` (App. F, Fig. 7: 101, step 0.02).

    Row-major: point i·resolution + j is (t_j, t_i), so ``.reshape(resolution, resolution)`` of a value
    per point gives an image with x₀ along columns and x₁ along rows.
    """
    require_int("query_grid", "resolution", resolution, 2)
    t = torch.linspace(-input_range, input_range, resolution, dtype=dtype)
    x1, x0 = torch.meshgrid(t, t, indexing="ij")
    return torch.stack([x0.reshape(-1), x1.reshape(-1)], dim=-1)


def expand_queries(episode: Episode, points: Tensor) -> Episode:
    """Each context of ``episode`` once per query point: B·m single-query prompts, prompt b·m + i asks point i.

    ``points`` is ``(m, d)`` (the same points for every context, e.g. :func:`query_grid`) or
    ``(B, m, d)``. Any learner can then be evaluated on a grid; a model with a multi-query forward pass
    can check itself against it. ``label_query`` is dropped; per-context task
    entries are repeated, and ``p_query`` is recomputed at the new queries when the task allows it.
    """
    B, d = episode.batch_size, episode.d
    pts = points.to(episode.x) if points.dim() == 3 else points.to(episode.x).expand(B, *points.shape)
    if tuple(pts.shape[::2]) != (B, d):
        raise ShapeError(f"expand_queries: points must have shape (m, {d}) or ({B}, m, {d}); got {tuple(points.shape)}")
    m = pts.shape[1]

    def rep(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.repeat_interleave(m, dim=0)

    task = {k: (v.repeat_interleave(m, dim=0) if k in episode.batched else v) for k, v in episode.task.items()}
    if "p_query" in task:
        try:
            task["p_query"] = log_probabilities(episode.task, pts).exp().reshape(B * m, -1)
        except (ShapeError, KeyError):
            del task["p_query"]
    batched = tuple(k for k in episode.batched if k in task)
    return replace(
        episode,
        x=episode.x.repeat_interleave(m, dim=0),
        x_query=pts.reshape(B * m, d),
        y=rep(episode.y),
        y_query=None,
        labels=rep(episode.labels),
        label_query=None,
        task=task,
        batched=batched,
    )
