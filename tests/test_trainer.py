"""The shared trainer: determinism, resume, clipping, schedules, fixed sets, logging."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json

import pytest
import torch

from iclab import ConfigError
from iclab.core.seeding import derive_seed, generator
from iclab.experiments.registry import RunContext
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.tasks import LinearRegression
from iclab.training import ModelSpec, TrainConfig, TrainingRun, load_history, stop, train
from iclab.training.optim import clip_gradients, clip_groups_, lr_factor
from iclab.training.trainer import mse_loss

TASK = LinearRegression(d=3)
SAMPLE = functools.partial(TASK.sample, n=8)


def _model(seed: int = 0, pattern: str = "sparse") -> LinearTransformer:
    return LinearTransformer(
        LinearTransformerConfig(d=3, n_layers=2, pattern=pattern, init_std=0.1), generator=generator(seed)
    )


def _cfg(**kw: object) -> TrainConfig:
    base = dict(steps=30, batch_size=64, lr=0.01, eval_every=10, eval_batch=128, progress=False)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_same_seed_same_run() -> None:
    a = train(_model(), SAMPLE, _cfg())
    b = train(_model(), SAMPLE, _cfg())
    assert a.history == b.history
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_different_seed_different_data() -> None:
    a = train(_model(), SAMPLE, _cfg(seed=0))
    b = train(_model(), SAMPLE, _cfg(seed=1))
    assert a.history[0]["train_loss"] != b.history[0]["train_loss"]


def test_training_reduces_loss() -> None:
    r = train(_model(), SAMPLE, _cfg(steps=200, lr=0.05, batch_size=512))
    first, last = r.history[0]["test_loss"], r.final_test_loss
    assert last < 0.7 * first


def test_resume_is_bit_exact(tmp_path) -> None:
    cfg = _cfg(steps=40, checkpoint_every=15, resample_every=7, snapshot_every=10)
    snap = lambda m: {"A": m.A}  # noqa: E731
    full = train(_model(), SAMPLE, cfg, snapshot_fn=snap)
    # interrupt: run to step 30 via a shorter config is not the same config, so emulate a crash
    out = tmp_path / "run"
    part = train(_model(), SAMPLE, cfg, out_dir=out, snapshot_fn=snap)
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["finished"] and ck["step"] == 40
    # rewind to the step-30 checkpoint state by re-running with a crash injected
    out2 = tmp_path / "run2"

    class Crash(Exception):
        pass

    calls = {"n": 0}

    def crashing(batch: int, **kw: object):
        calls["n"] += 1
        if calls["n"] == 6:  # the batch of step 28 (after the 1-episode memory probe; resampled at 0, 7, 14, 21, 28)
            raise Crash
        return SAMPLE(batch, **kw)

    with pytest.raises(Crash):
        train(_model(), crashing, cfg, out_dir=out2, snapshot_fn=snap)
    assert torch.load(out2 / "checkpoint.pt", weights_only=True)["step"] == 15 * (28 // 15)
    resumed = train(_model(seed=5), SAMPLE, cfg, out_dir=out2, snapshot_fn=snap)
    assert resumed.resumed_from == 15
    assert resumed.history == full.history == part.history
    assert torch.equal(resumed.snapshots["A"], full.snapshots["A"])
    rows = load_history(out2)
    assert rows == [json.loads(json.dumps(r)) for r in full.history]


def test_finished_run_is_reused(tmp_path) -> None:
    cfg = _cfg(steps=10)
    train(_model(), SAMPLE, cfg, out_dir=tmp_path)
    again = train(_model(seed=3), SAMPLE, cfg, out_dir=tmp_path)
    assert again.resumed_from == 10


def test_fixed_training_set_full_batch_is_deterministic_gd() -> None:
    cfg = _cfg(optimizer="sgd", lr=0.1, train_size=64, batch_size=64, steps=20, log_every=1)
    r = train(_model(), SAMPLE, cfg)
    losses = [row["train_loss"] for row in r.history]
    assert all(b <= a + 1e-6 for a, b in itertools.pairwise(losses)), (
        "full-batch GD with a small step must not increase the loss"
    )


def test_minibatches_from_fixed_set() -> None:
    r = train(_model(), SAMPLE, _cfg(train_size=256, batch_size=32, steps=20))
    assert len(r.history) > 0


def test_lbfgs_runs_and_descends() -> None:
    r = train(
        _model(pattern="pattern11"),
        SAMPLE,
        _cfg(optimizer="lbfgs", lr=0.1, train_size=256, batch_size=256, resample_every=0, steps=20),
    )
    assert r.final_test_loss < r.history[0]["test_loss"]


def test_lbfgs_strong_wolfe_line_search_is_used_and_descends() -> None:
    from iclab.training.optim import make_optimizer

    cfg = _cfg(optimizer="lbfgs", lr=1.0, lbfgs_line_search="strong_wolfe", train_size=256, batch_size=256,
               resample_every=0, steps=10)  # fmt: skip
    model = _model(pattern="pattern11")
    opt = make_optimizer(list(model.parameters()), cfg)
    assert opt.defaults["line_search_fn"] == "strong_wolfe"
    r = train(model, SAMPLE, cfg)
    assert r.final_test_loss < r.history[0]["test_loss"]
    with pytest.raises(ConfigError, match="TrainConfig.lbfgs_line_search"):
        _cfg(lbfgs_line_search="armijo")


def test_per_matrix_clipping_clips_each_block() -> None:
    p = torch.nn.Parameter(torch.zeros(3, 2, 2))
    p.grad = torch.stack([torch.full((2, 2), 10.0), torch.full((2, 2), 0.001), torch.full((2, 2), -5.0)])
    clip_gradients([p], 0.5, "per_matrix")
    norms = torch.linalg.matrix_norm(p.grad)
    assert torch.allclose(norms, torch.tensor([0.5, 0.002, 0.5]))


def test_global_clipping() -> None:
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    p.grad, q.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    clip_gradients([p, q], 1.0, "global")
    assert torch.allclose(torch.cat([p.grad, q.grad]).norm(), torch.tensor(1.0), atol=1e-6)


def test_schedules() -> None:
    step = _cfg(schedule="step", step_every=10, step_gamma=0.5, steps=100)
    assert [lr_factor(t, step) for t in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    cos = _cfg(schedule="cosine", steps=100)
    assert lr_factor(0, cos) == 1.0 and abs(lr_factor(50, cos) - 0.5) < 1e-12 and lr_factor(100, cos) < 1e-12
    warm = _cfg(warmup_steps=4)
    assert [lr_factor(t, warm) for t in (0, 3, 4)] == [0.25, 1.0, 1.0]


def test_tensorboard_and_metrics_files(tmp_path) -> None:
    train(_model(), SAMPLE, _cfg(steps=12, tensorboard=True), out_dir=tmp_path)
    assert any((tmp_path / "tb").iterdir())
    rows = load_history(tmp_path)
    assert rows[-1]["step"] == 11 and "test_loss" in rows[-1]


def test_float64_training() -> None:
    r = train(_model(), SAMPLE, _cfg(dtype="float64", steps=5))
    assert next(r.model.parameters()).dtype == torch.float64


def test_nan_loss_is_reported(tmp_path) -> None:
    with pytest.raises(FloatingPointError, match="non-finite"):
        train(_model(), SAMPLE, _cfg(optimizer="sgd", lr=1e6, steps=50, log_every=1), out_dir=tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("steps", 0, "TrainConfig.steps must be an int >= 1; got 0"),
        ("skip_limit", 0, "TrainConfig.skip_limit must be an int >= 1; got 0"),
        ("optimizer", "adamx", "TrainConfig.optimizer must be one of"),
        ("lr", -1.0, "TrainConfig.lr must be a float > 0; got -1.0"),
        ("clip", 0.0, "TrainConfig.clip must be null or a float > 0"),
        ("train_size", 8, "TrainConfig.train_size must be null or an int >= batch_size"),
        ("schedule", "linear", "TrainConfig.schedule must be one of"),
    ],
)
def test_bad_train_config(field: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        _cfg(**{field: value})


def test_skip_nonfinite_skips_bad_batches_and_counts_them() -> None:
    """A batch with an inf label gives an inf gradient: without the option the run stops with a clear
    error; with it the step is skipped (weights untouched), counted, and training goes on."""

    def poisoned(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32):
        ep = SAMPLE(batch, generator=generator, dtype=dtype)
        if generator.initial_seed() % 3 == 0:  # some steps' batches carry an inf label
            ep.y_query[0] = float("inf")
        return ep

    cfg = _cfg(steps=20, resample_every=1, log_every=1, eval_every=0, skip_nonfinite=True)
    res = train(_model(), poisoned, cfg, test_episode=SAMPLE(64, generator=generator(9)))
    skipped = res.history[-1]["skipped_steps"]
    assert 0 < skipped < 20
    assert all(torch.isfinite(p).all() for p in res.model.parameters())
    with pytest.raises(FloatingPointError, match="non-finite"):
        train(_model(), poisoned, _cfg(steps=20, resample_every=1, log_every=1, eval_every=0))


def _poisoned_at(key: int):
    """SAMPLE, with an inf label in the training batch drawn at step ``key`` (the trainer seeds each draw)."""
    bad = derive_seed(_cfg().seed, "data", key)

    def poisoned(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32):
        ep = SAMPLE(batch, generator=generator, dtype=dtype)
        if generator.initial_seed() == bad:
            ep.y_query[0] = float("inf")
        return ep

    return poisoned


def test_skip_nonfinite_skips_a_float32_loss_that_overflows_with_finite_gradients() -> None:
    """A label of 1e20 makes the float32 squared error overflow (1e40 > 3.4e38) while each prompt's gradient
    (≈ 2·1e20/B) stays finite: the loss is inf, so the step is skipped as a non-finite gradient would be."""
    big = derive_seed(_cfg().seed, "data", 4)

    def sample(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32):
        ep = SAMPLE(batch, generator=generator, dtype=dtype)
        if generator.initial_seed() == big:
            ep.y_query[0] = 1e20
        return ep

    cfg = _cfg(steps=10, resample_every=2, log_every=1, eval_every=0, skip_nonfinite=True)
    model = _model()
    loss = mse_loss(model, sample(64, generator=generator(big)))
    loss.backward()
    assert torch.isinf(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
    res = train(_model(), sample, cfg)
    assert res.skipped_steps == 2 and all(torch.isfinite(p).all() for p in res.model.parameters())
    with pytest.raises(FloatingPointError, match=r"non-finite loss \(inf\) at step 4"):
        train(_model(), sample, dataclasses.replace(cfg, skip_nonfinite=False))


def test_a_run_that_skips_every_batch_stops_at_skip_limit(tmp_path) -> None:
    """Every batch from step 6 on overflows (the weights, not a rare batch): the run ends at the ``skip_limit``-th step
    skipped in a row, naming it, also when a checkpoint fell inside the streak and the run was resumed from it; a
    streak shorter than the limit (one bad batch of 2 steps) is skipped and training goes on."""
    first_bad = 6

    def sample(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32):
        ep = SAMPLE(batch, generator=generator, dtype=dtype)
        if generator.initial_seed() in bad:
            ep.y_query[0] = float("inf")
        return ep

    bad = {derive_seed(_cfg().seed, "data", k) for k in range(first_bad, 40, 2)}
    cfg = _cfg(steps=40, resample_every=2, log_every=1, eval_every=0, skip_nonfinite=True, skip_limit=5)
    with pytest.raises(
        FloatingPointError, match=r"5 steps in a row skipped .* at step 10 .*the weights, not a rare batch"
    ):
        train(_model(), sample, cfg)
    # stopped at step 8 (2 skipped in a row so far), resumed: the streak goes on from 2
    with pytest.raises(stop.Stopped):
        train(_model(), sample, cfg, out_dir=tmp_path, stop_when=lambda k: k == 8)
    with pytest.raises(
        FloatingPointError, match=r"5 steps in a row skipped .* at step 10 .*the weights, not a rare batch"
    ):
        train(_model(), sample, cfg, out_dir=tmp_path)
    bad = {derive_seed(_cfg().seed, "data", first_bad)}
    assert train(_model(), sample, cfg).skipped_steps == 2


def test_a_nonfinite_test_loss_is_kept_under_skip_nonfinite(caplog) -> None:
    """A test set with one prompt whose float32 error overflows: without ``skip_nonfinite`` the run stops at the first
    evaluation; with it the inf is kept in the curve with a warning and training goes on (the weights are finite)."""
    test = SAMPLE(64, generator=generator(9))
    test.y_query[0] = 1e20
    cfg = _cfg(steps=12, log_every=1, eval_every=5, skip_nonfinite=True)
    with caplog.at_level("WARNING"):
        res = train(_model(), SAMPLE, cfg, test_episode=test)
    assert [r["test_loss"] for r in res.history if "test_loss" in r] == [float("inf")] * 4  # steps 0, 5, 10, 11
    assert "non-finite test loss (inf) at step 0, kept in the curve" in caplog.text and res.skipped_steps == 0
    with pytest.raises(FloatingPointError, match=r"non-finite test loss \(inf\) at step 0"):
        train(_model(), SAMPLE, dataclasses.replace(cfg, skip_nonfinite=False), test_episode=test)


def test_a_diverged_run_resumes_from_its_checkpoint_once_it_skips_nonfinite_steps(tmp_path) -> None:
    """A run that cannot skip dies on the one batch that overflows; the same run with ``skip_nonfinite`` turned on
    resumes from the checkpoint it kept (written before that batch) and ends bit for bit where the run that skipped
    from step 0 ends. The other way round, or with any other setting changed, the checkpoint is not taken."""
    poisoned = _poisoned_at(12)  # steps 12 and 13
    base = dict(steps=20, resample_every=2, log_every=1, eval_every=0, checkpoint_every=5)
    with pytest.raises(FloatingPointError, match="skip_nonfinite"):
        train(_model(), poisoned, _cfg(**base), out_dir=tmp_path / "run")
    resumed = train(_model(), poisoned, _cfg(**base, skip_nonfinite=True), out_dir=tmp_path / "run")
    fresh = train(_model(), poisoned, _cfg(**base, skip_nonfinite=True))
    assert resumed.resumed_from == 10
    assert resumed.history[-1]["skipped_steps"] == fresh.history[-1]["skipped_steps"] == 2  # the bad batch's 2 steps
    for a, b in zip(resumed.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # the finished checkpoint of the run that skips does not continue one that cannot (it starts again and dies),
    # nor one with another lr
    with pytest.raises(FloatingPointError):
        train(_model(), poisoned, _cfg(**base), out_dir=tmp_path / "run")
    other = train(_model(), SAMPLE, _cfg(**base, lr=0.02, skip_nonfinite=True), out_dir=tmp_path / "run")
    assert other.resumed_from is None


def test_the_context_names_the_runs_that_skipped(tmp_path) -> None:
    """RunContext.execute keeps, per run that skipped steps, (skipped, steps): the runner's summary reads it."""
    cfg = _cfg(steps=20, resample_every=2, log_every=1, eval_every=0, skip_nonfinite=True)
    spec = ModelSpec(LinearTransformer, LinearTransformerConfig(d=3, n_layers=2, pattern="sparse", init_std=0.1))
    runs = [
        TrainingRun(name=n, model=spec, task=t, train=cfg) for n, t in (("bad", _poisoned_at(12)), ("good", SAMPLE))
    ]
    ctx = RunContext(out_dir=tmp_path, device=torch.device("cpu"), preset="smoke")
    results = ctx.execute(runs)
    assert [r.skipped_steps for r in results] == [2, 0]
    assert ctx.skipped == {"bad": (2, 20)}


def test_a_finite_float64_loss_beyond_float32_range_is_not_called_non_finite() -> None:
    """A float64 run whose loss exceeds float32's 3.4e38 is still finite: the trainer must not stop it."""

    def huge(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float64):
        ep = SAMPLE(batch, generator=generator, dtype=torch.float64)
        return dataclasses.replace(ep, y_query=ep.y_query * 1e25)  # squared error ~1e50

    cfg = _cfg(steps=3, log_every=1, eval_every=0, lr=1e-30, dtype="float64")
    res = train(_model().double(), huge, cfg)
    assert 1e40 < res.history[-1]["train_loss"] < float("inf")


# --- per-group clipping, the coefficient rule, masks and the post-step projection ---------------------------------


class _Masked(LinearTransformer):
    """A full-pattern LinearTransformer whose P is held at zero in its last row (a stand-in for a model whose
    parameterisation has entries the paper's pattern fixes)."""

    def projection_masks(self) -> dict[str, torch.Tensor]:
        mask = torch.zeros(1, 4, 4, dtype=torch.bool)
        mask[0, -1, :] = True
        return {f"layers.{i}.P_free": mask for i in range(len(self.layers))}


def _full(seed: int = 0, cls: type = LinearTransformer) -> LinearTransformer:
    return cls(LinearTransformerConfig(d=3, n_layers=2, pattern="full", init_std=0.1), generator=generator(seed))


def test_per_group_clips_each_layer_to_its_threshold() -> None:
    """Default groups: one per layer (P and Q together); group i to clip_thresholds[i] by c/‖g‖ (no ε)."""
    from iclab.training.trainer import clip_groups

    model = _full()
    groups = clip_groups(model)
    assert [[id(p) for p in g] for g in groups] == [[id(p) for p in layer.parameters()] for layer in model.layers]
    for g in groups:
        for p in g:
            p.grad = torch.full_like(p, 3.0)
    clip_groups_(groups, (1e-3, 100.0))
    norm0 = torch.cat([p.grad.reshape(-1) for p in groups[0]]).norm()
    assert abs(float(norm0) / 1e-3 - 1) < 1e-6  # clipped to c (float32)
    assert all(torch.equal(p.grad, torch.full_like(p, 3.0)) for p in groups[1])  # under its threshold: untouched


def test_clip_coefficient_rules() -> None:
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=torch.float64)  # norm 5
    clip_gradients([p], 1.0, "global", eps=0.5)
    assert torch.equal(p.grad, torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=torch.float64) * (1.0 / 5.5))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=torch.float64)
    clip_groups_([[p]], (1.0,), eps=0.0)
    assert torch.equal(p.grad, torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=torch.float64) * (1.0 / 5.0))
    p.grad = torch.zeros(4, dtype=torch.float64)
    clip_groups_([[p]], (1.0,))  # a zero gradient stays zero (no 0/0)
    assert torch.equal(p.grad, torch.zeros(4, dtype=torch.float64))


def test_masked_entries_in_or_out_of_the_norm() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    mask = torch.tensor([[False, False], [True, True]])
    p.grad = torch.tensor([[3.0, 4.0], [100.0, 0.0]], dtype=torch.float64)
    clip_groups_([[p]], (1.0,), masks={p: mask})  # norm 5 over the free entries
    assert torch.allclose(p.grad[0], torch.tensor([0.6, 0.8], dtype=torch.float64), rtol=0, atol=1e-15)
    p.grad = torch.tensor([[3.0, 4.0], [100.0, 0.0]], dtype=torch.float64)
    clip_groups_([[p]], (1.0,))  # norm over every entry
    assert torch.allclose(p.grad.norm(), torch.tensor(1.0, dtype=torch.float64))


def test_projection_after_step_leaves_the_first_step_the_drawn_init() -> None:
    """``after_step``: the first step's loss is the unprojected model's; ``start_and_after_step``: the projected
    one's. Both end with the masked entries at zero."""
    mask_sum = lambda m: sum(float(layer.P_free[0, -1].detach().abs().sum()) for layer in m.layers)  # noqa: E731
    raw = train(_full(cls=_Masked), SAMPLE, _cfg(steps=1, eval_every=0))
    after = train(_full(cls=_Masked), SAMPLE, _cfg(steps=3, projection="after_step", eval_every=0))
    start = train(_full(cls=_Masked), SAMPLE, _cfg(steps=3, projection="start_and_after_step", eval_every=0))
    assert after.history[0]["train_loss"] == raw.history[0]["train_loss"]
    assert start.history[0]["train_loss"] != raw.history[0]["train_loss"]
    assert mask_sum(after.model) == 0.0 and mask_sum(start.model) == 0.0


def test_clip_masked_false_leaves_masked_gradients_out() -> None:
    cfg = _cfg(steps=5, optimizer="sgd", clip=1e-3, clip_mode="per_group", clip_masked=False, projection="after_step")
    a = train(_full(cls=_Masked), SAMPLE, cfg)
    b = train(_full(cls=_Masked), SAMPLE, dataclasses.replace(cfg, clip_masked=True))
    pa, pb = (torch.cat([p.detach().reshape(-1) for p in r.model.parameters()]) for r in (a, b))
    assert not torch.equal(pa, pb)


def test_declared_clip_groups_are_used_and_checked() -> None:
    class OneGroup(LinearTransformer):
        def clip_groups(self) -> list[list[torch.nn.Parameter]]:
            return [list(self.parameters())]

    class Missing(LinearTransformer):
        def clip_groups(self) -> list[list[torch.nn.Parameter]]:
            return [list(self.layers[0].parameters())]

    train(_full(cls=OneGroup), SAMPLE, _cfg(steps=2, clip_thresholds=(1.0,), clip_mode="per_group"))
    with pytest.raises(ConfigError, match="exactly once"):
        train(_full(cls=Missing), SAMPLE, _cfg(steps=2, clip=1.0, clip_mode="per_group"))


@pytest.mark.parametrize(
    ("kw", "model_cls", "fragment"),
    [
        (dict(clip_thresholds=(1.0,), clip_mode="per_group"), LinearTransformer, "one threshold per clip group .*2"),
        (dict(projection="after_step"), LinearTransformer, "needs a model with projection_masks"),
        (dict(clip=1.0, clip_masked=False), LinearTransformer, "clip_masked false needs a model with projection_masks"),
    ],
)
def test_protocols_the_model_cannot_state_fail_before_any_work(kw: dict, model_cls: type, fragment: str) -> None:
    model = _full(cls=model_cls)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=fragment):
        train(model, SAMPLE, _cfg(steps=2, **kw))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_bad_masks_are_refused() -> None:
    class BadName(LinearTransformer):
        def projection_masks(self) -> dict[str, torch.Tensor]:
            return {"layers.0.nope": torch.zeros(1, 4, 4, dtype=torch.bool)}

    class BadShape(LinearTransformer):
        def projection_masks(self) -> dict[str, torch.Tensor]:
            return {"layers.0.P_free": torch.zeros(4, 4, dtype=torch.bool)}

    with pytest.raises(ConfigError, match="not a parameter"):
        train(_full(cls=BadName), SAMPLE, _cfg(steps=1, projection="after_step"))
    with pytest.raises(ConfigError, match=r"bool tensor of shape \(1, 4, 4\)"):
        train(_full(cls=BadShape), SAMPLE, _cfg(steps=1, projection="after_step"))


def test_an_ensemble_refuses_per_group_clipping() -> None:
    from iclab.training.ensemble import Ensemble, ensemble_loss, ensemble_sampler

    ens = Ensemble([_model(0), _model(1)])
    with pytest.raises(ConfigError, match="mix the ensemble's members"):
        train(ens, ensemble_sampler([SAMPLE, SAMPLE]), _cfg(steps=1, clip=1.0, clip_mode="per_group"),
              loss_fn=ensemble_loss())  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        (dict(clip_thresholds=(1.0,)), "clip_mode must be 'per_group' when clip_thresholds is set"),
        (dict(clip_thresholds=(1.0,), clip_mode="per_group", clip=1.0), "clip must be null when clip_thresholds"),
        (dict(clip_thresholds=(), clip_mode="per_group"), "clip_thresholds must be null or a non-empty tuple"),
        (dict(clip_thresholds=(0.0,), clip_mode="per_group"), "clip_thresholds must be null or a non-empty tuple"),
        (dict(clip=1.0, clip_eps=-1.0), "clip_eps must be null or a float >= 0"),
        (dict(clip_masked=False), "clip_masked must be true when no clip is set"),
        (dict(projection="before"), "projection must be one of"),
        (dict(clip_mode="per_layer"), "clip_mode must be one of"),
    ],
)
def test_bad_clip_rules(kw: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _cfg(**kw)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_the_foreach_optimiser_gives_the_bits_of_the_per_tensor_loop(optimizer, monkeypatch) -> None:
    """make_optimizer's foreach Adam / AdamW: the same run, bit for bit, as torch's per-tensor loop (its CPU default)."""
    from iclab.training import optim, trainer

    cfg = _cfg(optimizer=optimizer, weight_decay=0.01, betas=(0.99, 0.9), schedule="cosine", warmup_steps=5)
    fast = train(_model(), SAMPLE, cfg)
    per_tensor = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer]

    def loop(params, c):  # type: ignore[no-untyped-def]
        kw = dict(lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay, foreach=False)
        return per_tensor(params, **kw)

    monkeypatch.setattr(trainer, "make_optimizer", loop)
    monkeypatch.setattr(optim, "make_optimizer", loop)
    slow = train(_model(), SAMPLE, cfg)
    assert fast.history == slow.history
    for p, q in zip(fast.model.parameters(), slow.model.parameters(), strict=True):
        assert torch.equal(p, q)
