"""The HTTP wire format of ``rockroll serve``: one request/response model per action,
shared by the service (``server/``) and the SDK (``runtime/remote.py``), so the two cannot
drift apart. Also the mapping between typed sandbox errors and HTTP statuses.

Every error response body is ``{"error": <SandboxError subclass name>, "message": ...,
"sandbox_id": ...}``; 422s add FastAPI's ``detail`` list, whose ``loc`` names the field.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from .. import errors
from ..errors import CapacityError, SandboxError, SpecError, StorageFullError, StorageLimitError, UnsafeArchiveError
from ..spec import CommandResult, SandboxSpec, Snapshot

API = "/v1"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# Ordered most specific first: the first matching base class decides the status.
_STATUS: tuple[tuple[type[SandboxError], int], ...] = (
    (errors.SandboxNotFound, 404),
    (SpecError, 422),
    (CapacityError, 429),
    (errors.SandboxClosed, 409),
    (errors.GuestDied, 409),          # the sandbox's state (incl. SandboxLost): reset() recovers
    (errors.SandboxStartError, 503),
    (errors.IsolationUnavailable, 503),
    (UnsafeArchiveError, 400),
    (StorageFullError, 507),          # the disk's reserve or the token's quota is used up
    (StorageLimitError, 413),         # one layer or chain larger than allowed
    (errors.SnapshotError, 400),
    (errors.SandboxFileNotFound, 404),
    (errors.SandboxFileError, 400),
    (errors.SessionError, 400),
    (SandboxError, 400),
)


class AuthError(SandboxError):
    """The service refused the bearer token (missing or wrong): set ``ROCKROLL_TOKEN``."""


def status_of(exc: SandboxError) -> int:
    return next(code for cls, code in _STATUS if isinstance(exc, cls))


def error_body(exc: SandboxError) -> dict[str, Any]:
    """The JSON body of a typed error; ``error_from_body`` inverts it."""
    message = exc.args[0] if exc.args else ""
    body: dict[str, Any] = {"error": type(exc).__name__, "message": message, "sandbox_id": exc.sandbox_id}
    if isinstance(exc, SpecError):
        msg = message.split(": ", 1)[1] if message.startswith(exc.field + ": ") else message
        body.update(field=exc.field, detail=[{"loc": ["body", exc.field], "msg": msg, "type": "value_error"}])
    elif isinstance(exc, CapacityError):
        body["retry_after"] = exc.retry_after
    elif isinstance(exc, UnsafeArchiveError):
        body.update(member=exc.member, reason=exc.reason)
    elif isinstance(exc, StorageLimitError):
        body.update(limit=exc.limit, value=exc.value)
    return body


def error_from_body(status: int, body: Any) -> SandboxError:
    """Rebuild the exception the service raised, as the same class a local sandbox raises."""
    if not isinstance(body, dict):
        body = {}
    if status == 401:
        return AuthError(body.get("message") or "unauthorized: wrong or missing bearer token")
    name, message, sid = body.get("error"), str(body.get("message") or ""), body.get("sandbox_id")
    if status == 422 or name == "SpecError":
        if "field" in body:
            return SpecError(str(body["field"]), _strip_field(message, body["field"]))
        detail = body.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):  # FastAPI's own 422
            loc = [str(p) for p in detail[0].get("loc", ()) if p not in ("body", "query", "path")]
            return SpecError(".".join(loc) or "body", str(detail[0].get("msg", "invalid")))
        return SpecError("body", message or f"HTTP {status}")
    cls = getattr(errors, name, None) if isinstance(name, str) else None
    if cls is None or not (isinstance(cls, type) and issubclass(cls, SandboxError)):
        cls = AuthError if name == "AuthError" else SandboxError
        message = message or f"HTTP {status}: {str(body)[:200]}"
    if cls is CapacityError:
        return CapacityError(message, retry_after=float(body.get("retry_after") or 1.0), sandbox_id=sid)
    if cls is UnsafeArchiveError:
        return UnsafeArchiveError(str(body.get("member")), str(body.get("reason")), sandbox_id=sid)
    if cls in (StorageLimitError, StorageFullError):
        err = cls(str(body.get("limit")), int(body.get("value") or 0), "", sandbox_id=sid)
        err.args = (message,)  # the service's words, not rebuilt
        return err
    return cls(message, sandbox_id=sid)


def _strip_field(message: str, field: str) -> str:
    return message[len(field) + 2:] if message.startswith(f"{field}: ") else message


# --------------------------------------------------------------------------- requests
def model_fields_of(dc: type) -> dict[str, Any]:
    """A dataclass's fields as pydantic field definitions: one source of truth, so the
    API models and the dataclasses cannot drift apart."""
    hints = typing.get_type_hints(dc)
    out = {}
    for f in dataclasses.fields(dc):
        default = Field(default_factory=f.default_factory) if f.default is dataclasses.MISSING else f.default
        out[f.name] = (hints[f.name], default if f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING else ...)
    return out


class _SpecInBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


SpecInFields = create_model("SpecInFields", __base__=_SpecInBase, **model_fields_of(SandboxSpec))


class SpecIn(SpecInFields):
    """``POST /v1/sandboxes``: the fields of ``SandboxSpec`` (checked by it, so its errors
    name the field), plus ``snapshot`` to start from a stored snapshot's digest.
    ``backend`` is accepted and ignored: the service runs its own backend."""

    # A digest only: a path here would make the service read its own files as tarballs.
    snapshot: str | None = Field(default=None, pattern=DIGEST_PATTERN,
                                 description="digest (sha256:...) of a snapshot stored on the service")

    def to_spec(self, backend: str) -> SandboxSpec:
        fields = self.model_dump(include=set(SandboxSpec.__dataclass_fields__))
        fields["backend"] = backend
        if fields.get("network") == "host":  # the service's own namespace: never a client's to ask
            raise SpecError("network", "'host' is an operator's choice on the local backend, not a service client's")
        spec = SandboxSpec.from_dict(fields)
        # The gateway would read the service's own environment or files (a secret's source, a
        # CA file) and send them where the client's policy says: an operator's, never a client's.
        if spec.egress is not None and spec.egress.injects():
            raise SpecError("egress.inject", "reads secrets of the service's host: not a service client's to ask")
        if spec.egress is not None and spec.egress.upstream_ca is not None:
            raise SpecError("egress.upstream_ca", "names a file of the service's host: not a service client's to ask")
        return spec


class PoolIn(SpecIn):
    """``POST /v1/pools`` (and each ``--pool`` / ``[[pool]]`` of ``rockroll serve``): keep
    ``size`` warm sandboxes of this spec (the fields of ``POST /v1/sandboxes``)."""

    size: int = Field(ge=1, le=4096, description="sandboxes the pool owns: idle plus handed out")


class ExposeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(ge=1, le=65535, description="a TCP port of the sandbox")


class ExposeOut(BaseModel):
    host: str = Field(description="an address of the service's host (127.0.0.1)")
    port: int


class EgressLogOut(BaseModel):
    records: list[dict[str, Any]] = Field(description="the egress audit log's records after ``since``, oldest "
                                          "first (seq, time, kind, method, host, path, ip, port, status, bytes_out, "
                                          "bytes_in, decision, reason)")
    kept: int = Field(description="records the log holds now")
    bytes: int = Field(description="their encoded size")
    max_bytes: int = Field(description="the log's bound: past it the oldest records are dropped")
    dropped: int = Field(description="records dropped so far to stay within max_bytes")


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: str
    timeout: float | None = None
    session: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None


class ForkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(default=1, ge=1, le=64)


MAX_BATCH = 1024  # sandboxes one POST /v1/sandboxes/batch may ask for


class BatchIn(BaseModel):
    """``POST /v1/sandboxes/batch``: many sandboxes in one request (what the SDK sends
    for creates issued together); each item as ``POST /v1/sandboxes`` takes it."""
    model_config = ConfigDict(extra="forbid")
    sandboxes: list[SpecIn] = Field(min_length=1, max_length=MAX_BATCH)


class RestoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: str = Field(pattern=DIGEST_PATTERN)


# --------------------------------------------------------------------------- responses
class ResultOut(create_model("ResultFields", **model_fields_of(CommandResult))):
    """``CommandResult`` on the wire."""

    @classmethod
    def of(cls, r: CommandResult) -> "ResultOut":
        return cls(**r.__dict__)

    def to_result(self) -> CommandResult:
        return CommandResult(**self.model_dump())


class CommandOut(BaseModel):
    """One entry of a sandbox's recent-commands log (dashboard)."""
    cmd: str
    exit_code: int | None
    duration_s: float
    at: float
    error: str | None = None


class StatsOut(BaseModel):
    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    network: dict[str, Any] | None = Field(default=None, description="a sandbox with network=True: bytes_in, "
                                           "bytes_out, connections, dns_queries, denied (by reason)")


class SandboxOut(BaseModel):
    id: str
    state: str = Field(description="alive | dead (guest died: reset() recovers) | closed")
    spec: dict[str, Any]
    created: float
    last_used: float
    commands_run: int = 0
    pool: str | None = Field(default=None, description="the warm pool it was handed out from")
    stats: StatsOut | None = None
    recent: list[CommandOut] | None = None


class BatchItemOut(BaseModel):
    """One line of the batch's answer (NDJSON, in the order the sandboxes become ready):
    ``index`` into the request's ``sandboxes``, the ``status`` the single create would
    have answered, and its body: ``sandbox`` (201) or ``error`` (an ``ErrorOut``)."""
    index: int
    status: int
    sandbox: SandboxOut | None = None
    error: dict[str, Any] | None = None


class PoolOut(BaseModel):
    """A warm pool: its spec, how many it owns, and how requests for its spec were served."""
    id: str
    spec: dict[str, Any]
    snapshot: str | None = None
    size: int
    idle: int = Field(description="warm sandboxes ready to hand out")
    busy: int = Field(description="sandboxes handed out")
    hits: int = Field(description="creates served by a warm sandbox")
    misses: int = Field(description="creates of this spec that found none idle (made on demand)")
    replaced: int = Field(description="dead or failed sandboxes the pool replaced")
    error: str | None = Field(default=None, description="why the pool could not fill, if it cannot")


class SnapshotOut(BaseModel):
    id: str
    digest: str
    size: int
    layers: list[str] = Field(default_factory=list)
    image: str = "host"

    @classmethod
    def of(cls, s: Snapshot) -> "SnapshotOut":
        return cls(id=s.id, digest=s.digest, size=s.size, layers=list(s.layers), image=s.image)

    def to_snapshot(self) -> Snapshot:
        return Snapshot(id=self.id, digest=self.digest, size=self.size, layers=tuple(self.layers),
                        image=self.image)


class ExistsOut(BaseModel):
    exists: bool
    type: str | None = None


class OkOut(BaseModel):
    ok: bool


class ErrorOut(BaseModel):
    error: str
    message: str
    sandbox_id: str | None = None


class HealthOut(BaseModel):
    ok: bool
    run_id: str
    sandboxes: int
    backend: str
