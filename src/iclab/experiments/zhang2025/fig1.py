"""Zhang et al. 2025, Fig. 1: linear ATTN_M (eq. M; D = 4, N = 31, H = 8, λ = (.4, .3, .2, .1)) and the two-layer
linear MLP on the cubic feature z = vec(βx_qᵀ) (eq. 6-7), started at the ATTN_M weights mapped by eq. (6)-(7) and
trained by full-batch GD on the same P sequences, have identical loss curves, with one abrupt drop from
L(M_0) = tr Λ to L(M_D) (eq. 19) after a plateau of length ≈ (τ/‖Λ²‖_F) ln(1/w_init) (eq. 54).

    iclab run zhang2025.fig1 --preset quick

Claims:

- attention_equals_mlp: max |L_ATTN_M − L_MLP| / L(0) over the run <= 1e-9 (float64).
- one_abrupt_drop: the ATTN_M loss drops exactly once.
- final_loss_is_L_MD: population loss of the final weights = L(M_D) of eq. (19) within 2 % (finite P).
- plateau_length_eq54: time of the loss midpoint / eq. (54) in [0.75, 1.5].

``dynamics=all_blocks`` (``iclab run zhang2025.fig1 --preset quick dynamics=all_blocks``): ATTN_M trains every
block on the finite set (u_i and the vector v_i start at zero and move, App. G eq. 91), the MLP stays the reduced
model on z. attention_equals_mlp is then bounded by ε, the odd-in-w moments of the set relative to the even ones
(:func:`~iclab.experiments.zhang2025._setup.odd_moment_ratio`): they alone drive the blocks, so the curves differ by
O(ε)·L(0). Added: conservation_law_full_blocks, ⟨ṽ_i, ṽ_j⟩ − ⟨K_i, K_j⟩_F on the full weights (eq. 55's law with
every block in) drifts <= 1e-3 of max v_i².

Time on 2 CPU cores: quick 2-9 s; paper under 90 s (all claims pass).

What did not match: eq. (54) is an estimate; with a random, unaligned init the drop comes 15-27 % later, so the claim
accepts 0.75-1.5× (docs/papers/zhang2025.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from iclab.experiments.registry import ClaimResult, card, check
from iclab.experiments.zhang2025._merged import QUICK, SMOKE, MergedResults, MergedSetup, merged_drop_time, run_merged
from iclab.experiments.zhang2025._setup import finite
from iclab.models.reduced_attention import MergedAttention
from iclab.plotting import save, subplots
from iclab.theory import attention_dynamics as ad


@dataclass(frozen=True, kw_only=True)
class Fig1Tolerances:
    exact: float = 1e-9  # |L_ATTN_M − L_MLP| / L(0), float64
    final_rtol: float = 0.02  # finite-P population loss vs L(M_D)
    plateau_rtol: float = 0.25  # drop time vs eq. (54) (random, unaligned init drops ~10 % late)
    odd_factor: float = 1.0  # dynamics='all_blocks': |L_ATTN_M − L_MLP| / L(0) <= odd_factor · ε of the set
    conservation_hi: float = 5e-3  # dynamics="all_blocks": full-block balance drift / max v_i² (GD at lr 0.1: 1.8e-3)


@dataclass(frozen=True, kw_only=True)
class Fig1Config(MergedSetup):
    tol: Fig1Tolerances = field(default_factory=Fig1Tolerances)
    all_blocks_claims: ClassVar[bool] = True


def plot(results: MergedResults, cfg: Fig1Config, out: Path) -> list[Path]:
    levels = ad.plateau_losses(results.Lambda, 1 / cfg.n)
    fig, axes = subplots(1, 1)
    ax = axes[0, 0]
    t = results.time.numpy()
    ax.plot(t, results.train_loss.numpy(), lw=2.5, color="tab:blue", alpha=0.6, label="ATTN_M (train)")
    ax.plot(t, results.mlp_train_loss.numpy(), "--", color="k", lw=1, label="MLP on z (train)")
    ax.plot(t, results.loss.numpy(), color="tab:orange", lw=1, label="ATTN_M (population)")
    ax.axhline(levels[-1].item(), ls=":", color="gray", label="L(M_D), eq. (19)")
    ax.axvline(ad.merged_plateau_time(results.Lambda, cfg.w_init), ls=":", color="tab:green", label="eq. (54)")
    ax.set_xlabel("t / τ")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    ax.set_title("Fig. 1: ATTN_M ≡ 2-layer MLP on vec(βx_qᵀ)", fontsize=9)
    return [save(fig, out / "fig1.png")]


def _equals_mlp(results: MergedResults, cfg: Fig1Config) -> ClaimResult:
    a, m = results.train_loss, results.mlp_train_loss
    gap = float((a - m).abs().max() / a[0])
    if not cfg.all_blocks:
        return check(
            "attention_equals_mlp",
            gap,
            hi=cfg.tol.exact,
            detail="max |L_ATTN_M − L_MLP| / L(0) with mapped init and the same data (eq. 6-7), float64",
        )
    eps = results.odd_ratio
    blocks = max(float(b.abs().max()) for b in results.blocks.values()) / float(results.v.abs().max())
    return check(
        "attention_equals_mlp",
        gap,
        hi=cfg.tol.odd_factor * eps,
        detail=f"max |L_ATTN_M − L_MLP| / L(0), ATTN_M with every block trained on the P = {cfg.train_size} "
        f"sequences, vs {cfg.tol.odd_factor:g}·ε, ε = {eps:.3g} the odd-in-w moments of this set relative to the "
        "even ones: they alone move the zero blocks (App. D.1), so the two models differ at first order in ε "
        f"(zero blocks reach {blocks:.3g} of max |v_i|)",
    )


def _full_block_conservation(results: MergedResults, cfg: Fig1Config) -> ClaimResult:
    model = MergedAttention(cfg.d, cfg.n_heads, w_init=0.0, all_blocks=True)
    bal = model.conserved_quantities({"v": results.v, "U": results.U, **results.blocks})["balance"]  # (T, H, H)
    drift = float((bal - bal[:1]).abs().max() / results.v.pow(2).max().clamp_min(1e-300))
    return check(
        "conservation_law_full_blocks",
        drift,
        hi=cfg.tol.conservation_hi,
        detail="max_t |Q(t) − Q(0)| / max v_i² for Q_ij = ⟨ṽ_i, ṽ_j⟩ − ⟨K_i, K_j⟩_F, ṽ_i = [vector v_i, v_i], "
        "K_i = [U_i; u_iᵀ]: eq. (55)'s law on the full weights (the model is unchanged by K → AK, ṽ → A^{-T}ṽ "
        "across heads), conserved by gradient flow; GD drifts at O(lr²) per step",
        smoke="lr 0.1 for 40 steps: the Euler drift is 6e-3 of the still tiny max v_i²",
    )


def claims(results: MergedResults, cfg: Fig1Config) -> list[ClaimResult]:
    levels = ad.plateau_losses(results.Lambda, 1 / cfg.n)
    t_drop = merged_drop_time(results, cfg)
    t_th = ad.merged_plateau_time(results.Lambda, cfg.w_init)
    extra = [_full_block_conservation(results, cfg)] if cfg.all_blocks else []
    return [
        _equals_mlp(results, cfg),
        check(
            "one_abrupt_drop",
            ad.count_drops(results.time, results.loss),
            expected=1,
            atol=0,
            detail="abrupt drops of the ATTN_M loss (ATTN_S: D)",
        ),
        check(
            "final_loss_is_L_MD",
            float(results.loss[-1]),
            expected=float(levels[-1]),
            rtol=cfg.tol.final_rtol,
            detail="population loss of the final weights vs eq. (19) with m = D (finite-P overfitting allowed)",
            smoke="40 steps: the loss is still on its plateau at tr Λ = 1",
        ),
        check(
            "plateau_length_eq54",
            finite(t_drop) / t_th,
            lo=1 - cfg.tol.plateau_rtol,
            hi=1 + 2 * cfg.tol.plateau_rtol,
            detail=f"time of the loss midpoint {t_drop:.1f}τ / (τ/‖Λ²‖_F) ln(1/w_init) = {t_th:.1f}τ; random init drops later than aligned init",
            smoke="40 steps: the drop has not happened yet (measured 1e9/t_eq54)",
        ),
        *extra,
    ]


run = run_merged
CARD = card(
    Fig1Config,
    "Fig. 1: linear ATTN_M and the 2-layer linear MLP on the cubic feature have identical loss curves",
    smoke=SMOKE,
    quick=QUICK,
)
