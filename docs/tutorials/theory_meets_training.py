# %% [markdown]
# # Theory meets training
#
# Two closed forms of the library against a training run:
#
# 1. **Ahn et al. 2023, Thm 1.** For $x \sim N(0, \Sigma)$, $w_\star \sim N(0, I)$ and $n$ context pairs, the
#    best one-layer linear transformer is one step of PGD with
#    $\Gamma_\star = \left(\frac{n+1}{n}\Sigma + \frac{\operatorname{tr}\Sigma}{n} I\right)^{-1}$, whose loss is
#    $f_\star = \sum_j \lambda_j \frac{\lambda_j + \operatorname{tr}\Sigma}{(n+1)\lambda_j + \operatorname{tr}\Sigma}$
#    over the eigenvalues $\lambda_j$ of $\Sigma$ (eq. 6). Does Adam find it?
# 2. **Zhang et al. 2025, eq. (19).** Multi-head linear attention with separate rank-one key and query
#    (ATTN_S) learns the principal components of $\Lambda$ one at a time: its loss rests on plateaus at
#    $\mathcal{L}(\mathcal{M}_m) = \operatorname{tr}\Lambda - \sum_{j \le m} \lambda_j^3 / \hat\lambda_j$, where
#    $\hat\lambda_j$ are the eigenvalues of the second moment $E(\hat\Lambda^2)$. Does the exact population gradient
#    flow visit them?

# %%
import functools
import os

import torch

import iclab
from iclab import models, plotting, tasks, theory, training

SMALL = os.environ.get("ICLAB_TUTORIAL_SIZE") == "small"  # the tests run every tutorial at small sizes
STEPS = 300 if SMALL else 3000
FLOW_STEPS = 8000 if SMALL else 20000
torch.set_default_dtype(torch.float64)

# %% [markdown]
# ## Thm 1: the trained layer against Γ⋆ and f⋆
#
# A one-layer transformer of the sparse pattern (8) computes $\hat y = \langle x_q, \Gamma X^\top y / n\rangle$
# with $\Gamma$ read off its weights. We train it on a correlated $\Sigma$ and compare its exact population loss
# `theory.one_layer_loss(Γ, Σ, n)` and a Monte Carlo test loss with $f_\star$ = `theory.theorem1_loss(Σ, n)`.

# %%
d, n = 3, 10
Sigma = torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.25]])
task = tasks.LinearRegression(d=d, covariance=Sigma)  # w⋆ ~ N(0, I)
model = models.LinearTransformer(
    models.LinearTransformerConfig(d=d, n_layers=1, pattern="sparse"), generator=iclab.generator(0)
)
config = training.TrainConfig(
    steps=STEPS, batch_size=2048, lr=0.05, schedule="cosine", eval_every=0, progress=False, dtype="float64"
)
training.train(model, functools.partial(task.sample, n=n), config)

P, Q = model.P[0, 0].detach(), model.Q[0, 0].detach()
gamma = -(P[-1, -1] * Q[:-1, :-1]).T
gamma_star = theory.theorem1_preconditioner(Sigma, n)
f_star = theory.theorem1_loss(Sigma, n)
test = task.sample(20_000, n, generator=iclab.generator(1), dtype=torch.float64)
with torch.no_grad():
    mc = float(((model.predict(test) - test.y_query) ** 2).mean())
print(f"f⋆ (Thm 1)                      {f_star:.4f}")
print(f"exact loss of the trained Γ     {theory.one_layer_loss(gamma, Sigma, n):.4f}")
print(f"Monte Carlo test loss           {mc:.4f}")
relative = torch.linalg.norm(gamma - gamma_star) / torch.linalg.norm(gamma_star)
print(f"‖Γ − Γ⋆‖_F / ‖Γ⋆‖_F             {float(relative):.3f}")
assert theory.one_layer_loss(gamma, Sigma, n) <= f_star * 1.05

# %% [markdown]
# ## Eq. (19): the plateaus of ATTN_S under the population flow
#
# `training.population_flow` runs gradient descent on the *exact* population loss (no sampling noise), Euler steps
# of the paper's gradient flow; `theory.attention_dynamics.plateau_losses(Λ, 1/N)` gives the levels
# $\mathcal{L}(\mathcal{M}_0), \dots, \mathcal{L}(\mathcal{M}_D)$. Here $\Lambda = \operatorname{diag}(0.4, 0.3, 0.2,
# 0.1)$, $N = 31$ and 8 rank-one heads from a small initialisation.

# %%
Lam = torch.diag(torch.tensor([0.4, 0.3, 0.2, 0.1]))
N = 31
levels = theory.attention_dynamics.plateau_losses(Lam, 1 / N)
attention = models.SeparateAttention(4, 8, rank=1, w_init=0.05, generator=iclab.generator(2))
trajectory = training.population_flow(attention, Lam, inv_n=1 / N, lr=0.25, steps=FLOW_STEPS, record_every=50)

fig, axes = plotting.subplots(size=(5.0, 3.2))
ax = axes[0, 0]
ax.plot(trajectory.time, trajectory.loss, label="population flow")
for m, level in enumerate(levels):
    ax.axhline(float(level), color="grey", linestyle="--", linewidth=0.8)
    ax.text(float(trajectory.time[-1]), float(level), f" m = {m}", va="bottom", ha="right", fontsize=7)
ax.set_xlabel("t / τ")
ax.set_ylabel("population loss")
ax.legend()

# %% [markdown]
# Each plateau of the curve sits on a dashed level. Measured: how many recorded points lie within 1% of
# $\operatorname{tr}\Lambda$ of each level (time spent there), and how close the loss comes to each level.

# %%
scale = float(levels[0])
for m, level in enumerate(levels):
    gaps = (trajectory.loss - level).abs()
    near = int((gaps < 0.01 * scale).sum())
    print(f"L(M_{m}) = {float(level):.4f}: closest {float(gaps.min()):.1e}, {near} points near")
assert float((trajectory.loss - levels[2]).abs().min()) < 1e-3  # the flow rests on the level m = 2
