"""sun2025.linear_depth (Prop. 1 at every depth) and sun2025.order_ablation (the Sec. 2.2 remark on the block order)
run at smoke and check their claims; the sun2025 configs reject bad values; every claim function passes on good
synthetic rows and fails on bad ones."""

from __future__ import annotations

import math

import pytest
import torch

import iclab
from iclab import models, tasks
from iclab.core.seeding import generator
from iclab.experiments import get, run_experiment
from iclab.experiments.registry import RunContext
from iclab.experiments.runner import resolve_config
from iclab.experiments.sun2025._setup import BilinearSetup, ModelRow, bilinear_run, loss_vs_length, paper_train
from iclab.experiments.sun2025.constructions import ConstructionsConfig
from iclab.experiments.sun2025.fig1 import Fig1Config, Fig1Results, Fig1Tolerances
from iclab.experiments.sun2025.fig1 import claims as claims_fig1
from iclab.experiments.sun2025.fig2 import Fig2Config, Fig2Results
from iclab.experiments.sun2025.fig2 import claims as claims_fig2
from iclab.experiments.sun2025.fig3 import Fig3Config
from iclab.experiments.sun2025.fig4 import Fig4Config, Fig4Results
from iclab.experiments.sun2025.fig4 import claims as claims_fig4
from iclab.experiments.sun2025.linear_depth import LinearDepthConfig, LinearDepthResults, affine_oracle_gap
from iclab.experiments.sun2025.linear_depth import claims as claims_linear_depth
from iclab.experiments.sun2025.order_ablation import (
    OrderAblationConfig,
    OrderAblationResults,
    OrderAblationTolerances,
    depths,
)
from iclab.experiments.sun2025.order_ablation import claims as claims_order_ablation
from iclab.experiments.sun2025.theorem5 import Theorem5Config, Theorem5Results, Theorem5Row
from iclab.experiments.sun2025.theorem5 import claims as claims_theorem5
from iclab.models.bilinear import BilinearTransformer, BilinearTransformerConfig
from iclab.theory import polynomial_features as pf
from iclab.theory.preconditioned_gd import mc_loss


def _claims(res) -> dict[str, object]:
    return {c.name: c for c in res.claims}


def test_linear_depth_smoke_runs_and_checks_the_floor(tmp_path) -> None:
    res = run_experiment("sun2025.linear_depth", "smoke", out=tmp_path)
    claims = _claims(res)
    assert set(claims) == {"no_depth_below_affine_floor", "every_depth_reaches_one_layer_optimum"}
    assert res.figures and all(f.is_file() and f.stat().st_size > 1000 for f in res.figures)
    assert claims["no_depth_below_affine_floor"].expected == f">= {pf.affine_floor(2):.4g}"  # d(d+3)/2 = 5 at d = 2
    for c in res.claims:
        assert math.isfinite(float(c.measured))
    # smoke trains 6 steps: the loss sits near E[y²] = 1 + 4d + d(d−1)/2 = 10, far above the floor 5
    assert claims["no_depth_below_affine_floor"].passed
    # ... and far above the one-layer optimum: reported as not checked, never passed by a loose tolerance
    assert claims["every_depth_reaches_one_layer_optimum"].status == "not checked"


def test_order_ablation_smoke_runs_and_builds_both_orders(tmp_path) -> None:
    res = run_experiment("sun2025.order_ablation", "smoke", out=tmp_path)
    claims = _claims(res)
    assert set(claims) == {"attention_first_between_depths_L2", "both_orders_below_linear_floor_L2"}
    assert res.figures and all(f.is_file() and f.stat().st_size > 1000 for f in res.figures)
    assert claims["attention_first_between_depths_L2"].passed  # the real slack 1.1: the three are barely trained
    assert claims["both_orders_below_linear_floor_L2"].status == "not checked"
    assert {p.name for p in res.out_dir.glob("d2-*")} == {
        "d2-ffn_first-L1-n20-seed0",  # the sandwich's lower depth
        "d2-ffn_first-L2-n20-seed0",
        "d2-attention_first-L2-n20-seed0",
    }


def _model_row(model: str, losses: list[float], ses: list[float], **fields: object) -> ModelRow:
    """A synthetic :class:`ModelRow`: test losses (and standard errors) at every test length, no training curves."""
    empty = torch.zeros(0)
    base: dict[str, object] = dict(d=3, seed=0, n_train=50, steps=empty, test_loss=empty, snap_steps=empty,
                                   block_loss=torch.zeros(1, 1))  # fmt: skip
    return ModelRow(model=model, length_loss=torch.tensor(losses), length_se=torch.tensor(ses), **{**base, **fields})


def _row(model: str, loss: float, se: float, seed: int = 0, floor: float = 9.0) -> ModelRow:
    return _model_row(model, [loss], [se], seed=seed, floor_gap=(loss - floor, se))


def test_linear_depth_claims_fail_below_the_floor_and_when_untrained() -> None:
    cfg = LinearDepthConfig(seeds=1, n=50, depths=(1, 3), test_ns=(50,))
    base = {"floor": 9.0, "one_layer": 10.419, "affine_ls": (9.8, 0.1)}
    ok = claims_linear_depth(LinearDepthResults(**base, rows=[_row("L1", 10.3, 0.1), _row("L3", 9.9, 0.1)]), cfg)
    assert all(c.passed for c in ok), ok
    below = claims_linear_depth(LinearDepthResults(**base, rows=[_row("L1", 10.3, 0.1), _row("L3", 8.5, 0.1)]), cfg)
    assert not below[0].passed and below[0].measured == pytest.approx(8.8)  # 8.5 + 3σ < 9
    untrained = claims_linear_depth(LinearDepthResults(**base, rows=[_row("L1", 15.0, 0.1), _row("L3", 9.9, 0.1)]), cfg)
    assert untrained[0].passed and not untrained[1].passed


def test_affine_oracle_gap_of_the_zero_predictor_is_zero_loss_minus_floor() -> None:
    """The oracle φ(x_q)ᵀΛ⁻¹Rw has mean error = the Prop.-1 floor, so for ŷ = 0: E[y²] − floor = 10 − 5 (d = 2)."""
    cfg = LinearDepthConfig(d=2, d_bar=4, n=10)
    zero = models.BilinearTransformer(models.BilinearTransformerConfig(d=2, d_bar=4, n_blocks=1, ffn="none", init="identity"))  # fmt: skip
    gap, se = affine_oracle_gap(zero, cfg, 40_000, seed=0)
    assert 0 < se < 0.2
    assert abs(gap - (tasks.quadratic(2).zero_predictor_loss() - pf.affine_floor(2))) < 4 * se, (gap, se)


def test_order_ablation_claims_check_the_depth_sandwich_and_the_floor() -> None:
    """The Sec. 2.2 remark as the paper states it: FFN-first(L) <= attention-first(L) <= FFN-first(L − 1), each within
    the slack; the equal-depth ratio is reported, not judged."""
    cfg = OrderAblationConfig(seeds=1, n=50, blocks=(2,), test_ns=(50,), tol=OrderAblationTolerances(slack=1.1))

    def rows(ffn: float, attn: float, ffn_below: float = 8.0) -> OrderAblationResults:
        losses = {"ffn_first-L1": ffn_below, "ffn_first-L2": ffn, "attention_first-L2": attn}
        return OrderAblationResults(rows=[_row(label, loss, 0.01) for label, loss in losses.items()], floor=9.0)

    between = claims_order_ablation(rows(2.0, 6.0), cfg)  # 3x apart at equal depth, yet inside the sandwich
    assert [c.passed for c in between] == [True, True] and between[0].measured == pytest.approx(0.75)
    assert "equal-depth ratio 3" in between[0].detail
    assert claims_order_ablation(rows(2.0, 1.9), cfg)[0].measured == pytest.approx(2.0 / 1.9)  # within the slack
    assert not claims_order_ablation(rows(2.0, 1.5), cfg)[0].passed  # attention-first beats the paper's order: > 1.1
    assert not claims_order_ablation(rows(2.0, 8.9), cfg)[0].passed  # attention-first worse than one block less
    above = claims_order_ablation(rows(2.0, 9.5, 20.0), cfg)
    assert not above[1].passed
    one = OrderAblationConfig(seeds=1, n=50, blocks=(1,), test_ns=(50,))  # L = 1: only the lower side
    solo = claims_order_ablation(OrderAblationResults(rows=[_row("ffn_first-L1", 5.0, 0.01), _row("attention_first-L1", 6.0, 0.01)], floor=9.0), one)  # fmt: skip
    assert solo[0].passed and solo[0].measured == pytest.approx(5.0 / 6.0)
    only_ffn = OrderAblationConfig(seeds=1, n=50, blocks=(2,), test_ns=(50,), orders=("ffn_first",))
    assert depths(only_ffn, "ffn_first") == (2,)  # one order: nothing to compare, no extra depth
    assert [c.name for c in claims_order_ablation(OrderAblationResults(rows=[_row("ffn_first-L2", 2.0, 0.01)], floor=9.0), only_ffn)] == ["both_orders_below_linear_floor_L2"]  # fmt: skip
    assert depths(OrderAblationConfig(blocks=(2, 4)), "ffn_first") == (1, 2, 3, 4)
    assert depths(OrderAblationConfig(blocks=(2, 4)), "attention_first") == (2, 4)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_the_two_orders_nest_within_one_block(L: int) -> None:
    """The paper's 'does not affect the expressive power', exactly (float64, 1e-10): a zero FFN (W = 0) and a zero
    attention (P = 0) are the identity, and the FFN never writes the label, so every attention-first(L) model is an
    FFN-first(L) model (its first FFN zero, its blocks shifted) and every FFN-first(L − 1) model is an
    attention-first(L) model (its first attention zero)."""
    task = tasks.quadratic(2)
    ep = task.sample(32, 12, generator=iclab.generator(0), dtype=torch.float64)

    def make(order: str, n_blocks: int, seed: int) -> models.BilinearTransformer:
        cfg = models.BilinearTransformerConfig(d=2, d_bar=7, n_blocks=n_blocks, order=order, init_std=0.3)
        return models.BilinearTransformer(cfg, generator=iclab.generator(seed)).double()

    attn_first, ffn_first = make("attention_first", L, 1), make("ffn_first", L, 2)
    with torch.no_grad():
        ffn_first.ffn[0].W0_free.zero_()
        for k in range(L):
            ffn_first.attn[k].load_state_dict(attn_first.attn[k].state_dict())
            if k + 1 < L:
                ffn_first.ffn[k + 1].load_state_dict(attn_first.ffn[k].state_dict())
    torch.testing.assert_close(ffn_first.predict(ep), attn_first.predict(ep), rtol=1e-10, atol=1e-10)
    if L > 1:
        shallow, deep = make("ffn_first", L - 1, 3), make("attention_first", L, 4)
        with torch.no_grad():
            deep.attn[0].P_free.zero_()
            for k in range(L - 1):
                deep.ffn[k].load_state_dict(shallow.ffn[k].state_dict())
                deep.attn[k + 1].load_state_dict(shallow.attn[k].state_dict())
        torch.testing.assert_close(deep.predict(ep), shallow.predict(ep), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(make("ffn_first", L, 5).predict(ep), attn_first.predict(ep))  # not the same by accident


def test_attention_first_last_ffn_never_reaches_the_read_out() -> None:
    """The FFN masks the label row (eq. 3), so in LSA → FFN blocks the final FFN cannot change ŷ: at equal L the
    attention-first model has one useful FFN fewer (why the orders nest within one block, not at equal depth)."""
    task = tasks.quadratic(2)
    ep = task.sample(16, 10, generator=iclab.generator(0), dtype=torch.float64)
    cfg = models.BilinearTransformerConfig(d=2, d_bar=7, n_blocks=2, order="attention_first", init_std=0.3)
    model = models.BilinearTransformer(cfg, generator=iclab.generator(1)).double()
    before = model.predict(ep)
    with torch.no_grad():
        model.ffn[-1].W0_free.normal_(generator=iclab.generator(2))
        model.ffn[0].W0_free.normal_(generator=iclab.generator(3))
    after_first = model.predict(ep)
    assert not torch.allclose(after_first, before)  # the first FFN matters ...
    with torch.no_grad():
        model.ffn[-1].W0_free.mul_(5.0)
    torch.testing.assert_close(model.predict(ep), after_first, rtol=1e-12, atol=1e-12)  # ... the last one does not


# --------------------------------------------------------------------------------------------
# Config validation (every bad value is rejected before any model trains)


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (BilinearSetup, dict(n=0), r"BilinearSetup\.n must be an int >= 1 .*got 0"),
        (BilinearSetup, dict(d=0), r"BilinearSetup\.d must be an int >= 1; got 0"),
        (BilinearSetup, dict(seeds=0), r"BilinearSetup\.seeds must be an int >= 1; got 0"),
        (
            BilinearSetup,
            dict(test_ns=(0,)),
            r"BilinearSetup\.test_ns must be a tuple of at least 1 distinct int\(s\) >= 1; got \(0,\)",
        ),
        (BilinearSetup, dict(test_ns=()), r"BilinearSetup\.test_ns must be"),
        (BilinearSetup, dict(test_batch=1), r"BilinearSetup\.test_batch must be an int >= 2"),
        (BilinearSetup, dict(d=3, d_bar=3), r"BilinearSetup\.d_bar must be an int >= 4 for d = 3.*got 3"),
        (Fig1Config, dict(ds=(3, 12)), r"Fig1Config\.d_bar must be an int >= 13 for d = 12.*got 12"),
        (Fig1Config, dict(ds=()), r"Fig1Config\.ds must be"),
        (Fig1Config, dict(ds=(3, 3)), r"Fig1Config\.ds must be a tuple of at least 1 distinct"),
        (Fig1Config, dict(blocks=(0, 2)), r"Fig1Config\.blocks must be .*got \(0, 2\)"),
        (Fig1Config, dict(test_ns=(0,)), r"Fig1Config\.test_ns must be"),
        (Fig1Tolerances, dict(margin=0.0), r"Fig1Tolerances\.margin must be a float > 0"),
        (Fig2Config, dict(d_bar=5), r"Fig2Config\.d_bar must be an int >= 6 for d = 4"),  # sparse FFNs: d + 2
        (Fig2Config, dict(variants=("dense", "linear")), r"Fig2Config\.variants must be"),
        (Fig3Config, dict(d=4, d_bar=14), r"Fig3Config\.d_bar must be an int >= C\(d\+2, 2\) = 15"),
        (Fig3Config, dict(ns=(25,)), r"Fig3Config\.ns must be a tuple of at least 2"),
        (Fig4Config, dict(n_trains=(0, 100)), r"Fig4Config\.n_trains must be .*got \(0, 100\)"),
        (Fig4Config, dict(n=0), r"Fig4Config\.n must be"),
        (Theorem5Config, dict(n=0), r"Theorem5Config\.n must be"),
        (ConstructionsConfig, dict(ds=(0, 3)), r"ConstructionsConfig\.ds must be"),
        (ConstructionsConfig, dict(prompts=1), r"ConstructionsConfig\.prompts must be an int >= 2"),
        (LinearDepthConfig, dict(depths=()), r"LinearDepthConfig\.depths must be"),
        (OrderAblationConfig, dict(blocks=(0,)), r"OrderAblationConfig\.blocks must be"),
        (OrderAblationConfig, dict(orders=("ffn_first", "sideways")), r"OrderAblationConfig\.orders must be"),
    ],
)
def test_sun2025_configs_reject_bad_values(cls: type, kwargs: dict, match: str) -> None:
    with pytest.raises(iclab.ConfigError, match=match):
        cls(**kwargs)


def test_a_bad_tolerance_or_training_value_is_refused_under_the_cards_name() -> None:
    with pytest.raises(iclab.ConfigError, match=r"^sun2025\.fig1\.tol\.margin must be a float > 0; got 0\.0$"):
        resolve_config(get("sun2025.fig1"), "quick", ["margin=0"])
    with pytest.raises(iclab.ConfigError, match=r"^sun2025\.theorem5\.train\.lr must be a float > 0"):
        resolve_config(get("sun2025.theorem5"), "quick", ["lr=-1"])
    cfg = resolve_config(get("sun2025.linear_depth"), "quick")  # flat preset keys land in the nested configs
    assert (cfg.train.lr, cfg.train.eps, cfg.train.snapshot_every, cfg.tol.gap_tol) == (3e-3, 1e-3, 0, 1.5)


def test_sun2025_configs_accept_what_the_models_accept() -> None:
    Fig2Config(variants=("dense",), d_bar=5)  # a dense FFN needs d̄ >= d + 1 only
    Theorem5Config(d=12)  # the Thm-5 model is built with d̄ = C(d+2, 2), not d_bar
    Fig1Config(ds=(3, 11), d_bar=12)


def test_an_explicit_n_is_never_replaced_by_the_config(tmp_path) -> None:
    # tiny training settings: were n = 0 replaced by cfg.n (the old ``n or cfg.n``), this would train one step and pass
    train = paper_train(steps=1, batch_size=4, eval_batch=4, eval_every=1, snapshot_every=0)
    cfg = BilinearSetup(d=2, d_bar=4, n=20, subnet_batch=4, train=train)
    ctx = RunContext(out_dir=tmp_path, device=torch.device("cpu"), preset="smoke")
    mcfg = models.BilinearTransformerConfig(d=2, d_bar=4, n_blocks=1)
    with pytest.raises(iclab.ConfigError, match=r"PolynomialRegression\.n must be an int >= 1.*got 0"):
        ctx.train(bilinear_run(cfg, ctx.device, seed=0, task=tasks.quadratic(2), model_cfg=mcfg, name="n0", n=0))
    # the same run with n = 20 trains (its own run directory, the sub-network losses snapshotted at steps 0 and 1)
    res = ctx.train(bilinear_run(cfg, ctx.device, seed=0, task=tasks.quadratic(2), model_cfg=mcfg, name="n20"))
    assert (tmp_path / "n20").is_dir() and res.snapshot_steps == [0, 1] and res.snapshots["block_loss"].shape == (2, 2)


# --------------------------------------------------------------------------------------------
# Claim functions on synthetic results: each passes on good rows and fails on bad ones (no training)

FIG1_CFG = Fig1Config(seeds=2, n=50, ds=(3, 4), blocks=(1, 2, 4), linear_layers=3, test_ns=(25, 50))
#: (d, model) -> (loss at n_test = 25, loss at n_test = n = 50, standard error): every fig-1 claim passes.
FIG1_GOOD = {
    (3, "linear"): (10.5, 9.8, 0.1), (3, "L1"): (9.0, 5.0, 0.05), (3, "L2"): (50.0, 1.0, 0.01), (3, "L4"): (1.0, 5e-4, 1e-6),
    (4, "linear"): (15.5, 14.5, 0.1), (4, "L1"): (9.0, 3.0, 0.05), (4, "L2"): (60.0, 2.0, 0.02), (4, "L4"): (5.0, 0.5, 0.01),
}  # fmt: skip


def _fig1_results(**changes: tuple[float, float, float]) -> Fig1Results:
    """Rows for FIG1_CFG; ``changes`` maps 'd3_L4' to new (short, at_n, se). Seed 1 sits 1e-5 above seed 0."""
    table = dict(FIG1_GOOD)
    for key, value in changes.items():
        d, model = key.split("_")
        table[(int(d[1:]), model)] = value
    rows = []
    for (d, model), (short, at_n, se) in table.items():
        for seed in range(FIG1_CFG.seeds):
            L = 0 if model == "linear" else int(model[1:])
            sub = torch.linspace(20.0, at_n, L + 1, dtype=torch.float64).unsqueeze(0)  # ℓ-block losses decrease in ℓ
            rows.append(_model_row(model, [short, at_n + 1e-5 * seed], [se, se], d=d, seed=seed, block_loss=sub))
    return Fig1Results(rows=rows, least_squares={})


def _failed(claims: list) -> set[str]:
    return {c.name for c in claims if not c.passed}


def test_fig1_claims_pass_on_good_rows() -> None:
    claims = {c.name: c for c in claims_fig1(_fig1_results(), FIG1_CFG)}
    assert {"deep_models_beat_single_block_bound_d4", "single_block_above_bound_d4", "converged_L4_d3"} <= set(claims)
    assert all(c.passed for c in claims.values()), [c for c in claims.values() if not c.passed]
    assert claims["deep_models_beat_single_block_bound_d4"].measured == pytest.approx(2.0, abs=1e-4)  # max over L >= 2
    assert claims["single_block_above_bound_d4"].measured == pytest.approx(3.15)  # L = 1: loss + 3σ
    assert "std over seeds 7.07e-06" in claims["converged_L4_d3"].detail


@pytest.mark.parametrize(
    ("changes", "fails"),
    [
        (dict(d3_linear=(10.0, 8.5, 0.1)), {"linear_tf_above_affine_floor_d3"}),  # below Prop. 1's floor 9
        (dict(d3_L2=(50.0, 4.6, 0.01)), {"bilinear_below_linear_floor_d3"}),  # above 0.5 × 9
        (dict(d4_L2=(60.0, 0.4, 0.01)), {"depth_helps_d4"}),  # L = 2 better than L = 4: a depth inversion
        # one deep model above the bound fails the claim although the best one (L = 4) is below it
        (dict(d4_L2=(60.0, 2.5, 0.01)), {"deep_models_beat_single_block_bound_d4"}),
        (dict(d4_L1=(9.0, 2.1, 0.05)), {"single_block_above_bound_d4"}),  # one block below 2.298
        (dict(d3_L4=(1.0, 5e-3, 1e-5)), {"converged_L4_d3"}),  # L = 4 not converged (Fig. 9)
        (dict(d3_L2=(0.5, 1.0, 0.01)), {"short_prompts_are_worse_d3"}),  # shorter prompts better
    ],
)
def test_fig1_claims_fail_on_bad_rows(changes: dict, fails: set[str]) -> None:
    assert _failed(claims_fig1(_fig1_results(**changes), FIG1_CFG)) == fails


def test_fig1_claims_sub_networks_and_optional_checks() -> None:
    res = _fig1_results()
    for r in res.rows:
        if r.d == 3 and r.model != "linear":
            r.block_loss = r.block_loss.flip(-1)  # ℓ-block losses increase in ℓ
    assert _failed(claims_fig1(res, FIG1_CFG)) == {"subnetwork_loss_decreases_with_l_d3"}
    cfg = Fig1Config(seeds=2, n=50, ds=(3, 4), blocks=(2, 4), test_ns=(25, 50))  # no L = 1
    rows = [r for r in _fig1_results().rows if r.model != "L1"]
    names = {c.name for c in claims_fig1(Fig1Results(rows=rows, least_squares={}), cfg)}
    assert "deep_models_beat_single_block_bound_d4" in names and "single_block_above_bound_d4" not in names
    cfg = Fig1Config(seeds=2, n=50, ds=(3,), blocks=(1, 2), test_ns=(25, 50))  # the quick preset's shape
    rows = [r for r in _fig1_results().rows if r.d == 3 and r.model != "L4"]
    names = {c.name for c in claims_fig1(Fig1Results(rows=rows, least_squares={}), cfg)}
    assert not names & {"converged_L4_d3", "deep_models_beat_single_block_bound_d4", "single_block_above_bound_d4"}


FIG2_CFG = Fig2Config(seeds=1, n=50, test_ns=(50,))


def _fig2_results(**losses: float) -> Fig2Results:
    base = {"dense": 1.2, "sparse": 2.8, "sparse_strict": 2.9, "linear": 5.6}
    return Fig2Results(rows=[_row(m, v, 0.05) for m, v in {**base, **losses}.items()])


def test_fig2_claims_pass_on_good_rows_and_fail_on_bad_ones() -> None:
    good = claims_fig2(_fig2_results(), FIG2_CFG)
    assert len(good) == 5 and all(c.passed for c in good), good
    # dense worse than sparse (also above the quadratic floor 2)
    assert _failed(claims_fig2(_fig2_results(dense=3.0), FIG2_CFG)) == {"dense_beats_sparse", "dense_below_quadratic_floor_2"}  # fmt: skip
    assert _failed(claims_fig2(_fig2_results(dense=2.1), FIG2_CFG)) == {"dense_below_quadratic_floor_2"}
    assert _failed(claims_fig2(_fig2_results(sparse=6.0), FIG2_CFG)) == {"sparse_beats_linear"}
    assert _failed(claims_fig2(_fig2_results(linear=4.5), FIG2_CFG)) == {"linear_above_floor_5"}  # below 5
    assert _failed(claims_fig2(_fig2_results(sparse_strict=1.5), FIG2_CFG)) == {"strict_sparse_above_quadratic_floor_2"}  # fmt: skip


FIG4_CFG = Fig4Config(seeds=1, n_trains=(25, 100), test_ns=(10, 25, 100))


def _fig4_results(losses: dict[int, tuple[float, float, float]]) -> Fig4Results:
    return Fig4Results(
        rows=[_model_row(f"n_train={n}", list(v), [0.01] * len(v), n_train=n) for n, v in losses.items()]
    )


def test_fig4_claims_check_both_halves_of_the_crossing() -> None:
    good = {25: (50.0, 8.0, 7.62), 100: (1e5, 20.0, 6.0)}  # losses at n_test = 10, 25, 100
    claims = claims_fig4(_fig4_results(good), FIG4_CFG)
    assert [c.name for c in claims] == [
        "longer_training_prompts_win_on_long_tests",
        "short_tests_degrade_for_long_training_prompts",
        "longer_training_prompts_lose_on_short_tests",
    ]
    assert all(c.passed for c in claims) and claims[2].measured == pytest.approx(2000.0)
    no_cross = {25: (50.0, 8.0, 7.62), 100: (30.0, 20.0, 6.0)}  # n_train = 100 also better at n_test = 10
    assert _failed(claims_fig4(_fig4_results(no_cross), FIG4_CFG)) == {"longer_training_prompts_lose_on_short_tests"}
    long_loses = {25: (50.0, 8.0, 5.0), 100: (1e5, 20.0, 6.0)}
    assert _failed(claims_fig4(_fig4_results(long_loses), FIG4_CFG)) == {"longer_training_prompts_win_on_long_tests"}
    one = Fig4Config(seeds=1, n_trains=(100,), test_ns=(10, 25, 100))  # no second n_train: no crossing checks
    assert [c.name for c in claims_fig4(_fig4_results({100: good[100]}), one)] == ["short_tests_degrade_for_long_training_prompts"]  # fmt: skip


def test_an_exploding_bilinear_model_has_an_infinite_length_loss_not_nan() -> None:
    """The bilinear transformer is a polynomial: a nan error is an overflow (inf − inf in the stack), so the test-length
    loss reports inf (the paper preset's 6-block models gave nan at n_test = 25 and failed short_prompts_are_worse on it)."""
    torch.manual_seed(0)
    model = BilinearTransformer(BilinearTransformerConfig(d=2, d_bar=7, n_blocks=4))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(30.0)  # four squarings of a 30x input overflow float64
    task = tasks.PolynomialRegression(d=2, monomials="quadratic")
    assert math.isnan(mc_loss(model.double(), task, 5, 64, generator=generator(0))[0])
    assert loss_vs_length(model, task, (5,), 64, seed=0) == [(math.inf, math.inf)]
    model.load_state_dict({k: v / 30.0 for k, v in model.state_dict().items()})  # a sane model: finite loss
    assert all(math.isfinite(m) for m, _ in loss_vs_length(model, task, (5, 20), 64, seed=0))
    assert next(model.parameters()).dtype == torch.float32  # handed back in float32, as the trainer holds it


def test_fig4_claims_take_an_overflowed_short_prompt_loss_as_the_larger() -> None:
    """The paper preset's 4-block models explode on prompts far below their training length (in a reduced run: mean
    loss inf in float64 at n_test = 25 for every n_train): inf counts as above any finite loss, both-inf moves the
    crossing to the next test length shorter than both training lengths, and an inf on the wrong side fails."""
    inf = math.inf
    cfg = Fig4Config(seeds=1, n_trains=(25, 100), test_ns=(5, 10, 25, 100))  # losses at n_test = 5, 10, 25, 100
    both_then_long = {25: (inf, 50.0, 8.0, 7.62), 100: (inf, inf, 20.0, 6.0)}
    claims = {c.name: c for c in claims_fig4(_fig4_results(both_then_long), cfg)}
    assert all(c.passed for c in claims.values()), claims
    assert claims["short_tests_degrade_for_long_training_prompts"].measured == inf
    assert "n_test = 10" in claims["longer_training_prompts_lose_on_short_tests"].detail
    wrong_side = {25: (inf, inf, 8.0, 7.62), 100: (inf, 1e3, 20.0, 6.0)}  # the short-trained model explodes first
    assert _failed(claims_fig4(_fig4_results(wrong_side), cfg)) == {"longer_training_prompts_lose_on_short_tests"}
    all_inf = {25: (inf, inf, 8.0, 7.62), 100: (inf, inf, 20.0, 6.0)}  # no comparable length below both: undecided
    failed = {c.name: c for c in claims_fig4(_fig4_results(all_inf), cfg) if not c.passed}
    assert set(failed) == {"longer_training_prompts_lose_on_short_tests"}
    assert "overflowed (inf) at every n_test in [5, 10]" in failed["longer_training_prompts_lose_on_short_tests"].detail
    nan_short = {25: (50.0, 8.0, 8.0, 7.62), 100: (math.nan, 1e5, 20.0, 6.0)}  # nan is never a measurement
    assert "short_tests_degrade_for_long_training_prompts" in _failed(claims_fig4(_fig4_results(nan_short), cfg))


def _theorem5_results(scale: float, off: float) -> tuple[Theorem5Results, Theorem5Config]:
    cfg = Theorem5Config(d=2, n=50)
    st = pf.quadratic_stats(2)
    g_star = pf.optimal_gamma(cfg.n, st)
    gamma = scale * g_star
    loss = pf.one_block_loss(gamma, cfg.n, st)
    row = Theorem5Row(seed=0, gamma=gamma, off_pattern=off, exact_loss=loss, steps=torch.zeros(0), test_loss=torch.zeros(0))  # fmt: skip
    opt = pf.one_block_loss(g_star, cfg.n, st)
    return Theorem5Results(rows=[row], gamma_star=g_star, optimal_loss=opt, construction_loss=pf.construction_constant(2) / cfg.n), cfg  # fmt: skip


def test_theorem5_claims_pass_near_gamma_star_and_fail_far_from_it() -> None:
    good = claims_theorem5(*_theorem5_results(1.02, 1e-3))
    assert all(c.passed for c in good), good
    assert _failed(claims_theorem5(*_theorem5_results(1.02, 0.05))) == {"attention_is_5_sparse"}
    far = claims_theorem5(*_theorem5_results(0.5, 1e-3))  # Γ = Γ*/2: 50 % off, and a higher loss
    assert _failed(far) == {"learned_loss_reaches_L_gamma_star", "learned_gamma_is_gamma_star"}
    res, cfg = _theorem5_results(1.0, 1e-3)
    res.rows[0].exact_loss = 0.9 * res.optimal_loss  # below the optimum: impossible, flagged
    assert _failed(claims_theorem5(res, cfg)) == {"learned_loss_reaches_L_gamma_star"}
