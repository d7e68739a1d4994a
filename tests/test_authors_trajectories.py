"""iclab's trainer equals the authors' own training loops, step for step.

Each fixture in tests/data/authors/ was written by ``scripts/authors_fixtures.py <paper>``, which runs one paper's
published training loop (imported from the authors' repository, pinned in the fixture's ``meta``) for one small
configuration in float64: the initial weights, every batch, the loss of every step and the final weights. Each test
builds the iclab model from those weights, trains it with :func:`iclab.training.train` on the same batches
(:class:`iclab.training.GivenBatches`) under a ``TrainConfig`` that states the authors' protocol, and asserts the loss
curve and the final weights to 1e-10 relative. Remake a fixture with the authors' repositories at hand:

    python scripts/authors_fixtures.py cheng2024 --peers /tmp/peers --out tests/data/authors/
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from iclab.core.episode import Episode
from iclab.core.io import safe_torch_load
from iclab.models.linear_attention import LinearAttention, LinearTransformer, LinearTransformerConfig
from iclab.training import GivenBatches, TrainConfig, train

DATA = Path(__file__).parent / "data" / "authors"
RTOL = 1e-10


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: the relative gap of a whole curve or weight tensor."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def test_cheng2024_authors_trajectory_exp_softmax_n14_L3() -> None:
    """Cheng, Chen, Sra 2024, ``run_exp`` (transformer-functional-gradient): softmax attention on K^exp data, n = 14,
    L = 3, batch 16, 200 steps. Their ``Transformer_F`` is :class:`MaskedKernelTransformer` (full P = V, Q, K, the
    Asm. 2.1/4.4 entries masked, every head / n), trained by :func:`authors_train`: AdamW (0.9, 0.9) at lr 0.1,
    layer i's whole gradient clipped to 10⁻⁸/(9 − i)² by c/‖g‖, ``zero_row_col`` after every step. Their batch k
    serves the steps listed in ``batch_of_step`` (a new batch after every step t with t % 10 == 0)."""
    from iclab.experiments.cheng2024._protocols import MaskedKernelTransformer, authors_train
    from iclab.models import KernelTransformerConfig

    fx = safe_torch_load(DATA / "cheng2024_exp_softmax_n14_L3.pt")
    c = fx["meta"]["config"]
    d, n, L = c["d"], c["n"], c["n_layers"]
    cfg = KernelTransformerConfig(
        d=d, n_layers=L, activations=(c["activation"],), value="full", qk="full", divide_by_n=True, init_std=0.0
    )
    model = MaskedKernelTransformer(cfg).double()
    init = fx["init"]  # (L, 1, 3, D, D): P, Q, K
    model.load_matrices(V=init[:, :, 0], Q=init[:, :, 1], K=init[:, :, 2])
    Z, yq = fx["Z"], fx["y_query"]  # (K, B, n+1, D), (K, B)
    batches = [
        Episode(x=Z[k, :, :n, :d], y=Z[k, :, :n, d], x_query=Z[k, :, n, :d], y_query=yq[k]) for k in range(len(Z))
    ]
    steps = len(fx["loss"])
    train_cfg = authors_train(
        steps=steps,
        batch_size=Z.shape[1],
        resample_every=1,
        dtype="float64",
        eval_every=0,
        log_every=1,
        checkpoint_every=0,
        progress=False,
    )
    assert train_cfg.lr == c["lr"] and list(train_cfg.betas) == c["betas"]
    result = train(model, GivenBatches([batches[k] for k in fx["batch_of_step"]]), train_cfg)
    losses = torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64)
    assert len(losses) == steps
    assert _rel(losses, torch.tensor(fx["loss"], dtype=torch.float64)) < RTOL
    final = torch.stack([model.V, model.Q, model.K], dim=2)  # (L, H, 3, D, D), their layout
    assert _rel(final, fx["final"]) < RTOL
    free = fx["final"] != 0  # the entries zero_row_col leaves free
    assert float((fx["final"] - init)[free].abs().max()) > 1e-2  # they moved: not a comparison of two starts


def test_cheng2024_protocol_authors_is_a_config_choice(tmp_path: Path) -> None:
    """``cheng2024.<card> protocol=authors`` trains every model with the authors' loop (the model and config of the
    trajectory test above); the default presets are untouched (tests/data/smoke_claims.json)."""
    from iclab.experiments import run_experiment
    from iclab.experiments.cheng2024._protocols import AUTHORS_CLIP, MaskedKernelTransformer
    from iclab.experiments.cheng2024._setup import model_job
    from iclab.experiments.registry import get
    from iclab.experiments.runner import resolve_config

    cfg = resolve_config(get("cheng2024.fig3"), "smoke", ["protocol=authors"])
    job = model_job(cfg, seed=0, kernel="exp", activations=("softmax",), n=cfg.n, n_layers=3, name="x", value="label")
    spec, train_cfg = job.run.model, job.run.train
    assert spec.cls is MaskedKernelTransformer and spec.kwargs == {"pattern": "label"}
    assert spec.config.divide_by_n and spec.config.exp_logit_cap is None
    assert (train_cfg.optimizer, train_cfg.lr, train_cfg.betas, train_cfg.clip_thresholds) == (
        "adamw", 0.1, (0.9, 0.9), AUTHORS_CLIP
    )  # fmt: skip
    assert (train_cfg.steps, train_cfg.batch_size) == (cfg.train.steps, cfg.train.batch_size)  # the preset's budget
    model = spec.build(torch.Generator().manual_seed(0))
    masks = model.projection_masks()
    assert not masks["layers.0.V_free"][0, -1, -1] and masks["layers.0.V_free"][0, :-1].all()  # A ≡ 0: only r free
    result = run_experiment("cheng2024.fig3", "smoke", out=tmp_path, overrides=["protocol=authors"])
    assert result.claims


@pytest.mark.parametrize("mode", ["gd", "free"])
def test_wang2025_authors_trajectory_softmax_k1(mode: str) -> None:
    """Wang et al. 2025 (icl_attention_categorical, ``experiments_torch``): the §6.1 task with N = 20, one block,
    softmax kernel, L = 64 fixed contexts in 2 unshuffled minibatches of 32, 200 updates of their ``train_loop``.

    Their ``TransformerGDInterleaved`` is the GD model with ``scale_param='logit'`` (their ``kernel_param`` c,
    softmax(c x_jᵀx_i/√D)), their ``TransformerInterleaved`` the free model with ``attn_logit_scale = 1/√D`` (their
    scaled dot product) and ``cross_key_dim = D`` (their D-wide cross-attention W_Q^c, W_K^c); both learn all C
    columns of W_e (``zero_last_class=False``). The TrainConfig is the paper preset's (``run_train_config``: Adam /
    AdamW β = (0.9, 0.98), lr 1e-3 from the authors' table) with ``clip=None``: their PyTorch loop does not clip,
    the preset clips the global norm to 1 (docs/errata.md, Wang et al., "Gradient clipping")."""
    import dataclasses
    import math

    from iclab.experiments.wang2025._setup import CatSetup, ce_loss, run_train_config
    from iclab.models.categorical_attention import CategoricalTransformer, CategoricalTransformerConfig

    fx = safe_torch_load(DATA / "wang2025_softmax_k1.pt")
    c, run = fx["meta"]["config"], fx["runs"]["gd" if mode == "gd" else "tf"]
    d, dp, n, mb = c["d"], c["d_embed"], c["n"], c["minibatch"]
    D = d + 3 * dp
    kw = {"scale_param": "logit"} if mode == "gd" else {"cross_key_dim": D}
    cfg = CategoricalTransformerConfig(d=d, d_embed=dp, num_classes=c["num_classes"], n_blocks=c["n_blocks"],
                                       kernel=c["kernel"], mode=mode, zero_last_class=False,  # type: ignore[arg-type]
                                       attn_logit_scale=1 / math.sqrt(D), **kw)  # fmt: skip
    model = CategoricalTransformer(cfg).double()
    init, final = run["init"], run["final"]
    names = {"W_Q_1": "W_Q", "W_K_1": "W_K", "W_V_1": "W_V", "P_1": "P"}  # (layer, head, ·, ·): paper orientation
    cross = {"W_Q_2": "W_Qc", "W_K_2": "W_Kc", "W_V_2": "W_Vc", "P_2": "Pc"}  # (layer, 1, ·, ·)

    def ours(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Their parameters under our names (block 0)."""
        if mode == "gd":
            return {"alpha": theirs["alpha"], "scale": theirs["kernel_param"][0], "W_e": theirs["embedding_matrix"]}
        out = {f"blocks.0.{v}": theirs[k][0] for k, v in names.items()}
        out.update({f"blocks.0.{v}": theirs[k][0, 0] for k, v in cross.items()})
        return {**out, "W_e": theirs["embedding_matrix"]}

    def weights() -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        return {k: model.W_e if k == "W_e" else params[k] for k in ours(init)}

    with torch.no_grad():
        model.set_embeddings(init["embedding_matrix"])
        for k, v in ours(init).items():
            if k != "W_e":
                weights()[k].copy_(v)
    x, labels = fx["x"], fx["labels"]  # (L, N+1, d), (L, N+1): the query last
    chunks = [
        Episode(x=x[i : i + mb, :n], x_query=x[i : i + mb, n], labels=labels[i : i + mb, :n], label_query=labels[i : i + mb, n])
        for i in range(0, c["L"], mb)
    ]  # fmt: skip
    steps = c["updates"]
    preset = run_train_config(CatSetup(), model, mode, c["L"], steps=steps)
    assert (preset.lr, preset.schedule == "constant" or preset.step_every > steps) == (c["lr"], True)
    assert preset.optimizer == ("adam" if mode == "gd" else "adamw") and preset.weight_decay == 0
    assert preset.betas == ((0.9, 0.999) if mode == "gd" else (0.9, 0.98))
    train_cfg = dataclasses.replace(preset, clip=None, train_size=None, batch_size=mb, dtype="float64",
                                    eval_every=0, snapshot_every=0, checkpoint_every=0, log_every=1, progress=False)  # fmt: skip
    batches = [chunks[t % len(chunks)] for t in range(steps)]  # their unshuffled DataLoader, pass after pass
    result = train(model, GivenBatches(batches), train_cfg, loss_fn=ce_loss)
    losses = torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64)
    assert len(losses) == steps
    assert _rel(losses, torch.tensor(run["loss"], dtype=torch.float64)) < RTOL
    for k, v in ours(final).items():
        assert _rel(weights()[k], v) < RTOL, k
        assert _rel(weights()[k], ours(init)[k]) > 1e-4, k  # it moved: not a comparison of two starts


def _ahn_batches(fx: dict) -> list[Episode]:
    """The fixture's batches (their Z: tokens as rows, [x, y], the query last with label slot 0) as Episodes."""
    Z, yq = fx["Z"], fx["y_query"]  # (K, B, N+1, d+1), (K, B)
    n, d = Z.shape[2] - 1, Z.shape[3] - 1
    return [Episode(x=Z[k, :, :n, :d], y=Z[k, :, :n, d], x_query=Z[k, :, n, :d], y_query=yq[k]) for k in range(len(Z))]


def _ahn_train(model: torch.nn.Module, preset: TrainConfig, fx: dict, c: dict) -> list[float]:
    """Train ``model`` on the fixture's batches by the card's ``preset`` at the fixture's size, in float64; the loss
    of every step."""
    import dataclasses

    assert (preset.optimizer, preset.weight_decay, preset.clip_mode, preset.schedule) == (
        "adamw",
        0.0,
        "per_matrix",
        "step",
    )
    assert (preset.lr, list(preset.betas), preset.clip) == (c["lr"], c["betas"], c["clip_r"])
    assert (preset.resample_every, preset.step_every, preset.step_gamma) == (c["resample_every"], c["halve_every"], 0.5)
    cfg = dataclasses.replace(preset, steps=c["steps"], batch_size=c["batch"], dtype="float64", eval_every=0,
                              snapshot_every=0, checkpoint_every=0, log_every=1, progress=False)  # fmt: skip
    result = train(model, GivenBatches(_ahn_batches(fx)), cfg)
    return [r["train_loss"] for r in result.history]


def _ahn_pattern11(fx: dict, c: dict, allparam: torch.Tensor) -> LinearTransformer:
    """Their ``Transformer_F`` as the pattern-(11) :class:`LinearTransformer`: their P is B, their Q is Aᵀ (their
    scores z_targetᵀ Q z_source are the paper's z_sourceᵀ Q z_target: their Z is the paper's Zᵀ), the read-out
    −[Z_L]_{d+1,n+1} as their ``in_context_loss`` (output + y)."""
    cfg = LinearTransformerConfig(d=c["d"], n_layers=c["n_layers"], pattern="pattern11", init_std=0.0)
    return LinearTransformer(cfg).double().load_matrices(A=allparam[:, :, 1].transpose(-1, -2), B=allparam[:, :, 0])


def _ahn_final(model: LinearTransformer) -> torch.Tensor:
    """The model's weights in their ``allparam`` layout (L, 1, 2, d, d)."""
    return torch.stack([model.B, model.A.transpose(-1, -2)], dim=2)


def _ahn_pattern11_trajectory(name: str, preset: TrainConfig) -> None:
    """Train the pattern-(11) model from the fixture's start on its batches by ``preset``; assert equal to theirs."""
    fx = safe_torch_load(DATA / name)
    c = fx["meta"]["config"]
    model = _ahn_pattern11(fx, c, fx["init"])
    losses = _ahn_train(model, preset, fx, c)
    assert len(losses) == c["steps"]
    assert _rel(torch.tensor(losses, dtype=torch.float64), torch.tensor(fx["loss"], dtype=torch.float64)) < RTOL
    assert _rel(_ahn_final(model), fx["final"]) < RTOL
    assert _rel(fx["final"], fx["init"]) > 1e-2  # they moved: not a comparison of two starts


def test_ahn2023_authors_trajectory_variable_n_N4() -> None:
    """Ahn et al. 2023 (LinearTransformer), the training cell of variable_N_exp.ipynb (Fig. 6) at N = 4, L = 3, 8
    prompts, a new batch every step, 200 steps: their ``Transformer_F`` (pattern 11), AdamW β = (0.99, 0.99), their
    per-matrix ``clip_and_step`` (0.001), lr 0.001 by their rule for N < 5. The TrainConfig is the card's paper
    preset for that N, ``Fig6Config().train_for(4, 3)``, at the fixture's size."""
    from iclab.experiments.ahn2023.fig6 import Fig6Config

    preset = Fig6Config().train_for(4, 3)
    assert preset.lr == 0.001 and Fig6Config().train_for(6, 3).lr == 0.01  # the notebook's rule
    _ahn_pattern11_trajectory("ahn2023_variable_n_N4.pt", preset)


def test_ahn2023_authors_trajectory_variable_l_L4() -> None:
    """Ahn et al. 2023, the training cell of variable_L_exp.ipynb (Fig. 7) at L = 4, N = 20, 64 prompts, a new batch
    every 100 steps, 300 steps: AdamW β = (0.99, 0.9), lr 0.01, per-matrix clip 0.01. The TrainConfig is the
    card's paper preset ``Fig7Config().train`` at the fixture's size."""
    from iclab.experiments.ahn2023.fig7 import Fig7Config

    _ahn_pattern11_trajectory("ahn2023_variable_l_L4.pt", Fig7Config().train)


def test_ahn2023_authors_trajectory_fig1_p0() -> None:
    """Ahn et al. 2023, rotation demonstration-Adam-p0.ipynb (Figs 1-2: P = 0, i.e. pattern (8)), 64 prompts, 300
    steps, the card's paper preset (AdamW (0.99, 0.9), lr 0.02, clip 0.01, a new batch every 100 steps).

    Their notebook draws P at random (std 1e-4) and zeroes it (``zero_p``) after every step, so its first step sees
    the random P; iclab's pattern (8) holds P = 0 from the start. With ``zero_p`` also before step 0 (run
    ``zero_start``, the one rule changed in their loop) the two are equal to 1e-10; the notebook's own run
    (``published``) differs from it by the measured gap asserted below (docs/errata.md, Ahn et al.)."""
    from iclab.experiments.ahn2023.fig1 import Fig1Config

    fx = safe_torch_load(DATA / "ahn2023_fig1_p0.pt")
    c, run, published = fx["meta"]["config"], fx["runs"]["zero_start"], fx["runs"]["published"]
    assert float(run["init"][:, :, 0].abs().max()) == 0  # P = 0 before step 0
    model = LinearTransformer(
        LinearTransformerConfig(d=c["d"], n_layers=c["n_layers"], pattern="sparse", init_std=0.0)
    ).double()
    model.load_matrices(A=-run["init"][:, :, 1].transpose(-1, -2))  # eq. (8): Q = −[[A, 0], [0, 0]]; theirs is Qᵀ
    losses = torch.tensor(_ahn_train(model, Fig1Config().train, fx, c), dtype=torch.float64)
    theirs = torch.tensor(run["loss"], dtype=torch.float64)
    assert _rel(losses, theirs) < RTOL
    assert _rel(-model.A.transpose(-1, -2), run["final"][:, :, 1]) < RTOL
    assert _rel(run["final"][:, :, 1], run["init"][:, :, 1]) > 1e-2
    gap = _rel(theirs, torch.tensor(published["loss"], dtype=torch.float64))
    assert 1e-9 < gap < 1e-5  # the notebook's random P at step 0: a small, nonzero effect on the loss curve


def test_zhang2025_authors_trajectory_softmax_separate_H5() -> None:
    """Zhang et al. 2025 (linattn-icl), their ``train.train`` on the token route of Fig. 5's ATTN_S: softmax
    attention, separate rank-one key and query, H = 5, D = 4, 32 tokens (the query last, a source too), no
    residual, no 1/N (softmax), read-out +ŷ; full-batch SGD at lr 0.02 on P = 256 sequences, 300 epochs.

    Their ``value.weight`` rows h·(D+1) … are P_h, ``key.weight`` / ``query.weight`` rows h·R … are W_K,h / W_Q,h (iclab's
    score c_iᵀ W_Kᵀ W_Q z_j is their q_j · k_i). The model is the card's :func:`token_spec`; the TrainConfig the card's
    ``sgd`` at the fixture's lr on the one fixed batch."""
    import dataclasses

    from iclab.experiments.zhang2025._setup import token_spec
    from iclab.experiments.zhang2025.fig5 import Fig5Config

    fx = safe_torch_load(DATA / "zhang2025_softmax_separate_H5.pt")
    c = fx["meta"]["config"]
    d, H, R, T = c["d"], c["heads"], c["rank"], c["tokens"]
    spec = token_spec(d, H, key_query="separate", activation="softmax", init_std=0.0)
    model = cast(LinearTransformer, spec.build(torch.Generator().manual_seed(0))).double()

    def ours(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Their weights as iclab's stacked (L = 1, H, ·, ·) P, W_K, W_Q."""
        return {
            "P": theirs["value.weight"].reshape(1, H, d + 1, d + 1),
            "W_K": theirs["key.weight"].reshape(1, H, R, d + 1),
            "W_Q": theirs["query.weight"].reshape(1, H, R, d + 1),
        }

    model.load_matrices(**ours(fx["init"]))
    x, yq = fx["x"], fx["y"][:, 0]  # (P, T, D+1), (P,)
    n = T - 1
    batch = Episode(x=x[:, :n, :d], y=x[:, :n, d], x_query=x[:, n, :d], y_query=yq)
    preset = Fig5Config().train
    assert (preset.optimizer, preset.momentum, preset.weight_decay, preset.lr) == ("sgd", 0.0, 0.0, c["lr"])
    assert not preset.clipping and preset.schedule == "constant"
    cfg = dataclasses.replace(preset, steps=c["epochs"], batch_size=c["P"], resample_every=0, dtype="float64",
                              eval_every=0, checkpoint_every=0, log_every=1, progress=False)  # fmt: skip
    result = train(model, GivenBatches([batch]), cfg)
    losses = torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64)
    assert len(losses) == c["epochs"]
    assert _rel(losses, torch.tensor(fx["loss"], dtype=torch.float64)) < RTOL
    layer = cast(LinearAttention, model.layers[0])
    mine = {"P": model.P, "W_K": layer.W_K.unsqueeze(0), "W_Q": layer.W_Q.unsqueeze(0)}
    for k, v in ours(fx["final"]).items():
        assert _rel(mine[k], v) < RTOL, k
        assert _rel(v, ours(fx["init"])[k]) > 1e-2, k  # it moved
