"""The service's warm pools: ``POST /v1/sandboxes`` for a pooled spec is served from warm sandboxes.

Each pool is an ``AsyncSandboxPool`` (``sandbox/pool.py``) of one spec, so it keeps that
pool's guarantees: it owns ``size`` sandboxes (idle ones plus those handed out), a
sandbox handed back (``DELETE /v1/sandboxes/{id}``, the idle reaper) is reset to its image
(or restored to the pool's snapshot) in the background before anyone gets it again, so it
carries nothing of its last user, and dead idle sandboxes are replaced.

**Matching is exact.** A request is served by the pool whose key equals the request's: the
``SandboxSpec`` after defaults (every field, ``env`` included; the service's backend filled
in) and the ``snapshot`` digest. Nothing "close enough" matches: a pool of
``memory_mb=512`` never serves a request for 1024 MB (the user would get other limits than
asked), and ``image="hub:counter@1"`` does not match a pool of ``"hub:counter@1.0.0"`` (a
range may resolve to a newer version later). Such requests are ordinary creates.

A *hit* is a request that found a warm sandbox in its pool; a *miss* one whose pool had
none idle (the pool creates one on demand; it is closed when given back if the pool then
owns more than ``size``); requests that match no pool are counted apart, as ``unpooled``.

Each handed-out sandbox gets a service id of its own, ``<sandbox id>.<lease>``: the same
sandbox handed out again is a different id, so a client that already gave it back reaches
``SandboxClosed``, never the next user's sandbox.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from ..errors import SpecError
from ..pool import AsyncSandboxPool
from ..protocol.wire import PoolIn, PoolOut
from ..spec import SandboxSpec

log = logging.getLogger("rockroll.serve")


def pool_key(spec: SandboxSpec, snapshot: str | None) -> str:
    """The id of the pool serving ``spec`` (+ ``snapshot``): a digest of the spec with every
    default filled in, so equal specs (however written) have equal keys."""
    canon = json.dumps({"spec": spec.to_dict(), "snapshot": snapshot}, sort_keys=True, separators=(",", ":"))
    return "pool-" + hashlib.sha256(canon.encode()).hexdigest()[:12]


class WarmPool:
    """One pool of the service, with its hit/miss counts and the leases it handed out."""

    def __init__(self, spec: SandboxSpec, snapshot: str | None, size: int, *, health_interval_s: float = 5.0):
        self.id = pool_key(spec, snapshot)
        self.spec, self.snapshot = spec, snapshot
        self.pool = AsyncSandboxPool(spec, size, snapshot=snapshot, health_interval_s=health_interval_s)
        if not isinstance(self.pool, AsyncSandboxPool):  # a backend's own pool (ray spreads over hosts)
            raise SpecError("backend", f"the service keeps warm pools on the local and docker backends, "
                                       f"not {spec.backend!r}")
        self.hits = self.misses = 0
        self.leases: dict[str, int] = {}  # sandbox id -> times handed out
        self.error: str | None = None     # why the last fill failed (shown until one succeeds)

    def lease_id(self, sandbox_id: str) -> str:
        n = self.leases[sandbox_id] = self.leases.get(sandbox_id, 0) + 1
        return f"{sandbox_id}.{n}"

    @property
    def held(self) -> int:
        """Sandboxes this pool holds that no client has: idle, being created or reset."""
        return self.pool.idle + self.pool.warming

    def describe(self) -> PoolOut:
        return PoolOut(id=self.id, spec=self.spec.to_dict(), snapshot=self.snapshot, size=self.pool.size,
                       idle=self.pool.idle, busy=self.pool.busy, hits=self.hits, misses=self.misses,
                       replaced=self.pool.replaced, error=self.error)


def parse_pool_option(text: str) -> dict[str, Any]:
    """``--pool size=4,image=hub:counter@1.0.0,memory_mb=512`` -> a ``PoolIn`` body.
    Values are JSON where they parse as JSON (numbers, true/false/null), else strings."""
    body: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError("pool", f"expected KEY=VALUE, got {item!r}")
        try:
            body[key.strip()] = json.loads(raw)
        except ValueError:
            body[key.strip()] = raw
    return body


def load_pools_file(path: str | Path) -> list[dict[str, Any]]:
    """The ``[[pool]]`` tables of a TOML file, each a ``PoolIn`` body (``size`` plus the
    fields of ``POST /v1/sandboxes``)."""
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecError("pools", f"{path}: {e}") from None
    pools = data.get("pool", [])
    if not isinstance(pools, list) or not all(isinstance(p, dict) for p in pools) or set(data) - {"pool"}:
        raise SpecError("pools", f"{path}: expected only [[pool]] tables")
    return pools


def check_pools(bodies: Iterable[dict[str, Any]]) -> list[PoolIn]:
    """Validate pool bodies as the API does; errors name the pool and the field."""
    out = []
    for i, body in enumerate(bodies):
        try:
            pool = PoolIn.model_validate(body)
            pool.to_spec("local")  # SandboxSpec's own checks (the backend is filled in later)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err.get("loc", ())) or "body"
            raise SpecError(f"pool[{i}].{field}", str(err.get("msg", "invalid"))) from None
        except SpecError as e:
            message = e.args[0].removeprefix(f"{e.field}: ")
            raise SpecError(f"pool[{i}].{e.field}", message) from None
        out.append(pool)
    return out
