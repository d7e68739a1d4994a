"""L-BFGS as ``torch.optim.LBFGS`` runs it (same options, iterations, step sizes, stopping tests and strong-Wolfe line
search), its curvature pairs kept in two (history_size, p) ring buffers and its two-loop recursion done in one C call.

``torch.optim.LBFGS`` keeps the pairs as Python lists of vectors and runs the recursion as 4·m tensor operations per
iteration (m pairs, up to ``history_size``): at Ahn et al.'s history of 600 and a model of a few hundred parameters,
≈ 10 ms of dispatch per iteration, most of an L-BFGS step (Ahn et al. 2023, Fig. 3 and the quick presets of Figs 6, 7).
Here the recursion is ``_lbfgs.c`` (:mod:`iclab.core.native`; the loop below where it cannot be built, on a GPU or with
``ICLAB_NATIVE=0``). The directions equal torch's up to the order in which the dot products add (tested), and a
checkpoint of ``torch.optim.LBFGS`` (its list state) continues here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.optim.lbfgs import _strong_wolfe

from iclab.core import native as native_kernels

#: the two-loop recursion by ``_lbfgs.c`` on a CPU; ``ICLAB_NATIVE=0`` or False here: the torch loop
NATIVE = native_kernels.ENABLED
_SOURCE = Path(__file__).with_name("_lbfgs.c")
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SIGNATURES = native_kernels.per_real(lambda R: {"lbfgs_direction": ([_L, _L, _L, _L, _P, _P, _P, R, _P, _P], _I)})
#: what runs slower without ``_lbfgs.c`` (benchmarks/bench_lbfgs.py, Ahn et al.'s Fig. 3 quick step, 1 thread)
COST = "an L-BFGS step with a history of 600 pairs about 3.5× slower"
#: torch.optim.LBFGS's list state, converted to the ring buffers when a step finds it (a checkpoint of that optimiser)
_LIST_STATE = ("old_dirs", "old_stps", "ro", "al")


def native() -> ctypes.CDLL | None:
    """``_lbfgs.c`` compiled (:func:`iclab.core.native.load`); None where it cannot be built."""
    return native_kernels.load(_SOURCE, _SIGNATURES, cost=COST)


class LBFGS(torch.optim.LBFGS):
    """``torch.optim.LBFGS`` with the two-loop recursion in C over ring buffers (module docstring).

    State (of the first parameter, as torch's): ``S``, ``Y`` (cap, p) the steps and gradient changes, ``rho`` (cap,),
    ``first`` the row of the oldest pair and ``count`` the pairs held; cap grows by doubling up to ``history_size``.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """At most ``max_iter`` iterations, as torch.optim.LBFGS.step; returns the loss of the first evaluation."""
        if len(self.param_groups) != 1:
            raise ValueError(f"LBFGS takes one parameter group, not {len(self.param_groups)}")
        closure = torch.enable_grad()(closure)
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()  # type: ignore[no-untyped-call]
        if flat_grad.abs().max() <= tol_grad:
            return orig_loss
        _from_lists(state, group["history_size"])
        d, t, h_diag = state.get("d"), state.get("t"), state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            d, h_diag = _next_direction(state, flat_grad, prev_flat_grad, d, t, h_diag, group["history_size"])
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tol_change:  # not a descent direction
                break
            loss, flat_grad, t, evals, opt_cond = self._move(
                closure, d, t, loss, flat_grad, gtd, max_eval - current_evals, last=n_iter == max_iter
            )
            current_evals += evals
            state["func_evals"] += evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state.update(d=d, t=t, H_diag=h_diag, prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss

    def _move(
        self,
        closure: Callable[[], Any],
        d: Tensor,
        t: Any,
        loss: float,
        flat_grad: Tensor,
        gtd: Tensor,
        max_ls: int,
        *,
        last: bool,
    ) -> tuple[float, Tensor, Any, int, bool]:
        """Step along ``d``: by the strong-Wolfe line search, or by ``t`` and (unless ``last``: the next step's first
        evaluation is that loss) a new evaluation. (loss, gradient, step size, evaluations, gradient-tolerance met)."""
        group = self.param_groups[0]
        search, tol_grad = group["line_search_fn"], group["tolerance_grad"]
        if search is not None:
            if search != "strong_wolfe":
                raise ValueError(f"line_search_fn: only 'strong_wolfe' is supported, not {search!r}")
            x0 = self._clone_param()  # type: ignore[no-untyped-call]

            def along(x: list[Tensor], step: float, direction_: Tensor) -> tuple[float, Tensor]:
                loss_, grad_ = self._directional_evaluate(closure, x, step, direction_)  # type: ignore[no-untyped-call]
                return float(loss_), grad_

            loss, flat_grad, t, evals = _strong_wolfe(along, x0, t, d, loss, flat_grad, gtd, max_ls=max_ls)
            self._add_grad(t, d)
            return loss, flat_grad, t, evals, bool(flat_grad.abs().max() <= tol_grad)
        self._add_grad(t, d)
        if last:
            return loss, flat_grad, t, 0, False
        with torch.enable_grad():
            loss_t = closure()
        flat_grad = self._gather_flat_grad()  # type: ignore[no-untyped-call]
        return float(loss_t), flat_grad, t, 1, bool(flat_grad.abs().max() <= tol_grad)


def _next_direction(
    state: dict[str, Any],
    grad: Tensor,
    prev_grad: Tensor | None,
    d: Tensor | None,
    t: Any,
    h_diag: Any,
    history: int,
) -> tuple[Tensor, Any]:
    """(direction, H₀ scale) of an iteration: −g at the first, else −H g after storing the last step's pair when its
    curvature yᵀs exceeds 1e-10."""
    if state["n_iter"] == 1:
        state["first"], state["count"] = 0, 0
        return grad.neg(), 1
    assert prev_grad is not None and d is not None
    y = grad.sub(prev_grad)
    s = d.mul(t)
    ys = y.dot(s)
    if ys > 1e-10:
        _push(state, s, y, 1.0 / ys, history)
        h_diag = ys / y.dot(y)
    return direction(state, grad, h_diag), h_diag


def _push(state: dict[str, Any], s: Tensor, y: Tensor, rho: Tensor, history: int) -> None:
    """Store the pair (s, y) and ρ = 1 / yᵀs as the newest, over the oldest once ``history`` are held."""
    S, count, first = state.get("S"), state["count"], state["first"]
    cap = 0 if S is None else S.shape[0]
    if count == cap < history:  # full below the history size: double (the pairs are rows 0 … count − 1)
        new = min(history, max(8, 2 * cap))
        grown = {k: s.new_zeros((new, s.numel()) if k != "rho" else (new,)) for k in ("S", "Y", "rho")}
        for k, buf in grown.items():
            if cap:
                buf[:cap] = state[k]
            state[k] = buf
        cap = new
    if count < cap:
        row = (first + count) % cap
        state["count"] = count + 1
    else:  # history full: the newest overwrites the oldest
        row = first
        state["first"] = (first + 1) % cap
    state["S"][row], state["Y"][row], state["rho"][row] = s, y, rho


def direction(state: dict[str, Any], grad: Tensor, h_diag: Tensor | float) -> Tensor:
    """−H g by the two-loop recursion over the stored pairs (``_lbfgs.c`` on a CPU, else the same loop in torch)."""
    count, first = state["count"], state["first"]
    q = grad.clone(memory_format=torch.contiguous_format)
    if count == 0:
        return q.neg_().mul_(h_diag)
    S, Y, rho = state["S"], state["Y"], state["rho"]
    cap, p = S.shape
    al = rho.new_empty(cap)
    gamma = float(h_diag)
    lib = native() if NATIVE and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) else None
    if lib is not None:
        fn = lib.lbfgs_direction_f32 if q.dtype == torch.float32 else lib.lbfgs_direction_f64
        fn(p, cap, first, count, S.data_ptr(), Y.data_ptr(), rho.data_ptr(), gamma, al.data_ptr(), q.data_ptr())
        return q
    q.neg_()
    rows = [(first + j) % cap for j in range(count)]
    for i in reversed(rows):
        al[i] = S[i].dot(q) * rho[i]
        q.add_(Y[i], alpha=-float(al[i]))
    q.mul_(gamma)
    for i in rows:
        b = Y[i].dot(q) * rho[i]
        q.add_(S[i], alpha=float(al[i] - b))
    return q


def _from_lists(state: dict[str, Any], history: int) -> None:
    """Move torch.optim.LBFGS's list state (a checkpoint of that optimiser) into the ring buffers, oldest first."""
    dirs, steps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
    for key in _LIST_STATE:
        state.pop(key, None)
    if dirs is None or steps is None or ro is None:
        return
    state["first"], state["count"] = 0, 0
    state.pop("S", None)
    for y, s, r in zip(dirs[-history:], steps[-history:], ro[-history:], strict=True):
        _push(state, s, y, torch.as_tensor(r, dtype=y.dtype, device=y.device), history)
