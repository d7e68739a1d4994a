"""Baseline for bench_attention_dynamics.py: a straightforward token-level ATTN_S in plain PyTorch.

Zhang, Singh, Latham, Saxe 2025, eq. (S) as a practitioner would first write it (and as the authors'
code does): per head a key, query and value map on the (d+1)-wide tokens, the full (N+1)×(N+1) score
matrix per head in a Python loop over heads, the read-out ŷ_q = [out]_{N+1, d+1}, MSE, autograd and one
SGD step on the whole training set per epoch. Unlike the authors' code it keeps the paper's 1/N, so its
iterates are exactly those of :class:`iclab.models.SeparateAttention` under
:func:`iclab.training.full_batch_gd` (the benchmark checks this before timing).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class NaiveSeparateAttention(nn.Module):
    """ŷ_q = Σ_h [(1/N) Σ_i (x̃_q W_Q,hᵀ)(x̃_i W_K,hᵀ)ᵀ (W_V,h x̃_i)]_{d+1}, tokens as rows, query last."""

    def __init__(self, d: int, n_heads: int, rank: int = 1) -> None:
        super().__init__()
        D = d + 1
        self.keys = nn.ModuleList(nn.Linear(D, rank, bias=False) for _ in range(n_heads))
        self.queries = nn.ModuleList(nn.Linear(D, rank, bias=False) for _ in range(n_heads))
        self.values = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(n_heads))

    @torch.no_grad()
    def load_reduced(self, v: Tensor, k: Tensor, q: Tensor) -> NaiveSeparateAttention:
        """Zero blocks and reduced weights: value last row [0, v_h], key rows [k_hr, 0], query rows [q_hr, 0]."""
        for h in range(len(self.keys)):
            self.values[h].weight.zero_()
            self.values[h].weight[-1, -1] = v[h]
            self.keys[h].weight.zero_()
            self.keys[h].weight[:, :-1] = k[h]
            self.queries[h].weight.zero_()
            self.queries[h].weight[:, :-1] = q[h]
        return self

    def forward(self, X: Tensor) -> Tensor:  # (P, N+1, d+1) -> (P,)
        N = X.shape[1] - 1
        out = torch.zeros_like(X)
        for key, query, value in zip(self.keys, self.queries, self.values, strict=True):
            scores = query(X) @ key(X).transpose(1, 2) / N  # (P, T, T): target rows, source columns
            out = out + scores[:, :, :N] @ value(X)[:, :N]  # sources: the N context tokens
        return out[:, -1, -1]


def tokens(x: Tensor, y: Tensor, x_query: Tensor) -> Tensor:
    """(P, N, d), (P, N), (P, d) -> (P, N+1, d+1) with the query's label slot 0."""
    ctx = torch.cat([x, y.unsqueeze(-1)], dim=-1)
    qry = torch.cat([x_query, torch.zeros_like(x_query[:, :1])], dim=-1).unsqueeze(1)
    return torch.cat([ctx, qry], dim=1)


def train_epoch(model: NaiveSeparateAttention, X: Tensor, y_query: Tensor, opt: torch.optim.Optimizer) -> float:
    """One full-batch GD step; returns the loss before the step."""
    opt.zero_grad(set_to_none=True)
    loss = (model(X) - y_query).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.detach())
