# %% [markdown]
# # A new task in 30 lines
#
# A task is anything with `sample(batch, n, *, generator, dtype) -> Episode` (the `iclab.tasks.Task` protocol),
# and a learner anything with `predict(episode)` (`iclab.Learner`). So a new problem needs no registration: write a
# sampler, and every model, trainer and algorithm of the library works on it. Here: **noisy sparse regression**,
# $y = \langle w_\star, x \rangle + \varepsilon$ with $x \sim N(0, I_d)$, $w_\star$ with $k$ non-zero
# $N(0, 1)$ entries at random places and $\varepsilon \sim N(0, \sigma^2)$.

# %%
import functools
import os
from dataclasses import dataclass

import torch

import iclab
from iclab import algorithms, models, plotting, training

SMALL = os.environ.get("ICLAB_TUTORIAL_SIZE") == "small"  # the tests run every tutorial at small sizes
STEPS = 200 if SMALL else 3000
torch.set_default_dtype(torch.float64)


# %% [markdown]
# ## The task: one dataclass, one method


# %%
@dataclass(frozen=True)
class NoisySparseRegression:
    d: int = 8
    k: int = 2  # non-zero entries of w⋆
    noise_std: float = 0.1

    def sample(
        self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
    ) -> iclab.Episode:
        dev = generator.device
        x = torch.randn(batch, n + 1, self.d, generator=generator, dtype=dtype, device=dev)
        support = torch.rand(batch, self.d, generator=generator, device=dev).argsort(-1)[:, : self.k]
        values = torch.randn(batch, self.k, generator=generator, dtype=dtype, device=dev)
        w = torch.zeros(batch, self.d, dtype=dtype, device=dev).scatter(1, support, values)
        noise = self.noise_std * torch.randn(batch, n + 1, generator=generator, dtype=dtype, device=dev)
        y = torch.einsum("bnd,bd->bn", x, w) + noise
        return iclab.Episode(x=x[:, :n], y=y[:, :n], x_query=x[:, n], y_query=y[:, n], task={"w": w}, batched=("w",))


task = NoisySparseRegression()
assert isinstance(task, iclab.tasks.Task)  # the protocol is all a task has to satisfy

# %% [markdown]
# ## A learner of our own: ISTA for the lasso
#
# A learner is a class with `predict`. Iterative soft-thresholding minimises
# $\frac{1}{2n}\|Xw - y\|^2 + \lambda \|w\|_1$ for every prompt of the batch at once.


# %%
@dataclass(frozen=True)
class Lasso:
    lam: float = 0.05
    iters: int = 200

    def predict(self, episode: iclab.Episode) -> torch.Tensor:
        X, y = episode.x, episode.y
        n = X.shape[1]
        step = n / torch.linalg.matrix_norm(X, ord=2) ** 2  # 1 / Lipschitz constant of the smooth part
        w = X.new_zeros(X.shape[0], X.shape[2])
        for _ in range(self.iters):
            grad = torch.einsum("bnd,bn->bd", X, torch.einsum("bnd,bd->bn", X, w) - y) / n
            z = w - step[:, None] * grad
            w = z.sign() * (z.abs() - step[:, None] * self.lam).clamp(min=0)
        return (w * episode.x_query).sum(-1)


# %% [markdown]
# ## Train a transformer on it
#
# Three layers of the eq.-(11) linear transformer (GD++ capable, Ahn et al. 2023), trained at $n = 16$.

# %%
n_train = 16
model = models.LinearTransformer(
    models.LinearTransformerConfig(d=task.d, n_layers=3, pattern="sparse"), generator=iclab.generator(0)
)
config = training.TrainConfig(steps=STEPS, batch_size=512, lr=0.01, eval_every=0, progress=False, dtype="float64")
training.train(model, functools.partial(task.sample, n=n_train), config)

# %% [markdown]
# ## Compare learners across context lengths, and plot

# %%
learners = {
    "trained transformer (3 layers)": model,
    "least squares": algorithms.LeastSquares(),
    "ridge λ = 0.1": algorithms.Ridge(0.1),
    "lasso (ISTA)": Lasso(),
    "GD, 3 steps η = 0.5": algorithms.gd([0.5, 0.5, 0.5], d=task.d),
}
lengths = [4, 8, 12, 16, 24, 32]
losses: dict[str, list[float]] = {name: [] for name in learners}
for n in lengths:
    episode = task.sample(2048, n, generator=iclab.generator(100 + n), dtype=torch.float64)
    for name, learner in learners.items():
        with torch.no_grad():
            losses[name].append(float(((learner.predict(episode) - episode.y_query) ** 2).mean()))

fig, axes = plotting.subplots(size=(5.0, 3.2))
ax = axes[0, 0]
for name, values in losses.items():
    ax.plot(lengths, values, marker="o", label=name)
ax.axvline(n_train, color="grey", linestyle=":", linewidth=0.8)
ax.set(xlabel="context length n", ylabel="test MSE", yscale="log")
ax.legend(fontsize=7)
for name, values in losses.items():
    print(f"{name:32s}", " ".join(f"{v:7.3f}" for v in values))

# %% [markdown]
# Least squares fails around $n = d = 8$ (the interpolation peak) and wins with long contexts; the lasso uses the
# sparsity and wins at short ones. The transformer, trained at $n = 16$ only, is a fixed three-step algorithm:
# compare it with three steps of plain GD near its training length, and see it degrade far from it.
# From here: change `k`, the noise, or the architecture (`n_layers`, `pattern="full"`, `activation="relu"`), or
# train a `models.BilinearTransformer` on the same sampler.
