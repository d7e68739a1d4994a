"""In-context regression of random polynomials (Sun, Jadbabaie, Azizan 2025, Sec. 2.1 and 4.2).

    x ~ N(0, I_d),   f(x; w) = Σ_m w_m x^{a_m},   every coefficient w_m iid N(0, 1), fresh per prompt,
    y_i = f(x_i; w)  (noiseless, as everywhere in the paper)

A *monomial set* is an (M, d) integer tensor of exponents a_m. Its default order is graded and,
inside a degree, ``itertools.combinations_with_replacement`` order on the variable indices, which
for degree 2 is eq. (7)'s order: 1, x_1, …, x_d, x_1², x_1x_2, …, x_1x_d, x_2², …, x_d².

Coefficient convention (Sun et al. 2025, §2.1). The coefficient vector ``w (B, M)`` multiplies the *raw*
monomials. For the quadratic class this is the paper's svec(W) ~ N(0, I) with
f(x) = [1 xᵀ] W [1; x], W symmetric and off-diagonal entries W_ij = w_ij / 2 (:func:`smat`).

Named sets: ``"quadratic"`` (every monomial of degree ≤ 2, C(d+2, 2) of them), ``"sparse_cubic"``
(the fixed 10-term cubic in 4 variables of Sec. 4.2), or an int k (every monomial of degree ≤ k).
"""

from __future__ import annotations

import ctypes
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from iclab.core import native as native_kernels
from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.threads import map_on_threads, split_evenly
from iclab.tasks.linear_regression import check_batch_n

MONOMIAL_SETS = ("quadratic", "sparse_cubic")

#: Sec. 4.2: w_0 + Σ_i w_i x[i] + w_12 x[1]x[2] + w_23 x[2]x[3] + w_34 x[3]x[4] + w_123 x[1]x[2]x[3] + w_234 x[2]x[3]x[4].
SPARSE_CUBIC = (
    (0, 0, 0, 0),
    (1, 0, 0, 0),
    (0, 1, 0, 0),
    (0, 0, 1, 0),
    (0, 0, 0, 1),
    (1, 1, 0, 0),
    (0, 1, 1, 0),
    (0, 0, 1, 1),
    (1, 1, 1, 0),
    (0, 1, 1, 1),
)


def all_monomials(d: int, degree: int) -> Tensor:
    """(M, d) exponents of every monomial of total degree ≤ ``degree``, graded, eq.-(7) order."""
    require_int("all_monomials", "d", d, 1)
    require_int("all_monomials", "degree", degree, 0)
    rows = []
    for k in range(degree + 1):
        for combo in itertools.combinations_with_replacement(range(d), k):
            a = [0] * d
            for j in combo:
                a[j] += 1
            rows.append(a)
    return torch.tensor(rows, dtype=torch.long)


def monomial_set(
    d: int, monomials: str | int | Tensor | tuple[tuple[int, ...], ...], owner: str = "PolynomialRegression"
) -> Tensor:
    """Resolve a named set, a degree or explicit exponents to a validated (M, d) long tensor.

    ``owner`` names the caller in error messages (``FeatureLeastSquares.monomials must be ...``).
    """
    require_int("monomial_set", "d", d, 1)
    if isinstance(monomials, str):
        require(owner, "monomials", monomials in MONOMIAL_SETS, f"one of {MONOMIAL_SETS}, an int degree >= 0 or an (M, d) exponent table", monomials)  # fmt: skip
        if monomials == "quadratic":
            return all_monomials(d, 2)
        require(owner, "d", d == 4, "4 for monomials='sparse_cubic' (Sec. 4.2)", d)
        return torch.tensor(SPARSE_CUBIC, dtype=torch.long)
    if isinstance(monomials, int) and not isinstance(monomials, bool):
        require(owner, "monomials", monomials >= 0, "a degree >= 0", monomials)
        return all_monomials(d, monomials)
    try:
        a = torch.as_tensor(monomials)
    except (TypeError, ValueError):
        a = None
    ok = a is not None and a.dim() == 2 and a.shape[0] >= 1 and a.shape[1] == d and not a.is_floating_point()
    require(owner, "monomials", ok, f"an (M, {d}) table of integer exponents", monomials)
    assert a is not None
    require(owner, "monomials", bool((a >= 0).all()), "non-negative exponents", a.tolist())
    require(owner, "monomials", len({tuple(r) for r in a.tolist()}) == a.shape[0], "distinct monomials", a.tolist())  # fmt: skip
    return a.long()


def monomials(x: Tensor, exponents: Tensor) -> Tensor:
    """(..., d), (M, d) -> (..., M): the raw monomials x^{a_m}."""
    xs = x.movedim(-1, 0)  # (d, ...): contiguous per-variable slabs
    powers = [torch.ones_like(xs), xs]  # powers[p][j] = x_j^p
    for _ in range(2, int(exponents.max()) + 1):
        powers.append(powers[-1] * xs)
    out = torch.ones(exponents.shape[0], *xs.shape[1:], dtype=x.dtype, device=x.device)  # (M, ...)
    for m, row in enumerate(exponents.tolist()):
        for j, p in enumerate(row):
            if p:
                out[m].mul_(powers[p][j])
    return out.movedim(0, -1)  # (..., M), a view: the slabs stay contiguous


#: bytes of one chunk's monomial features in :func:`polynomial_values`' torch code (a (c, T, M) block stays in cache)
VALUES_CHUNK_BYTES = 1 << 18
#: compute the labels by the C kernel ``_polynomial.c`` where it can be built (:mod:`iclab.core.native`); environment
#: ``ICLAB_NATIVE=0`` or False here: always the torch code
NATIVE = native_kernels.ENABLED
VALUES_PART = 512  # prompts per C call at most (a multiple of 4 calls per batch)
#: what runs slower without ``_polynomial.c`` (benchmarks/bench_sun_data.py, the ``sample`` case)
COST = "drawing a polynomial batch about 3× slower"
_SOURCE = Path(__file__).with_name("_polynomial.c")
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(lambda _: {"pv_values": ([_L, _I, _I, _I, _P, _P, _L, _P, _P], _I)})


def native() -> ctypes.CDLL | None:
    """``_polynomial.c`` compiled (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, cost=COST)


def polynomial_values(x: Tensor, w: Tensor, exponents: Tensor) -> Tensor:
    """(B, T, d), (B, M), (M, d) -> (B, T): f(x_t; w_b) = Σ_m w_bm x_t^{a_m} for every prompt b (Sec. 2.1).

    The same numbers, bit for bit, as ``einsum("btm,bm->bt", monomials(x, exponents), w)`` (a batched product that
    adds the M terms in order, each rounded): on a CPU by the C kernel ``_polynomial.c`` (tokens in vector lanes),
    elsewhere, or with ``ICLAB_NATIVE=0``, by that product over chunks of prompts whose (c, T, M) features fit in
    cache; parts of the batch run on torch's threads (:func:`~iclab.core.threads.map_on_threads`). The (B, T, M)
    feature tensor is never formed.
    """
    B, T, d = x.shape
    out = x.new_empty(B, T)
    lib = native() if _uses_native(x, w, exponents) else None
    if lib is not None:
        fn = getattr(lib, "pv_values_f32" if x.dtype == torch.float32 else "pv_values_f64")
        a = exponents.to(torch.int32).contiguous()
        wc, M = w.contiguous(), exponents.shape[0]
        step = split_evenly(B, VALUES_PART)

        def part(s: int) -> int:
            e = min(s + step, B)
            return int(fn(e - s, T, d, M, a.data_ptr(), x[s:e].data_ptr(), x.stride(0), wc[s:e].data_ptr(), out[s:e].data_ptr()))  # fmt: skip

        if not any(map_on_threads(part, range(0, B, step))):
            return out
    per = max(1, VALUES_CHUNK_BYTES // (T * exponents.shape[0] * x.element_size()))
    wc3 = w.unsqueeze(-1)  # (B, M, 1)

    def run(s: int) -> None:
        torch.bmm(monomials(x[s : s + per], exponents), wc3[s : s + per], out=out[s : s + per].unsqueeze(-1))

    map_on_threads(run, range(0, B, per), x.device.type != "cpu")
    return out


def _uses_native(x: Tensor, w: Tensor, exponents: Tensor) -> bool:
    """Whether the C kernel takes these operands: CPU float32/float64, tokens of contiguous d-vectors, small exponents."""
    ok = NATIVE and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and w.dtype == x.dtype
    ok = ok and x.shape[0] > 0 and x.shape[1] > 0 and x.shape[-1] <= 64 and exponents.device.type == "cpu"
    ok = ok and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] and int(exponents.max()) <= 16
    return ok and not (x.requires_grad or w.requires_grad)


def quadratic_features(x: Tensor) -> Tensor:
    """(..., d) -> (..., C(d+2, 2)): x̄ of eq. (7), (1, x, then x_j² − 1 and x_j x_k (j < k) in pair order).

    E[x̄ x̄ᵀ] = diag(1, 1_d, 2 on squares, 1 on products) (Lemma 3); this is what the Thm-2 FFN writes.
    """
    d = x.shape[-1]
    cols = [torch.ones_like(x[..., :1]), x]
    for j, k in itertools.combinations_with_replacement(range(d), 2):
        cols.append((x[..., j] * x[..., k] - (1.0 if j == k else 0.0)).unsqueeze(-1))
    return torch.cat(cols, dim=-1)


def block_features(x: Tensor, ell: int) -> Tensor:
    """(..., d) -> (..., 2d+1): the Thm-6/9 block ℓ ≥ 1, (1, x, x[ℓ%d]·x) with ℓ%d = ((ℓ−1) mod d) + 1."""
    j = (ell - 1) % x.shape[-1]
    return torch.cat([torch.ones_like(x[..., :1]), x, x[..., j : j + 1] * x], dim=-1)


def smat(w: Tensor, d: int) -> Tensor:
    """(..., C(d+2,2)) quadratic coefficients in eq.-(7) order -> (..., d+1, d+1) symmetric W with
    f(x) = [1 xᵀ] W [1; x]: W_00 = w_0, W_0i = w_i/2, W_ii = w_ii, W_ij = w_ij/2 (smat of Sun et al. 2025, §2.1)."""
    W = torch.zeros(*w.shape[:-1], d + 1, d + 1, dtype=w.dtype, device=w.device)
    pairs = [(0, 0)] + [(0, i + 1) for i in range(d)]
    pairs += [(j + 1, k + 1) for j, k in itertools.combinations_with_replacement(range(d), 2)]
    for m, (i, j) in enumerate(pairs):
        if i == j:
            W[..., i, i] = w[..., m]
        else:
            W[..., i, j] = W[..., j, i] = w[..., m] / 2
    return W


@dataclass(frozen=True, kw_only=True)
class PolynomialRegression:
    """Episodes y = Σ_m w_m x^{a_m} with x ~ N(0, I_d) and w ~ N(0, I_M), one w per prompt.

    ``task`` holds ``w (B, M)`` (per prompt) and ``exponents (M, d)``: the oracle's view.
    """

    d: int = 3
    monomials: str | int | Tensor | tuple[tuple[int, ...], ...] = "quadratic"
    exponents: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_int(self, "d", self.d, 1)
        object.__setattr__(self, "exponents", monomial_set(self.d, self.monomials))

    @property
    def n_monomials(self) -> int:
        """Number of monomials in the target's feature set."""
        return self.exponents.shape[0]

    @property
    def degree(self) -> int:
        """Highest total degree among the monomials."""
        return int(self.exponents.sum(1).max())

    def sample(self, batch: int, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        """``batch`` episodes with ``n`` context pairs on ``generator.device``."""
        check_batch_n(type(self).__name__, batch, n)
        dev = generator.device
        x_all = torch.randn(batch, n + 1, self.d, generator=generator, device=dev, dtype=dtype)  # (B, n+1, d)
        w = torch.randn(batch, self.n_monomials, generator=generator, device=dev, dtype=dtype)  # (B, M)
        exponents = self.exponents.to(dev)
        y_all = polynomial_values(x_all, w, exponents)  # (B, n+1)
        task = {"w": w, "exponents": exponents}
        return Episode(
            x=x_all[:, :n], y=y_all[:, :n], x_query=x_all[:, n], y_query=y_all[:, n], task=task, batched=("w",)
        )

    def zero_predictor_loss(self) -> float:
        """E[y²] = Σ_m E[x^{2a_m}] (16 / 23 for the quadratic class in d = 3 / 4; 10 for the cubic)."""
        return float(sum(math.prod(_dfact(2 * int(p) - 1) for p in row) for row in self.exponents))


def _dfact(k: int) -> int:
    """k!! for odd k >= -1 (E x^{2p} = (2p−1)!!)."""
    return math.prod(range(k, 0, -2)) if k > 0 else 1


def quadratic(d: int) -> PolynomialRegression:
    """Random quadratics in d variables (Sec. 2.1): C(d+2, 2) coefficients iid N(0, 1)."""
    return PolynomialRegression(d=d, monomials="quadratic")


def sparse_cubic() -> PolynomialRegression:
    """The fixed 10-term cubic in 4 variables of Sec. 4.2."""
    return PolynomialRegression(d=4, monomials="sparse_cubic")
