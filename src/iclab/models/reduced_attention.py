"""Multi-head linear attention after the zero-block reduction, and its equivalent networks.

Zhang, Singh, Latham, Saxe 2025 ("Training dynamics of in-context learning in linear attention").
Tokens are the columns [x_n; y_n] and [x_q; 0] of the paper's X (eq. 1). With the zero blocks of
Sec. 2.3-2.4 (vector part of the value row v_i = 0, and u_i = 0 for ATTN_M / scalar key k_ir = 0 for
ATTN_S, preserved by gradient flow, App. D.1 and F.1) only these weights reach the query output:

* ATTN_M, merged key-query (eq. M):   ŷ_q = Σ_i v_i βᵀ U_i x_q,               v (H,), U (H, d, d)
* ATTN_S, separate rank-R (eq. S):    ŷ_q = Σ_i Σ_r v_i βᵀ k_ir q_irᵀ x_q,    v (H,), k, q (H, R, d)

with β = (1/N) Σ_n y_n x_n (eq. 4). Both are ŷ_q = βᵀ W x_q for an effective (d, d) matrix W, so every
loss of W pulls back to the parameters through :meth:`parameter_flow`. ``n_seeds = S`` gives every
parameter a leading seed axis so that S independent runs train as one batched model.

Equivalent networks: ATTN_M is the two-layer linear MLP ŷ = w_2ᵀ W_1 z on the cubic feature
z = vec(β x_qᵀ) (eq. 6-7, :class:`CubicFeatureMLP`); ATTN_S rank 1 is a sum of H three-layer linear
convolutional nets ŷ = Σ_i v_i q_iᵀ (I_d ⊗ k_iᵀ) z (eq. 13, :meth:`SeparateAttention.predict_conv`).
:meth:`token_layer` builds the full (d+1)-wide :class:`~iclab.models.linear_attention.LinearAttention`
layer these models reduce from.

``all_blocks=True`` keeps the zero blocks as parameters (ATTN_M: u_i; ATTN_S: the scalar keys k_ir; both: the
vector part of the value row), started at zero as in Sec. 2.3-2.4, so that they move when the data's odd moments
in w do not vanish (a finite training set, App. G). ŷ_q then reads the whole token second moment
s = (Σ_n z_n z_nᵀ + z_q z_qᵀ)/N of the (d+1)-wide tokens (the query, label slot 0, is a source as in the paper's
X Xᵀ): ŷ_q = vec(s)ᵀ W̃ x_q with an effective (D², d) matrix W̃ (eq. 91 of App. G written in one piece), and every
weight that reaches ŷ_q is trained. This is the full one-layer linear attention (the "*" entries, which cannot reach
ŷ_q, get no gradient and are left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from iclab.core.episode import Episode
from iclab.core.errors import ShapeError, is_int, require, require_int
from iclab.models.linear_attention import LinearAttention

__all__ = [
    "CubicFeatureMLP",
    "MergedAttention",
    "SeparateAttention",
    "all_blocks_statistic",
    "context_statistic",
    "cubic_feature",
    "prefix_statistics",
]


# --- the in-context statistics -------------------------------------------------------------------


def _regression(owner: str, episode: Episode) -> Tensor:
    if episode.y is None:
        raise ValueError(f"{owner} needs a regression episode (float labels y); got a classification episode")
    return episode.y


def context_statistic(episode: Episode) -> Tensor:
    """β = (1/N) Σ_n y_n x_n, the in-context input-output correlation (eq. 4). (B, d)."""
    y = _regression("context_statistic", episode)
    return torch.einsum("bn,bnd->bd", y, episode.x) / episode.n


def all_blocks_statistic(episode: Episode) -> Tensor:
    """s = (Σ_n z_n z_nᵀ + z_q z_qᵀ)/N, z_n = [x_n; y_n], z_q = [x_q; 0], flattened row-major (index c·D + b):
    the statistic the full one-layer linear attention reads (the paper's X Xᵀ / N, the query a source; App. G
    eq. 91: its blocks are Λ̂ + x_q x_qᵀ/N, β and (1/N) Σ_n y_n²). (B, D²) with D = d + 1."""
    y = _regression("all_blocks_statistic", episode)
    z = torch.cat([episode.x, y.unsqueeze(-1)], dim=-1)  # (B, N, D)
    zq = torch.nn.functional.pad(episode.x_query, (0, 1))  # (B, D): the query's label slot is 0
    gram = torch.einsum("bni,bnj->bij", z, z) + zq.unsqueeze(-1) * zq.unsqueeze(-2)
    return (gram / episode.n).flatten(-2)


def cubic_feature(beta: Tensor, x_query: Tensor) -> Tensor:
    """z = vec(β x_qᵀ) = x_q ⊗ β (eq. 7, 38; vec stacks columns). (…, d), (…, d) -> (…, d²)."""
    return (x_query.unsqueeze(-1) * beta.unsqueeze(-2)).flatten(-2)  # entry b·d + a = x_q,b β_a


def prefix_statistics(episode: Episode) -> tuple[Tensor, Tensor, Tensor]:
    """The next-token-prediction loss (eq. 23) as n regression problems per prompt.

    Prefix m = 1..n predicts y_{m+1} from the first m pairs: β_m = (1/m) Σ_{j≤m} y_j x_j, query
    x_{m+1} (the episode's query for m = n). Returns β (B, n, d), x_q (B, n, d), y_q (B, n); the
    loss of eq. (23) is the mean over both axes (context lengths uniform on {1..n}, E(1/N) = H_n/n).
    """
    y = _regression("prefix_statistics", episode)
    if episode.y_query is None:
        raise ValueError("prefix_statistics needs the episode's y_query (the last next-token target)")
    m = torch.arange(1, episode.n + 1, dtype=episode.dtype, device=episode.device)  # (n,)
    beta = torch.cumsum(y.unsqueeze(-1) * episode.x, dim=1) / m[:, None]  # (B, n, d)
    xq = torch.cat([episode.x[:, 1:], episode.x_query.unsqueeze(1)], dim=1)  # (B, n, d)
    yq = torch.cat([y[:, 1:], episode.y_query.unsqueeze(1)], dim=1)  # (B, n)
    return beta, xq, yq


# --- the reduced models ----------------------------------------------------------------------------


class _ReducedAttention(nn.Module):
    """Shared part of the reduced models: ŷ = βᵀ W x_q with W built from the named parameters."""

    names: tuple[str, ...] = ()
    block_names: tuple[str, ...] = ()  # the zero blocks, parameters with ``all_blocks=True``
    v: Tensor  # (H,) or (S, H): the value weight of each head, in every reduced model

    def __init__(self, d: int, n_heads: int, w_init: float, n_seeds: int | None, all_blocks: bool = False) -> None:
        super().__init__()
        owner = type(self).__name__
        require_int(owner, "d", d, 1)
        require_int(owner, "n_heads", n_heads, 1)
        require(owner, "w_init", float(w_init) >= 0, "a float >= 0", w_init)
        require(owner, "n_seeds", n_seeds is None or is_int(n_seeds, 1), "None or an int >= 1", n_seeds)
        require(owner, "all_blocks", isinstance(all_blocks, bool), "True or False", all_blocks)
        self.d, self.n_heads, self.w_init, self.n_seeds = d, n_heads, float(w_init), n_seeds
        self.all_blocks = all_blocks
        if all_blocks:
            self.names = (*type(self).names, *self.block_names)

    @property
    def stat_dim(self) -> int:
        """Length of the statistic ŷ_q reads: d (β) for the reduced model, (d+1)² (vec s) with ``all_blocks``."""
        return (self.d + 1) ** 2 if self.all_blocks else self.d

    def statistic(self, episode: Episode) -> Tensor:
        """β (B, d) (eq. 4), or vec s (B, (d+1)²) with ``all_blocks`` (:func:`all_blocks_statistic`)."""
        return all_blocks_statistic(episode) if self.all_blocks else context_statistic(episode)

    def _zeros(self, shape: tuple[int, ...]) -> nn.Parameter:
        """A zero block (Sec. 2.3-2.4: initialised at zero)."""
        return self._draw(shape, 0.0, None)

    def _draw(self, shape: tuple[int, ...], var: float, generator: torch.Generator | None) -> nn.Parameter:
        full = shape if self.n_seeds is None else (self.n_seeds, *shape)
        if var == 0:  # no draw from any random state
            return nn.Parameter(torch.zeros(full))
        return nn.Parameter(torch.randn(full, generator=generator) * var**0.5)

    # functional forms: ``params`` maps name -> tensor with any leading axes (seeds, time, ...)
    def params(self) -> dict[str, Tensor]:
        """Detached copies of the parameters, name -> tensor."""
        return {k: getattr(self, k).detach().clone() for k in self.names}

    @torch.no_grad()
    def load_params(self, params: dict[str, Tensor]) -> _ReducedAttention:
        """Copy ``params`` (same names and shapes) into the module. Returns self."""
        require(type(self).__name__, "params", set(params) == set(self.names), f"exactly {self.names}", sorted(params))
        for k, v in params.items():
            getattr(self, k).copy_(v)
        return self

    def _get(self, params: dict[str, Tensor] | None) -> dict[str, Tensor]:
        return {k: getattr(self, k) for k in self.names} if params is None else params

    def effective_matrix(self, params: dict[str, Tensor] | None = None) -> Tensor:
        """W with ŷ_q = βᵀ W x_q: (d, d), or (S, d, d) with seeds (any leading axes of ``params``). With
        ``all_blocks``: W̃ (…, (d+1)², d) with ŷ_q = vec(s)ᵀ W̃ x_q (:func:`all_blocks_statistic`)."""
        raise NotImplementedError

    def parameter_flow(self, G: Tensor, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """−½ ∂L/∂θ for every parameter θ, given G = −½ ∂L/∂W (chain rule through W; W̃ with ``all_blocks``).

        For the population loss G = Λ² − E(Λ̂²) W Λ (eq. 57) this is the right-hand side of the
        gradient flow τ dθ/dt (ATTN_M: App. D matrix form; ATTN_S: eq. 14 and 84). A GD step with
        learning rate η on the MSE is θ ← θ + 2η · parameter_flow(G).
        """
        raise NotImplementedError

    def conserved_quantities(self, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The quantities that gradient flow on any loss of W keeps constant (eq. 55, 83, 89)."""
        raise NotImplementedError

    def from_statistics(self, beta: Tensor, x_query: Tensor) -> Tensor:
        """ŷ = βᵀ W x_q from the statistics: (B, k), (B, d) -> (B,), or (S, B) with seeds; k = :attr:`stat_dim`
        (β, or vec s with ``all_blocks``)."""
        k = self.stat_dim
        if beta.dim() != 2 or x_query.dim() != 2 or beta.shape != (x_query.shape[0], k) or x_query.shape[1] != self.d:
            raise ShapeError(
                f"{type(self).__name__}.from_statistics needs statistics of shape (B, {k}) and x_query (B, {self.d}); "
                f"got {tuple(beta.shape)} and {tuple(x_query.shape)}"
            )
        return torch.einsum("bi,...ij,bj->...b", beta, self.effective_matrix(), x_query)

    def predict(self, episode: Episode) -> Tensor:
        """+ŷ_q for every prompt, (B,) (single-seed models only)."""
        owner = type(self).__name__
        _regression(owner, episode)
        if self.n_seeds is not None:
            raise ValueError(
                f"{owner}.predict serves single-seed models; this one has n_seeds={self.n_seeds}: "
                "use from_statistics(beta, x_query) -> (S, B) or select(seed)"
            )
        if episode.d != self.d:
            raise ShapeError(f"{owner} was built for d={self.d}; got an episode with d={episode.d}")
        dtype = getattr(self, self.names[0]).dtype
        if episode.dtype != dtype:
            raise ShapeError(
                f"{owner} has {dtype} parameters; got a {episode.dtype} episode (call model.to({episode.dtype}))"
            )
        return self.from_statistics(self.statistic(episode), episode.x_query)

    def forward(self, episode: Episode) -> Tensor:
        return self.predict(episode)

    def _new(self, n_seeds: int | None) -> _ReducedAttention:
        raise NotImplementedError

    def select(self, seed: int) -> _ReducedAttention:
        """The single-seed model of seed index ``seed`` (a copy)."""
        require(type(self).__name__, "n_seeds", self.n_seeds is not None, "set to select a seed", self.n_seeds)
        out = self._new(None)
        ref = getattr(self, self.names[0])
        out.to(dtype=ref.dtype, device=ref.device)
        return out.load_params({k: getattr(self, k)[seed].detach() for k in self.names})

    @classmethod
    def stack(cls, models: Sequence[_ReducedAttention]) -> _ReducedAttention:
        """One batched model with ``n_seeds = len(models)`` from single-seed models of one shape."""
        require(cls.__name__, "models", len(models) >= 1 and all(type(m) is cls for m in models), f"{cls.__name__}s")
        first = models[0]
        require(cls.__name__, "models", all(m.n_seeds is None for m in models), "single-seed models", "batched ones")
        out = first._new(len(models))
        ref = getattr(first, first.names[0])
        out.to(dtype=ref.dtype, device=ref.device)
        return out.load_params({k: torch.stack([getattr(m, k).detach() for m in models]) for k in first.names})


def _check_single(model: _ReducedAttention, what: str) -> None:
    require(type(model).__name__, "n_seeds", model.n_seeds is None, f"None for {what}", model.n_seeds)


def _check_reduced(model: _ReducedAttention, what: str) -> None:
    require(type(model).__name__, "all_blocks", not model.all_blocks, f"False for {what} (the reduced model)", True)


def _value_row(p: dict[str, Tensor]) -> Tensor:
    """The label row of each head's value matrix, [vector v_i, v_i] (…, H, D) (Sec. 2.3)."""
    return torch.cat([p["v_vec"], p["v"].unsqueeze(-1)], dim=-1)


class MergedAttention(_ReducedAttention):
    """ATTN_M reduced (eq. M): ŷ_q = Σ_i v_i βᵀ U_i x_q, with the paper's 1/N inside β.

    Init (App. C.2, eq. 34): v_i ~ N(0, w_init²/H), U_i entries ~ N(0, w_init²/(H d²)), so that
    ‖v‖ and (Σ_i ‖U_i‖_F²)^{1/2} are O(w_init) (eq. 35).
    """

    names = ("v", "U")

    def __init__(
        self,
        d: int,
        n_heads: int,
        *,
        w_init: float = 1e-3,
        generator: torch.Generator | None = None,
        n_seeds: int | None = None,
        all_blocks: bool = False,
    ) -> None:
        super().__init__(d, n_heads, w_init, n_seeds, all_blocks)
        H = n_heads
        self.v = self._draw((H,), self.w_init**2 / H, generator)  # (H,) or (S, H)
        self.U = self._draw((H, d, d), self.w_init**2 / (H * d * d), generator)  # (H, d, d) or (S, H, d, d)
        if all_blocks:  # after the draws above: the same seed gives the same v, U
            self.u, self.v_vec = self._zeros((H, d)), self._zeros((H, d))

    block_names = ("u", "v_vec")

    def _new(self, n_seeds: int | None) -> MergedAttention:
        return MergedAttention(self.d, self.n_heads, w_init=0.0, n_seeds=n_seeds, all_blocks=self.all_blocks)

    @staticmethod
    def _key_rows(p: dict[str, Tensor]) -> Tensor:
        """The first d columns of W_i^{KQ}, [U_i; u_iᵀ] (…, H, D, d): the columns the query reads."""
        return torch.cat([p["U"], p["u"].unsqueeze(-2)], dim=-2)

    def effective_matrix(self, params: dict[str, Tensor] | None = None) -> Tensor:
        p = self._get(params)
        if self.all_blocks:  # W̃[(c, b), a] = Σ_i [W_i^{KQ}]_{c,a} [W_i^V]_{D,b} (eq. 91 in one piece)
            return torch.einsum("...hca,...hb->...cba", self._key_rows(p), _value_row(p)).flatten(-3, -2)
        return (p["v"][..., None, None] * p["U"]).sum(-3)  # W = Σ_i v_i U_i

    def parameter_flow(self, G: Tensor, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        p = self._get(params)
        if self.all_blocks:
            d = self.d
            Gt = G.unflatten(-2, (d + 1, d + 1))  # (…, D, D, d): −½ ∂L/∂W̃[c, b, a]
            dK = torch.einsum("...cba,...hb->...hca", Gt, _value_row(p))
            dp = torch.einsum("...cba,...hca->...hb", Gt, self._key_rows(p))
            return {"v": dp[..., d], "U": dK[..., :d, :], "u": dK[..., d, :], "v_vec": dp[..., :d]}
        G = G.unsqueeze(-3)  # (…, 1, d, d)
        return {
            "v": (p["U"] * G).sum((-1, -2)),  # τ dv_i/dt = ⟨U_i, G⟩_F
            "U": p["v"][..., None, None] * G,  # τ dU_i/dt = v_i G
        }

    def conserved_quantities(self, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``balance`` (…, H, H) = w_2 w_2ᵀ − W_1 W_1ᵀ = v_i v_j − ⟨U_i, U_j⟩_F (eq. 55).

        With ``all_blocks`` the same law on the full weights: ŷ_q = Σ_i ⟨K_i x_q ⊗ ṽ_i, s⟩ (K_i = [U_i; u_iᵀ],
        ṽ_i = [vector v_i, v_i]) is unchanged by K → A K, ṽ → A^{-T} ṽ across heads for any invertible A, so
        gradient flow keeps ⟨ṽ_i, ṽ_j⟩ − ⟨K_i, K_j⟩_F constant (the argument of eq. 55 with v_i, U_i replaced)."""
        p = self._get(params)
        if self.all_blocks:
            K, vt = self._key_rows(p), _value_row(p)
            return {"balance": vt @ vt.mT - torch.einsum("...hca,...gca->...hg", K, K)}
        vv = p["v"].unsqueeze(-1) * p["v"].unsqueeze(-2)
        return {"balance": vv - torch.einsum("...hij,...gij->...hg", p["U"], p["U"])}

    def mlp(self) -> CubicFeatureMLP:
        """The equivalent two-layer MLP on z (eq. 6-7): w_2 = v, row i of W_1 = vec(U_i)ᵀ."""
        _check_single(self, "mlp()")
        _check_reduced(self, "mlp()")
        out = CubicFeatureMLP(self.d, self.n_heads, w_init=0.0).to(dtype=self.v.dtype, device=self.v.device)
        with torch.no_grad():
            out.w2.copy_(self.v)
            out.W1.copy_(self.U.transpose(-1, -2).reshape(self.n_heads, -1))  # vec stacks columns
        return out

    def token_layer(
        self, *, star_std: float = 0.0, generator: torch.Generator | None = None, **kwargs: Any
    ) -> LinearAttention:
        """The full ATTN_M layer on (d+1)-wide tokens whose query output equals this model.

        P_h = W_h^V with last row [0, v_h] (zero block), Q_h = W_h^{KQ} with top-left U_h and
        bottom-left u_h = 0 (zero block; the model's ``u`` and ``v_vec`` with ``all_blocks``). The entries that cannot reach ŷ_q (the paper's "*": the
        first d rows of W^V, the last column of W^{KQ}) are N(0, star_std²). ``kwargs`` go to
        :class:`LinearAttention` (e.g. ``sources``, ``residual``). Read ŷ_q = +[z_out]_{n+1, d+1}.
        """
        _check_single(self, "token_layer()")
        d, H = self.d, self.n_heads
        layer = LinearAttention(d, n_heads=H, init_std=star_std, generator=generator, **kwargs)
        layer.to(dtype=self.v.dtype, device=self.v.device)
        with torch.no_grad():
            layer.P_free[:, -1, :] = 0.0
            layer.P_free[:, -1, -1] = self.v
            layer.Q_free[:, :, :d] = 0.0
            layer.Q_free[:, :d, :d] = self.U
            if self.all_blocks:
                layer.P_free[:, -1, :d] = self.v_vec
                layer.Q_free[:, -1, :d] = self.u
        return layer


class SeparateAttention(_ReducedAttention):
    """ATTN_S reduced (eq. S): ŷ_q = Σ_i Σ_r v_i βᵀ k_ir q_irᵀ x_q; one value weight per head is
    shared by the R key/query pairs of that head (rank 1: eq. 12).

    Init (App. C.2, eq. 36): v_i ~ N(0, w_init²/H), k_ir, q_ir entries ~ N(0, w_init²/(H R d)).
    """

    names = ("v", "k", "q")

    def __init__(
        self,
        d: int,
        n_heads: int,
        rank: int = 1,
        *,
        w_init: float = 1e-3,
        generator: torch.Generator | None = None,
        n_seeds: int | None = None,
        all_blocks: bool = False,
    ) -> None:
        super().__init__(d, n_heads, w_init, n_seeds, all_blocks)
        require_int("SeparateAttention", "rank", rank, 1)
        self.rank = rank
        H, R = n_heads, rank
        self.v = self._draw((H,), self.w_init**2 / H, generator)  # (H,) or (S, H)
        self.k = self._draw((H, R, d), self.w_init**2 / (H * R * d), generator)  # (H, R, d) or (S, H, R, d)
        self.q = self._draw((H, R, d), self.w_init**2 / (H * R * d), generator)
        if all_blocks:  # after the draws above: the same seed gives the same v, k, q
            self.k_scalar, self.v_vec = self._zeros((H, R)), self._zeros((H, d))

    block_names = ("k_scalar", "v_vec")

    def _new(self, n_seeds: int | None) -> SeparateAttention:
        return SeparateAttention(
            self.d, self.n_heads, self.rank, w_init=0.0, n_seeds=n_seeds, all_blocks=self.all_blocks
        )

    @staticmethod
    def _full_keys(p: dict[str, Tensor]) -> Tensor:
        """The key rows [k_irᵀ, k_ir (scalar)] (…, H, R, D)."""
        return torch.cat([p["k"], p["k_scalar"].unsqueeze(-1)], dim=-1)

    def effective_matrix(self, params: dict[str, Tensor] | None = None) -> Tensor:
        p = self._get(params)
        if self.all_blocks:  # W̃[(c, b), a] = Σ_i Σ_r k̃_ir,c ṽ_i,b q_ir,a
            W = torch.einsum("...hrc,...hb,...hra->...cba", self._full_keys(p), _value_row(p), p["q"])
            return W.flatten(-3, -2)
        vk = (p["v"][..., None, None] * p["k"]).flatten(-3, -2)  # (…, H·R, d): rows v_i k_irᵀ
        return vk.mT @ p["q"].flatten(-3, -2)  # Σ_i Σ_r v_i k_ir q_irᵀ

    def parameter_flow(self, G: Tensor, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        p = self._get(params)
        if self.all_blocks:
            d = self.d
            Gt = G.unflatten(-2, (d + 1, d + 1))  # (…, D, D, d): −½ ∂L/∂W̃[c, b, a]
            kt, vt, q = self._full_keys(p), _value_row(p), p["q"]
            dk = torch.einsum("...cba,...hb,...hra->...hrc", Gt, vt, q)
            dp = torch.einsum("...cba,...hrc,...hra->...hb", Gt, kt, q)
            dq = torch.einsum("...cba,...hrc,...hb->...hra", Gt, kt, vt)
            return {"v": dp[..., d], "k": dk[..., :d], "q": dq, "k_scalar": dk[..., d], "v_vec": dp[..., :d]}
        v, G = p["v"][..., None, None], G.unsqueeze(-3)  # (…, H, 1, 1), (…, 1, d, d)
        Gq = p["q"] @ G.mT  # (…, H, R, d): rows (G q_ir)ᵀ
        return {
            "v": (p["k"] * Gq).sum((-1, -2)),  # Σ_r k_irᵀ G q_ir (84a)
            "k": v * Gq,  # v_i G q_ir (84b)
            "q": v * (p["k"] @ G),  # v_i Gᵀ k_ir (84c), rows k_irᵀ G
        }

    def conserved_quantities(self, params: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``key_query`` (…, H, R) = ‖k_ir‖² − ‖q_ir‖² and ``key_value`` (…, H) = Σ_r ‖k_ir‖² − v_i²
        (eq. 83 for R = 1, eq. 89).

        With ``all_blocks`` the same laws on the full weights, k̃_ir = [k_ir; scalar k_ir] and ṽ_i = [vector v_i,
        v_i]: ŷ_q = Σ_i Σ_r ⟨k̃_ir ⊗ ṽ_i ⊗ q_ir, s ⊗ x_q⟩ is unchanged by k̃_ir → α k̃_ir, q_ir → q_ir/α and by
        k̃_i· → k̃_i·/α, ṽ_i → α ṽ_i, so gradient flow keeps ‖k̃_ir‖² − ‖q_ir‖² and Σ_r ‖k̃_ir‖² − ‖ṽ_i‖² constant
        (the argument of eq. 83, 89 with every block in)."""
        p = self._get(params)
        k = self._full_keys(p) if self.all_blocks else p["k"]
        vv = _value_row(p).pow(2).sum(-1) if self.all_blocks else p["v"].pow(2)
        kk, qq = k.pow(2).sum(-1), p["q"].pow(2).sum(-1)
        return {"key_query": kk - qq, "key_value": kk.sum(-1) - vv}

    def conv_kernels(self) -> Tensor:
        """K_ir = I_d ⊗ k_irᵀ ∈ R^{d×d²} (eq. 13: kernel size d, stride d). (H, R, d, d²)."""
        _check_single(self, "conv_kernels()")
        _check_reduced(self, "conv_kernels()")
        eye = torch.eye(self.d, dtype=self.k.dtype, device=self.k.device)
        return torch.einsum("ab,hrc->hrabc", eye, self.k).flatten(-2)

    def predict_conv(self, episode: Episode) -> Tensor:
        """ŷ_q = Σ_i v_i Σ_r q_irᵀ K_ir z, the convolutional form (eq. 13), (B,); equals :meth:`predict`."""
        _check_single(self, "predict_conv()")
        _check_reduced(self, "predict_conv()")
        z = cubic_feature(context_statistic(episode), episode.x_query)  # (B, d²)
        hidden = torch.einsum("hrak,bk->bhra", self.conv_kernels(), z)  # (B, H, R, d): K_ir z
        return torch.einsum("h,hra,bhra->b", self.v, self.q, hidden)

    def token_layer(
        self, *, star_std: float = 0.0, generator: torch.Generator | None = None, **kwargs: Any
    ) -> LinearAttention:
        """The full ATTN_S layer (key_query='separate') whose query output equals this model.

        W_K rows [k_irᵀ, 0] (zero block: scalar key; ``k_scalar`` with ``all_blocks``), W_Q rows [q_irᵀ, *], value last row [0, v_i]
        (zero block; ``v_vec`` with ``all_blocks``); the "*" entries are N(0, star_std²). Read ŷ_q = +[z_out]_{n+1, d+1}.
        """
        _check_single(self, "token_layer()")
        d, H, R = self.d, self.n_heads, self.rank
        layer = LinearAttention(
            d, n_heads=H, key_query="separate", rank=R, init_std=star_std, generator=generator, **kwargs
        )
        layer.to(dtype=self.v.dtype, device=self.v.device)
        with torch.no_grad():
            layer.P_free[:, -1, :] = 0.0
            layer.P_free[:, -1, -1] = self.v
            layer.W_K_free[..., :d] = self.k
            layer.W_K_free[..., -1] = self.k_scalar if self.all_blocks else 0.0
            layer.W_Q_free[..., :d] = self.q
            if self.all_blocks:
                layer.P_free[:, -1, :d] = self.v_vec
        return layer


class CubicFeatureMLP(nn.Module):
    """Two-layer linear network ŷ = w_2ᵀ W_1 z on the cubic feature z = vec(β x_qᵀ) (eq. 6-7).

    w_2 (H,), W_1 (H, d²); init as ATTN_M (eq. 34): w_2 ~ N(0, w_init²/H), W_1 ~ N(0, w_init²/(H d²)).
    Equals :class:`MergedAttention` as a function (w_2 = v, W_1[i] = vec(U_i)ᵀ), hence has identical
    dynamics under any optimiser (Fig. 1).
    """

    def __init__(self, d: int, width: int, *, w_init: float = 1e-3, generator: torch.Generator | None = None) -> None:
        super().__init__()
        require_int("CubicFeatureMLP", "d", d, 1)
        require_int("CubicFeatureMLP", "width", width, 1)
        require("CubicFeatureMLP", "w_init", float(w_init) >= 0, "a float >= 0", w_init)
        self.d, self.width = d, width
        scale_2, scale_1 = w_init / width**0.5, w_init / (width * d * d) ** 0.5
        if w_init == 0:
            self.w2, self.W1 = nn.Parameter(torch.zeros(width)), nn.Parameter(torch.zeros(width, d * d))
        else:
            self.w2 = nn.Parameter(torch.randn(width, generator=generator) * scale_2)
            self.W1 = nn.Parameter(torch.randn(width, d * d, generator=generator) * scale_1)

    def from_features(self, z: Tensor) -> Tensor:
        """(B, d²) -> (B,)."""
        return z @ self.W1.T @ self.w2

    def predict(self, episode: Episode) -> Tensor:
        """+ŷ_q, (B,)."""
        _regression("CubicFeatureMLP", episode)
        if episode.d != self.d:
            raise ShapeError(f"CubicFeatureMLP was built for d={self.d}; got an episode with d={episode.d}")
        if episode.dtype != self.w2.dtype:
            raise ShapeError(
                f"CubicFeatureMLP has {self.w2.dtype} parameters; got a {episode.dtype} episode "
                f"(call model.to({episode.dtype}))"
            )
        return self.from_features(cubic_feature(context_statistic(episode), episode.x_query))

    def forward(self, episode: Episode) -> Tensor:
        return self.predict(episode)
