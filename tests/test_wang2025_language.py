"""experiments.wang2025.language: early stopping on the validation NLL (the authors' protocol) and the reported run."""

from __future__ import annotations

import math

import pytest
import torch

from iclab.experiments import run_experiment
from iclab.experiments.wang2025.language import BestCheckpoint, LanguageConfig, evaluate_tokens
from iclab.models.language import LanguageGPT
from iclab.training import TrainConfig

V, T = 13, 8


def _windows(seed: int, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (n, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def test_best_checkpoint_keeps_the_lowest_validation_nll_and_survives_a_restart(tmp_path) -> None:
    """A worse model does not replace the best one on disk; a new BestCheckpoint on the same file (a resumed run)
    starts from the stored best; ``load_best`` restores exactly those parameters; the model's train/eval mode is
    left as it was."""
    torch.manual_seed(0)
    model = LanguageGPT(V, 8, 2, T, dropout=0.1).train()
    inputs, targets = _windows(0)
    best = BestCheckpoint(tmp_path / "best.pt", inputs, targets)
    first = best(model)
    assert model.training  # the snapshot measures in eval mode and puts the mode back
    assert math.isclose(float(first["val_nll"]), evaluate_tokens(model, inputs, targets)["nll"], rel_tol=1e-6)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.ln_out.weight.mul_(50.0)  # logits ×50: confidently wrong on random targets, a much higher NLL
    second = best(model)
    assert float(second["val_nll"]) > float(first["val_nll"]) + 1.0
    resumed = BestCheckpoint(tmp_path / "best.pt", inputs, targets)
    assert resumed.best == pytest.approx(float(first["val_nll"]))
    resumed.load_best(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in good.items())


def test_language_smoke_reports_the_early_stopped_model(tmp_path) -> None:
    """Every run reports its best validation step; the validation curve comes from eval-mode snapshots at step 0,
    every train.snapshot_every steps and the end; the paper preset keeps the protocol's 5 seeds."""
    res = run_experiment("wang2025.language", "smoke", out=tmp_path)
    cfg = res.config
    for r in res.results.runs:
        assert r.curve_steps == [0, 5, 10, 15] == list(range(0, cfg.train.steps + 1, cfg.train.snapshot_every))
        assert r.best_val_nll == min(r.curve_val_nll)
        assert r.best_step == r.curve_steps[r.curve_val_nll.index(r.best_val_nll)]
    assert LanguageConfig().seeds == 5


def test_language_config_rejects_bad_schedules() -> None:
    from iclab.core.errors import ConfigError

    with pytest.raises(ConfigError, match="LanguageConfig.train.schedule must be 'constant' or 'cosine'; got 'step'"):
        LanguageConfig(train=TrainConfig(schedule="step"))
    with pytest.raises(
        ConfigError, match=r"LanguageConfig.train.warmup_steps must be an int in \[0, train.steps = 100\)"
    ):
        LanguageConfig(train=TrainConfig(steps=100, warmup_steps=100))
    assert LanguageConfig().train.schedule == "constant"  # the authors' constant lr
    from iclab.experiments import get
    from iclab.experiments.runner import resolve_config

    with pytest.raises(ConfigError, match=r"^wang2025.language.train.schedule must be 'constant' or 'cosine'"):
        resolve_config(get("wang2025.language"), "quick", ["schedule=step"])  # the shorthand routes to train
