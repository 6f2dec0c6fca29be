"""ROCK's sandbox admin API (``/apis/envs/sandbox/v1``) over the service's sandboxes.

The unmodified ``rl-rock`` SDK drives rockroll with nothing but its base URL changed:

    Sandbox(SandboxConfig(base_url="http://127.0.0.1:8765", image="host", memory="1g",
                          extra_headers={"Authorization": "Bearer TOKEN"}))

``start`` / ``start_async`` (both return once the sandbox is ready, so the SDK's status
poll ends at its first look instead of sleeping 3 s), ``get_status``, ``is_alive``,
``stop`` / ``delete``, ``execute``, ``create_session`` / ``run_in_session`` /
``close_session`` (so ``arun`` in normal and nohup modes), ``read_file``, ``write_file``,
``upload``, ``commit`` (a snapshot that ``start(image=tag)`` starts from). Answers carry
ROCK's envelope ``{"status": "Success" | "Failed", "message", "error", "result"}`` over
HTTP 200, as ROCK's admin does; a failure's ``result`` has ROCK's ``code`` (4000: the
request, 5000: the service) so the SDK raises its typed error where it checks one.

ROCK's start fields map onto ``SandboxSpec`` (``memory="8g"`` -> ``memory_mb``, ``cpus``
or the harder ``limit_cpus`` -> ``cpus``, ``disk="50G"`` -> ``disk_mb``,
``auto_clear_time_minutes`` -> ``ttl_s``); what cannot be honoured (GPUs, kata, registry
pull credentials, archiving, a chosen id, a non-Linux image, fields this service does not know)
is refused by name, never dropped. ROCK has no network switch: its sandboxes get the
spec's default, no network. Command semantics are SWE-ReX's, shared in ``compat.py``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..errors import SandboxError, SpecError
from ..protocol.wire import AuthError, status_of
from ..spec import DEFAULT_DISK_MB, SandboxSpec
from . import compat, swerex
from .compat import PS1, CompatError
from .deps import Fleet
from .fleet import Entry

PREFIX = "/apis/envs/sandbox/v1"
BAD_REQUEST, SERVER_ERROR = 4000, 5000  # rock._codes: the SDK raises BadRequest/InternalServerRockError
ROCK_COMMAND_TIMEOUT = 1200.0  # ROCK's default command timeout: its sandboxes' run() default


class Refused(ValueError):
    """A ROCK field this service cannot honour; the message names it and says why."""


def envelope(result: Any = None, *, error: str | None = None, message: str | None = None,
             code: int | None = None) -> JSONResponse:
    """ROCK's answer: ``Success`` with ``result``, or ``Failed`` with ``error`` (and ``code``)."""
    if error is None:
        return JSONResponse({"status": "Success", "message": message, "error": None, "result": result})
    if code is not None:
        result = {"code": code, "exit_code": None, "failure_reason": error}
    return JSONResponse({"status": "Failed", "message": message or "request failed", "error": error,
                         "result": result}, status_code=200)


def _answer(e: Exception) -> JSONResponse | None:
    if isinstance(e, AuthError):  # the SDK raises on the HTTP status
        return JSONResponse({"status": "Failed", "message": "unauthorized", "error": str(e), "result": None},
                            status_code=401)
    if isinstance(e, RequestValidationError):
        return envelope(error=compat.first_error(e), message="invalid parameter", code=BAD_REQUEST)
    if isinstance(e, (SpecError, Refused)):
        return envelope(error=str(e), message="invalid parameter", code=BAD_REQUEST)
    if isinstance(e, CompatError):
        return envelope(error=e.message, message=e.kind)
    if isinstance(e, SandboxError):  # the request's fault (an unknown id...) or the service's, as /v1 says
        return envelope(error=str(e), message=type(e).__name__,
                        code=BAD_REQUEST if status_of(e) < 500 else SERVER_ERROR)
    return None


router = APIRouter(prefix=PREFIX, route_class=compat.route_class(_answer), dependencies=[Depends(compat.check_token)])


# ------------------------------------------------------------------- the spec
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MB = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}


def size_mb(field: str, value: str) -> int:
    """Docker's size notation ("8g", "512m", "50G", "1.5Gi", bytes without a unit) in MiB."""
    m = _SIZE.match(value)
    if m is None:
        raise SpecError(field, f"must be a size like '8g' or '512m', not {value!r}")
    return max(1, round(float(m[1]) * _MB[m[2].lower()]))


class StartIn(BaseModel):
    """ROCK's ``SandboxStartRequest`` (rl-rock 1.11), every field; unknown ones are refused."""

    model_config = ConfigDict(extra="forbid")
    image: str = Field(min_length=1)
    image_os: str = "linux"
    auto_clear_time_minutes: int | None = Field(default=None, ge=1)
    auto_clear_time: int | None = None  # the SDK sends both names
    pull: Literal["never", "always", "missing"] = "missing"
    memory: str = "8g"
    cpus: float = 2
    limit_cpus: float | None = None
    sandbox_id: str | None = None
    registry_username: str | None = None
    registry_password: str | None = None
    startup_timeout: float | None = None
    use_kata_runtime: bool = False
    auto_archive_seconds: int | None = None
    auto_delete_seconds: int | None = Field(default=None, ge=0)
    disk: str | None = "50G"
    num_gpus: float | None = None
    accelerator_type: str | None = None

    def refusals(self) -> list[str]:
        """What this request asks that rockroll cannot give, each with why."""
        why = []
        if self.image_os.lower() != "linux":
            why.append(f"image_os={self.image_os!r}: rockroll runs Linux sandboxes only")
        if self.num_gpus or self.accelerator_type:
            why.append("num_gpus/accelerator_type: this service gives sandboxes no GPU")
        if self.use_kata_runtime:
            why.append("use_kata_runtime: no kata VMs here; sandboxes are namespaces + cgroups + seccomp")
        if self.registry_username or self.registry_password:
            why.append("registry_username/password: images come from the service's own store, not a registry")
        if self.sandbox_id:
            why.append("sandbox_id: the service names its sandboxes")
        if self.auto_archive_seconds:
            why.append("auto_archive_seconds: a stopped sandbox is deleted at once, never archived "
                       "(snapshot it through /v1 first)")
        return why

    def to_spec(self, backend: str) -> SandboxSpec:
        minutes = self.auto_clear_time_minutes or self.auto_clear_time
        return SandboxSpec(
            image=self.image, backend=backend, cpus=self.limit_cpus or self.cpus,
            memory_mb=size_mb("memory", self.memory),
            disk_mb=size_mb("disk", self.disk) if self.disk else DEFAULT_DISK_MB,
            ttl_s=minutes * 60.0 if minutes else None, timeout_s=ROCK_COMMAND_TIMEOUT)


def _mem(spec: SandboxSpec) -> str | None:
    return None if spec.memory_mb is None else f"{spec.memory_mb}m"


def _started(entry: Entry) -> dict:
    spec = entry.sb.spec
    return {"sandbox_id": entry.id, "host_name": "rockroll", "host_ip": "127.0.0.1", "cpus": spec.cpus,
            "memory": _mem(spec), "disk": None if spec.disk_mb is None else f"{spec.disk_mb}m",
            "code": 2000, "exit_code": None, "failure_reason": None}


# ------------------------------------------------------------------- lifecycle
class Commits:
    """What ``commit`` saved on this service: an image tag names a snapshot (its digest and
    image), and the last commit of each sandbox is kept for the SDK's status call."""

    def __init__(self) -> None:
        self.tags: dict[str, tuple[str, str]] = {}
        self.last: dict[str, dict] = {}


def _commits(request: Request) -> Commits:
    state = request.app.state
    if not hasattr(state, "rock_commits"):
        state.rock_commits = Commits()
    return state.rock_commits


@router.post("/start")
@router.post("/start_async")
async def start(body: StartIn, fleet: Fleet, commits: Commits = Depends(_commits)) -> JSONResponse:
    refusals = body.refusals()
    if refusals:
        raise Refused("; ".join(refusals))
    spec, snapshot = body.to_spec(fleet.backend), None
    if body.image in commits.tags:  # a tag commit() made: start from that snapshot
        snapshot, image = commits.tags[body.image]
        spec = replace(spec, image=image)
    entry = await fleet.create(spec, snapshot)
    return envelope(_started(entry))


@router.get("/get_status")
async def get_status(sandbox_id: str, fleet: Fleet, include_all_states: bool = False) -> JSONResponse:
    if sandbox_id in fleet.tombstones:  # stopped: ROCK still reports it, as not alive
        why = {"status": "stopped", "message": fleet.tombstones[sandbox_id]}
        return envelope({"sandbox_id": sandbox_id, "host_name": "rockroll", "is_alive": False, "state": "stopped",
                         "status": {"docker_run": why}, "state_history": []})
    entry = fleet.get(sandbox_id)
    ok = await fleet.call(entry, entry.sb.ping())
    stage = {"status": "success" if ok else "failed", "message": "ready" if ok else "the sandbox does not answer"}
    return envelope({**_started(entry), "status": {"image_pull": stage, "docker_run": stage}, "is_alive": ok,
                     "image": entry.sb.spec.image, "state": "running" if ok else "stopped",
                     "port_mapping": {}, "state_history": []})


@router.get("/is_alive")
async def is_alive(sandbox_id: str, fleet: Fleet) -> JSONResponse:
    try:
        entry = fleet.get(sandbox_id)
        ok = await fleet.call(entry, entry.sb.ping())
    except SandboxError:  # ROCK answers "not alive", not an error
        ok = False
    return envelope({"is_alive": ok, "message": "rockroll" if ok else f"sandbox {sandbox_id} is not alive"})


class SandboxIdIn(BaseModel):
    sandbox_id: str = Field(min_length=1)


@router.post("/stop")
@router.post("/delete")
async def stop(body: SandboxIdIn, fleet: Fleet) -> JSONResponse:
    if body.sandbox_id not in fleet.tombstones:  # stopping twice is fine
        fleet.get(body.sandbox_id)
    await fleet.close(body.sandbox_id, "client")
    return envelope(f"{body.sandbox_id} stopped")


@router.get("/get_token")
async def get_token() -> JSONResponse:
    # The SDK asks for object-storage credentials after each upload; without them it uploads directly.
    return envelope(error="no object storage (OSS) here: uploads go straight to the sandbox")


class CommitIn(BaseModel):
    sandbox_id: str = Field(min_length=1)
    image_tag: str = Field(min_length=1)
    username: str = ""  # registry credentials: nothing is pushed, so they are neither used nor kept
    password: str = ""


@router.post("/commit")
async def commit(body: CommitIn, fleet: Fleet, commits: Commits = Depends(_commits)) -> JSONResponse:
    """ROCK pushes the container as an image; here the sandbox is snapshotted and
    ``image_tag`` names that snapshot on this service, so ``start(image=image_tag)`` starts
    from it (copy-on-write) until the service restarts. Nothing leaves the host."""
    entry = fleet.get(body.sandbox_id)
    started = datetime.now(timezone.utc).isoformat()
    snap = await fleet.call(entry, entry.sb.snapshot())
    commits.tags[body.image_tag] = (snap.digest, snap.image)
    commits.last[entry.id] = {"sandbox_id": entry.id, "image_tag": body.image_tag, "phase": "SUCCEEDED",
                              "started_at": started, "completed_at": datetime.now(timezone.utc).isoformat(),
                              "exit_code": 0}
    return envelope(commits.last[entry.id])


@router.get("/commit/{sandbox_id}")
async def commit_status(sandbox_id: str, commits: Commits = Depends(_commits)) -> JSONResponse:
    if sandbox_id not in commits.last:
        raise Refused(f"sandbox_id: no commit of {sandbox_id} on this service")
    return envelope(commits.last[sandbox_id])


@router.post("/restart")
async def unsupported() -> JSONResponse:
    return envelope(error="restart: not supported by rockroll: a stopped sandbox is gone; commit() it first "
                          "and start(image=<its tag>), or use snapshots (POST /v1/sandboxes/{id}/snapshots)",
                    code=BAD_REQUEST)


# ------------------------------------------------------------------- commands
class CommandIn(swerex.CommandIn):  # ROCK's SandboxCommand: SWE-ReX's Command with ROCK's defaults
    sandbox_id: str = Field(min_length=1)
    session_type: Literal["bash"] = "bash"
    timeout: float | None = ROCK_COMMAND_TIMEOUT


@router.post("/execute")
async def execute(body: CommandIn, fleet: Fleet) -> JSONResponse:
    result = await compat.execute(fleet, fleet.get(body.sandbox_id), body.command, timeout=body.timeout, env=body.env,
                                  cwd=body.cwd, check=body.check, error_msg=body.error_msg)
    return envelope({"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code})


class CreateSessionIn(BaseModel):
    sandbox_id: str = Field(min_length=1)
    session_type: Literal["bash"] = "bash"
    session: str = Field(default="default", min_length=1)
    startup_source: list[str] = []
    env_enable: bool = False
    env: dict[str, str] | None = None
    remote_user: str | None = None
    startup_timeout: float = 1.0
    max_read_size: int = 2000


@router.post("/create_session")
async def create_session(body: CreateSessionIn, fleet: Fleet) -> JSONResponse:
    if body.remote_user not in (None, "", "root"):
        raise Refused(f"remote_user={body.remote_user!r}: sessions run as the sandbox's one user")
    output = await compat.open_session(fleet, fleet.get(body.sandbox_id), body.session,
                                       startup_source=body.startup_source, env=body.env)
    return envelope({"output": output, "session_type": "bash"})


class BashActionIn(swerex.BashActionIn):  # ROCK's SandboxBashAction
    sandbox_id: str = Field(min_length=1)


@router.post("/run_in_session")
async def run_in_session(body: BashActionIn, fleet: Fleet) -> JSONResponse:
    if body.is_interactive_command or body.is_interactive_quit:
        raise Refused("is_interactive_command/quit: rockroll sessions have no terminal (stdin is /dev/null)")
    output, code, note = await compat.run_in_session(fleet, fleet.get(body.sandbox_id), body.session,
                                                     held_liveness_check(body.command),
                                                     timeout=body.timeout, check=body.check,
                                                     error_msg=body.error_msg)
    matched = next((s for s in body.expect if s and s in output), PS1)
    return envelope({"session_type": "bash", "output": output, "exit_code": code, "failure_reason": note,
                     "expect_string": matched})


_LIVENESS = re.compile(r"kill -0 ([0-9]+)")
LIVENESS_HOLD_S = 3.0  # under the SDK's own limit on one check: 2 x its wait_interval, which is >= 5 s


def held_liveness_check(command: str) -> str:
    """ROCK's SDK waits for a nohup command by sending ``kill -0 <pid>`` and sleeping at least
    5 s between tries, so even a 1 s job costs 5 s. Such a check is held here until the
    process ends (at most ``LIVENESS_HOLD_S``) and then answered as ``kill -0`` would be:
    the first check is usually the last. Any other command passes through untouched."""
    m = _LIVENESS.fullmatch(command.strip())
    if m is None:
        return command
    pid, tries = m[1], int(LIVENESS_HOLD_S / 0.05)
    return (f"__rr_t=0; while kill -0 {pid} 2>/dev/null && [ $__rr_t -lt {tries} ]; do sleep 0.05; "
            f"__rr_t=$((__rr_t+1)); done; kill -0 {pid}")


class CloseSessionIn(BaseModel):
    sandbox_id: str = Field(min_length=1)
    session_type: Literal["bash"] = "bash"
    session: str = "default"


@router.post("/close_session")
async def close_session(body: CloseSessionIn, fleet: Fleet) -> JSONResponse:
    await compat.close_session(fleet, fleet.get(body.sandbox_id), body.session)
    return envelope({"session_type": "bash"})


# ------------------------------------------------------------------- files
class ReadFileIn(BaseModel):
    sandbox_id: str = Field(min_length=1)
    path: str = Field(min_length=1)
    encoding: str | None = None
    errors: str | None = None


@router.post("/read_file")
async def read_file(body: ReadFileIn, fleet: Fleet) -> JSONResponse:
    content = await compat.read_text(fleet, fleet.get(body.sandbox_id), body.path, body.encoding, body.errors)
    return envelope({"content": content})


class WriteFileIn(BaseModel):
    sandbox_id: str = Field(min_length=1)
    path: str = Field(min_length=1)
    content: str


@router.post("/write_file")
async def write_file(body: WriteFileIn, fleet: Fleet) -> JSONResponse:
    await compat.write_text(fleet, fleet.get(body.sandbox_id), body.path, body.content)
    return envelope({"success": True, "message": f"Successfully write content to file {body.path}"})


@router.post("/upload")
async def upload(fleet: Fleet, file: UploadFile = File(...), target_path: str = Form(min_length=1),
                 sandbox_id: str = Form(min_length=1)) -> JSONResponse:
    size = await compat.upload(fleet, fleet.get(sandbox_id), file, target_path)
    return envelope({"success": True, "message": f"uploaded {size} bytes to {target_path}",
                     "file_name": file.filename or ""})
