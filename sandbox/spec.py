"""Specs and results: the data that crosses every boundary of the sandbox engine."""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping
from urllib.parse import urlsplit

from .egress import EgressPolicy
from .errors import SpecError

BACKENDS = ("local", "docker", "remote", "ray")
DEFAULT_DISK_MB = 2048  # each sandbox's writable layer; None: no limit
DISK_MB_MAX = 1 << 20  # 1 TiB: a sparse image (and an ext4) of any host filesystem can be that big


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is made of. Validated on construction; errors name the field.

    ``cpus``, ``memory_mb``, ``pids`` and ``disk_mb`` are hard limits (``None``: unlimited);
    ``disk_mb`` bounds the sandbox's writable layer, bytes and inodes alike (writes past it
    fail with ENOSPC; ``deployment/disk.py``).
    ``timeout_s`` is the default timeout of ``run()``; ``ttl_s`` the idle lifetime a
    service or pool enforces. ``network=False`` leaves only loopback; ``network=True`` gives
    the sandbox a network namespace of its own reaching the public internet (nothing private,
    never the host's own addresses), narrowed by ``egress`` (an ``EgressPolicy``: host names,
    CIDRs, ports; ``egress.py``). ``network="host"`` (local backend only, an operator's
    choice, never a service client's) shares the creating process's own network namespace,
    as before sandboxes had networks of their own: for a machine where nothing may be wired
    into its namespace (``envhub/build.py``'s ``ROCKROLL_BUILD_NETWORK=host``).
    ``max_output_bytes`` caps each of stdout and stderr of one command.
    ``model_endpoint`` (``http://host:port`` of a model service, as this host reaches it)
    gives the sandbox an OpenAI-compatible endpoint without opening its network: its
    sessions see ``OPENAI_BASE_URL=http://127.0.0.1:8080/v1`` and a key of their own
    (``runtime/model_channel.py``).
    """

    image: str = "host"
    backend: str = "local"
    cpus: float | None = 1.0
    memory_mb: int | None = 1024
    pids: int | None = 256
    disk_mb: int | None = DEFAULT_DISK_MB
    network: bool | Literal["host"] = False
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"
    timeout_s: float = 120.0
    ttl_s: float | None = None
    max_output_bytes: int = 1 << 20
    model_endpoint: str | None = None
    egress: EgressPolicy | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image:
            raise SpecError("image", "must be a non-empty string")
        if self.backend not in BACKENDS:
            raise SpecError("backend", f"must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        _positive("cpus", self.cpus, minimum=0.01, maximum=CPUS_MAX)
        _positive("memory_mb", self.memory_mb, minimum=16, integer=True)
        _positive("pids", self.pids, minimum=8, integer=True, maximum=PID_MAX_LIMIT)
        _positive("disk_mb", self.disk_mb, minimum=16, integer=True, maximum=DISK_MB_MAX)
        _positive("timeout_s", self.timeout_s, minimum=0.001)
        _positive("ttl_s", self.ttl_s, minimum=0.001)
        _positive("max_output_bytes", self.max_output_bytes, minimum=1, integer=True)
        if not (isinstance(self.network, bool) or self.network == "host"):
            raise SpecError("network", f"must be true, false or 'host', not {self.network!r}")
        if self.network == "host" and self.backend != "local":
            raise SpecError("network", "'host' (the host's own network namespace) is for the local backend only")
        if not isinstance(self.workdir, str) or not posixpath.isabs(self.workdir):
            raise SpecError("workdir", f"must be an absolute path, not {self.workdir!r}")
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and k.isidentifier() and isinstance(v, str) for k, v in self.env.items()
        ):
            raise SpecError("env", "must map variable names (identifiers) to strings")
        if self.model_endpoint is not None and not _is_http_url(self.model_endpoint):
            raise SpecError("model_endpoint", f"must be an http://host:port URL, not {self.model_endpoint!r}")
        object.__setattr__(self, "env", dict(self.env))
        if self.egress is not None:
            object.__setattr__(self, "egress", EgressPolicy.from_value(self.egress))
            if self.network is not True:
                raise SpecError("egress", "an egress policy needs network=True")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SandboxSpec":
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpecError(sorted(unknown)[0], "unknown field")
        return cls(**data)


def _is_http_url(url) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname) and parts.port is not None \
            and parts.path in ("", "/") and not parts.username and not parts.password
    except ValueError:  # a port out of range
        return False


PID_MAX_LIMIT = 1 << 22  # the most pids a Linux system can have (64-bit), so the most a cgroup can cap
# More CPUs than any host has; the CFS quota of a huge value overflows (the kernel's ERANGE, a 503)
CPUS_MAX = 4096


def _positive(name: str, value, *, minimum: float, integer: bool = False, maximum: float | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise SpecError(name, f"must be {'an integer' if integer else 'a number'}, not {value!r}")
    if value < minimum:
        raise SpecError(name, f"must be >= {minimum}, not {value!r}")
    if maximum is not None and value > maximum:
        raise SpecError(name, f"must be <= {maximum} (None: unlimited), not {value!r}")


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one ``run()``. stdout and stderr are kept apart.

    ``timed_out``: the command's process group was killed at its timeout (the session
    lives on). ``truncated``: stdout or stderr went past the output cap.
    ``oom_killed``: the memory limit killed the command.
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Snapshot:
    """A saved sandbox state: a chain of content-addressed layer tarballs.

    ``digest`` names the top layer (``sha256:<hex>``); ``layers`` is the whole chain,
    base first, each layer holding only the changes on top of the previous one.
    ``path`` is the local tarball of the top layer.
    """

    id: str
    digest: str
    size: int
    layers: tuple[str, ...] = ()
    image: str = "host"
    path: Path | None = None
