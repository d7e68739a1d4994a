"""Second derivatives through the fused passes (:func:`iclab.core.native.first_order`).

Every fast path with a hand-written backward (the C kernels and the torch passes that keep tensors made in their
forward) returns gradients that carry no graph. A backward with ``create_graph`` through one of them raises and names
the pass that has second derivatives; that pass computes the same function (gradients equal to 1e-10 in float64)
and gives them (a non-zero Hessian-vector product). Without this guard they came out as zero (KernelTransformer, the moment kernel) or as a
confusing "does not require grad".
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import iclab
from iclab import models, tasks
from iclab.core import native as native_kernels
from iclab.core.episode import Episode
from iclab.experiments.zhang2025._setup import token_spec
from iclab.models import _query_fast
from iclab.tasks.gaussian_process import GaussianProcess
from iclab.tasks.linear_regression import LinearRegression

#: the cases whose fused pass is a C kernel alone: without one the torch code (differentiable twice) runs
C_ONLY = ("linear-moment", "softmax-query-row", "kernel-linear")
F64 = torch.float64


def _loss(model: torch.nn.Module, ep: Episode) -> torch.Tensor:
    if ep.y_query is not None:
        return (model(ep) - ep.y_query).pow(2).mean()
    return torch.nn.functional.cross_entropy(model(ep), ep.label_query)


def _linear_moment() -> tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]:
    model = token_spec(4, 2, key_query="merged", activation="linear", init_std=0.3).build()
    ep = LinearRegression(d=4).sample(40, 9, generator=iclab.generator(1), dtype=F64)
    return model, ep, lambda m: setattr(m, "forward", m.forward_tokens)


def _softmax_query_row() -> tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]:
    model = token_spec(4, 2, key_query="merged", activation="softmax", init_std=0.3).build()
    ep = LinearRegression(d=4).sample(40, 9, generator=iclab.generator(1), dtype=F64)
    return model, ep, lambda m: setattr(_query_fast, "NATIVE", False)  # what ICLAB_NATIVE=0 sets


def _kernel(acts: tuple[str, ...]) -> Callable[[], tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]]:
    def build() -> tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]:
        cfg = models.KernelTransformerConfig(d=5, n_layers=2, activations=acts, init_std=0.4)
        task = GaussianProcess.random_rotation((1.0, 1.0, 0.25, 2.25, 1.0), generator=iclab.generator(0), kernel="exp")
        ep = task.sample(24, 7, generator=iclab.generator(3), dtype=F64)
        return (
            models.KernelTransformer(cfg, generator=iclab.generator(1)).to(F64),
            ep,
            lambda m: setattr(m, "fast", False),
        )

    return build


def _bilinear() -> tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]:
    cfg = models.BilinearTransformerConfig(d=3, d_bar=8, n_blocks=2, init_std=0.3)
    model = models.BilinearTransformer(cfg, generator=iclab.generator(0)).to(F64)
    ep = tasks.quadratic(3).sample(20, 7, generator=iclab.generator(1), dtype=F64)
    return model, ep, lambda m: setattr(m, "forward", m.forward_tokens)


def _categorical() -> tuple[torch.nn.Module, Episode, Callable[[torch.nn.Module], None]]:
    cfg = models.CategoricalTransformerConfig(n_blocks=2, mode="free", kernel="softmax", init_std=0.3)
    model = models.CategoricalTransformer(cfg, generator=iclab.generator(0)).to(F64)
    g = iclab.generator(2)
    C, d = cfg.num_classes, cfg.d
    ep = Episode(x=torch.rand(6, 9, d, generator=g, dtype=F64) * 2 - 1,
                 x_query=torch.rand(6, d, generator=g, dtype=F64) * 2 - 1,
                 labels=torch.randint(C, (6, 9), generator=g), label_query=torch.randint(C, (6,), generator=g))  # fmt: skip
    return model, ep, lambda m: setattr(m, "fast", False)


CASES = {
    "linear-moment": _linear_moment,
    "softmax-query-row": _softmax_query_row,
    "kernel-exp": _kernel(("exp",)),
    "kernel-linear": _kernel(("linear",)),
    "kernel-linear-exp": _kernel(("linear", "exp")),
    "bilinear": _bilinear,
    "categorical": _categorical,
}


@pytest.mark.parametrize("case", CASES)
def test_a_fused_pass_refuses_create_graph_and_its_remedy_gives_second_derivatives(case, monkeypatch) -> None:
    monkeypatch.setattr(_query_fast, "NATIVE", _query_fast.NATIVE)  # restored after the remedy of the query row
    model, ep, remedy = CASES[case]()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = torch.autograd.grad(_loss(model, ep), params)
    if case not in C_ONLY or (native_kernels.ENABLED and native_kernels.compiler() is not None):
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(_loss(model, ep), params, create_graph=True)
    remedy(model)
    grads = torch.autograd.grad(_loss(model, ep), params, create_graph=True)
    for a, b in zip(grads, fused, strict=True):  # the remedy's pass is the same function
        assert float((a - b).abs().max()) <= 1e-10 * max(float(b.abs().max()), 1e-300)
    hvp = torch.autograd.grad(sum(g.pow(2).sum() for g in grads) / 2, params, allow_unused=True)
    assert any(h is not None and bool(h.abs().sum() > 0) for h in hvp)
