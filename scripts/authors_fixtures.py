"""Fixtures from the authors' own training loops, for tests/test_authors_trajectories.py.

Each sub-command runs one paper's published training loop (its functions, optimiser and clipping code, imported
from the authors' repository at run time, nothing copied) for one small configuration in float64 and writes
``<out>/<paper>_<config>.pt``: the initial weights, every batch, the loss of every step, the final weights and a
``meta`` dict (repository, pinned commit, configuration, torch version, date). Plain tensors, lists, floats and
strings only. The tests train iclab from the same weights on the same batches and compare.

    python scripts/authors_fixtures.py cheng2024 --peers /tmp/peers --out tests/data/authors/

Run it with a Python that has torch and numpy (the authors' environment); it does not import iclab. ``--peers``
holds the authors' repositories checked out at the commits listed in its COMMITS.txt.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def notebook_functions(path: Path, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions ``names`` of a Jupyter notebook, defined in ``namespace`` from the notebook's own
    source (a later cell's definition replaces an earlier one, as when the notebook runs)."""
    found: dict[str, ast.FunctionDef] = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        src = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        found.update({n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names})
    missing = sorted(set(names) - set(found))
    if missing:
        raise KeyError(f"{path}: functions not found: {missing}")
    for name in names:
        exec(compile(ast.Module(body=[found[name]], type_ignores=[]), f"{path}::{name}", "exec"), namespace)
    return {n: namespace[n] for n in names}


def commit_of(peers: Path, repo: str) -> str:
    """The pinned commit of ``repo`` in ``peers/COMMITS.txt`` (lines ``<repo> <commit> <date>``)."""
    for line in (peers / "COMMITS.txt").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == repo:
            return parts[1]
    raise KeyError(f"{repo} is not in {peers / 'COMMITS.txt'}")


def meta(peers: Path, repo: str, config: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
    """The fixture's provenance: the repository (``owner/repo`` when the owner is given), its pinned commit, the
    configuration, the torch version and the date."""
    import torch

    return {
        "repository": repo if owner is None else f"{owner}/{repo}",
        "commit": commit_of(peers, repo),
        "config": config,
        "torch": str(torch.__version__),
        "date": datetime.date.today().isoformat(),
    }


def cheng2024(args: argparse.Namespace) -> Path:
    """Cheng, Chen, Sra 2024 (transformer-functional-gradient): ``run_exp`` of run-exp.ipynb, step for step.

    Their model ``Transformer_F`` (allparam (L, 1, 3, D, D): P, Q, K per layer, all entries drawn N(0, 0.1²)),
    AdamW(lr 0.1, weight_decay 0) with betas set to (0.9, 0.9) before every step, their ``clip_and_step`` (layer i's
    whole gradient, masked entries included, scaled to at most 10⁻⁸/(9 − i)²), ``zero_row_col`` after every step,
    and a new batch from ``generate_data_inplace`` after every step t with t % 10 == 0 (so batch 0 serves step 0,
    batch k >= 1 steps 10(k − 1) + 1 … 10k). In float64, on the CPU (their ``.cuda()`` calls made no-ops).
    """
    import numpy as np
    import torch

    repo = args.peers / "transformer-functional-gradient"
    sys.path.insert(0, str(repo))
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]  # their hard-coded .cuda()
    torch.set_default_dtype(torch.float64)
    import linear_transformer as ftf  # the authors' module

    clip_and_step = notebook_functions(repo / "run-exp.ipynb", ["clip_and_step"], {"torch": torch, "np": np})[
        "clip_and_step"
    ]
    d, n, L, B, steps, seed = 5, 14, 3, 16, 200, 0  # Figs 1-2's d, n and L; a small batch
    kernel, act = "exp", "softmax"  # Fig. 3's K^exp data and softmax attention
    lr, clip_r = 0.1, 1e-8  # run_exp's values (its clip_r is 1e-8 for t <= 8000)
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = ftf.Transformer_F(L, 1, d, 0.1, N=n)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.99, 0.99), weight_decay=0)
    U = torch.linalg.svd(torch.empty(d, d).uniform_(-1, 1))[0]  # run_exp: a random rotation, D = I
    D = torch.eye(d)
    Z = torch.zeros([B, n + 1, d + 1])
    Z, y = ftf.generate_data_inplace(Z, kernel, U=U, D=D)
    init = model.allparam.detach().clone()
    batches, labels, batch_of_step, losses = [Z.clone()], [y.clone()], [], []
    for t in range(steps):
        optimizer.param_groups[0]["lr"] = lr
        optimizer.param_groups[0]["betas"] = (0.9, 0.9)
        batch_of_step.append(len(batches) - 1)
        loss = ftf.in_context_loss(model, Z, y, act)
        loss.backward()
        clip_and_step(model.allparam, optimizer, clip_r=clip_r)
        model.zero_row_col()
        optimizer.zero_grad()
        losses.append(loss.item())
        if t % 10 == 0 and t + 1 < steps:  # the batch after the last step is never read
            Z, y = ftf.generate_data_inplace(Z, kernel, U=U, D=D)
            batches.append(Z.clone())
            labels.append(y.clone())
    config = dict(d=d, n=n, n_layers=L, batch=B, steps=steps, seed=seed, kernel=kernel, activation=act, lr=lr)
    config.update(clip_r=clip_r, betas=[0.9, 0.9], resample="after every step t with t % 10 == 0", dtype="float64")
    record = {
        "init": init,  # (L, 1, 3, D, D): P, Q, K of each layer
        "Z": torch.stack(batches),  # (K, B, n+1, D): [x, y] tokens, the query's label slot 0
        "y_query": torch.stack(labels),  # (K, B)
        "batch_of_step": batch_of_step,
        "loss": losses,
        "final": model.allparam.detach().clone(),
        "meta": meta(args.peers, "transformer-functional-gradient", config, owner="chengxiang"),
    }
    name = f"cheng2024_{kernel}_{act}_n{n}_L{L}.pt"
    out = args.out / name
    torch.save(record, out)
    print(f"{out}: loss {losses[0]:.6g} -> {losses[-1]:.6g} over {steps} steps, {len(batches)} batches")
    return out


def _stub_modules(names: dict[str, dict[str, Any]]) -> None:
    """Register empty stand-in modules (with the given attributes) under ``names``."""
    import types

    for name, attrs in names.items():
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules[name] = module


def wang2025(args: argparse.Namespace) -> Path:
    """Wang, Convertino, Cheng, Henao, Carin 2025 (icl_attention_categorical, ``src/experiments_torch``): the §6.1
    task (their ``HighDimCategorical``: d = 10, C = 25, d' = 5, λ = 10, 5 anchors) with N = 20, softmax kernel, one
    block (``wang2025_softmax_k1.pt``) and two blocks (``wang2025_softmax_k2.pt``: their GD model's erasure head and
    cross-attention then feed a second functional-GD step); their GD model ``TransformerGDInterleaved`` and Trained
    TF ``TransformerInterleaved`` (init_seed 0, init_scale their ``conf_init``'s 0.002 / blocks), each trained by
    their ``eval.train_loop``: Adam (GD) / AdamW β = (0.9, 0.98), weight decay 0 (Trained TF), lr 1e-3 (their
    ``config.gd_lr``, used for both; their PyTorch ``conf_init`` sets it, and no schedule, at every depth), no
    clipping, 100 passes over L = 64 fixed contexts in 2 minibatches of 32, unshuffled (200 updates). In float64
    (default dtype set before their code builds anything). Their context labels come from torch's global generator
    (seeded 0 here). Both depths see the same contexts (the same seeds): the two-block file names the one-block file
    (``data``) for them instead of holding a copy (checked equal when it is written).

    The loss of every update is the value their ``train_step`` returns to ``train_loop``; the gradient norm before
    each update is recorded too (no clip is applied). Diagnostic variant, off by default: environment
    ``WANG2025_CLIP=<c>`` clips the global gradient norm to c before each update (``clip_grad_norm_``, iclab's
    paper-preset rule, c = 1.0) and writes ``wang2025_softmax_k1_clip<c>.pt`` (one block) instead.

    Their modules import tensorflow/keras (for the ImageNet features) and IPython at module level; empty stand-ins
    are registered for those names, as the synthetic experiment never uses them.
    """
    import os

    clip = float(os.environ["WANG2025_CLIP"]) if os.environ.get("WANG2025_CLIP") else None
    first = _wang_record(args, 1, clip)
    if clip is None:
        _wang_record(args, 2, None)
    return first


def _wang_record(args: argparse.Namespace, layers: int, clip: float | None) -> Path:
    """One fixture of :func:`wang2025`: ``layers`` blocks, both models, the global clip ``clip`` (None: none)."""
    import contextlib
    import io

    import torch
    import torch._dynamo  # before the stand-ins: dynamo probes installed packages by name

    class _Unavailable:
        def __init__(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("keras stand-in: not installed")

    keras = type(sys)("keras")
    _stub_modules({"keras.applications": {}, "keras.preprocessing": {"image": None}, "IPython": {},
                   "keras.applications.vgg16": {"VGG16": _Unavailable, "preprocess_input": _Unavailable},
                   "IPython.display": {"display": print}})  # fmt: skip
    sys.modules["keras"] = keras
    _stub_modules({"tensorflow": {"keras": keras}})
    path = str(args.peers / "icl_attention_categorical" / "src" / "experiments_torch")
    if path not in sys.path:
        sys.path.insert(0, path)
    torch.set_default_dtype(torch.float64)
    with contextlib.redirect_stdout(io.StringIO()):
        import eval as peval  # their train_loop
        from config import config
        from torch.utils.data import DataLoader
        from transformer import TransformerGDInterleaved, TransformerInterleaved
        from util import conf_init

        from data import HighDimCategorical

    d, C, e, N, L, mb, epochs, kernel = 10, 25, 5, 20, 64, 32, 100, "softmax"
    conf_init(save_path=None, model_type="interleaved", num_seeds=1, num_layers=layers, data_kernel="high_dim",
              model_kernel=kernel, num_cats=C, c_size=N, i_size=d, e_size=e, high_dim_k=5, high_dim_lambda=10,
              dist=0.1, training_data_size=L, minibatch_size=mb, training_steps_tf=epochs, training_steps_gd=epochs)  # fmt: skip
    torch.manual_seed(0)
    W_e = torch.randn((config.data_e_size, config.num_cats), generator=torch.Generator().manual_seed(42))
    kw = dict(device="cpu", model_type="interleaved", i_size=d, c_size=N, data_e_size=e, params_e_size=e, cats=C,
              k=config.high_dim_k, dist=config.dist, l=config.high_dim_lambda, W_e=W_e, input_range=1)  # fmt: skip
    train = HighDimCategorical(seed=100, batches=L, **kw)
    held = HighDimCategorical(seed=100 + L, batches=mb, **kw)  # their val/eval passes; not recorded
    train_dl = DataLoader(train, batch_size=config.mb_size, shuffle=False)
    held_dl = DataLoader(held, batch_size=mb, shuffle=False)

    def adam(m: Any) -> Any:
        return torch.optim.Adam(m.parameters(), lr=config.gd_lr)  # eval.run_experiment's GD optimiser

    def adamw(m: Any) -> Any:  # eval.run_experiment's Trained TF optimiser
        return torch.optim.AdamW(m.parameters(), lr=config.gd_lr, betas=[config.b1, config.b2], weight_decay=config.wd)

    runs: dict[str, Any] = {}
    for tag, cls, make in (("gd", TransformerGDInterleaved, adam), ("tf", TransformerInterleaved, adamw)):
        model = cls(num_layers=layers, input_size=d, num_categories=C, emb_size=e, init_scale=config.init_scale,
                    include_query=False, kernel=kernel, num_queries=1, device="cpu", init_seed=0)  # fmt: skip
        init = {k: v.detach().clone() for k, v in model.named_parameters()}
        losses: list[float] = []
        norms: list[float] = []
        train_step, optimizer = model.train_step, make(model)
        step = optimizer.step

        def recording(features: Any, labels: Any, train_step: Any = train_step, losses: list[float] = losses) -> Any:
            loss, acc = train_step(features, labels)
            if torch.is_grad_enabled():  # train_loop's updates, not its eval_loop passes
                losses.append(loss.item())
            return loss, acc

        def stepping(*a: Any, step: Any = step, model: Any = model, norms: list[float] = norms, **k: Any) -> Any:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            if clip is not None:  # diagnostic variant only
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            return step(*a, **k)

        model.train_step, optimizer.step = recording, stepping
        with contextlib.redirect_stdout(io.StringIO()):
            peval.train_loop(model, optimizer, epochs, train_dl, held_dl, held_dl, None)
        final = {k: v.detach().clone() for k, v in model.named_parameters()}
        runs[tag] = {"init": init, "loss": losses, "grad_norm": norms, "final": final}
        print(f"{tag}: loss {losses[0]:.6g} -> {losses[-1]:.6g} over {len(losses)} updates, "
              f"grad norm max {max(norms):.3g}")  # fmt: skip
    config_out = dict(d=d, num_classes=C, d_embed=e, n=N, L=L, minibatch=mb, passes=epochs, updates=len(losses),
                      n_blocks=layers, kernel=kernel, data_lambda=10, anchors=5, W_e_seed=42, data_seed=100,
                      label_seed=0, init_seed=0, init_scale=config.init_scale, lr=config.gd_lr,
                      gd_optimizer="Adam betas (0.9, 0.999)", tf_optimizer="AdamW betas (0.9, 0.98) wd 0",
                      clip=clip, minibatch_order="0, 1, 0, 1, ... (DataLoader, shuffle=False)", dtype="float64")  # fmt: skip
    record = {
        "x": train.data[:, :d].transpose(1, 2).contiguous(),  # (L, N+1, d): the N context inputs, then the query
        "labels": train.labels,  # (L, N+1) int64: context labels, then the query label
        "runs": runs,  # {"gd", "tf"}: init / final {their parameter name: tensor}, loss, grad_norm per update
        "meta": meta(args.peers, "icl_attention_categorical", config_out),
    }
    if layers > 1:  # the same contexts as the one-block fixture (same seeds): kept there only, to keep files small
        one = torch.load(args.out / "wang2025_softmax_k1.pt")
        assert torch.equal(one["x"], record.pop("x")) and torch.equal(one["labels"], record.pop("labels"))
        record["data"] = "wang2025_softmax_k1.pt"  # the file holding "x" and "labels"
    name = f"wang2025_softmax_k{layers}.pt" if clip is None else f"wang2025_softmax_k{layers}_clip{clip:g}.pt"
    out = args.out / name
    torch.save(record, out)
    print(f"{out}")
    return out


def _ahn_run(
    lt: Any,
    clip_and_step: Callable[..., Any],
    *,
    n_layer: int,
    N: int,
    B: int,
    steps: int,
    lr: float,
    betas: tuple[float, float],
    clip_r: float,
    resample_every: int,
    halve_every: int,
    zero_p: str = "never",
    seed: int = 0,
    d: int = 5,
    var: float = 1e-4,
) -> dict[str, Any]:
    """One run of the training cell of Ahn et al.'s variable_N / variable_L / rotation-p0 notebooks, step for step:
    ``torch.manual_seed(seed)``, their ``Transformer_F(n_layer, 1, d, var)``, AdamW(lr, betas, weight_decay 0), the
    seeds reset, U the left singular vectors of a U(-1, 1) matrix, D = diag(1, 1, 1/2, 1/4, 1), ``generate_data``
    once, then per step t: lr halved when t % halve_every == 0 and t > 1, ``generate_data_inplace`` when
    t % resample_every == 0, ``in_context_loss``, backward, their ``clip_and_step`` (each [layer, head, P/Q] matrix
    clipped to clip_r), ``zero_grad``, and ``zero_p`` after the step when ``zero_p`` is "after" (the p0 notebook) or
    "start_and_after" (also once before step 0: the one rule changed to compare with pattern (8) from the start).

    The data are generated in float32 as in the notebooks (their ``torch.FloatTensor`` draws) and each batch is cast
    to float64 for the float64 model; the CPU stands in for their ``.cuda()``."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    model = lt.Transformer_F(n_layer, 1, d, var)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=0)
    torch.set_default_dtype(torch.float32)  # their data code: float32 throughout
    np.random.seed(seed)
    torch.manual_seed(seed)
    U = torch.linalg.svd(torch.FloatTensor(5, 5).uniform_(-1, 1))[0]
    D = torch.diag(torch.FloatTensor([1, 1, 1 / 2, 1 / 4, 1]))
    Z, y = lt.generate_data("normal", N, d, B, 0.1, U, D)
    torch.set_default_dtype(torch.float64)
    if zero_p == "start_and_after":
        model.zero_p()
    init = model.allparam.detach().clone()
    batches, labels, losses = [], [], []
    for t in range(steps):
        if t % halve_every == 0 and t > 1:
            optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"] * 0.5
        if t % resample_every == 0:
            torch.set_default_dtype(torch.float32)
            Z, y = lt.generate_data_inplace(Z, U=U, D=D)
            torch.set_default_dtype(torch.float64)
            batches.append(Z.clone())
            labels.append(y.clone())
        loss = lt.in_context_loss(model, Z.double(), y.double())
        loss.backward()
        clip_and_step(model.allparam, optimizer, clip_r=clip_r)
        optimizer.zero_grad()
        if zero_p != "never":
            model.zero_p()
        losses.append(loss.item())
    return {
        "init": init,  # (L, 1, 2, d, d): their P (= B of eq. 11) and Q (= Aᵀ of eq. 11) per layer
        "Z": torch.stack(batches),  # (K, B, N+1, d+1) float32: [x, y] tokens as rows, the query's label slot 0
        "y_query": torch.stack(labels),  # (K, B) float32
        "loss": losses,
        "final": model.allparam.detach().clone(),
    }


def ahn2023(args: argparse.Namespace) -> Path:
    """Ahn, Cheng, Daneshmand, Sra 2023 (LinearTransformer): the training cells of three notebooks, small, float64
    (:func:`_ahn_run`), each written to its own file:

    - ``ahn2023_variable_n_N4.pt``: variable_N_exp.ipynb (Fig. 6) at N = 4, L = 3: lr by the notebook's rule
      (0.001 for N < 5, else 0.01), β = (0.99, 0.99), clip 0.001, a new batch every step; 8 prompts, 200 steps.
    - ``ahn2023_variable_l_L4.pt``: variable_L_exp.ipynb (Fig. 7) at L = 4, N = 20: lr 0.01, β = (0.99, 0.9),
      clip 0.01, a new batch every 100 steps; 64 prompts, 300 steps.
    - ``ahn2023_fig1_p0.pt``: rotation demonstration-Adam-p0.ipynb (Figs 1-2, P = 0): L = 3, N = 20, lr 0.02,
      β = (0.99, 0.9), clip 0.01, a new batch every 100 steps, ``zero_p`` after every step; 64 prompts, 300 steps.
      Two runs on the same batches: ``published`` (the notebook: the first step sees the random P) and ``zero_start``
      (``zero_p`` also before step 0: pattern (8) from the start).
    """
    import numpy as np
    import torch

    repo = args.peers / "LinearTransformer"
    sys.path.insert(0, str(repo))
    torch.set_default_dtype(torch.float64)
    import linear_transformer as lt  # the authors' module

    def clip_fn(notebook: str) -> Callable[..., Any]:
        return notebook_functions(repo / notebook, ["clip_and_step"], {"torch": torch, "np": np})["clip_and_step"]

    def config(notebook: str, figure: str, **run: Any) -> dict[str, Any]:
        return dict(notebook=notebook, figure=figure, d=5, seed=0, init_var=1e-4, data_dtype="float32",
                    dtype="float64", **run)  # fmt: skip

    def record(cfg: dict[str, Any], **extra: Any) -> dict[str, Any]:
        kw = {k: cfg[k] for k in ("N", "steps", "lr", "clip_r", "resample_every", "halve_every")}
        kw.update(n_layer=cfg["n_layers"], B=cfg["batch"], betas=tuple(cfg["betas"]), **extra)
        return _ahn_run(lt, clip_fn(cfg["notebook"]), **kw)

    def save(name: str, cfg: dict[str, Any], rec: dict[str, Any]) -> Path:
        return _ahn_save(args, name, {**rec, "meta": meta(args.peers, "LinearTransformer", cfg, owner="chengxiang")})

    N = 4
    lr = 0.001 if N < 5 else 0.01  # the notebook's rule (its training cell)
    cfg = config("variable_N_exp.ipynb", "Fig. 6", N=N, n_layers=3, batch=8, steps=200, lr=lr, betas=[0.99, 0.99],
                 clip_r=0.001, resample_every=1, halve_every=2000)  # fmt: skip
    first = save("ahn2023_variable_n_N4.pt", cfg, record(cfg))
    cfg = config("variable_L_exp.ipynb", "Fig. 7", N=20, n_layers=4, batch=64, steps=300, lr=0.01, betas=[0.99, 0.9],
                 clip_r=0.01, resample_every=100, halve_every=4000)  # fmt: skip
    save("ahn2023_variable_l_L4.pt", cfg, record(cfg))
    rules = {"published": "after", "zero_start": "start_and_after"}
    cfg = config("rotation demonstration-Adam-p0.ipynb", "Figs 1-2", N=20, n_layers=3, batch=64, steps=300, lr=0.02,
                 betas=[0.99, 0.9], clip_r=0.01, resample_every=100, halve_every=2000, zero_p=rules)  # fmt: skip
    runs = {key: record(cfg, zero_p=rule) for key, rule in rules.items()}
    assert torch.equal(runs["published"]["Z"], runs["zero_start"]["Z"])  # the same batches
    both = {k: {f: r[f] for f in ("init", "loss", "final")} for k, r in runs.items()}
    save(
        "ahn2023_fig1_p0.pt", cfg, {"Z": runs["published"]["Z"], "y_query": runs["published"]["y_query"], "runs": both}
    )
    return first


def _ahn_save(args: argparse.Namespace, name: str, record: dict[str, Any]) -> Path:
    import torch

    out = args.out / name
    torch.save(record, out)
    loss = record["loss"] if "loss" in record else record["runs"]["published"]["loss"]
    print(f"{out}: loss {loss[0]:.6g} -> {loss[-1]:.6g} over {len(loss)} steps, {len(record['Z'])} batches")
    return out


def zhang_train(ptrain: Any, model: Any, data: dict[str, Any], popts: Any) -> list[float]:
    """Zhang et al.'s ``train.train(model, data, popts)`` (their module ``ptrain``), run in a scratch directory, and
    the loss curve it writes there (``np.savetxt``, one value per epoch) read back."""
    import contextlib
    import io
    import os
    import tempfile

    import numpy as np

    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                ptrain.train(model, data, popts)
            (curve,) = [f for f in os.listdir(tmp) if f.endswith(".txt")]
            return list(np.atleast_1d(np.loadtxt(curve)).tolist())
        finally:
            os.chdir(here)


def _zhang_setup(peers: Path, argv: list[str]) -> tuple[Any, Any, dict[str, Any], dict[str, Any], Any]:
    """Zhang et al.'s ``__main__`` of train.py for the options ``argv``, up to the training: their ``config`` parses
    the options, the seeds are set, their ``gen_dataset`` builds the data in float32 (as in their code) and their
    ``creat_network`` the model in float64. Returns (their train module, the parsed options, the float32 data, the
    same data in float64, the model)."""
    import contextlib
    import io

    import numpy as np
    import torch

    repo = peers / "linattn-icl"
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    saved = sys.argv
    sys.argv = [str(repo / "train.py"), *argv]  # their config() prints its parse of sys.argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import config as pcfg
            import train as ptrain

            import data as pdata

            popts = pcfg.config().parse_args(argv)
    finally:
        sys.argv = saved
    torch.manual_seed(popts.seed)  # their __main__
    np.random.seed(popts.seed)
    torch.set_default_dtype(torch.float32)
    with contextlib.redirect_stdout(io.StringIO()):
        data = pdata.gen_dataset(popts)
    torch.set_default_dtype(torch.float64)
    raw = {k: v.clone() for k, v in data.items()}
    data = {k: v.double() for k, v in data.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        model = ptrain.creat_network(popts)
    return ptrain, popts, raw, data, model


def _zhang_record(args: argparse.Namespace, name: str, argv: list[str], figure: str) -> Path:
    """Run their ``train.train`` for the options ``argv`` (:func:`_zhang_setup`, :func:`zhang_train`) and write
    ``<out>/<name>``: the float32 tokens and query labels, the initial and final weights, the loss of every epoch."""
    import torch

    ptrain, popts, raw, data, model = _zhang_setup(args.peers, argv)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    losses = zhang_train(ptrain, model, data, popts)
    final = {k: v.detach().clone() for k, v in model.named_parameters()}
    config = dict(argv=argv, figure=figure, d=popts.in_dim, tokens=popts.seq_len, heads=popts.head_num,
                  rank=popts.rank, P=popts.trainset_size, init=popts.init, lr=popts.lr, epochs=popts.epoch,
                  seed=popts.seed, icl=popts.icl, white_cov=popts.white_cov, optimizer="SGD (full batch)",
                  data_dtype="float32", dtype="float64")  # fmt: skip
    record = {
        "x": raw["x"],  # (P, T, D+1) float32: the tokens [x, y], the query last with label slot 0
        "y": raw["y"][:, -1, popts.in_dim :].clone(),  # (P, 1) float32: the query labels
        "init": init,  # {their parameter name: tensor}
        "loss": losses,
        "final": final,
        "meta": meta(args.peers, "linattn-icl", config, owner="yedizhang"),
    }
    out = args.out / name
    torch.save(record, out)
    print(f"{out}: loss {losses[0]:.6g} -> {losses[-1]:.6g} over {len(losses)} epochs")
    return out


def zhang2025(args: argparse.Namespace) -> Path:
    """Zhang, Singh, Latham, Saxe 2025 (linattn-icl): their ``train.train`` itself, untouched, for two small runs,
    each on the sequences of their ``gen_dataset`` (seed 10, their default) in float32 as in their code, cast to
    float64 with the model (its weights drawn in float64). Their ``config`` parses the options; ``train`` writes its
    loss curve to a text file (``np.savetxt``, 18 digits) in a scratch directory, read back from there.

    - ``zhang2025_softmax_separate_H5.pt``: the token route of Fig. 5 (ATTN_S: softmax attention, separate rank-one
      key and query, H = 5, D = 4, sequences of 32 tokens with the query last, init 0.01, full-batch SGD lr 0.02),
      P = 256 sequences, 300 epochs.
    - ``zhang2025_linear_merged_H8.pt``: Fig. 14's linear ATTN_M (``Attention_Merge``: one free W^KQ per head, the
      zero blocks zeroed at init only, no 1/N), with Fig. 14's README options (``--model attnM --head 8
      --white_cov --lr 0.0005``) on a mixture with half the task vectors fixed (``--icl 0.5``), P = 128, init 0.01
      (their 1e-6 stays on the plateau for thousands of epochs), 300 epochs.
    """
    argv = ["--model", "attnS", "--softmax", "--head_num", "5", "--rank", "1", "--in_dim", "4", "--seq_len", "32",
            "--trainset_size", "256", "--init", "0.01", "--lr", "0.02", "--epoch", "300"]  # fmt: skip
    first = _zhang_record(args, "zhang2025_softmax_separate_H5.pt", argv, "Fig. 5 (ATTN_S, softmax)")
    argv = ["--model", "attnM", "--head_num", "8", "--in_dim", "4", "--seq_len", "32", "--white_cov", "--icl", "0.5",
            "--trainset_size", "128", "--init", "0.01", "--lr", "0.0005", "--epoch", "300"]  # fmt: skip
    _zhang_record(args, "zhang2025_linear_merged_H8.pt", argv, "Fig. 14 (linear ATTN_M, fixed fraction 0.5)")
    return first


#: One sub-command per repository: {name: function(args)}, args holding ``peers`` and ``out`` (Paths).
COMMANDS: dict[str, Callable[[argparse.Namespace], Path]] = {
    "cheng2024": cheng2024,
    "wang2025": wang2025,
    "ahn2023": ahn2023,
    "zhang2025": zhang2025,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("paper", choices=sorted(COMMANDS))
    ap.add_argument("--peers", type=Path, default=Path("/tmp/peers"), help="the authors' repositories")
    ap.add_argument("--out", type=Path, default=Path("tests/data/authors"), help="where the fixtures go")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    COMMANDS[args.paper](args)


if __name__ == "__main__":
    main()
