r"""The roles that training is split into, as the loop sees them.

:func:`~rockroll.trainer.loop.run` drives a :class:`Roles`: a :class:`Trainer` (the policy;
it updates on groups, checkpoints itself and hands out its weights) and a :class:`Rollout`
(envs asking a generator; it produces groups for a policy version), plus the weight sync
between them. :class:`~.local.LocalRoles` runs them in this process, :class:`~.ray.RayRoles`
in Ray actors.

Roles that look at a step's batch before the policy trains on it (the KL reference, critics,
an attention pass) are :class:`BatchRole`\ s: :meth:`Roles.update` asks each to annotate the
batch, trains the policy with what they return, then lets each train itself. A new one is a
class with those methods, held by :class:`~.local.LocalRoles` and wrapped in an actor by
:mod:`.ray`; the loop only sees the protocols below.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from ..rollout.types import Group

__all__ = ["BatchRole", "RoleLost", "Roles", "Rollout", "Trainer"]


class RoleLost(RuntimeError):
    """A role the run cannot go on without (the trainer, a generator, a batch role) died with
    its process or node. What the last checkpoint holds is safe: the same command resumes it."""


class Trainer(Protocol):
    """The policy being trained."""

    def update(self, groups: list[Group], aux: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """One training step on ``groups`` (advantages, loss, optimizer steps) with what the
        batch roles computed on them (``aux``); its metrics."""

    def weights(self) -> dict[str, Any]:
        """The state dict a generator loads."""

    def restore(self) -> dict[str, Any] | None:
        """Load the latest checkpoint if resuming and there is one: ``{"step", "rollout",
        "roles", "path"}`` (``roles``: the batch roles' states, by name)."""

    def save(self, step: int, rollout_state: dict[str, Any], roles_state: dict[str, Any] | None = None) -> None:
        """A checkpoint of ``step``: the policy, the RNGs, the config, ``rollout_state`` and
        the batch roles' ``roles_state`` (by name), in one folder written atomically."""


class Rollout(Protocol):
    """Envs and the generator(s) they ask: groups of samples for a policy version."""

    def start(self, version: int, state: dict[str, Any] | None = None) -> None:
        """Start producing groups for the weights of ``version`` (from a checkpoint's rollout state)."""

    def get_batch(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """Block until a step's groups are ready; them and the rollout metrics."""

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        """Episodes from each task's first observation with the current weights; eval metrics."""

    def advance(self, version: int) -> None:
        """The generators now serve ``version``: admit the groups it allows (and end a pause)."""

    def pause(self) -> None:
        """Start no new group and wait for the running ones (before :meth:`state_dict`)."""

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`start` resumes from."""

    def close(self) -> None:
        """Stop every env and background thread; idempotent."""


class BatchRole(Protocol):
    """A role consulted on each step's groups around the policy's update: the frozen KL
    reference, critics, an attention pass. Tensors it returns are aligned with the rows of
    ``collate(groups)`` (per token: (B, T) on predicted tokens, like ``Batch.mask``) and on CPU.
    A class may inherit this protocol for the defaults of :meth:`state_dict` and
    :meth:`load_state_dict` (a role with no state of its own)."""

    trains: bool = False  # whether train() works on the role's models (the critics) or only reports

    def annotate(self, groups: list[Group]) -> dict[str, torch.Tensor]:
        """What the policy's update reads (e.g. ``ref_logp``), before it runs."""

    def train(self, groups: list[Group], aux: dict[str, torch.Tensor]) -> dict[str, float]:
        """After the policy's update: train this role on the same groups (critics); its metrics
        (``{}`` for a frozen role). ``aux``: every role's annotations of the step."""

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """The policy's new weights, for a role that follows the policy (the attention copy);
        the others ignore them."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this role to resume it exactly (CPU tensors): a trained
        role's models and optimizers (the critics); ``{}`` for a role whose state is derived
        from the config and the policy (the frozen reference, the attention copy)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back to what :meth:`state_dict` returned (on resume, before the first sync)."""


class Roles(ABC):
    """The roles of one run, as :func:`~rockroll.trainer.loop.run` drives them."""

    tokenizer: Any
    trainer: Trainer
    rollout: Rollout
    batch_roles: list[BatchRole] = []
    batch_names: list[str] = []  # each batch role's name (ray.roles, checkpoints): placement.role_name

    def update(self, groups: list[Group]) -> dict[str, float]:
        """One step's update: every batch role annotates ``groups``, the trainer trains on them
        with the annotations, then each batch role trains (critics) on the same step."""
        aux: dict[str, torch.Tensor] = {}
        for role in self.batch_roles:
            aux.update(role.annotate(groups))
        metrics = self.trainer.update(groups, aux)
        for role in self.batch_roles:
            metrics.update(role.train(groups, aux))
        return metrics

    def batch_state(self) -> dict[str, Any]:
        """Every batch role's :meth:`~BatchRole.state_dict`, by name: what a checkpoint keeps."""
        return {name: role.state_dict() for name, role in zip(self.batch_names, self.batch_roles)}

    def load_batch_state(self, saved: dict[str, Any] | None) -> None:
        """Resume every batch role from a checkpoint's :meth:`batch_state`; a role it lacks
        (a checkpoint from before roles were saved, or a role added since) starts afresh."""
        for name, role in zip(self.batch_names, self.batch_roles):
            if saved is not None and name in saved:
                role.load_state_dict(saved[name])
            else:
                print(f"rockroll: the checkpoint holds no state of batch role {name!r}: it starts afresh")

    @abstractmethod
    def sync_weights(self, version: int) -> None:
        """The trainer's weights to every generator, which then labels its samples ``version``."""

    @abstractmethod
    def close(self) -> None:
        """Stop every role (the rollout first); idempotent."""

    def lost(self, error: BaseException) -> list[str]:
        """The roles ``error`` says are gone with their process or node (``["the trainer
        (rank 0)"]``); none for an error of the run itself. In one process nothing is lost alone."""
        return []

    def summary(self) -> dict[str, Any]:
        """Objects of this process that the run's summary hands back (none when remote)."""
        return {}
