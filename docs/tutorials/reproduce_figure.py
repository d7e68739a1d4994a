# %% [markdown]
# # Reproduce and extend a figure
#
# Every figure of the five papers is a *reproduction card*: a config dataclass whose defaults are the paper's
# settings, presets (`smoke`, `quick`, `paper`), a run, a plot and a list of claims checked numerically. On the
# command line it is `iclab run zhang2025.fig1 --preset quick`; here the same through `iclab.experiments`.
# The card is Zhang et al. 2025's Fig. 1: multi-head linear attention with merged key and query (ATTN_M) trained
# by gradient descent is a two-layer linear network on a cubic feature, and its loss drops once, abruptly, from
# $\operatorname{tr}\Lambda$ to $\mathcal{L}(\mathcal{M}_D)$.

# %%
import os
import tempfile
from pathlib import Path

from iclab import experiments, reporting

SMALL = os.environ.get("ICLAB_TUTORIAL_SIZE") == "small"  # the tests run every tutorial at small sizes
PRESET = "smoke" if SMALL else "quick"
out = Path(tempfile.mkdtemp(prefix="iclab-tutorial-"))  # or "runs", the command line's default

# %% [markdown]
# ## Find the card

# %%
names = list(experiments.all_experiments())
print(len(names), "experiments, e.g.", names[:4])
card = experiments.get("zhang2025.fig1")
print(card.title)
print(sorted(card.presets))

# %% [markdown]
# ## Run it and read its claims
#
# `run_experiment` writes `out/<experiment>/<preset>-<config hash>/` (config, results, figures, `claims.json`);
# the same call again reuses the finished run. A claim is `passed`, `failed`, or `not checked` at a preset too
# small for it (the reason is in its detail).

# %%
result = experiments.run_experiment("zhang2025.fig1", PRESET, out=out)
print(result.out_dir.relative_to(out), f"{result.seconds:.1f} s", "passed" if result.passed else "FAILED")
for claim in result.claims:
    print(f"{claim.status:12s} {claim.name}: measured {claim.measured}, expected {claim.expected}")
print([f.name for f in result.figures])

# %% [markdown]
# ## Change a setting
#
# Overrides are `key=value` strings on the card's config, checked before any work (a bad name or value is refused
# under its full name). Training settings nest under `train.`; a new config is a new run directory.

# %%
print(result.config.w_init, result.config.train.lr, result.config.train.steps)
bigger_init = experiments.run_experiment("zhang2025.fig1", PRESET, out=out, overrides=["w_init=0.05"])
print(bigger_init.out_dir.name, "vs", result.out_dir.name)
for claim in bigger_init.claims:
    print(f"{claim.status:12s} {claim.name}: {claim.measured}")

# %% [markdown]
# ## Sweep a setting
#
# A sweep is a grid (or zip, or list) of overrides of one card, as a dict or a YAML file
# (`iclab sweep examples/sweeps/smoke.yaml`). It writes a table (`sweep.parquet`, a `pandas.DataFrame` here) and
# one figure per metric.

# %%
sweep = experiments.run_sweep(
    {"name": "fig1-lr", "experiment": "zhang2025.fig1", "preset": PRESET, "grid": {"train.lr": [0.05, 0.1]}},
    out=out,
)
print("all points ran:", sweep.ok)
print(sweep.table.iloc[:, :6].to_string())

# %% [markdown]
# ## The report
#
# `iclab reproduce` ends by writing `report.md` and a static HTML site from the run directories; from Python:

# %%
markdown = reporting.write_report([result, bigger_init], out, preset=PRESET)
site = reporting.write_site(out)
print(markdown.name, "and", site.relative_to(out))
print(markdown.read_text().splitlines()[0])
