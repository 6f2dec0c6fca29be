"""verifiers on rockroll's sandboxes: a ``verifiers.v1`` ``Runtime`` whose box is a rockroll sandbox.

verifiers (0.4.0, the v1 API) runs each rollout's harness program in a ``Runtime``
(``verifiers/v1/runtimes/base.py``): ``start()``, ``run(argv, env) -> ProgramResult``,
``read`` / ``write`` of files, ``run_background``, ``stop()`` (shielded ``teardown``) and a
synchronous ``cleanup()`` backstop, all async. Its own runtimes are a host subprocess, local
containers through a CLI (docker, podman, apptainer) and paid remote sandboxes (prime, modal,
e2b); none is a local sandbox engine. :class:`RockrollRuntime` is one, on any rockroll
backend (``SandboxSpec(backend="local" | "docker" | "remote" | "ray")``), keeping rockroll's
guarantees: no network unless the spec opens one, the spec's cpu / memory / pids / disk limits,
each command's own timeout, and the sandbox closed when the runtime stops -- on a failed start
too, and at interpreter exit by rockroll's reaper.

verifiers builds its own runtimes from a closed table (``make_runtime``), so a rockroll box is
placed the way verifiers places a borrowed one -- ``Agent.run(task, runtime=box)``::

    async with provision(SandboxSpec()) as box:
        trace = await agent.run(task, runtime=box)

Semantics, as verifiers' container runtimes have them: each ``run`` is a fresh process in the
workdir (``cd`` and ``export`` do not carry over; files do), with the task's runtime env, the
harness's env and nothing of the host's; relative paths are the workdir's. Runs go to
separate sandbox sessions, so they run concurrently (verifiers gathers writes and probes while
a program runs). Failures of the box are ``verifiers.v1.errors.SandboxError`` (the rockroll
error chained), a command that fails is its exit code, a command past its timeout exit 137 with
a note on stderr (verifiers' harness check then names it a ``HarnessError``).

Not supported (see docs/integrations.md): ``open_process`` (live stdio processes: ACP
harnesses), ``with_user``, verifiers' allow/block network policies (a box's network is the
spec's; a task that asks for a policy is refused by verifiers' borrow check), and the model
endpoint for a harness inside a no-network box: verifiers' interception server listens on the
host's loopback, which a rockroll sandbox cannot reach unless ``network="host"`` (local backend,
the host's own network namespace).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from rockroll.sandbox import SandboxSpec, open_async_sandbox
from rockroll.sandbox import SandboxError as RockrollSandboxError

from .episodes import require

vf_runtimes = require("verifiers.v1.runtimes", "verifiers")
vf_errors = require("verifiers.v1.errors", "verifiers")
pydantic_config = require("pydantic_config", "verifiers")

__all__ = ["RockrollConfig", "RockrollRuntime", "RockrollRuntimeInfo", "provision"]

class RockrollConfig(pydantic_config.BaseConfig):
    """What a trace records of the box (``trace.agent.runtime``): the spec's placement fields.
    ``workdir`` and ``image`` are the names verifiers reads off a runtime's config."""

    type: Literal["rockroll"] = "rockroll"
    backend: str = "local"
    image: str = "host"
    workdir: str = "/workspace"
    network: bool | Literal["host"] = False
    cpu: float | None = None
    memory_mb: int | None = None
    pids: int | None = None
    disk_mb: int | None = None

    @classmethod
    def of(cls, spec: SandboxSpec) -> RockrollConfig:
        return cls(backend=spec.backend, image=spec.image, workdir=spec.workdir, network=spec.network,
                   cpu=spec.cpus, memory_mb=spec.memory_mb, pids=spec.pids, disk_mb=spec.disk_mb)


class RockrollRuntimeInfo(RockrollConfig, vf_runtimes.BaseRuntimeInfo):
    """The config plus the sandbox id (``id``) once started."""


class RockrollRuntime(vf_runtimes.Runtime):
    """A verifiers ``Runtime`` on one rockroll sandbox, opened by ``start()`` from ``spec``
    (default ``SandboxSpec()``: the local backend, no network, 1 CPU, 1 GiB, 256 pids) and
    closed by ``stop()``. ``program_timeout_s`` bounds the harness's main program
    (``run_program``; default the spec's ``timeout_s``), every other command gets the spec's
    ``timeout_s``. Also an async context manager (``start`` / ``stop``)."""

    is_local = True  # on this host's loopback for verifiers' interception (no tunnel asked)

    def __init__(self, spec: SandboxSpec | None = None, name: str | None = None, *,
                 program_timeout_s: float | None = None) -> None:
        super().__init__(name)
        self.spec = spec or SandboxSpec()
        self.config = RockrollConfig.of(self.spec)
        self.info = RockrollRuntimeInfo(**self.config.model_dump())
        self.program_timeout_s = program_timeout_s or self.spec.timeout_s
        self._sandbox: Any = None
        # Idle session names: a session runs one command at a time, so concurrent runs
        # each take one (made on first use) and give it back when done.
        self._idle_sessions: list[str] = []
        self._sessions_made = 0

    @property
    def sandbox(self) -> Any:
        """The live rockroll ``AsyncSandbox`` (snapshots, forks, usage); SandboxError if none."""
        if self._sandbox is None or self._sandbox.closed:
            raise vf_errors.SandboxError(f"runtime {self.name!r} has no live sandbox (start() it)")
        return self._sandbox

    async def __aenter__(self) -> RockrollRuntime:
        await self.start()  # a failed open leaves no sandbox behind (rockroll closes its own)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self._sandbox is not None:
            raise RuntimeError(f"runtime {self.name!r} is already started")
        vf_runtimes.register(self)  # verifiers' atexit backstop calls cleanup()
        with _as_sandbox_error("starting a sandbox"):
            self._sandbox = await open_async_sandbox(self.spec)
        self.info.id = self._sandbox.id

    async def teardown(self) -> None:
        """Close the sandbox (its processes, cgroups, overlay and disk go with it); idempotent.
        ``stop()`` runs this shielded from cancellation."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            with contextlib.suppress(RockrollSandboxError):
                await sandbox.close()

    def cleanup(self) -> None:
        """verifiers' synchronous atexit backstop. Nothing to do here: rockroll's own run
        registry closes every live sandbox of the process at exit (and the next run reaps a
        killed one's), which works where the event loop is already gone."""

    async def alive(self) -> bool:
        if self._sandbox is None or self._sandbox.closed:
            return False
        try:
            return bool(await self._sandbox.ping())
        except Exception:  # noqa: BLE001 - failing to answer at all means the box is gone
            return False

    # ----------------------------------------------------------------- commands
    async def run(self, argv: list[str], env: dict[str, str]) -> vf_runtimes.ProgramResult:
        return await self._exec(argv, env, self.spec.timeout_s)

    async def run_program(self, argv: list[str], env: dict[str, str]) -> vf_runtimes.ProgramResult:
        return await self._exec(argv, env, self.program_timeout_s)

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        # Detached from the command's process group, so it lives until the sandbox closes.
        script = f"setsid {shlex.join(argv)} > {shlex.quote(log)} 2>&1 < /dev/null &"
        result = await self._exec(["sh", "-c", script], env, self.spec.timeout_s)
        if result.exit_code != 0:
            raise vf_errors.SandboxError(f"background process failed to start: {result.stderr.strip()}")

    async def _exec(self, argv: list[str], env: Mapping[str, str], timeout: float) -> vf_runtimes.ProgramResult:
        if not argv:
            raise ValueError("an empty argv")
        sandbox = self.sandbox
        session = self._idle_sessions.pop() if self._idle_sessions else self._new_session()
        try:
            with _as_sandbox_error(f"running {argv[0]!r}"):
                # cwd: a throwaway subshell, so one run's cd/export never reach the next.
                result = await sandbox.run(shlex.join(argv), timeout=timeout, session=session,
                                           env=self.process_env(dict(env)), cwd=self.spec.workdir)
        finally:
            # Also when cancelled (verifiers' stage timeouts): rockroll kills the command, not
            # the session, so the session is free again either way.
            self._idle_sessions.append(session)
        stderr = result.stderr
        if result.timed_out:
            stderr += f"\n[rockroll] killed at its timeout of {timeout:g} s"
        if result.truncated:
            stderr += f"\n[rockroll] output cut at {self.spec.max_output_bytes} bytes"
        # a command its timeout killed already reads exit 137, as under docker exec
        return vf_runtimes.ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=stderr)

    def _new_session(self) -> str:
        self._sessions_made += 1
        return f"vf-{self._sessions_made}"

    # ----------------------------------------------------------------- files
    async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None:
            return await super()._read(path, max_bytes)  # capped inside the box (head -c)
        with _as_sandbox_error(f"read {path!r}"):
            return await self.sandbox.read_file(path)

    async def write(self, path: str, data: bytes) -> None:
        with _as_sandbox_error(f"write {path!r}"):
            await self.sandbox.write_file(path, data)

    async def expose(self, port: int) -> str:
        with _as_sandbox_error(f"exposing port {port}"):
            host, published = await self.sandbox.expose(port)
        return f"http://{host}:{published}"


@contextlib.contextmanager
def _as_sandbox_error(what: str):
    """A rockroll SandboxError (start, exec, file I/O) as verifiers' SandboxError, chained."""
    try:
        yield
    except RockrollSandboxError as e:
        raise vf_errors.SandboxError(f"rockroll: {what}: {type(e).__name__}: {e}") from e


@contextlib.asynccontextmanager
async def provision(spec: SandboxSpec | None = None, *, env: Mapping[str, str] | None = None,
                    name: str | None = None, program_timeout_s: float | None = None
                    ) -> AsyncIterator[RockrollRuntime]:
    """verifiers' ``provision_runtime`` for a rockroll box: started inside the ``try`` (a
    failed start still reaches ``stop``), stopped on exit, errors or cancellation included.
    ``env`` is the runtime-wide environment (verifiers' ``task.runtime_env()``)."""
    runtime = RockrollRuntime(spec, name, program_timeout_s=program_timeout_s)
    runtime.env = dict(env or {})
    try:
        await runtime.start()
        yield runtime
    finally:
        await runtime.stop()
