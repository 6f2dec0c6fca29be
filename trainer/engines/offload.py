"""A role's tensors off its device between its turns, and copies of its state for a checkpoint.

Time-division sharing of one GPU (ROLL's colocation): roles placed on the same device by
``ray.roles`` (fractional ``num_gpus`` in one bundle) take turns by the loop's order, and a
role with ``ray.roles.<name>.offload: true`` holds its weights and optimizer state in host
memory while it is not working: :meth:`Offloadable.onload` before its phase of a step,
:meth:`Offloadable.offload` after (:class:`~rockroll.trainer.roles.ray.RayRoles` calls them). Without a GPU
the role's home is the CPU and both are no-ops (only :attr:`Offloadable.residency` changes).

Moving a module with ``Module.to`` rebinds each parameter's ``.data`` in place, so an
optimizer keeps its parameters; its per-parameter state (Adam's moments) moves with them,
except ``step``, which torch keeps on the CPU for non-capturable optimizers.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["Offloadable", "cpu_copy", "home_device", "move_state"]


def home_device() -> torch.device:
    """Where a role's models live while it works: the GPU Ray gave its actor, if any."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_copy(obj: Any) -> Any:
    """``obj`` (nested dicts, lists and tuples of tensors, as state dicts are) with every
    tensor copied to the CPU: a checkpoint's copy, independent of the live tensors, that a
    process without the role's device can unpickle."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def move_state(modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer],
               device: torch.device | str) -> None:
    """Every parameter and buffer of ``modules`` and every tensor of the optimizers' state
    (but ``step``) to ``device``, in place."""
    for m in modules:
        m.to(device)
    for opt in optimizers:
        for state in opt.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = v.to(device)


class Offloadable:
    """Mixin of a role that can leave its device between turns: :meth:`resident_state` names
    what moves (its models, and its optimizers for a training role)."""

    residency: str = "device"  # "device" or "host": where the state is now
    onloads: int = 0  # how many times it came back to the device (a schedule's record)

    def resident_state(self) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
        """The models and optimizers that move."""
        raise NotImplementedError

    def offload(self) -> None:
        """Models and optimizer state to host memory, the device's cached blocks released
        (the caching allocator would otherwise keep them from the role that works next)."""
        move_state(*self.resident_state(), "cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.residency = "host"

    def onload(self) -> None:
        """Back on the device, before the role's phase."""
        move_state(*self.resident_state(), home_device())
        self.residency = "device"
        self.onloads += 1

    def where(self) -> dict[str, Any]:
        """Where the state is (``residency``), where its first parameter is, and ``onloads``."""
        modules, _ = self.resident_state()
        device = next((str(p.device) for m in modules for p in m.parameters()), None)
        return {"residency": self.residency, "device": device, "onloads": self.onloads}
