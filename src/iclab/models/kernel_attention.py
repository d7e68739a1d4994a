"""Generalized (kernel) attention: the layer and the L-layer transformer of Cheng, Chen, Sra 2024.

Cheng, Chen, Sra 2024, eq. (2)-(3) and, with several heads, eq. (26):

    Z_{ℓ+1} = Z_ℓ + Σ_s V_ℓ^s Z_ℓ M h̃^s(B_ℓ^s X_ℓ, C_ℓ^s X_ℓ),     TF(Z_0) = [Z_L]_{d+1, n+1} ≈ −ŷ

The paper's tokens are columns, Z ∈ R^{D×(n+1)} with D = d + 1 and X its first d rows; here
z = Zᵀ is (B, n+1, D), query last. [h̃(U, W)]_{ij} = h̃(u_i, w_j) weighs *source* token i in the
output of *target* token j; M removes the query as a source (there is no causal mask), so target j
receives Σ_{i≤n} h̃_{ij} V z_i. The scores come from :func:`iclab.core.kernels.gram` with the n
context tokens as sources and all n+1 tokens as targets; ``softmax`` is normalised over the n
sources of each target (eq. 6 / 12).

Score parameterisations (``qk``):

* ``blocks`` B, C ∈ R^{d×d}: scores h̃(B x_i, C x_j) on the covariates only (Asm. 2.1).
* ``full``   Q, K ∈ R^{D×D}: standard attention h̃(Q z_i, K z_j) on the whole token (Examples 1-3;
             with Q = [[B, 0], [0, 0]], K = [[C, 0], [0, 0]] it equals ``blocks``).

Value parameterisations (``value``):

* ``sparse`` V = [[A, 0], [0, r]] (Asm. 4.4; Thm 4.6).
* ``label``  V = [[0, 0], [0, r]], i.e. A ≡ 0 (Thm 4.5; Prop. 3.1): only the label row moves.
* ``full``   V ∈ R^{D×D} free.

The paper has no 1/n factor (the steps r absorb it); the authors' code divides every head's
output by n: ``divide_by_n``. The paper reads out −ŷ = [Z_L]_{d+1,n+1} (the loss (5) is
E([Z_L]_{d+1,n+1} + y)²); :meth:`KernelTransformer.predict` returns +ŷ = −[Z_L]_{d+1,n+1}.

Linear h̃ is evaluated by associativity, Δ_j = V (Σ_i z_i u_iᵀ) w_j: O(n·D²), no score matrix. The
per-head update is :func:`iclab.models.attention_core.attention_update`, shared with LinearAttention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.private_torch import is_transformed
from iclab.models._kernel_fast import CHUNK, kernel_stack
from iclab.models._kernel_fast import uses_native as kernel_uses_native
from iclab.models.attention_core import AttentionStack, attention_update, moment_mix

Activation = Literal["linear", "relu", "exp", "softmax"]
ACTIVATIONS = ("linear", "relu", "exp", "softmax")
Value = Literal["sparse", "label", "full"]
VALUES = ("sparse", "label", "full")
QK = Literal["blocks", "full"]
QKS = ("blocks", "full")


@dataclass(frozen=True, kw_only=True)
class KernelTransformerConfig:
    """Architecture of :class:`KernelTransformer` (Cheng et al. 2024, eq. 26): depth, one attention activation h̃ per head, value and key/query structure."""

    d: int = 5  # input dimension; tokens are D = d + 1 wide (label last)
    n_layers: int = 3
    activations: tuple[str, ...] = ("softmax",)  # h̃ of each head; n_heads = len(activations) (eq. 26)
    value: Value = "sparse"  # V = [[A, 0], [0, r]] (Asm. 4.4); "label": A ≡ 0 (Thm 4.5); "full"
    qk: QK = "blocks"  # B, C (d×d, Asm. 2.1) or full Q, K (D×D)
    sigma: float = 1.0  # exp / softmax bandwidth: exp(uᵀw/σ²) (the authors' code: σ² = 2)
    divide_by_n: bool = False  # the paper: no 1/n; the authors' code: every head's output / n
    init_std: float = 0.1  # i.i.d. N(0, init_std²) for every free entry (App. H.1; the code's 0.1)
    exp_logit_cap: float | None = None  # exp heads: exp(min(uᵀw/σ², cap)); None: exact (a training guard)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        require_int(self, "n_layers", self.n_layers, 1)
        acts = tuple(self.activations) if isinstance(self.activations, (tuple, list)) else None
        require(
            self,
            "activations",
            bool(acts) and all(a in ACTIVATIONS for a in acts),
            f"a non-empty tuple of names from {ACTIVATIONS}, one per head",
        )
        object.__setattr__(self, "activations", acts)
        require(self, "value", self.value in VALUES, f"one of {VALUES}")
        require(self, "qk", self.qk in QKS, f"one of {QKS}")
        require(self, "sigma", float(self.sigma) > 0, "a float > 0")
        require(self, "divide_by_n", isinstance(self.divide_by_n, bool), "a bool")
        require(self, "init_std", float(self.init_std) >= 0, "a float >= 0")
        cap = self.exp_logit_cap
        require(self, "exp_logit_cap", cap is None or float(cap) > 0, "null or a float > 0")

    @property
    def n_heads(self) -> int:
        """Number of heads: one per attention activation."""
        return len(self.activations)


class KernelAttention(nn.Module):
    """One residual layer z ← z + Σ_s Δ_s(z) with per-head h̃^s, eq. (26) (eq. (3) for one head).

    Parameters are stacked over heads: ``A`` (H, d, d) and ``r`` (H,) for the Asm.-4.4 value
    (``r`` only when A ≡ 0; ``V_free`` (H, D, D) for ``value='full'``), ``B_free``/``C_free``
    (H, d, d) or ``Q_free``/``K_free`` (H, D, D). The properties ``V``, ``Q``, ``K`` (H, D, D) give
    the paper's matrices whatever the parameterisation.
    """

    def __init__(
        self,
        d: int,
        *,
        activations: tuple[str, ...] = ("softmax",),
        value: Value = "sparse",
        qk: QK = "blocks",
        sigma: float = 1.0,
        divide_by_n: bool = False,
        init_std: float = 0.1,
        exp_logit_cap: float | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        cfg = KernelTransformerConfig(
            d=d,
            n_layers=1,
            activations=activations,
            value=value,
            qk=qk,
            sigma=sigma,
            divide_by_n=divide_by_n,
            init_std=init_std,
            exp_logit_cap=exp_logit_cap,
        )
        self.d, self.D, self.n_heads = d, d + 1, cfg.n_heads
        self.exp_logit_cap = exp_logit_cap
        self.activations, self.value, self.qk = cfg.activations, value, qk
        self.sigma, self.divide_by_n = float(sigma), divide_by_n
        H = self.n_heads

        def param(*shape: int) -> nn.Parameter:
            if init_std == 0:  # no draw from any random state
                return nn.Parameter(torch.zeros(H, *shape))
            return nn.Parameter(torch.randn(H, *shape, generator=generator) * init_std)

        if value == "full":
            self.V_free = param(self.D, self.D)
        else:
            self.r_free = param()
            if value == "sparse":
                self.A_free = param(d, d)
        if qk == "blocks":
            self.B_free, self.C_free = param(d, d), param(d, d)
        else:
            self.Q_free, self.K_free = param(self.D, self.D), param(self.D, self.D)

    # --- the paper's matrices ------------------------------------------------------------------
    def _ref(self) -> Tensor:
        return self.B_free if self.qk == "blocks" else self.Q_free

    @property
    def A(self) -> Tensor:
        """(H, d, d): the covariate block of V (zeros when A ≡ 0)."""
        if self.value == "full":
            return self.V_free[:, : self.d, : self.d]
        if self.value == "label":
            ref = self.r_free
            return torch.zeros(self.n_heads, self.d, self.d, dtype=ref.dtype, device=ref.device)
        return self.A_free

    @property
    def r(self) -> Tensor:
        """(H,): the label entry V_{D,D}."""
        return self.V_free[:, -1, -1] if self.value == "full" else self.r_free

    @property
    def V(self) -> Tensor:
        """(H, D, D) value matrix in the paper's orientation."""
        if self.value == "full":
            return self.V_free
        corner = torch.zeros(self.D, self.D, dtype=self.r_free.dtype, device=self.r_free.device)
        corner[-1, -1] = 1.0  # e_D e_Dᵀ; built out of place so the layer also works under vmap (Ensemble)
        V = self.r_free[:, None, None] * corner
        if self.value == "sparse":
            V = V + nn.functional.pad(self.A_free, (0, 1, 0, 1))
        return V

    @property
    def B(self) -> Tensor:
        """(H, d, d): the source ("query" in the paper's words) transform; Q's top-left block for ``qk='full'``."""
        return self.B_free if self.qk == "blocks" else self.Q_free[:, : self.d, : self.d]

    @property
    def C(self) -> Tensor:
        """(H, d, d): the target ("key") transform; K's top-left block for ``qk='full'``."""
        return self.C_free if self.qk == "blocks" else self.K_free[:, : self.d, : self.d]

    @property
    def Q(self) -> Tensor:
        """(H, D, D): [[B, 0], [0, 0]] (Asm. 2.1) or the free Q."""
        if self.qk == "full":
            return self.Q_free
        return nn.functional.pad(self.B_free, (0, 1, 0, 1))

    @property
    def K(self) -> Tensor:
        """(H, D, D): [[C, 0], [0, 0]] (Asm. 2.1) or the free K."""
        if self.qk == "full":
            return self.K_free
        return nn.functional.pad(self.C_free, (0, 1, 0, 1))

    # --- forward ---------------------------------------------------------------------------
    def forward(self, z: Tensor, n: int, *, query_only: bool = False) -> Tensor:
        """(B, T, D) -> (B, T, D). The first ``n`` tokens are the sources; all T are targets.

        ``query_only``: update only the last token (the query) and return it, (B, 1, D): a model's last
        layer needs nothing else, and for non-linear scores this is T times less work.
        """
        ctx = z[:, :n]  # (B, n, D): M drops the query as a source
        if query_only:
            z = z[:, -1:]
        query_maps, value_maps, key_maps = self._maps()
        out = attention_update(  # (B, T, D or 1); linear heads by associativity, softmax over the n sources
            ctx,
            z,
            query_maps,
            value_maps,
            self.activations,
            key_maps=key_maps,
            sigma=self.sigma,
            logit_cap=self.exp_logit_cap,
            scale=1.0 / n if self.divide_by_n else 1.0,
        )
        if self.value == "label":
            return torch.cat([z[..., :-1], z[..., -1:] + out], dim=-1)
        return z + out

    def _maps(self) -> tuple[Tensor, Tensor, Tensor]:
        """(query maps, value maps, key maps) of :func:`~iclab.models.attention_core.attention_update`.

        Head s: key [B_s, 0] z_i (or Q_s z_i), query [C_s, 0] z_j (or K_s z_j), value V_s z_i; the
        label-only value is r_s e_Dᵀ z_i = r_s y_i, a (1, D) map.
        """
        if self.value == "label":
            value_maps = nn.functional.pad(self.r_free[:, None, None], (self.d, 0))  # (H, 1, D): [0, r_s]
        else:
            value_maps = self.V
        if self.qk == "full":
            return self.K_free, value_maps, self.Q_free
        return nn.functional.pad(self.C_free, (0, 1)), value_maps, nn.functional.pad(self.B_free, (0, 1))

    @property
    def moment_sources(self) -> str | None:
        """'context' when every head is linear (the moment form of :mod:`~iclab.models.attention_core`), else None."""
        return "context" if all(act == "linear" for act in self.activations) else None

    def transfer(self, gram: Tensor, n: int) -> Tensor:
        """T (D, D, B) with z ← z T for every token when every head is linear: I + the heads' mix
        (:func:`~iclab.models.attention_core.moment_mix`), in the label column only for ``value='label'``."""
        if self.moment_sources is None:
            raise ValueError(f"transfer needs linear heads; this layer has {self.activations}")
        query_maps, value_maps, key_maps = self._maps()
        scale = 1.0 / n if self.divide_by_n else 1.0
        mix = moment_mix(gram, query_maps, value_maps, key_maps=key_maps, scale=scale)  # (D, D or 1, B)
        if self.value == "label":
            mix = nn.functional.pad(mix, (0, 0, self.d, 0))  # into the label column
        return mix + torch.eye(self.D, dtype=mix.dtype, device=mix.device).unsqueeze(-1)


class KernelTransformer(AttentionStack):
    """L residual kernel-attention layers with the read-out ŷ = −[Z_L]_{d+1, n+1} (eq. 4-5).

    ``predict`` returns +ŷ; ``trace`` also returns Z_0ᵀ … Z_Lᵀ and takes the Lemma-A.1 mode
    (``query_label``: the true y_{n+1} in the query's label slot, which shifts the last slot by
    exactly y_{n+1} and changes nothing else).
    """

    def __init__(
        self, config: KernelTransformerConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.config = config = config or KernelTransformerConfig()
        self.layers = nn.ModuleList(
            KernelAttention(
                config.d,
                activations=config.activations,
                value=config.value,
                qk=config.qk,
                sigma=config.sigma,
                divide_by_n=config.divide_by_n,
                init_std=config.init_std,
                exp_logit_cap=config.exp_logit_cap,
                generator=generator,
            )
            for _ in range(config.n_layers)
        )

    #: use the batch-last fused pass (:mod:`iclab.models._kernel_fast`) where it applies; False: the token pass
    fast: bool = True
    #: prompts per block of the fused pass on a CPU (a GPU takes the whole batch at once)
    fast_chunk: int = CHUNK

    def forward(self, episode: Episode) -> Tensor:
        """+ŷ (B,). V = [[A, 0], [0, r]] with B, C blocks and non-linear heads run through one fused batch-last
        pass with a hand-written backward (:func:`~iclab.models._kernel_fast.kernel_stack`: the same numbers, tested
        to 1e-10 in float64); all-linear heads by the same pass where it runs in C (on a CPU the kernel's pass beats
        the torch moment form, which does fewer FLOPs in many small products: 24 against 40 ms a Cheng et al. Fig. 4
        step at L = 3, one thread) and by the moment form elsewhere; the rest token by token."""
        cfg = self.config
        if (
            not self.fast
            or cfg.value == "full"
            or cfg.qk != "blocks"
            or (self.moment_sources is not None and not kernel_uses_native(episode.x, episode.n))
            or is_transformed(cast(KernelAttention, self.layers[0]).B_free, episode.x)
        ):
            return super().forward(episode)
        self._check(episode)
        assert episode.y is not None  # _check: a regression episode
        # (L, H, d, d) K = CᵀB (/σ² for exp and softmax heads): scores (C x_j)ᵀ(B x_i) = (Kᵀx_j)ᵀx_i
        bw = torch.tensor(
            [cfg.sigma**-2 if a in ("exp", "softmax") else 1.0 for a in cfg.activations], dtype=episode.dtype
        )
        K = self.BtC.transpose(-1, -2) * bw.to(episode.device)[:, None, None]
        A = self.A if cfg.value == "sparse" else None
        label = kernel_stack(
            episode.x,
            episode.y,
            episode.x_query,
            K,
            A,
            self.r,
            n=episode.n,
            activations=cfg.activations,
            scale=1.0 / episode.n if cfg.divide_by_n else 1.0,
            logit_cap=cfg.exp_logit_cap,
            chunk=episode.batch_size if episode.device.type == "cuda" else self.fast_chunk,
        )
        return self._read_label(label)

    def trace(self, episode: Episode, query_label: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(ŷ (B,), states (L+1, B, n+1, D) = Z_0ᵀ … Z_Lᵀ). ``states[ℓ][:, :, -1]`` is the label row:
        the residuals y_i − f_ℓ(x_i) at the demonstrations and −f_ℓ(x_q) at the query (eq. 22)."""
        return super().trace(episode, query_label)

    # --- the matrices theory talks about, stacked over layers (L, H, ·, ·) ---------------------
    @property
    def A(self) -> Tensor:
        """(L, H, d, d)."""
        return self._stack("A")

    @property
    def r(self) -> Tensor:
        """(L, H)."""
        return self._stack("r")

    @property
    def V(self) -> Tensor:
        """(L, H, D, D)."""
        return self._stack("V")

    @property
    def B(self) -> Tensor:
        """(L, H, d, d)."""
        return self._stack("B")

    @property
    def C(self) -> Tensor:
        """(L, H, d, d)."""
        return self._stack("C")

    @property
    def Q(self) -> Tensor:
        """(L, H, D, D)."""
        return self._stack("Q")

    @property
    def K(self) -> Tensor:
        """(L, H, D, D)."""
        return self._stack("K")

    @property
    def BtC(self) -> Tensor:
        """(L, H, d, d): B_ℓᵀC_ℓ, the only identifiable part of (B_ℓ, C_ℓ) (Remark E.2)."""
        B = self.B
        return B.transpose(-1, -2) @ self.C

    @torch.no_grad()
    def load_matrices(self, **blocks: Tensor) -> KernelTransformer:
        """Set the free parameters from stacked (L, H, ...) tensors, or (L, ...) for every head alike.

        Names: ``r`` (and ``A`` for ``value='sparse'``) or ``V`` for ``value='full'``; ``B``, ``C``
        or ``Q``, ``K`` for ``qk='full'``. Every free parameter must be given. Returns self.
        """
        cfg = self.config
        names = {"full": ("V",), "sparse": ("A", "r"), "label": ("r",)}[cfg.value]
        names += ("B", "C") if cfg.qk == "blocks" else ("Q", "K")
        self._load_stacked(names, blocks, f"value={cfg.value!r}, qk={cfg.qk!r}")
        return self
