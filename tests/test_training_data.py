"""Data sources told the step: GivenBatches trains on the batches given, resumes, and refuses what it cannot serve."""

from __future__ import annotations

import functools

import pytest
import torch

from iclab import ConfigError
from iclab.core.seeding import derive_seed, generator
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import GivenBatches, ModelSpec, StepSource, TrainConfig, TrainingRun, train

TASK = LinearRegression(d=3)
SAMPLE = functools.partial(TASK.sample, n=8)


def _model() -> LinearTransformer:
    return LinearTransformer(LinearTransformerConfig(d=3, n_layers=2, init_std=0.1), generator=generator(0))


def _cfg(**kw: object) -> TrainConfig:
    base = dict(steps=12, batch_size=16, lr=0.01, eval_every=4, eval_batch=32, progress=False, log_every=1)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _batches(k: int, batch: int = 16, dtype: torch.dtype = torch.float32) -> list:
    return [SAMPLE(batch, generator=generator(100 + i), dtype=dtype) for i in range(k)]


def test_given_batches_equal_the_sampler_s_own_batches() -> None:
    """GivenBatches of exactly the batches the trainer would draw reproduces the sampled run bit for bit."""
    cfg = _cfg(resample_every=3)
    drawn = [
        SAMPLE(cfg.batch_size, generator=generator(derive_seed(cfg.seed, "data", t)), dtype=torch.float32)
        for t in range(0, cfg.steps, 3)
    ]
    test = SAMPLE(cfg.eval_batch, generator=generator(derive_seed(cfg.seed, "test")), dtype=torch.float32)
    a = train(_model(), SAMPLE, cfg)
    b = train(_model(), GivenBatches(drawn), cfg, test_episode=test)
    assert a.history == b.history
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_step_t_reads_batch_t_over_resample_every() -> None:
    seen: list[int] = []
    batches = _batches(4)

    def loss(model: torch.nn.Module, ep) -> torch.Tensor:  # type: ignore[no-untyped-def]
        if ep.batch_size == 16 and model.training:
            seen.append(next(i for i, b in enumerate(batches) if torch.equal(b.x, ep.x)))
        return (model.predict(ep) - ep.y_query).pow(2).mean()

    train(_model(), GivenBatches(batches), _cfg(steps=8, resample_every=2, eval_every=0), loss_fn=loss)
    assert seen[:8] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert isinstance(GivenBatches(batches), StepSource)


def test_given_batches_are_cast_to_the_config_dtype() -> None:
    r = train(_model(), GivenBatches(_batches(3, dtype=torch.float32)), _cfg(steps=3, dtype="float64"))
    assert all(p.dtype == torch.float64 for p in r.model.parameters())


def test_resume_reads_the_same_batches(tmp_path) -> None:
    cfg = _cfg(steps=12, checkpoint_every=5)
    batches = _batches(12)
    full = train(_model(), GivenBatches(batches), cfg)

    class Crash(Exception):
        pass

    class Crashing(GivenBatches):
        def at(self, step: int, config: TrainConfig):  # type: ignore[no-untyped-def]
            if step == 8:
                raise Crash
            return super().at(step, config)

    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(_model(), Crashing(batches), cfg, out_dir=out)
    resumed = train(_model(), GivenBatches(batches), cfg, out_dir=out)
    assert resumed.resumed_from == 5
    assert resumed.history == full.history
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_training_run_takes_given_batches() -> None:
    run = TrainingRun(
        name="given",
        model=ModelSpec(LinearTransformer, LinearTransformerConfig(d=3, n_layers=2)),
        task=GivenBatches(_batches(4)),
        train=_cfg(steps=4),
    )
    assert len(run.execute().history) == 4


@pytest.mark.parametrize(
    ("episodes", "fragment"),
    [
        ([], "at least one Episode"),
        ("abc", "sequence of Episodes"),
        ([1], r"episodes\[0\] must be an Episode"),
    ],
)
def test_bad_given_batches(episodes: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        GivenBatches(episodes)  # type: ignore[arg-type]


def test_batches_of_different_shapes_are_refused() -> None:
    b = _batches(2)
    other = functools.partial(TASK.sample, n=5)(16, generator=generator(0))
    with pytest.raises(ConfigError, match=r"episodes\[2\] must have the shape"):
        GivenBatches([*b, other])


@pytest.mark.parametrize(
    ("cfg", "fragment"),
    [
        (dict(steps=5), "holds 4 batches; TrainConfig\\(steps=5\\) reads 5"),
        (dict(steps=13, resample_every=3), "reads 5"),
        (dict(batch_size=8), "batch_size must equal the given batches' size 16"),
        (dict(train_size=32), "train_size must be null"),
    ],
)
def test_configs_the_batches_cannot_serve_fail_before_any_work(cfg: dict, fragment: str) -> None:
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=fragment):
        train(model, GivenBatches(_batches(4)), _cfg(**cfg))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_enough_batches_with_resample_every() -> None:
    GivenBatches(_batches(4)).check(_cfg(steps=12, resample_every=3))
    GivenBatches(_batches(1)).check(_cfg(steps=12, resample_every=0))


def test_given_batches_is_not_a_sampler() -> None:
    with pytest.raises(TypeError, match="read by step"):
        GivenBatches(_batches(1))(16, generator=generator(0))
