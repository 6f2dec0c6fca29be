"""The host <-> guest protocol: frames, and the typed configuration of a sandbox's pid 1.

Standard library only, and nothing of ``rockroll`` imported: the guest (``guest/``) runs
with ``python -S -E`` and imports this module before ``pivot_root``, the host imports it
as any module. Both sides hold the same classes, so the config a deployment builds from a
``SandboxSpec`` (``deployment/local.py``, ``deployment/docker.py``) stays typed down to
the process that uses it.

Each frame is ``>II`` (header length, payload length) + JSON header + payload. Requests
carry an ``id``; every response echoes it, so many requests (commands in different
sessions) can be in flight at once. The first frame on the guest's stdin is its config
(``GuestConfig.frame``), not argv, which any process in the sandbox could read.
"""

from __future__ import annotations

import dataclasses
import json
import struct

FRAME = struct.Struct(">II")
MAX_FRAME = 1 << 30
PROTOCOL_VERSION = 1


def encode_frame(header: dict, payload: bytes = b"") -> bytes:
    """One protocol frame: sizes, JSON header, raw payload."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(head), len(payload)) + head + payload


class FrameReader:
    """Incremental frame decoder: ``feed(bytes)`` then iterate ``frames()``."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self):
        while len(self._buf) >= FRAME.size:
            hlen, plen = FRAME.unpack_from(self._buf)
            if hlen > MAX_FRAME or plen > MAX_FRAME:
                raise ValueError("oversized frame")
            end = FRAME.size + hlen + plen
            if len(self._buf) < end:
                return
            header = json.loads(bytes(self._buf[FRAME.size:FRAME.size + hlen]))
            if not isinstance(header, dict):  # both ends read fields off it: refuse, don't crash there
                raise ValueError("frame header is not a JSON object")
            payload = bytes(self._buf[FRAME.size + hlen:end])
            del self._buf[:end]
            yield header, payload


# Terminals (``guest/terminals.py``): at most this many per sandbox; output sent and not
# yet acknowledged by the host, per terminal (past it the guest stops reading: the writer
# blocks); keys waiting for the program to read them.
MAX_TERMINALS = 16
PTY_WINDOW = 256 << 10
PTY_INPUT_MAX = 1 << 20

# A spare guest (``deployment/local.py``) may get this frame before its config: it makes
# its network namespace, loopback up, while it waits (``GuestConfig.net_ready``).
PREPARE_NET = {"prepare": "net"}


@dataclasses.dataclass
class DiskConfig:
    """The sandbox's sized writable layer (``deployment/disk.py``): mounted at ``dir``
    (the same path in every sandbox, each in its own mount namespace), from the host's
    detached mount ``mount`` (a ``/proc/<host pid>/fd/<n>`` path), or, without one, a
    tmpfs the guest mounts itself with options ``tmpfs``."""

    dir: str
    mount: str | None = None
    tmpfs: str | None = None


@dataclasses.dataclass
class ModelConfig:
    """The in-sandbox model endpoint (``runtime/model_channel.py``): the guest listens on
    127.0.0.1:``port``; ``env`` (base URL, the sandbox's key) goes to every session."""

    port: int
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GuestConfig:
    """What pid 1 of a sandbox is told, built by a deployment from a ``SandboxSpec``.

    Local mode builds a root (``rootfs``, ``lowers``, ``upper``, ``work``, ``binds``) in
    namespaces of its own; enter mode (``enter_pid``, the docker backend) joins a running
    container's. ``seccomp`` (the syscall filter, hex) is added for every guest by
    ``deployment/process.py``; ``net_ready`` is the guest's own note (``PREPARE_NET``)."""

    id: str
    hostname: str = "sandbox"
    workdir: str = "/workspace"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    sessions: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> saved state
    cgroup_procs: list[str] = dataclasses.field(default_factory=list)  # cgroup.procs files to join
    disk: DiskConfig | None = None
    model: ModelConfig | None = None
    seccomp: str = ""
    # local mode
    rootfs: str = ""
    lowers: list[str] = dataclasses.field(default_factory=list)  # top first
    upper: str = ""
    work: str = ""
    binds: list[tuple[str, str, bool]] = dataclasses.field(default_factory=list)  # (src, dst, read-only)
    rlimits: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # (resource, soft, hard)
    userns: bool = False
    network: bool = False
    host_network: bool = False  # network="host": no namespace of its own
    # enter mode
    enter_pid: int | None = None
    # the guest's own
    net_ready: bool = False

    def frame(self) -> bytes:
        """The config frame (the first on the guest's stdin)."""
        return encode_frame({"config": dataclasses.asdict(self)})

    @classmethod
    def from_header(cls, header: dict) -> GuestConfig:
        """The config a ``frame()`` carried; ``TypeError`` for a field this side lacks."""
        fields = dict(header["config"])
        disk, model = fields.pop("disk", None), fields.pop("model", None)
        return cls(**fields, disk=DiskConfig(**disk) if disk else None,
                   model=ModelConfig(**model) if model else None)
