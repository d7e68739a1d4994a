"""How far the reduced route of Zhang, Singh, Latham, Saxe 2025 sits from the authors' finite-data GD.

The reduced models (:class:`~iclab.models.MergedAttention`, :class:`~iclab.models.SeparateAttention`) keep only the
weights that reach ŷ_q when the zero blocks of Sec. 2.3-2.4 stay zero (ATTN_M: u_i and the vector part of the value
row; ATTN_S: the scalar key k_i,D+1 and that vector part). Gradient flow keeps them at zero when the gradient of
those blocks vanishes at zero, which needs the odd moments of w to vanish (App. D.1, F.1): in the population limit,
and on any training set closed under y → −y (w → −w). The authors' training set (their ``data.gen_dataset``:
w whitened, P = 5000) is not, so under their GD the blocks drift. This script measures the effect at the paper's
P = 5000 and budgets, for Fig. 3 (ATTN_S, H = 5, rank one, lr 0.02, init 0.01, 10 001 epochs, six data/init seeds
10-15) and Fig. 1 (ATTN_M, H = 8, lr 1e-3, init 1e-6, 6001 epochs, seed 10):

* ``authors``: the authors' own ``train.train`` (their model, loss and ``torch.optim.SGD``, imported from their
  repository at run time, float64) for the first ``--authors-epochs`` epochs of seed 10 (a full budget of their
  loop takes 1.9 h (ATTN_S) / 2.2 h (ATTN_M) on 2 cores), and on the sign-symmetrised set for a few epochs;
* ``authors_moments``: the same model, every block free, in moment form (ŷ = Σ_i x_qᵀ A_i S ṽ_i with S = Σ over all
  32 tokens of z zᵀ, a quadratic loss in the 100 entries of Σ_i A_i ⊗ ṽ_i), checked equal to their loop over those
  epochs and then run for the full budget: the authors' finite-data dynamics at the paper's budget;
  (iclab trains the same model in the paper's parametrisation with ``all_blocks=True``, the cards' option
  ``dynamics=all_blocks``; ``FullModel`` stays here in the authors' parametrisation, the one matched to their loop);
* ``reduced``: iclab's reduced route (:func:`~iclab.training.population.full_batch_gd`) on the same data from the
  same (mapped) init, on the sign-symmetrised set (x, y) ∪ (x, −y), and :func:`population_flow` with their Λ.

For each: drop times, the order the eigenvectors are learned, plateau values, final losses, the zero blocks' drift
and the card's own claims (``fig3.claims``, ``fig1.claims``) evaluated on each trajectory.

    .venv/bin/python benchmarks/zhang_reduced_gap.py            # writes benchmarks/results/zhang-reduced-gap-cpu.json

The authors' part runs in their venv (``PEER_PYTHON``, default /tmp/benv/bin/python) as a sub-process of this same
file (``--authors-part``, which imports no iclab). Weights map as in docs/papers/zhang2025.md: ATTN_S ×N^{1/3},
ATTN_M ×√N, learning rate ×N^{2/3} / ×N, time t/τ = 2·lr'·epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("PEERS", "/tmp/peers"))
PEER_PYTHON = Path(os.environ.get("PEER_PYTHON", "/tmp/benv/bin/python"))
N_CTX = 31  # context pairs; the code's --seq_len 32 includes the query

#: the authors' options (README commands, P = 5000: their default --trainset_size)
FIGURES: dict[str, dict[str, Any]] = {
    "fig3": dict(
        argv=["--model", "attnS", "--head_num", "5", "--rank", "1", "--in_dim", "4", "--seq_len", "32",
              "--lr", "0.02", "--init", "0.01", "--epoch", "10001"],
        seeds=(10, 11, 12, 13, 14, 15), record_every=10,
    ),
    "fig1": dict(
        argv=["--model", "attnM", "--head_num", "8", "--init", "1e-6", "--lr", "0.001", "--epoch", "6001"],
        seeds=(10,), record_every=5,
    ),
}  # fmt: skip


# --- the authors' side (their venv; no iclab) -------------------------------------------------------------------


def _authors_part(out: Path, epochs: dict[str, int], sym_epochs: int, threads: int) -> None:
    """Their data, Λ and init for every seed; their ``train.train`` for ``epochs[fig]`` epochs of the first seed,
    and for ``sym_epochs`` on the sign-symmetrised set. Written to ``out`` (torch.save)."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    repo = PEERS / "linattn-icl"
    sys.path.insert(0, str(repo))
    with contextlib.redirect_stdout(io.StringIO()):
        import config as pcfg
        import train as ptrain

        import data as pdata

    def options(argv: list[str]) -> Any:
        saved = sys.argv
        sys.argv = [str(repo / "train.py"), *argv]  # their config() prints its parse of sys.argv
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return pcfg.config().parse_args(argv)
        finally:
            sys.argv = saved

    sys.path.insert(0, str(ROOT / "scripts"))
    from authors_fixtures import zhang_train

    def run_train(model: Any, data: dict[str, Any], popts: Any) -> list[float]:
        return zhang_train(ptrain, model, data, popts)

    def flip_y(t: Any, d: int) -> Any:
        f = t.clone()
        f[..., d] = -f[..., d]
        return f

    record: dict[str, Any] = {}
    for fig, spec in FIGURES.items():
        runs = []
        for i, seed in enumerate(spec["seeds"]):
            popts = options([*spec["argv"], "--seed", str(seed)])
            torch.manual_seed(popts.seed)  # their __main__
            np.random.seed(popts.seed)
            torch.set_default_dtype(torch.float32)
            with contextlib.redirect_stdout(io.StringIO()):
                raw = pdata.gen_dataset(popts)
            np.random.seed(popts.seed)  # gen_cov is the first draw from numpy's state in gen_dataset
            Lam = pdata.gen_cov(popts)
            torch.set_default_dtype(torch.float64)
            with contextlib.redirect_stdout(io.StringIO()):
                model = ptrain.creat_network(popts)
            init = {k: v.detach().clone() for k, v in model.named_parameters()}
            entry: dict[str, Any] = {"seed": seed, "x": raw["x"].clone(), "yq": raw["y"][:, -1, -1].clone()}
            entry.update(Lambda=torch.tensor(Lam, dtype=torch.float64), init=init)
            if i == 0:
                d = popts.in_dim
                data = {k: v.double() for k, v in raw.items()}
                t0 = time.perf_counter()
                popts.epoch = epochs[fig]
                entry["loss"] = run_train(model, data, popts)
                entry["final"] = {k: v.detach().clone() for k, v in model.named_parameters()}
                entry["seconds"] = time.perf_counter() - t0
                sym = {
                    "x": torch.cat([data["x"], flip_y(data["x"], d)]),
                    "y": torch.cat([data["y"], flip_y(data["y"], d)]),
                }
                model.load_state_dict(init)
                popts.epoch = sym_epochs
                entry["sym_loss"] = run_train(model, sym, popts)
                entry["sym_final"] = {k: v.detach().clone() for k, v in model.named_parameters()}
                entry["argv"] = [*spec["argv"][:-2], "--epoch", str(epochs[fig]), "--seed", str(seed)]
            runs.append(entry)
        record[fig] = runs
    record["torch"] = str(torch.__version__)
    torch.save(record, out)


# --- iclab's side --------------------------------------------------------------------------------------------------


def _features(x: Any, d: int) -> Any:
    """f = x_q ⊗ vec(S), S = Σ over all tokens (query included, label slot 0) of z zᵀ: (P, d·D²)."""
    import torch

    S = torch.einsum("pma,pmb->pab", x, x)  # (P, D, D)
    return (x[:, -1, :d, None, None] * S[:, None]).flatten(1)


def _moments(f: Any, y: Any) -> tuple[Any, Any, float]:
    """E_P(f fᵀ), E_P(y f), E_P(y²) as float64 numpy arrays."""
    return (f.T @ f / f.shape[0]).numpy(), (f.T @ y / f.shape[0]).numpy(), float(y.pow(2).mean())


class FullModel:
    """The authors' linear ATTN_M / ATTN_S with every block free, in their parametrisation (no 1/N, the query a
    source): ŷ = Σ_i x_qᵀ A_i S ṽ_i, A_i (d, D) the rows of the score matrix the query reads (ATTN_M: the first d
    rows of their W_i^{KQ}; ATTN_S: q_i k̃_iᵀ), ṽ_i (D,) the label row of their value matrix. The loss is the
    quadratic yy − 2cᵀt + tᵀMt in t = vec Σ_i A_i ⊗ ṽ_i; ``step`` is their SGD step (the gradient written out,
    float64 numpy: the arrays are a few hundred entries)."""

    def __init__(self, kind: str, params: dict[str, Any], d: int) -> None:
        import numpy as np

        self.kind, self.d = kind, d
        self.p = {k: np.array(v.detach().double().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
                  for k, v in params.items()}  # fmt: skip

    @classmethod
    def from_authors(cls, kind: str, theirs: dict[str, Any], d: int, H: int) -> FullModel:
        D = d + 1
        vrow = theirs["value.weight"].reshape(H, D, D)[:, d, :]  # (H, D): label row of each head's value matrix
        if kind == "attnS":
            return cls(kind, {"k": theirs["key.weight"], "q": theirs["query.weight"][:, :d], "v": vrow}, d)
        return cls(kind, {"A": theirs["kq.weight"].reshape(H, D, D)[:, :d, :], "v": vrow}, d)

    def tensor(self) -> Any:
        import numpy as np

        p = self.p
        if self.kind == "attnS":
            return np.einsum("ha,hb,hc->abc", p["q"], p["k"], p["v"]).ravel()
        return np.einsum("hab,hc->abc", p["A"], p["v"]).ravel()

    def loss(self, mom: tuple[Any, Any, Any]) -> float:
        M, c, yy = mom
        t = self.tensor()
        return float(yy - 2 * c @ t + t @ (M @ t))

    def step(self, mom: tuple[Any, Any, Any], lr: float) -> float:
        """One SGD step θ ← θ − lr ∂L/∂θ; returns the loss before it."""
        import numpy as np

        M, c, yy = mom
        t = self.tensor()
        Mt = M @ t
        loss = float(yy - 2 * c @ t + t @ Mt)
        G = (2 * (Mt - c)).reshape(self.d, self.d + 1, self.d + 1)  # ∂L/∂T
        p = self.p
        if self.kind == "attnS":
            gq = np.einsum("abc,hb,hc->ha", G, p["k"], p["v"])
            gk = np.einsum("abc,ha,hc->hb", G, p["q"], p["v"])
            gv = np.einsum("abc,ha,hb->hc", G, p["q"], p["k"])
            p["q"] -= lr * gq
            p["k"] -= lr * gk
        else:
            gA = np.einsum("abc,hc->hab", G, p["v"])
            gv = np.einsum("abc,hab->hc", G, p["A"])
            p["A"] -= lr * gA
        p["v"] -= lr * gv
        return loss

    def reduced(self, c: float) -> dict[str, Any]:
        """The reduced model's weights (×c) and the zero blocks: ATTN_S k̃_i,D+1, ATTN_M u_i; ṽ_i's vector part."""
        import torch

        p, d = {k: torch.from_numpy(v.copy()) for k, v in self.p.items()}, self.d
        if self.kind == "attnS":
            red = {"v": c * p["v"][:, d], "k": c * p["k"][:, None, :d], "q": c * p["q"][:, None, :]}
            return {**red, "zero_key": p["k"][:, d], "zero_value": p["v"][:, :d]}
        red = {"v": c * p["v"][:, d], "U": c * p["A"][:, :, :d].mT}
        return {**red, "zero_key": p["A"][:, :, d], "zero_value": p["v"][:, :d]}


def _rel(a: Any, b: Any) -> float:
    import torch

    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def _round(x: Any, digits: int = 4) -> Any:
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, list | tuple):
        return [_round(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    return x


def _run_full(
    model: FullModel, mom: Any, test_mom: Any, lr: float, epochs: int, every: int, c: float
) -> dict[str, Any]:
    """``epochs`` SGD steps; train loss of every step (before its update, as their curve), test loss and weights
    every ``every`` steps and at the end."""
    import torch

    train, test, snaps, rec = [], [], [], []
    for t in range(epochs + 1):
        if t % every == 0 or t == epochs:
            rec.append(t)
            test.append(model.loss(test_mom))
            snaps.append(model.reduced(c))
        if t == epochs:
            train.append(model.loss(mom))
            break
        train.append(model.step(mom, lr))
    params = {k: torch.stack([s[k] for s in snaps]) for k in snaps[0]}
    return {"steps": rec, "train_every_step": train, "test": torch.tensor(test, dtype=torch.float64), "params": params}


def _figure_runs(
    fig: str, record: dict[str, Any], test_size: int, max_epochs: int | None, epochs_override: int | None = None
) -> dict[str, Any]:
    """Every route of one figure, every seed."""
    import torch

    from iclab.core.episode import Episode
    from iclab.models.reduced_attention import MergedAttention, SeparateAttention
    from iclab.tasks.linear_regression import LinearRegression
    from iclab.theory import attention_dynamics as ad
    from iclab.training.population import full_batch_gd, population_flow

    F64 = torch.float64
    spec = FIGURES[fig]
    argv = spec["argv"]
    kind = argv[argv.index("--model") + 1]
    H = int(argv[argv.index("--head_num") + 1])
    lr, epochs, every = float(argv[argv.index("--lr") + 1]), int(argv[argv.index("--epoch") + 1]), spec["record_every"]
    epochs = epochs_override or epochs
    epochs = epochs if max_epochs is None else min(epochs, max_epochs)
    d = 4
    c = N_CTX ** (1 / 3) if kind == "attnS" else N_CTX**0.5  # their weights -> the paper's (the 1/N moved in)
    lr_red = c * c * lr
    out: dict[str, Any] = {"seeds": [], "lr_theirs": lr, "lr_reduced": lr_red, "epochs": epochs}
    for i, entry in enumerate(record[fig]):
        seed = entry["seed"]
        x = entry["x"].to(F64)  # (P, 32, D) tokens, query last with label slot 0
        yq = entry["yq"].to(F64)
        Lam = entry["Lambda"]
        mom = _moments(_features(x, d), yq)
        flip = x.clone()
        flip[..., d] = -flip[..., d]
        mom_sym = _moments(_features(torch.cat([x, flip]), d), torch.cat([yq, -yq]))
        mom_pm = _moments(_features(torch.cat([x, -x]), d), torch.cat([yq, -yq]))  # (x, y) ∪ (−x, −y)
        g = torch.Generator().manual_seed(seed)
        test = LinearRegression(d=d, covariance=Lam).sample(test_size, N_CTX, generator=g, dtype=F64)
        tx = torch.cat([torch.cat([test.x, test.y[..., None]], -1), torch.cat([test.x_query, 0 * test.x_query[:, :1]], -1)[:, None]], 1)  # fmt: skip
        assert test.y_query is not None
        test_mom = _moments(_features(tx, d), test.y_query)
        levels = ad.plateau_losses(Lam, 1 / N_CTX)
        row: dict[str, Any] = {"seed": seed}
        t0 = time.perf_counter()
        routes: dict[str, dict[str, Any]] = {}
        for name, m in (("authors_moments", mom), ("authors_moments_sym", mom_sym), ("authors_moments_pm", mom_pm)):
            fm = FullModel.from_authors(kind, entry["init"], d, H)
            routes[name] = _run_full(fm, m, test_mom, lr, epochs, every, c)
        row["seconds_authors_moments"] = time.perf_counter() - t0
        if i == 0:  # their loop vs the moment form, over the epochs their loop ran
            k = len(entry["loss"])
            fm = FullModel.from_authors(kind, entry["init"], d, H)
            mine = [fm.step(mom, lr) for _ in range(k)]
            theirs_final = FullModel.from_authors(kind, entry["final"], d, H).p
            ks = len(entry["sym_loss"])
            fs = FullModel.from_authors(kind, entry["init"], d, H)
            mine_sym = [fs.step(mom_sym, lr) for _ in range(ks)]
            sym_final = FullModel.from_authors(kind, entry["sym_final"], d, H)
            init = FullModel.from_authors(kind, entry["init"], d, H).p
            row["authors_loop"] = {
                "argv": entry["argv"],
                "epochs": k,
                "seconds": entry["seconds"],
                "loss_first_last": [entry["loss"][0], entry["loss"][-1]],
                "moment_form_vs_their_loop": {
                    "loss_max_rel": _rel(torch.tensor(mine), torch.tensor(entry["loss"])),
                    "weights_max_rel": max(_rel(fm.p[n], theirs_final[n]) for n in fm.p),
                    "update_max_rel": max(
                        _rel(fm.p[n] - init[n], theirs_final[n] - init[n]) for n in fm.p
                    ),
                },
                "sym_epochs": ks,
                "sym_moment_form_vs_their_loop_loss_max_rel": _rel(torch.tensor(mine_sym), torch.tensor(entry["sym_loss"])),
                "sym_zero_blocks_max_abs_after": max(
                    float(v.abs().max()) for k_, v in sym_final.reduced(c).items() if k_.startswith("zero")
                ),
                "zero_blocks_max_abs_after": max(
                    float(v.abs().max()) for k_, v in FullModel(kind, theirs_final, d).reduced(c).items() if k_.startswith("zero")
                ),
            }  # fmt: skip
        # iclab's reduced route from the mapped init: same data, the symmetrised set, the population limit
        a0 = FullModel.from_authors(kind, entry["init"], d, H).reduced(c)
        cls = SeparateAttention if kind == "attnS" else MergedAttention
        names = ("v", "k", "q") if kind == "attnS" else ("v", "U")
        ep = Episode(x=x[:, :N_CTX, :d], y=x[:, :N_CTX, d], x_query=x[:, N_CTX, :d], y_query=yq)
        ep_sym = Episode(x=torch.cat([ep.x, ep.x]), y=torch.cat([ep.y, -ep.y]), x_query=torch.cat([ep.x_query] * 2),
                         y_query=torch.cat([yq, -yq]))  # fmt: skip
        t0 = time.perf_counter()
        for name, data in (("reduced", ep), ("reduced_sym", ep_sym), ("population", None)):
            kw = dict(d=d, n_heads=H, w_init=0.0) | (dict(rank=1) if kind == "attnS" else {})
            model = cls(**kw).double().load_params({n: a0[n] for n in names})
            if data is None:
                tr = population_flow(model, Lam, inv_n=1 / N_CTX, lr=lr_red, steps=epochs, record_every=every)
                train = tr.loss
            else:
                tr = full_batch_gd(model, data, lr=lr_red, steps=epochs, record_every=every, Lambda=Lam)
                train = tr.train_loss
            params = dict(tr.params)
            zeros = torch.zeros_like(params["v"])
            full = _reduced_to_full(kind, params, c, d)
            test_loss = torch.tensor([_quad(test_mom, full(j)) for j in range(params["v"].shape[0])], dtype=F64)
            routes[name] = {"steps": tr.steps.tolist(), "population": tr.loss, "train": train, "test": test_loss,
                            "params": params | {"zero_key": zeros, "zero_value": zeros}}  # fmt: skip
        row["seconds_reduced"] = time.perf_counter() - t0
        row["routes"] = routes
        row["levels"] = levels
        row["Lambda"] = Lam
        out["seeds"].append(row)
    return out


def _effective(p: dict[str, Any]) -> Any:
    """The final effective matrix W = Σ_i v_i k_i q_iᵀ (ATTN_S) or Σ_i v_i U_i (ATTN_M), numpy."""
    import numpy as np

    v = p["v"][-1].numpy()
    if "k" in p:
        return np.einsum("h,hra,hrb->ab", v, p["k"][-1].numpy(), p["q"][-1].numpy())
    return np.einsum("h,hab->ab", v, p["U"][-1].numpy())


def _quad(mom: Any, t: Any) -> Any:
    M, c, yy = mom
    return yy - 2 * c @ t + t @ M @ t


def _reduced_to_full(kind: str, params: dict[str, Any], c: float, d: int) -> Any:
    """Record j of a reduced trajectory as the authors' t = vec Σ_i A_i ⊗ ṽ_i (zero blocks zero), numpy."""
    import numpy as np

    P = {k: v.numpy() for k, v in params.items()}

    def at(j: int) -> Any:
        vt = np.pad(P["v"][j][:, None] / c, ((0, 0), (d, 0)))  # (H, D): [0, v_i]
        if kind == "attnS":
            k, q = P["k"][j][:, 0] / c, P["q"][j][:, 0] / c  # (H, d)
            return np.einsum("ha,hb,hc->abc", q, np.pad(k, ((0, 0), (0, 1))), vt).ravel()
        A = np.pad(np.swapaxes(P["U"][j], -1, -2) / c, ((0, 0), (0, 0), (0, 1)))  # (H, d, D)
        return np.einsum("hab,hc->abc", A, vt).ravel()

    return at


ROUTES = ("authors_moments", "authors_moments_sym", "authors_moments_pm", "reduced", "reduced_sym", "population")


def _claims(fig: str, seed_row: dict[str, Any], route: dict[str, Any], time_: Any, reduced_mlp: Any) -> dict[str, Any]:
    """The card's own claims on one route of one seed, its held-out loss standing for the population loss."""
    import torch

    from iclab.experiments.zhang2025 import fig1, fig3
    from iclab.experiments.zhang2025._merged import MergedResults
    from iclab.experiments.zhang2025._staircase import RankRun, StaircaseResults

    p = route["params"]
    if fig == "fig3":
        run = RankRun(R=1, time=time_, loss=route["test"][None], train_loss=route["train"][None],
                      params={k: p[k][None] for k in ("v", "k", "q")})  # fmt: skip
        res = fig3.claims(StaircaseResults(seed_row["Lambda"], seed_row["levels"], [run]), fig3.Fig3Config(seeds=1))
    else:
        mr = MergedResults(Lambda=seed_row["Lambda"], time=time_, loss=route["test"], train_loss=route["train"],
                           mlp_train_loss=reduced_mlp, v=p["v"], U=p["U"], mlp_W1=p["U"].mT.flatten(-2))  # fmt: skip
        res = fig1.claims(mr, fig1.Fig1Config())
    out = {}
    for r in res:
        m = r.measured
        out[r.name] = {"measured": _round(float(m)) if isinstance(m, int | float) else m, "passed": bool(r.passed)}
    _ = torch
    return out


def _order(route: dict[str, Any], Lam: Any, time_: Any) -> list[int]:
    """ATTN_S: the eigen-index (0 = largest λ) each grown head learned, in the order the heads grew."""
    from iclab.experiments.zhang2025 import fig3
    from iclab.experiments.zhang2025._setup import Curves, Setup

    p = route["params"]
    run = Curves(time=time_, loss=route["test"][None], params={k: p[k][None] for k in ("v", "k", "q")})
    return [e.eig for e in fig3.learned_heads(run, Lam, Setup(), 0)]


def summarise(fig: str, runs: dict[str, Any]) -> dict[str, Any]:
    """Drop times, order, plateau values, final losses, zero-block drift, distances and the card's claims."""
    import torch

    from iclab.theory import attention_dynamics as ad

    lr_red = runs["lr_reduced"]
    per_seed, claims_by_route = [], {r: [] for r in ROUTES}
    for row in runs["seeds"]:
        Lam, levels = row["Lambda"], row["levels"]
        s: dict[str, Any] = {"seed": row["seed"], "levels_eq19": _round(levels.tolist(), 6)}
        if "authors_loop" in row:
            s["authors_loop"] = _round(row["authors_loop"], 4)
        red = row["routes"]["reduced"]
        for name in ROUTES:
            r = row["routes"][name]
            steps = torch.tensor(r["steps"], dtype=torch.float64)
            t = 2 * lr_red * steps
            train = r.get("train")
            if name.startswith("authors"):
                every_step = torch.tensor(r["train_every_step"], dtype=torch.float64)
                train = every_step[r["steps"]]
                r["train"] = train
            loss = r["test"]
            drops = ad.drop_times(t, loss, levels)
            values, _ = ad.plateau_values(t, loss, levels)
            p = r["params"]
            vmax = float(p["v"].abs().max())
            entry: dict[str, Any] = {
                "drop_times_tau": [_finite(x) for x in drops.tolist()],
                "plateau_values_test": [_finite(x) for x in values.tolist()],
                "final_train_loss": float(train[-1]),
                "final_test_loss": float(loss[-1]),
                "zero_blocks_max_abs_rel_to_max_v": max(float(p["zero_key"].abs().max()), float(p["zero_value"].abs().max()))
                * (N_CTX ** (1 / 3) if "k" in p else N_CTX**0.5) / vmax,
            }  # fmt: skip
            if name in ("reduced", "reduced_sym", "population"):
                entry["final_population_loss"] = float(r["population"][-1])
            if "k" in p:
                entry["order_learned"] = _order(r, Lam, t)
            if name != "reduced":
                entry["effective_W_vs_reduced_max_rel"] = _rel(_effective(p), _effective(red["params"]))
                entry["weights_vs_reduced_max_rel"] = {
                    k: _rel(p[k][-1], red["params"][k][-1]) for k in red["params"] if not k.startswith("zero")
                }
                entry["test_loss_vs_reduced_max_abs"] = float((loss - red["test"]).abs().max())
                entry["train_loss_vs_reduced_max_abs"] = float((train - red["train"]).abs().max())
            entry["claims"] = _claims(fig, row, r, t, red["train"] if "U" in p else None)
            claims_by_route[name].append(entry["claims"])
            s[name] = _round(entry, 5)
        per_seed.append(s)
    summary: dict[str, Any] = {}
    for name in ROUTES:
        names = claims_by_route[name][0].keys()
        summary[name] = {
            n: f"{sum(c[n]['passed'] for c in claims_by_route[name])}/{len(claims_by_route[name])} seeds" for n in names
        }
    if (
        fig == "fig3"
    ):  # eq. (77): the std over seeds of the last drop time vs the first (the card's later_drops_vary_more)
        for name in ROUTES:
            dt = torch.tensor(
                [[x if x is not None else float("nan") for x in s[name]["drop_times_tau"]] for s in per_seed]
            )
            sd = torch.nan_to_num(dt, nan=float(2 * lr_red * runs["epochs"])).std(0)
            summary[name]["later_drops_vary_more (std t_D / std t_1, >= 1)"] = _round(float(sd[-1] / sd[0]), 4)
    return {"lr_theirs": runs["lr_theirs"], "lr_reduced": lr_red, "epochs": runs["epochs"],
            "claims_passed": summary, "seeds": per_seed}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--authors-part", type=Path, help=argparse.SUPPRESS)  # the sub-process in the authors' venv
    ap.add_argument("--authors-epochs-s", type=int, default=150, help="epochs of their loop, Fig. 3 (ATTN_S)")
    ap.add_argument("--authors-epochs-m", type=int, default=40, help="epochs of their loop, Fig. 1 (ATTN_M)")
    ap.add_argument("--sym-epochs", type=int, default=10, help="epochs of their loop on the symmetrised set")
    ap.add_argument("--test-size", type=int, default=100_000, help="held-out sequences for the test loss")
    ap.add_argument("--max-epochs", type=int, help="cut the paper's budgets (10 001 / 6001 epochs) to this many")
    ap.add_argument("--fig3-card-epochs", type=int, default=60_001, help="Fig. 3 again at the card's budget (0: skip)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "zhang-reduced-gap-cpu.json")
    a = ap.parse_args(argv)
    epochs = {"fig3": a.authors_epochs_s, "fig1": a.authors_epochs_m}
    if a.authors_part is not None:
        _authors_part(a.authors_part, epochs, a.sym_epochs, a.threads)
        return
    import torch

    from iclab.core.provenance import provenance

    torch.set_num_threads(a.threads)
    for path, what in ((PEER_PYTHON, "the authors' venv"), (PEERS / "linattn-icl", "their repository")):
        if not path.exists():
            sys.exit(f"{what} not found at {path} (../shared/peer-bench/setup.sh); nothing measured")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "authors.pt"
        cmd = [str(PEER_PYTHON), __file__, "--authors-part", str(part), "--threads", str(a.threads),
               "--authors-epochs-s", str(a.authors_epochs_s), "--authors-epochs-m", str(a.authors_epochs_m),
               "--sym-epochs", str(a.sym_epochs)]  # fmt: skip
        subprocess.run(cmd, check=True)
        record = torch.load(part, weights_only=True)
    t_authors = time.perf_counter() - t0
    result: dict[str, Any] = {
        "about": (__doc__ or "").split("\n\n")[0],
        "authors": {"repository": "yedizhang/linattn-icl", "commit": _commit("linattn-icl"), "torch": record["torch"]},
        "seconds_authors_part": round(t_authors, 1),
    }
    for fig in FIGURES:
        t1 = time.perf_counter()
        runs = _figure_runs(fig, record, a.test_size, a.max_epochs)
        result[fig] = summarise(fig, runs)
        result[fig]["seconds"] = round(time.perf_counter() - t1, 1)
        print(f"{fig}: {json.dumps(result[fig]['claims_passed'], ensure_ascii=False)}", flush=True)
        if fig == "fig3" and a.fig3_card_epochs:  # the card's paper preset: 60 001 steps (all D drops)
            t1 = time.perf_counter()
            runs = _figure_runs(fig, record, a.test_size, a.max_epochs, a.fig3_card_epochs)
            key = f"fig3_{runs['epochs']}_epochs"
            result[key] = summarise(fig, runs)
            result[key]["seconds"] = round(time.perf_counter() - t1, 1)
            print(f"{key}: {json.dumps(result[key]['claims_passed'], ensure_ascii=False)}", flush=True)
    result["seconds_total"] = round(time.perf_counter() - t0, 1)
    result["provenance"] = provenance()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out} ({result['seconds_total']} s)")


def _commit(repo: str) -> str | None:
    try:
        for line in (PEERS / "COMMITS.txt").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == repo:
                return parts[1]
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
