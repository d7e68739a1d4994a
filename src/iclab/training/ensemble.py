"""Many seeds trained as one model: stacked parameters evaluated with ``torch.func.vmap``.

    members = [make_model(seed) for seed in seeds]                  # same architecture, own init
    ens = Ensemble(members)
    sample = ensemble_sampler([partial(task_s.sample, n=20) for task_s in tasks])
    result = train(ens, sample, cfg, loss_fn=ensemble_loss())     # the one trainer, unchanged
    trained = ens.unstack()                                         # S ordinary models again

An ensemble batch is the S members' batches concatenated member-major: prompt ``b`` of a batch of
S·B belongs to member ``b // B``. The loss is the *sum* of the members' mean losses, so every
member's gradient is exactly its own, and Adam, SGD and per-matrix clipping (which act element-
or block-wise on the stacked (S, …) parameters) update every member exactly as training it alone
on the same batches would (tests/test_ensemble.py checks this to 1e-10 in float64). A global
gradient norm would mix the members and L-BFGS couples all parameters through its line search and
history, so both are refused.

Whether this is faster than a loop depends on the model and the device: on a 2-core CPU it gains
for small, launch-bound models and loses for larger ones (docs/performance.md); on a GPU it runs S
small models in the kernel launches of one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from iclab.core.episode import Episode
from iclab.core.errors import ConfigError, require
from iclab.core.learner import Learner
from iclab.core.seeding import derive_seed, generator
from iclab.training.config import TrainConfig
from iclab.training.trainer import Sampler

_SEP = "::"  # parameter names hold dots; ParameterDict keys may not


def _episode_fields(ep: Episode) -> dict[str, Tensor]:
    return {
        k: getattr(ep, k)
        for k in ("x", "y", "x_query", "y_query", "labels", "label_query")
        if getattr(ep, k) is not None
    }


class Ensemble(nn.Module):
    """S models of one architecture whose parameters are stacked along a leading member axis.

    ``predict(episode)`` takes an ensemble batch (S·B prompts, member-major) and returns the S·B
    predictions; ``member_predict`` returns them as (S, B). Per-prompt task entries are not passed to
    the members (the learners of this library predict from the context alone).
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        require("Ensemble", "members", len(members) >= 1, "at least one model", len(members))
        kinds = {type(m) for m in members}
        require("Ensemble", "members", len(kinds) == 1, "models of one class", sorted(k.__name__ for k in kinds))
        shapes = [{k: tuple(v.shape) for k, v in m.state_dict().items()} for m in members]
        require(
            "Ensemble",
            "members",
            all(s == shapes[0] for s in shapes),
            "models with identical parameter shapes",
            "differing shapes",
        )
        params, buffers = stack_module_state(list(members))
        self.size = len(members)
        self.stacked = nn.ParameterDict({k.replace(".", _SEP): nn.Parameter(v) for k, v in params.items()})
        for p in self.stacked.values():
            p.ensemble_axis = True  # clip_gradients: axis 0 is the member
        for k, v in buffers.items():
            self.register_buffer("buf" + _SEP + k.replace(".", _SEP), v)
        # A list, so the template is not registered as a submodule; its weights live in ``stacked``.
        self._template = [_Predict(copy.deepcopy(members[0]).to("meta"))]

    def _state(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        params = {"m." + k.replace(_SEP, "."): v for k, v in self.stacked.items()}
        prefix = "buf" + _SEP
        buffers = {
            "m." + k[len(prefix) :].replace(_SEP, "."): v for k, v in self.named_buffers() if k.startswith(prefix)
        }
        return params, buffers

    def check_train_config(self, cfg: TrainConfig) -> None:
        check_ensemble_config(cfg)

    def member_predict(self, episode: Episode) -> Tensor:
        """(S·B,) prompts, member-major -> (S, B) predictions of each member on its own prompts."""
        S = self.size
        require(
            "Ensemble",
            "episode batch",
            episode.batch_size % S == 0,
            f"a multiple of the {S} members",
            episode.batch_size,
        )
        fields = {k: v.reshape(S, -1, *v.shape[1:]) for k, v in _episode_fields(episode).items()}
        params, buffers = self._state()
        template = self._template[0]

        def one(p: dict[str, Tensor], b: dict[str, Tensor], f: dict[str, Any]) -> Tensor:
            out: Tensor = functional_call(template, (p, b), (Episode(**f),))
            return out

        return vmap(one)(params, buffers, fields)

    def predict(self, episode: Episode) -> Tensor:
        return self.member_predict(episode).reshape(-1)

    def forward(self, episode: Episode) -> Tensor:
        return self.predict(episode)

    def unstack(self) -> list[nn.Module]:
        """The S members as ordinary models (on the ensemble's device and dtype), trained weights loaded."""
        params, buffers = self._state()
        ref = next(iter(params.values()))
        out = []
        for s in range(self.size):
            m = copy.deepcopy(self._template[0].m).to_empty(device=ref.device)
            m.load_state_dict({k[2:]: v[s].detach().clone() for k, v in {**params, **buffers}.items()})
            out.append(m)
        return out


class _Predict(nn.Module):
    """Routes ``forward`` to the member's ``predict`` (``functional_call`` calls ``forward``)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, episode: Episode) -> Tensor:
        return cast(Learner, self.m).predict(episode)


def ensemble_sampler(samples: Sequence[Sampler]) -> Sampler:
    """One sampler for an ensemble: member ``s`` draws its B prompts from ``samples[s]`` with its own
    generator, seeded from the trainer's generator and ``s``; the batches are concatenated
    member-major (S·B prompts). :func:`member_sampler` draws member ``s``'s part alone."""
    require("ensemble_sampler", "samples", len(samples) >= 1, "at least one sampler", len(samples))

    def sample(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        parts = [member_sampler(f, s)(batch, generator=generator, dtype=dtype) for s, f in enumerate(samples)]
        return _concat(parts)

    return sample


def member_sampler(sample: Sampler, member: int) -> Sampler:
    """Member ``member``'s share of :func:`ensemble_sampler`: the same prompts it gets in the ensemble."""

    def draw(batch: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Episode:
        g = _member_generator(generator, member)
        return sample(batch, generator=g, dtype=dtype)

    return draw


def _member_generator(g: torch.Generator, member: int) -> torch.Generator:
    return generator(derive_seed(g.initial_seed(), "member", member), g.device)


def _concat(parts: Sequence[Episode]) -> Episode:
    fields: dict[str, Any] = {k: torch.cat([_episode_fields(p)[k] for p in parts]) for k in _episode_fields(parts[0])}
    return Episode(**fields)


def ensemble_loss(
    per_prompt: Callable[[Tensor, Episode], Tensor] | None = None,
) -> Callable[[nn.Module, Episode], Tensor]:
    """The trainer's ``loss_fn`` for an :class:`Ensemble`: Σ_s (mean loss of member s on its prompts).

    ``per_prompt(pred (S, B), episode) -> (S, B)`` defaults to the squared error (ŷ − y_q)², the
    trainer's ``mse_loss`` member by member.
    """

    def loss(model: nn.Module, episode: Episode) -> Tensor:
        require("ensemble_loss", "model", isinstance(model, Ensemble), "an Ensemble", type(model).__name__)
        pred = cast(Ensemble, model).member_predict(episode)
        if per_prompt is None:
            assert episode.y_query is not None
            err = (pred - episode.y_query.reshape(pred.shape)).pow(2)
        else:
            err = per_prompt(pred, episode)
        return err.mean(dim=1).sum()

    return loss


def check_ensemble_config(cfg: TrainConfig) -> None:
    """Refuse the settings under which the members would not train independently (the trainer
    calls this through :meth:`Ensemble.check_train_config` before any work)."""
    if cfg.optimizer == "lbfgs":
        raise ConfigError("TrainConfig.optimizer 'lbfgs' cannot train an Ensemble: its line search couples the members")
    if cfg.clip is not None and cfg.clip_mode == "global":
        raise ConfigError(
            "TrainConfig.clip_mode 'global' cannot train an Ensemble: one norm would mix the members; use 'per_matrix'"
        )
    if cfg.train_size is not None and cfg.batch_size != cfg.train_size:
        raise ConfigError(
            "TrainConfig.batch_size must equal train_size (full batch) for an Ensemble: "
            f"minibatches of a fixed set would mix the members; got batch_size={cfg.batch_size}, train_size={cfg.train_size}"
        )
