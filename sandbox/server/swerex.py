"""SWE-ReX's runtime API over the service's sandboxes: one runtime per sandbox.

    RemoteRuntime(host="http://127.0.0.1:8765/swerex/<sandbox id>", auth_token=TOKEN)

is the unmodified ``swe-rex`` client (``swerex.runtime.remote``) driving a rockroll sandbox:
``is_alive``, ``create_session`` / ``run_in_session`` / ``close_session`` (SWE-ReX's bash
sessions: ``check``, ``timeout``, its exception types), ``execute``, ``read_file``,
``write_file``, ``upload`` (a directory comes zipped) and ``close`` (closes the sessions it
opened; the sandbox belongs to whoever created it, as a SWE-ReX server belongs to its
deployment). The semantics live in ``compat.py``, shared with ROCK's routes.

Errors travel as SWE-ReX's server sends them: status 511 with ``{"swerexception":
{"message", "class_path", "traceback", "extra_info"}}``, which the client re-raises as the
same class (``swerex.exceptions.SessionDoesNotExistError``, ``FileNotFoundError``, ...); a
wrong ``X-API-Key`` is a 401 and an unknown sandbox a 404, both ``{"detail": ...}``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..errors import SandboxClosed, SandboxError, SandboxFileError, SandboxNotFound, SpecError
from ..protocol.wire import AuthError
from . import compat
from .compat import PS1, CompatError
from .deps import Fleet

PREFIX = "/swerex/{sandbox_id}"


def _transfer(kind: str, message: str, extra_info: dict | None = None) -> JSONResponse:
    error = CompatError(kind, message, extra_info)
    return JSONResponse({"swerexception": {"message": message, "class_path": error.class_path,
                                           "traceback": "", "extra_info": error.extra_info}}, status_code=511)


def _answer(e: Exception) -> JSONResponse | None:
    """Every failure in SWE-ReX's shapes, whatever raised it (validation included)."""
    if isinstance(e, AuthError):
        return JSONResponse({"detail": str(e)}, status_code=401)
    if isinstance(e, (SandboxNotFound, SandboxClosed)):
        return JSONResponse({"detail": str(e)}, status_code=404)
    if isinstance(e, CompatError):
        return _transfer(e.kind, e.message, e.extra_info)
    if isinstance(e, RequestValidationError):
        return _transfer("ValueError", compat.first_error(e))
    if isinstance(e, SpecError):
        return _transfer("ValueError", str(e))
    if isinstance(e, SandboxFileError):
        return _transfer("OSError", str(e))
    if isinstance(e, SandboxError):
        return _transfer("SwerexException", f"{type(e).__name__}: {e}")
    return None


router = APIRouter(prefix=PREFIX, route_class=compat.route_class(_answer), dependencies=[Depends(compat.check_token)])


# requests: SWE-ReX's models (``swerex.runtime.abstract``), fields and defaults alike ----------
class CreateSessionIn(BaseModel):
    startup_source: list[str] = []
    session: str = "default"
    session_type: Literal["bash"] = "bash"
    startup_timeout: float = 1.0


class BashActionIn(BaseModel):
    command: str
    session: str = "default"
    timeout: float | None = None
    is_interactive_command: bool = False
    is_interactive_quit: bool = False
    check: compat.Check = "raise"
    error_msg: str = ""
    expect: list[str] = []
    action_type: Literal["bash"] = "bash"


class BashInterruptIn(BaseModel):
    session: str = "default"
    timeout: float = 0.2
    n_retry: int = 3
    expect: list[str] = []
    action_type: Literal["bash_interrupt"] = "bash_interrupt"


class CloseSessionIn(BaseModel):
    session: str = "default"
    session_type: Literal["bash"] = "bash"


class CommandIn(BaseModel):
    command: str | list[str]
    timeout: float | None = None
    shell: bool = False
    check: bool = False
    error_msg: str = ""
    env: dict[str, str] | None = None
    cwd: str | None = None
    merge_output_streams: bool = False


class ReadFileIn(BaseModel):
    path: str = Field(min_length=1)
    encoding: str | None = None
    errors: str | None = None


class WriteFileIn(BaseModel):
    content: str
    path: str = Field(min_length=1)


class ObservationOut(BaseModel):
    output: str = ""
    exit_code: int | None = None
    failure_reason: str = ""
    expect_string: str = ""
    session_type: Literal["bash"] = "bash"


# routes -------------------------------------------------------------------------------------
@router.get("/is_alive")
async def is_alive(sandbox_id: str, fleet: Fleet) -> dict:
    entry = fleet.get(sandbox_id)
    ok = await fleet.call(entry, entry.sb.ping())
    return {"is_alive": ok, "message": "" if ok else f"sandbox {sandbox_id} does not answer"}


@router.post("/create_session")
async def create_session(body: CreateSessionIn, sandbox_id: str, fleet: Fleet) -> dict:
    entry = fleet.get(sandbox_id)
    output = await compat.open_session(fleet, entry, body.session, startup_source=body.startup_source)
    return {"output": output, "session_type": "bash"}


@router.post("/run_in_session", response_model=ObservationOut)
async def run_in_session(body: Annotated[Union[BashActionIn, BashInterruptIn], Field(discriminator="action_type")],
                         sandbox_id: str, fleet: Fleet) -> ObservationOut:
    entry = fleet.get(sandbox_id)
    if isinstance(body, BashInterruptIn):
        # A timeout already killed the command's process group, so nothing is left to interrupt.
        if body.session not in entry.named_sessions:
            raise CompatError("SessionDoesNotExistError", f"session {body.session!r} does not exist")
        # A terminal's program (an interactive command) gets Ctrl-C; a plain command was
        # already killed by its timeout, so nothing is left to interrupt.
        answer = await compat.interrupt_interactive(fleet, entry, body.session, expect=body.expect,
                                                    timeout=body.timeout, n_retry=body.n_retry)
        output, matched = answer or ("", PS1)
        return ObservationOut(output=output, exit_code=0, expect_string=matched)
    if body.is_interactive_command or body.is_interactive_quit:
        output, matched = await compat.run_interactive(fleet, entry, body.session, body.command, expect=body.expect,
                                                       timeout=body.timeout, quit=body.is_interactive_quit)
        return ObservationOut(output=output, exit_code=0, expect_string=matched)
    output, code, note = await compat.run_in_session(fleet, entry, body.session, body.command, timeout=body.timeout,
                                                     check=body.check, error_msg=body.error_msg)
    matched = next((s for s in body.expect if s and s in output), PS1)
    return ObservationOut(output=output, exit_code=code, failure_reason=note, expect_string=matched)


@router.post("/close_session")
async def close_session(body: CloseSessionIn, sandbox_id: str, fleet: Fleet) -> dict:
    await compat.close_session(fleet, fleet.get(sandbox_id), body.session)
    return {"session_type": "bash"}


@router.post("/execute")
async def execute(body: CommandIn, sandbox_id: str, fleet: Fleet) -> dict:
    result = await compat.execute(fleet, fleet.get(sandbox_id), body.command, timeout=body.timeout, env=body.env,
                                  cwd=body.cwd, merge=body.merge_output_streams, check=body.check,
                                  error_msg=body.error_msg)
    return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


@router.post("/read_file")
async def read_file(body: ReadFileIn, sandbox_id: str, fleet: Fleet) -> dict:
    return {"content": await compat.read_text(fleet, fleet.get(sandbox_id), body.path, body.encoding, body.errors)}


@router.post("/write_file")
async def write_file(body: WriteFileIn, sandbox_id: str, fleet: Fleet) -> dict:
    await compat.write_text(fleet, fleet.get(sandbox_id), body.path, body.content)
    return {}


@router.post("/upload")
async def upload(sandbox_id: str, fleet: Fleet, file: UploadFile = File(...), target_path: str = Form(min_length=1),
                 unzip: bool = Form(False)) -> dict:
    await compat.upload(fleet, fleet.get(sandbox_id), file, target_path, unzip=unzip)
    return {}


@router.post("/close")
async def close(sandbox_id: str, fleet: Fleet) -> dict:
    await compat.close_sessions(fleet, fleet.get(sandbox_id))
    return {}
