"""Collective weight sync: the trainer broadcasts its weights to the generators over
torch.distributed, tensor by tensor, after each step.

The group is one of its own, built from a :class:`torch.distributed.TCPStore` and a backend
object (``ProcessGroupGloo`` / ``ProcessGroupNCCL``) rather than ``init_process_group``:
torch's default group in the trainer process may already belong to DeepSpeed (its world is
the trainer's ranks, not trainer + generators). Rank 0 is the trainer, ranks 1..N are the
generators. The backend is gloo on CPU and NCCL when CUDA is available; the code is the same.

The store and the gloo connections bind to the node's address as Ray reports it, which is
127.0.0.1 for the local Ray that rockroll starts (:func:`~rockroll.trainer.roles.ray.init_local_ray`).
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

import torch
import torch.distributed as dist

# (name, shape, dtype) of every tensor, in broadcast order: receivers allocate from it.
Manifest = list[tuple[str, tuple[int, ...], torch.dtype]]


def sync_device() -> torch.device:
    """Where broadcast tensors live: the current GPU for NCCL, else the CPU for gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def manifest(state_dict: dict[str, torch.Tensor]) -> Manifest:
    return [(k, tuple(state_dict[k].shape), state_dict[k].dtype) for k in sorted(state_dict)]


def checksum(state_dict: dict[str, Any]) -> str:
    """A digest of names and exact tensor bytes: equal digests mean equal weights."""
    h = hashlib.sha256()
    for k in sorted(state_dict):
        t = state_dict[k].detach().to("cpu").contiguous().reshape(-1)
        h.update(k.encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class WeightGroup:
    """One member of the trainer + generators group.

    Rank 0 creates the store on a free port of ``host`` (:meth:`host_store`) and shares its
    address; then every member calls :meth:`connect` at the same time (the backend's
    rendezvous waits for all of them)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = 600.0):
        self.rank, self.world_size = rank, world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.device = sync_device()
        self.store: Any = None
        self.pg: Any = None

    def host_store(self, host: str) -> tuple[str, int]:
        """Rank 0: a TCP store on a port the OS picks (no race for a "free" port)."""
        self.store = dist.TCPStore(host, 0, self.world_size, is_master=True, wait_for_workers=False,
                                   timeout=self.timeout)
        return host, self.store.port

    def connect(self, local_host: str, address: tuple[str, int] | None = None) -> None:
        """Join the group: ``local_host`` is this member's own address, ``address`` rank 0's
        store (rank 0 already holds it)."""
        if self.store is None:
            self.store = dist.TCPStore(address[0], address[1], self.world_size, is_master=False,
                                       timeout=self.timeout)
        if self.device.type == "cuda":
            self.pg = dist.ProcessGroupNCCL(self.store, self.rank, self.world_size)
        else:  # an explicit device: gloo's default one binds to the host name's (outward) address
            opts = dist.ProcessGroupGloo._Options()
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host)]
            opts._timeout = self.timeout
            self.pg = dist.ProcessGroupGloo(self.store, self.rank, self.world_size, opts)

    def send(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Rank 0: broadcast every tensor, in manifest order."""
        for k in sorted(state_dict):
            self.pg.broadcast(state_dict[k].to(self.device).contiguous(), 0).wait()

    def receive(self, spec: Manifest) -> dict[str, torch.Tensor]:
        """Ranks 1..N: the broadcast tensors, on :func:`sync_device` (CUDA under NCCL)."""
        out = {}
        for name, shape, dtype in spec:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            self.pg.broadcast(t, 0).wait()
            out[name] = t
        return out
