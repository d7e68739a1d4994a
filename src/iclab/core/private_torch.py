"""The two private torch functions iclab calls, each behind one helper.

torch 2.13 offers no public function that does the same thing (the reason is given at each helper); keeping
the calls here means a torch release that moves or renames them breaks this module only.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._C._functorch import is_functorch_wrapped_tensor


def is_transformed(*tensors: Tensor) -> bool:
    """Whether any tensor is wrapped by a torch.func transform (vmap, grad, jvp).

    Used to skip what cannot run on such a wrapper: the in-place fused kernels (vmap has no batched
    ``addcmul_``), the ctypes kernels that read ``data_ptr()``, and :meth:`Episode.memo`'s cache (vmap's
    tensors are rebuilt every call). ``torch.func`` exports no predicate for this; its one public function
    that tests for a wrapper, ``torch.func.debug_unwrap``, is documented for debugging only.
    """
    return any(is_functorch_wrapped_tensor(t) for t in tensors)


def standard_gamma(concentration: Tensor, *, generator: torch.Generator) -> Tensor:
    """Gamma(concentration, 1) draws, one per entry of ``concentration``, from ``generator``.

    Used for the χ² diagonal of Bartlett's decomposition of a Wishart matrix
    (:mod:`iclab.theory.preconditioned_gd`). ``torch.distributions.Gamma(...).sample()`` (and ``Chi2``)
    draws from the global generator only; ``torch._standard_gamma`` is the kernel behind it and the one
    gamma sampler in torch that takes a ``generator``.
    """
    return torch._standard_gamma(concentration, generator=generator)
