"""Where the Ray roles run: ``ray.roles`` (per role: CPUs and GPUs of each actor, and the role
it is colocated with) as one placement group.

:func:`plan` is pure (no Ray): every actor of a role placed on its own gets a bundle; actor i
of a role with ``colocate: X`` joins the bundle of X's actor i % (X's actors); a bundle asks
for the sum of its actors' resources (CPUs, GPUs and the custom resources of ``resources``,
which pin a role to the nodes that offer them). Roles are named ``trainer``, ``generator``,
``env_worker``, ``reward`` and, for batch roles, by :func:`role_name` of their class (``reference``...).

Time-division sharing of one GPU, as ROLL runs every role on one device: colocated roles
whose fractions add up to at most 1 (``trainer: {num_gpus: 0.5}, reference: {num_gpus: 0.5,
colocate: trainer}``) get the same GPU from Ray. They take turns by the loop's order: within
a step the batch roles annotate, then the trainer updates, then the batch roles train, then
the weights move; the models of every colocated role stay resident, so their memory must fit
on the device together, unless a role says ``offload: true``: it then keeps its models (and
optimizer state) in host memory outside its own phases (:mod:`rockroll.trainer.engines.offload`), so the device holds
the working role's state and the resident ones'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError, RayConfig, RoleResources

__all__ = ["MIN_BUNDLE_CPUS", "Placement", "plan", "role_name"]

# Ray refuses a bundle that asks for nothing; one whose actors ask for nothing reserves this.
MIN_BUNDLE_CPUS = 0.01
# roles that by default ask for no GPU (env workers; the reward role, whose judge is usually
# an endpoint: ray.roles.reward gives a local judge model its device)
NO_DEVICE_ROLES = ("env_worker", "reward")


def role_name(cls: type) -> str:
    """A batch role's name in ``ray.roles``: its class's ``name``, else the class name without
    ``Role`` in snake case (``CriticsRole`` -> ``critics``)."""
    name = getattr(cls, "name", None)
    if isinstance(name, str) and name:
        return name
    base = cls.__name__.removesuffix("Role") or cls.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


@dataclass
class Placement:
    """One placement group: ``bundles[b]`` is what bundle b asks for; ``bundle[role][i]`` the
    bundle of the role's actor i; ``resources[role]`` what each of its actors asks for."""

    bundles: list[dict[str, float]]
    bundle: dict[str, list[int]]
    resources: dict[str, RoleResources]
    strategy: str = "PACK"
    group: Any = field(default=None, repr=False)  # the Ray placement group, once created

    def options(self, role: str, index: int) -> dict[str, Any]:
        """``actor_class.options(...)`` for actor ``index`` of ``role``: its resources, in its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        res = self.resources[role]
        return {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "resources": dict(res.resources),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=self.bundle[role][index])}

    def create(self, timeout_s: float = 120.0) -> Any:
        """The placement group, reserved (or a RuntimeError saying what the cluster lacks)."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        have = ray.cluster_resources()
        for key in sorted({"CPU", "GPU", *(k for b in self.bundles for k in b)}):
            want = sum(b.get(key, 0.0) for b in self.bundles)
            if want > have.get(key, 0.0) + 1e-9:
                raise ConfigError("ray.roles", f"the roles ask for {want:g} {key} in all, the cluster has "
                                  f"{have.get(key, 0.0):g}: bundles {self.bundles}")
        self.group = placement_group(self.bundles, strategy=self.strategy)
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            raise RuntimeError(f"ray.roles: the cluster did not reserve the bundles {self.bundles} "
                               f"({self.strategy}) within {timeout_s:g} s") from None
        return self.group

    def remove(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None


def plan(ray_cfg: RayConfig, counts: dict[str, int]) -> Placement | None:
    """The placement of a run whose roles have ``counts`` actors each (in bundle order), or
    None when ``ray.roles`` is empty (each actor then asks for ``ray.num_gpus`` as before and
    Ray schedules it freely). A role missing from ``ray.roles`` asks for ``ray.num_gpus``
    (env workers and the reward role: nothing) and is placed on its own."""
    if not ray_cfg.roles:
        return None
    for name, spec in ray_cfg.roles.items():
        if name not in counts:
            raise ConfigError(f"ray.roles.{name}", f"no such role in this run (its roles: {', '.join(counts)})")
        if spec.colocate is not None and spec.colocate not in counts:
            raise ConfigError(f"ray.roles.{name}.colocate",
                              f"{spec.colocate} is no role of this run (its roles: {', '.join(counts)})")
    default = {name: RoleResources(num_gpus=0.0 if name in NO_DEVICE_ROLES else ray_cfg.num_gpus) for name in counts}
    resources = {name: ray_cfg.roles.get(name, default[name]) for name in counts}
    bundles: list[dict[str, float]] = []
    where: dict[str, list[int]] = {}
    for name, n in counts.items():  # roles placed on their own first: one bundle per actor
        if resources[name].colocate is None:
            where[name] = list(range(len(bundles), len(bundles) + n))
            bundles += [{} for _ in range(n)]
    for name, n in counts.items():
        target = resources[name].colocate
        if target is not None:
            where[name] = [where[target][i % len(where[target])] for i in range(n)]
    for name, n in counts.items():
        for b in where[name]:
            for key, amount in (("CPU", resources[name].num_cpus), ("GPU", resources[name].num_gpus),
                                *resources[name].resources.items()):
                if amount:
                    bundles[b][key] = bundles[b].get(key, 0.0) + amount
    for b in bundles:
        if not any(b.values()):
            b["CPU"] = MIN_BUNDLE_CPUS
    return Placement(bundles, where, resources, ray_cfg.placement_strategy)
