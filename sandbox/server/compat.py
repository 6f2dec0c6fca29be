"""What the ROCK and SWE-ReX compatible routes (``rock.py``, ``swerex.py``) share.

Both protocols descend from SWE-ReX's runtime: named bash sessions that must be created
before use, a ``check`` mode deciding whether a non-zero exit code is an error, one merged
output stream, a syntax check before running. The helpers here give those semantics on
top of the fleet's sandboxes (``AsyncSandbox``); failures are ``CompatError`` named by the
exception class SWE-ReX (and ROCK's rocklet) raise, which each router puts in its own shape.

Their clients authenticate in their own ways: SWE-ReX sends ``X-API-Key``, ROCK's SDK
whatever ``extra_headers`` hold (``Authorization: Bearer`` or ROCK's ``XRL-Authorization:
Bearer``), and ROCK's env client nothing but the userinfo of ``ROCK_BASE_URL``
(``http://rock:TOKEN@host:port``, sent as HTTP Basic). Each is checked against the
service's one token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import io
import re
import secrets
import shlex
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal

from fastapi import Request, Response, UploadFile
from fastapi.routing import APIRoute

from ..base import CHUNK, once
from ..errors import ExpectTimeout, TerminalError
from ..protocol.wire import AuthError
from ..spec import CommandResult
from ..storage.limits import StorageLimits
from ..terminal import AsyncTerminal
from .fleet import Entry, SandboxFleet

Check = Literal["silent", "raise", "ignore"]
PS1 = "SHELLPS1PREFIX"  # SWE-ReX's prompt: the "expect string" of a command that simply ended


class CompatError(Exception):
    """A failure as SWE-ReX's runtime reports it: ``kind`` is its exception class's name
    (``swerex.exceptions.<kind>``, or a builtin such as ``FileNotFoundError``)."""

    BUILTIN = {"FileNotFoundError", "IsADirectoryError", "ValueError", "UnicodeDecodeError", "OSError"}

    def __init__(self, kind: str, message: str, extra_info: dict[str, Any] | None = None):
        super().__init__(message)
        self.kind, self.message, self.extra_info = kind, message, extra_info or {}

    @property
    def class_path(self) -> str:
        return f"builtins.{self.kind}" if self.kind in self.BUILTIN else f"swerex.exceptions.{self.kind}"


def route_class(answer: Callable[[Exception], Response | None]) -> type[APIRoute]:
    """Routes whose every failure (validation and auth included) ``answer`` turns into the
    response their protocol's client expects; what it returns None for propagates."""

    class Guarded(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    return await handler(request)
                except Exception as e:  # noqa: BLE001 - answered or re-raised
                    response = answer(e)
                    if response is None:
                        raise
                    return response

            return guarded

    return Guarded


def first_error(e) -> str:
    """A validation error as ``"field: message"`` (the first one; the body's own location dropped)."""
    errors = e.errors()
    first = errors[0] if errors else {}
    field = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
    return f"{field}: {first.get('msg', 'invalid request')}"


# --------------------------------------------------------------------------- auth
def presented_token(request: Request) -> bytes:
    """The token a client sent, in any header the supported clients use (b"" if none)."""
    headers = request.headers
    for name in ("authorization", "xrl-authorization"):
        scheme, _, value = headers.get(name, "").partition(" ")
        if scheme.lower() == "bearer":
            return value.strip().encode()
        if scheme.lower() == "basic":  # userinfo of the URL: the password is the token
            try:
                return base64.b64decode(value.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return b""
    return headers.get("x-api-key", "").encode()


def check_token(request: Request) -> None:
    if not hmac.compare_digest(presented_token(request), request.app.state.token):
        raise AuthError("missing or wrong token (Authorization: Bearer, XRL-Authorization: Bearer, "
                        "X-API-Key, or the password of the URL)")


# --------------------------------------------------------------------------- commands
def command_line(command: str | list[str]) -> str:
    """A command as one bash line: a list is quoted word by word (``subprocess.run``'s way)."""
    return command if isinstance(command, str) else shlex.join(command)


def merged(cmd: str) -> str:
    """``cmd`` with stderr folded into stdout in the order written (what a terminal shows,
    and what SWE-ReX returns). A brace group runs in the session's own shell, so ``cd`` and
    ``export`` still persist; the newline ends a trailing comment or heredoc."""
    return "{ " + cmd + "\n} 2>&1"


async def syntax_error(cmd: str) -> str | None:
    """bash's complaint about ``cmd``'s syntax, or None. ``bash -n`` only parses (nothing is
    expanded or run), so the host's bash can check it before it reaches the sandbox."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    proc = await asyncio.create_subprocess_exec(bash, "-n", stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(cmd.encode())
    if proc.returncode == 0:
        return None
    return (f"Error (exit code {proc.returncode}) while checking bash command \n{cmd!r}\n"
            f"---- Stderr ----\n{err.decode(errors='backslashreplace')}\n"
            f"---- Stdout ----\n{out.decode(errors='backslashreplace')}")


def overflow_note(result: CommandResult, entry: Entry) -> str:
    """Why the output is shorter than the command wrote ("" if it is not)."""
    if not result.truncated:
        return ""
    return f"output truncated at {entry.sb.spec.max_output_bytes} bytes (the sandbox's max_output_bytes)"


async def open_session(fleet: SandboxFleet, entry: Entry, name: str, *, startup_source: list[str] = (),
                       env: dict[str, str] | None = None) -> str:
    """Create session ``name`` as a fresh shell: ``SessionExistsError`` if this protocol
    already made it. ``startup_source`` files are sourced and ``env`` exported in it (the
    output of that comes back)."""
    if name in entry.named_sessions:
        raise CompatError("SessionExistsError", f"session {name} already exists")
    if env and not all(isinstance(k, str) and k.isidentifier() for k in env):
        raise CompatError("ValueError", "env: variable names must be identifiers")
    await fleet.call(entry, entry.sb.close_session(name))  # ours may hold one of that name: start afresh
    lines = [f"source {shlex.quote(path)}" for path in startup_source]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    output = ""
    if lines:
        result = await fleet.run(entry, merged("\n".join(lines)), session=name)
        output = result.stdout
    entry.named_sessions.add(name)
    return output


async def run_in_session(fleet: SandboxFleet, entry: Entry, name: str, command: str, *, timeout: float | None,
                         check: Check = "raise", error_msg: str = "") -> tuple[str, int | None, str]:
    """Run ``command`` in session ``name`` with SWE-ReX's semantics: ``(output, exit_code,
    note)``, output merged, ``note`` saying why it was cut. Raises ``CompatError``:
    ``SessionDoesNotExistError``, ``BashIncorrectSyntaxError`` (nothing ran),
    ``CommandTimeoutError`` (the command was killed; the session lives on), and with
    ``check="raise"`` ``NonZeroExitCodeError``. ``check="ignore"`` reports no exit code."""
    if name not in entry.named_sessions:
        raise CompatError("SessionDoesNotExistError", f"session {name!r} does not exist")
    if (complaint := await syntax_error(command)) is not None:
        raise CompatError("BashIncorrectSyntaxError", complaint)
    result = await fleet.run(entry, merged(command), session=name, timeout=timeout)
    if result.timed_out:
        raise CompatError("CommandTimeoutError",
                          f"timeout after {timeout} seconds while running command {command!r}")
    if check == "raise" and result.exit_code != 0:
        msg = (f"Command {command!r} failed with exit code {result.exit_code}. "
               f"Here is the output:\n{result.stdout!r}")
        raise CompatError("NonZeroExitCodeError", f"{error_msg}: {msg}" if error_msg else msg)
    return result.stdout, None if check == "ignore" else result.exit_code, overflow_note(result, entry)


# --- interactive commands (SWE-ReX's ``is_interactive_command`` / ``is_interactive_quit``)
# A session's commands run without a terminal (stdin is /dev/null); a REPL or debugger
# needs one. So the first interactive command of a session opens a terminal for it: bash
# with SWE-ReX's prompt and its echo off (as SWE-ReX's pexpect shell), in the session's
# current directory with its exported variables, and types the command there; later ones type into the same terminal.
# The quit (``is_interactive_quit``) waits for the prompt and closes it. Like SWE-ReX, the
# ``expect`` strings are regular expressions, searched with the prompt added.
_ANSI = re.compile(r"\x1B[@-_][0-?]*[ -/]*[@-~]")
_ECHO_OFF = "ECHOISOFFNOW"


def _strip_control_chars(text: str) -> str:
    return _ANSI.sub("", text).replace("\r\n", "\n")


async def _session_terminal(fleet: SandboxFleet, entry: Entry, name: str) -> AsyncTerminal:
    term = entry.terminals.get(name)
    if term is not None and not term.exited:
        return term
    # The session's directory and exported variables, handed over in a file the terminal
    # sources and removes at once.
    exports = f"/tmp/.rr-interactive-{secrets.token_hex(6)}"
    cwd = (await fleet.run(entry, f"umask 077; export -p > {exports}; pwd", session=name)).stdout.strip() or None
    term = await fleet.call(entry, entry.sb.open_terminal(
        ["bash", "--norc", "--noprofile"], cwd=cwd, idle_timeout=None, cols=1000,
        env={"PS1": PS1, "PS2": "", "PS0": ""}))
    entry.terminals[name] = term
    # no bracketed-paste escapes around each prompt (SWE-ReX's output has none)
    await term.write(f". {exports}; rm -f {exports}; bind 'set enable-bracketed-paste off' 2>/dev/null\n")
    await _echo_off(fleet, entry, term)
    return term


async def _echo_off(fleet: SandboxFleet, entry: Entry, term: AsyncTerminal) -> None:
    """Turn the terminal's echo off and wait for the prompt after it (the marker is typed
    split, so its echo, before echo is off, does not match)."""
    await term.write(f"stty -echo; echo {_ECHO_OFF[:6]}''{_ECHO_OFF[6:]}\n")
    await fleet.call(entry, term.expect(_ECHO_OFF, timeout=30))
    await fleet.call(entry, term.expect(PS1, timeout=30))


async def run_interactive(fleet: SandboxFleet, entry: Entry, name: str, command: str, *, expect: list[str],
                          timeout: float | None, quit: bool) -> tuple[str, str]:
    """Type ``command`` into session ``name``'s terminal and wait for one of ``expect`` or
    the prompt: ``(output, matched)``. Raises ``CompatError`` ``CommandTimeoutError``."""
    if name not in entry.named_sessions:
        raise CompatError("SessionDoesNotExistError", f"session {name!r} does not exist")
    term = await _session_terminal(fleet, entry, name)
    patterns = [*expect, PS1]
    await term.write(command + "\n")
    try:
        found = await fleet.call(entry, term.expect(patterns, timeout=30.0 if timeout is None else timeout))
    except ExpectTimeout:
        raise CompatError("CommandTimeoutError",
                          f"timeout after {timeout} seconds while running command {command!r}") from None
    except TerminalError as e:
        entry.terminals.pop(name, None)
        raise CompatError("SwerexException", f"the interactive program ended: {e}") from None
    output = _strip_control_chars(found.before)
    if quit:
        if found.index == len(expect):  # back at bash: turn its echo off again, as SWE-ReX does
            await _echo_off(fleet, entry, term)
    else:
        output = output.lstrip().removeprefix(command).strip()
    return output, patterns[found.index]


async def interrupt_interactive(fleet: SandboxFleet, entry: Entry, name: str, *, expect: list[str],
                                timeout: float, n_retry: int) -> tuple[str, str] | None:
    """Ctrl-C into session ``name``'s terminal (SWE-ReX's ``BashInterruptAction``), until
    the prompt or one of ``expect`` shows: ``(output, matched)``; None if it has no terminal."""
    term = entry.terminals.get(name)
    if term is None or term.exited:
        return None
    patterns = [*expect, PS1]
    for _ in range(max(1, n_retry)):
        await term.write("\x03")
        try:
            found = await fleet.call(entry, term.expect(patterns, timeout=timeout))
        except ExpectTimeout:
            continue
        return _strip_control_chars(found.before).strip(), patterns[found.index]
    raise CompatError("SwerexException", "Failed to interrupt session")


async def close_session(fleet: SandboxFleet, entry: Entry, name: str) -> None:
    if name not in entry.named_sessions:
        raise CompatError("SessionDoesNotExistError", f"session {name!r} does not exist")
    entry.named_sessions.discard(name)
    term = entry.terminals.pop(name, None)
    if term is not None:
        await term.close()
    await fleet.call(entry, entry.sb.close_session(name))


async def close_sessions(fleet: SandboxFleet, entry: Entry) -> None:
    """Close every session this protocol opened (SWE-ReX's ``close``); the sandbox stays."""
    for name in sorted(entry.named_sessions):
        await close_session(fleet, entry, name)


async def execute(fleet: SandboxFleet, entry: Entry, command: str | list[str], *, timeout: float | None,
                  env: dict[str, str] | None = None, cwd: str | None = None, merge: bool = False,
                  check: bool = False, error_msg: str = "") -> CommandResult:
    """A command outside any session (SWE-ReX's ``execute``): a throwaway subshell in the
    sandbox's workdir unless ``cwd``; ``env`` adds to its environment. Raises
    ``CompatError``: ``CommandTimeoutError``, and with ``check`` ``NonZeroExitCodeError``."""
    if env and not all(isinstance(k, str) and k.isidentifier() for k in env):
        raise CompatError("ValueError", "env: variable names must be identifiers")
    line = command_line(command)
    # an explicit cwd makes the command a throwaway subshell: a `cd` in it touches no session
    result = await fleet.run(entry, merged(line) if merge else line, timeout=timeout, env=env,
                           cwd=cwd or entry.sb.spec.workdir, session="rr-execute")
    if result.timed_out:
        raise CompatError("CommandTimeoutError", f"Timeout ({timeout}s) exceeded while running command")
    if check and result.exit_code != 0:
        msg = (f"Command {command!r} failed with exit code {result.exit_code}. "
               f"Stdout:\n{result.stdout!r}\nStderr:\n{result.stderr!r}")
        raise CompatError("NonZeroExitCodeError", f"{error_msg}: {msg}" if error_msg else msg)
    return result


# --------------------------------------------------------------------------- files
async def read_text(fleet: SandboxFleet, entry: Entry, path: str, encoding: str | None = None,
                    errors: str | None = None) -> str:
    """A file's text, as ``Path.read_text(encoding, errors)`` gives it (UTF-8 by default)."""
    kind = await fleet.call(entry, entry.sb.stat(path))
    if kind is None:
        raise CompatError("FileNotFoundError", f"[Errno 2] No such file or directory: {path!r}")
    if kind == "dir":
        raise CompatError("IsADirectoryError", f"[Errno 21] Is a directory: {path!r}")
    data = await fleet.call(entry, entry.sb.read_file(path))
    try:
        return data.decode(encoding or "utf-8", errors or "strict")
    except LookupError as e:  # an unknown encoding or error handler
        raise CompatError("ValueError", f"encoding: {e}") from None
    except UnicodeDecodeError as e:
        raise CompatError("ValueError", f"{path}: {e}") from None


async def write_text(fleet: SandboxFleet, entry: Entry, path: str, content: str) -> None:
    await fleet.call(entry, entry.sb.write_file(path, content))


async def upload(fleet: SandboxFleet, entry: Entry, file: UploadFile, target: str, *, unzip: bool = False) -> int:
    """Store an uploaded file at ``target`` (parents made), streamed; with ``unzip`` it is a
    zip (SWE-ReX sends a directory so) unpacked into directory ``target``. Bytes received."""
    if not unzip:
        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await file.read(CHUNK):
                yield chunk
        return await fleet.call(entry, entry.sb.write_stream(target, chunks()))
    data = await asyncio.to_thread(zip_to_tar, file.file)
    return await fleet.call(entry, entry.sb.write_stream(target, once(data), tar=True))


def zip_to_tar(f) -> bytes:
    """A zip archive as the tar ``write_stream(tar=True)`` unpacks (inside the sandbox, by its
    agent). Links and devices are not carried: zip stores them as plain files, and so do we.
    What it unpacks to is metered like a snapshot layer (``max_layer_bytes``, the disk's
    free-space reserve): a zip bomb stops at the limit with ``StorageLimitError``."""
    try:
        archive = zipfile.ZipFile(f)
    except zipfile.BadZipFile as e:
        raise CompatError("ValueError", f"file: not a zip archive ({e})") from None
    meter = StorageLimits.from_env().meter(Path(tempfile.gettempdir()), what="an unzipped upload")
    buf = io.BytesIO()
    with archive, tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar, \
            tempfile.SpooledTemporaryFile(CHUNK) as spool:
        for info in archive.infolist():
            member = tarfile.TarInfo(info.filename.rstrip("/"))
            mode = (info.external_attr >> 16) & 0o777
            if info.is_dir():
                member.type, member.mode = tarfile.DIRTYPE, mode or 0o755
                tar.addfile(member)
                continue
            member.mode = mode if mode and stat.S_ISREG(info.external_attr >> 16) else 0o644
            spool.seek(0)
            spool.truncate()
            with archive.open(info) as src:
                while chunk := src.read(CHUNK):  # counted as it inflates: sizes in a zip can lie
                    meter.charge(len(chunk))
                    spool.write(chunk)
            member.size = spool.tell()
            spool.seek(0)
            tar.addfile(member, spool)
    return buf.getvalue()

