"""Seeds trained as one vmapped Ensemble train exactly as they would one by one."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from iclab import ConfigError
from iclab.core.seeding import generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import TrainConfig, train
from iclab.training.ensemble import Ensemble, ensemble_loss, ensemble_sampler, member_sampler
from iclab.training.optim import clip_gradients

F64 = torch.float64
TASKS = [LinearRegression.random_rotation((1.0, 0.5, 0.25), generator=generator(s)) for s in range(3)]
SAMPLES = [functools.partial(t.sample, n=6) for t in TASKS]


def _model(seed: int, pattern: str = "full") -> LinearTransformer:
    cfg = LinearTransformerConfig(d=3, n_layers=2, n_heads=2, pattern=pattern, init_std=0.2)
    return LinearTransformer(cfg, generator=generator(100 + seed)).to(F64)


def _cfg(**kw: object) -> TrainConfig:
    base = dict(
        steps=12,
        batch_size=32,
        lr=0.02,
        optimizer="adam",
        clip=0.05,
        resample_every=5,
        eval_every=4,
        eval_batch=64,
        dtype="float64",
        progress=False,
        seed=7,
    )
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("pattern", ["full", "sparse", "pattern11"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_ensemble_equals_members_trained_alone(pattern: str, optimizer: str) -> None:
    """Adam/SGD with per-matrix clipping: every member's weights equal its solo run to 1e-10."""
    cfg = _cfg(optimizer=optimizer, momentum=0.9 if optimizer == "sgd" else 0.0)
    ens = Ensemble([_model(s, pattern) for s in range(3)])
    res = train(ens, ensemble_sampler(SAMPLES), cfg, loss_fn=ensemble_loss())
    solo = [train(_model(s, pattern), member_sampler(SAMPLES[s], s), cfg).model for s in range(3)]
    for trained, alone in zip(ens.unstack(), solo, strict=True):
        for (name, p), q in zip(trained.named_parameters(), alone.parameters(), strict=True):
            assert torch.allclose(p, q, rtol=0, atol=1e-10), name
    # The logged loss is the members' sum: finite and decreasing from its start.
    losses = [r["train_loss"] for r in res.history]
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("family", ["kernel", "bilinear"])
def test_other_model_families_run_as_an_ensemble(family: str) -> None:
    """Every model family's parameters are built out of place, so vmap can batch its members."""
    from iclab.models import BilinearTransformer, BilinearTransformerConfig, KernelTransformer, KernelTransformerConfig

    def make(s: int) -> nn.Module:
        g = generator(200 + s)
        if family == "kernel":
            cfg = KernelTransformerConfig(d=3, n_layers=2, activations=("softmax", "linear"), init_std=0.3)
            return KernelTransformer(cfg, generator=g).to(F64)
        return BilinearTransformer(BilinearTransformerConfig(d=3, d_bar=10, n_blocks=2, init_std=0.3), generator=g).to(
            F64
        )

    members = [make(s) for s in range(3)]
    ens = Ensemble(members)
    ep = ensemble_sampler(SAMPLES)(5, generator=generator(1), dtype=F64)
    with torch.no_grad():
        pred = ens.member_predict(ep)
    for s, m in enumerate(members):
        with torch.no_grad():
            assert torch.allclose(m.predict(ep[s * 5 : (s + 1) * 5]), pred[s], atol=1e-12)
    assert float(pred.abs().max()) > 1e-3


def test_member_predict_matches_unstacked_models() -> None:
    ens = Ensemble([_model(s) for s in range(3)])
    ep = ensemble_sampler(SAMPLES)(5, generator=generator(1), dtype=F64)
    pred = ens.member_predict(ep)
    assert pred.shape == (3, 5)
    for s, m in enumerate(ens.unstack()):
        assert torch.allclose(m.predict(ep[s * 5 : (s + 1) * 5]), pred[s], atol=1e-12)
    assert torch.equal(ens.predict(ep), pred.reshape(-1))


def test_stacked_vector_parameters_clip_per_member() -> None:
    """Vectors and scalars are one block per member, never one block across members."""

    class Toy(nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.v = nn.Parameter(torch.full((4,), scale, dtype=F64))
            self.c = nn.Parameter(torch.tensor(scale, dtype=F64))

    members = [Toy(0.1), Toy(10.0)]
    ens = Ensemble(members)
    for p in ens.stacked.values():
        p.grad = p.detach().clone()
    for m in members:
        for p in m.parameters():
            p.grad = p.detach().clone()
    clip_gradients(ens.stacked.values(), 1.0, "per_matrix")
    for m in members:
        clip_gradients(m.parameters(), 1.0, "per_matrix")
    assert torch.allclose(ens.stacked["v"].grad, torch.stack([m.v.grad for m in members]))
    assert torch.allclose(ens.stacked["c"].grad, torch.stack([m.c.grad for m in members]))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"optimizer": "lbfgs"}, "lbfgs"),
        ({"clip_mode": "global"}, "global"),
        ({"train_size": 64, "batch_size": 32}, "batch_size must equal train_size"),
    ],
)
def test_refuses_settings_that_couple_members(changes: dict, match: str) -> None:
    ens = Ensemble([_model(s) for s in range(2)])
    before = [p.detach().clone() for p in ens.parameters()]
    with pytest.raises(ConfigError, match=match):
        train(ens, ensemble_sampler(SAMPLES[:2]), _cfg(**changes), loss_fn=ensemble_loss())
    assert all(torch.equal(p, q) for p, q in zip(ens.parameters(), before, strict=True))


def test_rejects_mismatched_members_and_batches() -> None:
    with pytest.raises(ConfigError, match="at least one model"):
        Ensemble([])
    with pytest.raises(ConfigError, match="identical parameter shapes"):
        Ensemble([_model(0, "full"), _model(1, "sparse")])
    ens = Ensemble([_model(s) for s in range(3)])
    ep = SAMPLES[0](7, generator=generator(0), dtype=F64)
    with pytest.raises(ConfigError, match="multiple of the 3 members"):
        ens.member_predict(ep)
