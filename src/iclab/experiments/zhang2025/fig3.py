"""Zhang et al. 2025, Fig. 3 (Sec. 4.2, App. D.8): ATTN_S with rank-one key and query (D = 4, N = 31, H = 5,
λ = (.4, .3, .2, .1), six seeds) learns the eigenvectors of Λ one at a time. The loss falls through D plateaus at the
levels L(M_m) of eq. (19) (a); head m's key aligns with e_m (c: keys in the eigenbasis, k_i·e_d, in the middle of each
plateau); its value weight rises as the ODE (21) to v* = (λ_m/a_m)^{1/3} (eq. 20a; b: seed 0, the ODE pinned at each
head's 50 % time, dashed); ‖k_i‖² − ‖q_i‖² and ‖k_i‖² − v_i² are conserved (eq. 83); later drops vary more over seeds
(eq. 77).

    iclab run zhang2025.fig3 --preset quick

Claims:

- plateau_levels_eq19: max |L − L(M_m)| over the detected plateaus <= 1e-4 (population flow; 0.01 at finite P).
- final_loss_is_L_MD: max over seeds of |L(end) − L(M_D)| <= 1e-6 (population flow; 0.01 at finite P).
- all_D_drops: every seed completes the D drops.
- eigenvectors_learned_in_descending_order: every seed's heads, in the order their v_i grew, align with e_1..e_D.
- keys_align_with_eigenvectors: min |cos(k_i, e_m)| of the learned heads at the end >= 0.95.
- value_weights_reach_eq20a: max |v_i / v*_m − 1| at the end <= 0.02.
- rise_time_matches_ode21_last_drop: |25→90 % rise time of the head learning e_D / the ODE (21)'s − 1| <= 0.05.
- rise_time_matches_ode21_median: the median of |10→90 % rise time / the ODE's − 1| over all learned heads <= 0.1.
- conservation_law_eq83: drift of ‖k_i‖² − ‖q_i‖², ‖k_i‖² − v_i² relative to max v_i² <= 1e-3.
- later_drops_vary_more: std over seeds of t_D / std of t_1 >= 1.

Time on 2 CPU cores: quick 9-23 s; paper (full-batch GD on P = 80 000, 60 001 steps, t/τ = 24 000) 24 s, 10/10.

What did not match: the ODE (21) holds for the last drop only; during the first drops several heads grow along the
same eigenvector, so the leading head rises 5-20 % slower (worst 2.9× at 10→90 %): the median over heads is checked
at 10 % (docs/papers/zhang2025.md).

``dynamics=all_blocks`` (``iclab run zhang2025.fig3 --preset quick dynamics=all_blocks``): every block trains by
full-batch GD on the ``train_size`` sequences of each seed (the scalar keys and the vector v_i start at zero and
move, App. G), whatever ``regime`` says (in the population limit they stay at zero). The claims that change:

- conservation_law_eq83 becomes conservation_law_full_blocks: ‖k̃_i‖² − ‖q_i‖², ‖k̃_i‖² − ‖ṽ_i‖² with the scalar key
  in k̃_i and the vector v_i in ṽ_i (eq. 83's law on the full weights) drift <= 1e-3 of max v_i².
- keys_align_with_eigenvectors >= 0.95 − ε and value_weights_reach_eq20a <= 0.02 + ε, ε the largest over seeds of
  the set's odd-in-w moments relative to the even ones
  (:func:`~iclab.experiments.zhang2025._setup.odd_moment_ratio`): the blocks that ε drives share the work of k_i
  and v_i at first order in ε.
- plateau_levels_eq19 and final_loss_is_L_MD at the finite-P tolerance 0.01 at least (the population loss of
  weights fitted to P sequences).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from iclab.experiments.registry import ClaimResult, RunContext, card, check
from iclab.experiments.zhang2025._setup import (
    F64,
    Curves,
    Setup,
    covariance,
    finite,
    loss_panel,
    odd_moment_ratio,
    reduced_spec,
    sgd,
    train_batched,
    training_sets,
)
from iclab.experiments.zhang2025._staircase import (
    POPULATION,
    SMOKE_STAIRS,
    RankRun,
    StaircaseConfig,
    StaircaseResults,
    StaircaseTolerances,
    claims_staircase,
    run_staircase,
    staircase_stats,
)
from iclab.models.reduced_attention import SeparateAttention
from iclab.plotting import heatmap, save, subplots
from iclab.theory import attention_dynamics as ad
from iclab.training import TrainConfig


@dataclass(frozen=True, kw_only=True)
class Fig3Tolerances(StaircaseTolerances):
    align_lo: float = 0.95  # |cos(k_i, e_m)| of the head that learned e_m
    value_rtol: float = 0.02  # |v_i| → (λ_i/a_i)^{1/3} (eq. 20a)
    rise_rtol: float = 0.05  # 10→90 % rise time of v_i vs the ODE (21)
    conservation_hi: float = 1e-3  # drift of ‖k_i‖² − ‖q_i‖², ‖k_i‖² − v_i² relative to max v_i²
    finite_atol: float = 0.01  # dynamics='all_blocks': plateau levels and final loss at least this loose (finite P)


@dataclass(frozen=True, kw_only=True)
class Fig3Config(StaircaseConfig):
    keep_keys: bool = True
    claim_rank_rule: bool = False
    claim_heads: bool = False
    # the paper gives no step count; at 20 001 steps (8000 τ) one of six seeds still sits on the third plateau
    train: TrainConfig = field(default_factory=lambda: sgd(lr=0.2, steps=60_001))
    tol: Fig3Tolerances = field(default_factory=Fig3Tolerances)
    all_blocks_claims: ClassVar[bool] = True


@dataclass
class Fig3Results(StaircaseResults):
    """With ``dynamics='all_blocks'``: ε of each seed's training set (:func:`odd_moment_ratio`)."""

    odd_ratio: list[float] = field(default_factory=list)


def run(cfg: Fig3Config, ctx: RunContext) -> StaircaseResults:
    """The reduced staircase run, or with ``dynamics='all_blocks'`` the same rank-one ATTN_S with every block
    trained on each seed's P sequences (v, k, q and the blocks k_scalar, v_vec kept)."""
    if not cfg.all_blocks:
        return run_staircase(cfg, ctx)
    Lam = covariance(cfg)
    levels = ad.plateau_losses(Lam, 1 / cfg.n)
    spec = reduced_spec(SeparateAttention, cfg, n_heads=cfg.n_heads, rank=1, w_init=cfg.w_init)
    r = train_batched(ctx, cfg, spec, Lam, name="R1", tag="R1", train=cfg.train, init_key=("init", "separate", 1))
    eps = [odd_moment_ratio(ep) for ep in training_sets(cfg, Lam, "R1", cfg.seeds)]
    run1 = RankRun(R=1, time=r.time, loss=r.loss, train_loss=r.train_loss, params=r.params)
    return Fig3Results(Lambda=Lam, levels=levels, runs=[run1], odd_ratio=eps)


@dataclass
class LearnedHead:
    """A rank-1 head that grew: the eigen-index it learned, its alignment, final |v_i|, v*, λ, a and the
    10/25/50/90 % crossing times of |v_i|/v*."""

    head: int
    eig: int
    align: float
    v: float
    vstar: float
    lam: float
    a: float
    t10: float
    t25: float
    t50: float
    t90: float


def learned_heads(run: Curves, Lam: Tensor, cfg: Setup, seed: int) -> list[LearnedHead]:
    """Rank-1 heads of ``seed`` that grew, in the order they grew: eigen-index learned (argmax |cos(k_i, e_d)|
    at the end), alignment, final |v_i|, and the 10/50/90 % crossing times of |v_i|/v*_d."""
    lam, _ = ad.spectrum(Lam)
    a = ad.second_moment_eigenvalues(Lam, 1 / cfg.n)
    t, v, k = run.time, run.params["v"][seed].abs(), run.params["k"][seed][..., 0, :]  # (T,), (T, H), (T, H, D)
    align = ad.key_alignment(k[-1], Lam)  # (H, D)
    out = []
    for h in range(v.shape[-1]):
        d_ = int(align[h].argmax())
        lam_d, a_d = float(lam[d_]), float(a[d_])
        vs = ad.value_fixed_point(lam_d, a_d)
        if v[-1, h] < 0.5 * vs:
            continue
        cross = ad.crossing_times(t, -v[:, h], -torch.tensor([0.1, 0.25, 0.5, 0.9], dtype=F64) * vs)
        out.append(LearnedHead(h, d_, float(align[h, d_]), float(v[-1, h]), vs, lam_d, a_d, *map(float, cross)))
    return sorted(out, key=lambda e: finite(e.t50))


def plot(results: StaircaseResults, cfg: Fig3Config, out: Path) -> list[Path]:
    Lam, levels = results.Lambda, results.levels
    run = results.runs[0]
    fig, axes = subplots(1, 2)
    loss_panel(axes[0, 0], run.time, run.loss, levels, "(a) loss, dashed: eq. (19)")
    ax = axes[0, 1]
    t = run.time
    v = run.params["v"][0].abs()
    for h in range(v.shape[-1]):
        ax.plot(t.numpy(), v[:, h].numpy(), lw=1.2)
    for e in learned_heads(run, Lam, cfg, 0):
        if math.isfinite(e.t50):
            ode = ad.value_ode_solve((t - e.t50).clamp(min=-e.t50), e.vstar / 2, e.lam, e.a)
            ax.plot(t.numpy(), ode.numpy(), "k--", lw=0.8)
    ax.set_xlabel("t / τ")
    ax.set_ylabel("|v_i|")
    ax.set_title("(b) value weights (seed 0), dashed: ODE (21)", fontsize=9)
    f_ab = save(fig, out / "fig3ab.png")
    st = staircase_stats(run, Lam, cfg)
    _, E = ad.spectrum(Lam)
    starts = torch.cat([torch.zeros(1, dtype=F64), torch.nan_to_num(st.drops[0], nan=float(t[-1]))])
    ends = torch.cat([starts[1:], t[-1:]])
    moments = ((starts + ends) / 2).tolist()
    fig, axes = subplots(1, len(moments), size=(2.4, 2.4))
    for j, tm in enumerate(moments):
        i = min(int(torch.searchsorted(t, torch.tensor(tm, dtype=F64))), t.numel() - 1)
        k = run.params["k"][0, i, :, 0, :]  # (H, D)
        heatmap(axes[0, j], k @ E, title=f"plateau {j}: k_i·e_d (t={tm:.0f})")
    return [f_ab, save(fig, out / "fig3c.png")]


def _conservation(run: Curves, cfg: Fig3Config) -> ClaimResult:
    """Eq. (83)'s law: in the reduced variables, or with ``dynamics='all_blocks'`` on the full weights."""
    p = run.params
    model = SeparateAttention(cfg.d, cfg.n_heads, w_init=0.0, all_blocks=cfg.all_blocks)
    cons = model.conserved_quantities({k: p[k] for k in model.names})  # (S, T, H, 1), (S, T, H)
    kq, kv = cons["key_query"], cons["key_value"]
    scale = float(p["v"].pow(2).max())
    drift = max(float((kq - kq[:, :1]).abs().max()), float((kv - kv[:, :1]).abs().max())) / scale
    if cfg.all_blocks:
        return check(
            "conservation_law_full_blocks",
            drift,
            hi=cfg.tol.conservation_hi,
            detail="max |Q(t) − Q(0)| / max v_i² for Q = ‖k̃_i‖² − ‖q_i‖², ‖k̃_i‖² − ‖ṽ_i‖², k̃_i = [k_i; scalar "
            "key], ṽ_i = [vector v_i, v_i]: eq. (83) on the full weights (ŷ_q is unchanged by k̃ → αk̃, q → q/α "
            "and by k̃ → k̃/α, ṽ → αṽ), conserved by gradient flow; the reduced pair drifts as the blocks grow",
            smoke="lr 0.5 for 200 steps: the Euler drift is of the order of the still tiny max v_i²",
        )
    return check(
        "conservation_law_eq83",
        drift,
        hi=cfg.tol.conservation_hi,
        detail="max |Q(t) − Q(0)| / max v_i² for Q = ‖k_i‖² − ‖q_i‖², ‖k_i‖² − v_i²",
        smoke="lr 0.5 for 200 steps: the Euler drift is 3e-3 of the still tiny max v_i²",
    )


def claims(results: StaircaseResults, cfg: Fig3Config) -> list[ClaimResult]:
    Lam, tol = results.Lambda, cfg.tol
    run = results.runs[0]
    D, S = cfg.d, run.loss.shape[0]
    eps, why = 0.0, ""
    if cfg.all_blocks:  # finite P: the population loss of fitted weights; the blocks share k_i's and v_i's work
        eps = max(getattr(results, "odd_ratio", None) or [0.0])
        why = f" (all blocks on P = {cfg.train_size}: + ε = {eps:.3g}, the set's odd-in-w moments, first order)"
        loose = dict(level_atol=tol.finite_atol, slope_tol=1e-4, final_atol=tol.finite_atol)
        tol = dataclasses.replace(tol, **{k: max(getattr(tol, k), v) for k, v in loose.items()})
        cfg = dataclasses.replace(cfg, tol=tol)
    out = claims_staircase(results, cfg)
    ordered, aligns, v_err, rise_err, rise_last = 0, [], [], [], []
    for s in range(S):
        heads = learned_heads(run, Lam, cfg, s)
        ordered += int([e.eig for e in heads] == list(range(D)))
        aligns += [e.align for e in heads]
        v_err += [abs(e.v / e.vstar - 1) for e in heads]
        for e in heads:
            if math.isfinite(e.t10) and math.isfinite(e.t90) and e.t10 > 0:
                rise_err.append(abs((e.t90 - e.t10) / ad.value_rise_time(e.lam, e.a) - 1))
                if e.eig == D - 1:
                    rise = ad.value_rise_time(e.lam, e.a, 0.25, 0.9)
                    rise_last.append(abs((e.t90 - e.t25) / rise - 1))
    drops = staircase_stats(run, Lam, cfg).drops
    sd = torch.nan_to_num(drops, nan=float(run.time[-1])).std(0)
    out += [
        check(
            "eigenvectors_learned_in_descending_order",
            ordered / S,
            lo=1.0,
            detail="share of seeds whose heads, in the order their v_i grew, align with e_1, e_2, …, e_D",
            smoke="200 steps: no head has learned an eigenvector yet",
        ),
        check(
            "keys_align_with_eigenvectors",
            min(aligns) if aligns else 0.0,
            lo=tol.align_lo - eps,
            detail="min over learned heads of |cos(k_i, e_m)| at the end (Fig. 3c)" + why,
            smoke="200 steps: no head has grown, so no key is measured (0)",
        ),
        check(
            "value_weights_reach_eq20a",
            max(v_err) if v_err else 1e9,
            hi=tol.value_rtol + eps,
            detail="max |v_i / (λ_m/a_m)^{1/3} − 1| at the end" + why,
            smoke="200 steps: no value weight has grown yet",
        ),
        check(
            "rise_time_matches_ode21_last_drop",
            max(rise_last) if rise_last else 1e9,
            hi=tol.rise_rtol,
            detail=f"max over seeds of |25→90 % rise time of the head learning e_D / that of eq. (21) − 1| ({len(rise_last)} "
            "heads; below 25 % the random, unaligned part of the init still counts in |v_i|)",
            smoke="200 steps: the last drop has not happened",
        ),
        check(
            "rise_time_matches_ode21_median",
            float(torch.tensor(rise_err).median()) if rise_err else 1e9,
            hi=2 * tol.rise_rtol,
            detail=f"median over {len(rise_err)} learned heads (max {max(rise_err, default=0):.2f}): earlier drops run "
            "slower than the ODE while other heads still share the direction (the ansatz (20) sets them to 0)",
            smoke="200 steps: no value weight has risen yet",
        ),
        _conservation(run, cfg),
        check(
            "later_drops_vary_more",
            float(sd[-1] / sd[0].clamp_min(1e-12)),
            lo=1.0,
            detail=f"std over seeds of t_D / std of t_1 (eq. 77); std(t_m) = {[round(x, 1) for x in sd.tolist()]}",
            smoke="200 steps: no drop has happened yet",
        ),
    ]
    return out


CARD = card(
    Fig3Config,
    "Fig. 3: ATTN_S rank one learns the eigenvectors of Λ one at a time: D drops at the eq. (19) levels",
    smoke=SMOKE_STAIRS,
    quick=dict(POPULATION, w_init=0.05, lr=0.25, steps=60_000, eval_every=10),
)
