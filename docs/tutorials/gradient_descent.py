# %% [markdown]
# # Is my transformer doing gradient descent?
#
# Ahn et al. 2023 prove that a linear transformer trained on in-context linear regression implements
# *preconditioned gradient descent* (PGD): with the empirical risk of the prompt's context
#
# $$R(w) = \frac{1}{2n} \sum_{i=1}^{n} \left(\langle w, x_i \rangle - y_i\right)^2,$$
#
# one layer of the eq.-(8) transformer predicts $\hat y = \langle w_1, x_q \rangle$ with
# $w_1 = w_0 - \Gamma \nabla R(w_0)$ from $w_0 = 0$, that is $w_1 = \Gamma X^\top y / n$, for a preconditioner
# $\Gamma$ read off its weights (Lemma 1). Here we train such a transformer, compare it with GD, PGD and least squares
# through the one call every learner has, `learner.predict(episode)`, and check that a closed-form construction
# is exactly PGD.

# %%
import functools
import os

import torch

import iclab
from iclab import algorithms, constructions, models, tasks, theory, training

SMALL = os.environ.get("ICLAB_TUTORIAL_SIZE") == "small"  # the tests run every tutorial at small sizes
STEPS = 300 if SMALL else 3000
torch.set_default_dtype(torch.float64)

# %% [markdown]
# ## A task and an episode
#
# `LinearRegression.random_rotation` is the problem of the paper's Sec. 4.3: $x \sim N(0, \Sigma)$ with
# $\Sigma = U^\top D U$ for a random rotation $U$, and $y = \langle w_\star, x \rangle$ with
# $w_\star \sim N(0, \Sigma^{-1})$. `task.sample(B, n, ...)` returns an `Episode`: `x` (B, n, d), `y` (B, n),
# `x_query` (B, d) and the target `y_query` (B,), which no learner reads.

# %%
d, n = 5, 20
task = tasks.LinearRegression.random_rotation(generator=iclab.generator(0))
test = task.sample(4096, n, generator=iclab.generator(1), dtype=torch.float64)
print(test.x.shape, test.y.shape, test.x_query.shape)

# %% [markdown]
# ## Train a one-layer linear transformer
#
# `pattern="sparse"` is the paper's eq. (8): $P$ reads only the label row and $Q = -[[A, 0], [0, 0]]$, so the
# layer can only compute $\hat y = \langle x_q, A^\top X^\top y / n \rangle$. The trainer takes a model, a sampler
# (called with a batch size and a seeded generator every step) and a `TrainConfig`.

# %%
model = models.LinearTransformer(
    models.LinearTransformerConfig(d=d, n_layers=1, pattern="sparse"), generator=iclab.generator(2)
)
config = training.TrainConfig(steps=STEPS, batch_size=1024, lr=0.05, eval_every=0, progress=False, dtype="float64")
result = training.train(model, functools.partial(task.sample, n=n), config)
print(f"trained {STEPS} steps, last training loss {result.history[-1]['train_loss']:.4f}")

# %% [markdown]
# ## Compare learners through one call
#
# Every learner, trained or closed-form, has `predict(episode) -> (B,)`. GD is PGD with $\Gamma = \eta I$; we take
# the best constant step for this episode (and the best multiple of $\Sigma^{-1}$) by a bounded scalar search (`theory.best_constant_step`). The
# transformer's own preconditioner is $\Gamma = A^\top$: if the transformer *is* PGD, `PGD(Γ)` must predict
# exactly what it predicts.

# %%
P, Q = model.P[0, 0].detach(), model.Q[0, 0].detach()
gamma = -(P[-1, -1] * Q[:-1, :-1]).T  # the preconditioner the trained layer applies


def mse(learner: iclab.Learner) -> float:
    with torch.no_grad():
        return float(((learner.predict(test) - test.y_query) ** 2).mean())


Sigma_inv = torch.linalg.inv(task.Sigma)
eta, _ = theory.best_constant_step(lambda s: mse(algorithms.gd([s], d=d)), (0.0, 2.0))
eta_inv, _ = theory.best_constant_step(lambda s: mse(algorithms.pgd(Sigma_inv, [s])), (0.0, 2.0))
learners = {
    "trained transformer": model,
    "PGD with the transformer's Γ": algorithms.PGD(gamma[None]),
    f"GD, best step η = {eta:.3f}": algorithms.gd([eta], d=d),
    f"PGD with Γ = {eta_inv:.3f} Σ⁻¹": algorithms.pgd(Sigma_inv, [eta_inv]),
    "least squares": algorithms.LeastSquares(),
}
for name, learner in learners.items():
    print(f"{name:32s} test MSE {mse(learner):.4f}")

with torch.no_grad():
    gap = (model.predict(test) - learners["PGD with the transformer's Γ"].predict(test)).abs().max()
print(f"transformer vs PGD(Γ): largest difference {gap:.1e}")
assert gap < 1e-10

# %% [markdown]
# The trained transformer and PGD with its own $\Gamma$ agree to rounding: it *is* one step of PGD, and a better
# one than plain GD because $\Gamma$ has learnt the geometry of $\Sigma$. How close is $\Gamma$ to a multiple of
# $\Sigma^{-1}$? `iclab.dist_to_identity(M)` is the paper's $\mathrm{Dist}(M, I) = \min_\alpha
# \|M - \alpha I\|_F / \|M\|_F$, so we measure $\Gamma \Sigma$ against the identity (0 would be exactly
# $\Gamma \propto \Sigma^{-1}$; one step from $w_0 = 0$ with $w_\star \sim N(0, \Sigma^{-1})$ also pays for the
# prior, so it need not reach 0).

# %%
print(f"Dist(ΓΣ, I) = {float(iclab.dist_to_identity(gamma @ task.Sigma)):.3f}")
print(f"Dist(Σ, I)  = {float(iclab.dist_to_identity(task.Sigma)):.3f}  (plain GD's Γ = ηI)")

# %% [markdown]
# ## A construction is exact
#
# `constructions.pgd(G)` returns a `LinearTransformer` whose weights make layer $\ell$ one PGD step with
# preconditioner $G_\ell$ (Lemma 1). Three layers with random preconditioners: the transformer and
# `algorithms.PGD(G)` agree to rounding on every prompt.

# %%
G = 0.1 * torch.randn(3, d, d, generator=iclab.generator(3))
constructed = constructions.pgd(G)
with torch.no_grad():
    difference = (constructed.predict(test) - algorithms.PGD(G).predict(test)).abs().max()
print(f"three-layer construction vs three PGD steps: {difference:.1e}")
assert difference < 1e-10
