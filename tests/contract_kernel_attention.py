"""Learner-battery entries for the kernel-attention family (Cheng, Chen, Sra 2024).

Imported by tests/test_learner_contract.py: every factory builds a fresh learner on d = D inputs.
Trained-like random models (one per h̃, multi-head, A ≡ 0, full Q/K) and the constructions of
Prop. 3.1, eq. (10), Thm 4.5's Σ^{-1/2} form and Prop. D.1.
"""

from __future__ import annotations

import torch

import iclab
from iclab import constructions, models
from iclab.core.kernels import Kernel
from iclab.models.kernel_attention import ACTIVATIONS

D = 4
F64 = torch.float64


def _model(activations: tuple[str, ...], **kw: object) -> models.KernelTransformer:
    cfg = models.KernelTransformerConfig(d=D, n_layers=2, activations=activations, init_std=0.15, **kw)  # type: ignore[arg-type]
    model = models.KernelTransformer(cfg, generator=iclab.generator(21)).to(F64)
    with torch.no_grad():  # O(1) label steps, so predictions are O(1) and the checks mean something
        for layer in model.layers:
            (layer.V_free[:, -1, -1] if cfg.value == "full" else layer.r_free).fill_(0.3)
    return model


def _spd(seed: int) -> torch.Tensor:
    g = iclab.generator(seed)
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=F64))
    return (q * torch.linspace(0.5, 2.0, D, dtype=F64)) @ q.T


_STEPS = torch.tensor([0.3, 0.2, 0.25], dtype=F64)
_G1 = torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64))
_G2 = torch.diag(torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=F64))

LEARNERS = {
    **{f"kernel-attention-{a}": (lambda a=a: _model((a,))) for a in ACTIVATIONS},
    "kernel-attention-2heads-linear-exp": lambda: _model(("linear", "exp")),
    "kernel-attention-A0-softmax": lambda: _model(("softmax",), value="label"),
    "kernel-attention-fullQK-relu": lambda: _model(("relu",), qk="full"),
    "kernel-attention-fullV-exp-per-n": lambda: _model(("exp",), value="full", divide_by_n=True),
    "construction-functional_gd-exp": lambda: constructions.functional_gd("exp", _STEPS, d=D),
    "construction-functional_gd-linear": lambda: constructions.functional_gd("linear", _STEPS, d=D),
    "construction-functional_gd-softmax": lambda: constructions.functional_gd("exp", _STEPS, d=D, normalized=True),
    "construction-functional_gd-whitened": lambda: constructions.functional_gd(
        "exp", _STEPS, sigma=1.3, transform=_spd(5)
    ),
    "construction-functional_gd-composite": lambda: constructions.functional_gd_multihead(
        (Kernel("linear", transform=_G1), Kernel("exp", transform=_G2)), _STEPS
    ),
    "construction-stationary_point-softmax-thm46": lambda: constructions.stationary_point(
        "softmax", _STEPS, _spd(6), 0.9, 1.1, covariate_steps=[0.05, -0.05, 0.1]
    )[0],
}
