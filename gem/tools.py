"""Sandbox-backed tool environments: the agent drives a sandbox with bash, then submits.

:class:`SandboxToolEnv` is the base of every env whose actions are tool calls (``bash``,
``submit``, parsed by :func:`rockroll.gem.actions.parse_action`) run in a
:mod:`rockroll.sandbox` sandbox. A subclass only says how a task is set up in a fresh
sandbox (:meth:`SandboxToolEnv._setup`) and how a submission is graded
(:meth:`SandboxToolEnv._evaluate`).

Sandboxes come from one warm :class:`~rockroll.sandbox.pool.AsyncSandboxPool` per
:class:`~rockroll.sandbox.SandboxSpec`, shared by every env of the process: ``reset``
gives the previous episode's sandbox back (the pool resets it in the background) and
acquires a ready one, so a reset costs an acquire, not a create. Unused pools stay warm up
to ``max_warm_pools`` (default :data:`MAX_WARM_POOLS`); beyond that the least recently used
are closed, so a pass over many tasks with a pool each keeps a bounded number of sandboxes.
:func:`close_pools` closes them all.

One implementation, two faces: the async core (``areset``/``astep``/``asave_state``/
``aclose``) runs on the sandbox engine's event loop (``rockroll.sandbox.sync.background_loop``,
where the pools and sandboxes live); the sync ``reset``/``step``/``save_state``/``close`` run
that same core through ``run_sync``. The async methods can be awaited from any event loop:
they hop to the engine's loop when called from another one.

Tasks are plain records in a small text format (see :func:`parse_records`), bundled as
package data, so scripts stay readable files rather than escaped strings.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import reprlib
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Coroutine, Protocol, Sequence, TypeVar

import gymnasium
from rockroll.sandbox import AsyncSandbox, CommandResult, SandboxError, SandboxSpec
from rockroll.sandbox.pool import AsyncSandboxPool
from rockroll.sandbox.sync import background_loop, run_sync

from .actions import TOOL_FORMATS, Action, parse_action
from .core import STATE_FORMAT, GemEnv, InfraError, truncate_observation

__all__ = [
    "MAX_WARM_POOLS",
    "Evaluation",
    "SandboxToolEnv",
    "check_task_id",
    "close_pools",
    "format_command_result",
    "parse_records",
    "shared_pool",
]

T = TypeVar("T")

#: Where env-internal files (setup and checker scripts, hidden tests) live in a sandbox:
#: written just before use, so the agent never sees a checker before it submits.
ENV_DIR = "/tmp/.rockroll-env"
#: The bash session env-internal commands run in: the agent's own session (its cwd,
#: exports, a stuck foreground job) never changes how a task is set up or graded.
ENV_SESSION = "rockroll-env"


# ---- task files ------------------------------------------------------------------------
def parse_records(text: str) -> list[dict[str, str]]:
    """Parse the bundled task format into one dict per record.

    A record starts with a line ``=== <id>``; inside it, each section starts with a line
    ``--- <name>`` and holds every line up to the next marker (trailing blank lines
    dropped). Lines before the first record and lines starting with ``#`` *between*
    records are comments. Returns ``[{"id": ..., "<name>": ..., ...}, ...]``.
    """
    records: list[dict[str, str]] = []
    section: list[str] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("=== "):
            records.append({"id": line[4:].strip()})
            section = None
        elif line.startswith("--- ") and records:
            name = line[4:].strip()
            if name in records[-1]:
                raise ValueError(f"line {lineno}: section {name!r} repeated in {records[-1]['id']!r}")
            section = []
            records[-1][name] = section  # type: ignore[assignment] - joined below
        elif section is not None:
            section.append(line)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate record ids: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1})))
    return [
        {k: v if isinstance(v, str) else "\n".join(v).rstrip("\n") for k, v in record.items()}
        for record in records
    ]


# ---- process-wide pools ----------------------------------------------------------------
# One pool per spec (and start snapshot) for the whole process (envs of the same spec share
# warm sandboxes), least recently used first. Only touched from the engine's event loop, so
# no lock is needed.
_POOLS: collections.OrderedDict[str, AsyncSandboxPool] = collections.OrderedDict()
# Acquires under way, per pool: their sandbox is not in the pool's busy set yet.
_ACQUIRING: collections.Counter[AsyncSandboxPool] = collections.Counter()
_CLOSING: set[asyncio.Task] = set()  # evicted pools being closed
#: How many pools stay warm when no env uses them. An env with one pool per task (SWE) keeps
#: that many tasks warm; a pass over many tasks then keeps a bounded number of sandboxes.
MAX_WARM_POOLS = 8


async def shared_pool(spec: SandboxSpec, size: int, snapshot: str | None = None, *,
                      max_pools: int = MAX_WARM_POOLS) -> AsyncSandboxPool:
    """The process's pool for ``spec`` (created on first use), holding at least ``size``
    idle sandboxes, at ``snapshot`` if given. Pools past the ``max_pools`` most recently
    asked for are closed, unless an env holds or is acquiring one of their sandboxes. Must
    be awaited on the engine's loop, where the pools live."""
    key = json.dumps([spec.to_dict(), snapshot], sort_keys=True)
    pool = _POOLS.get(key)
    if pool is None or pool.closed:
        pool = _POOLS[key] = AsyncSandboxPool(spec, size, snapshot=snapshot)
        await pool.start(wait=False)  # warm up in the background; the first acquire creates
    _POOLS.move_to_end(key)
    pool.size = max(pool.size, size)  # a vector env of n wants n warm sandboxes, not 2
    excess = len(_POOLS) - max(1, max_pools)
    for old_key, old in list(_POOLS.items())[:-1]:  # never the pool just asked for
        if excess <= 0:
            break
        if old.busy == 0 and not _ACQUIRING[old]:
            del _POOLS[old_key]
            excess -= 1
            # In the background: a reset does not wait for another task's sandboxes to close.
            closing = asyncio.create_task(old.close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)
    return pool


async def _acquire_from(pool: AsyncSandboxPool) -> AsyncSandbox:
    """``pool.acquire()``, the pool marked in use meanwhile, so no eviction closes it."""
    _ACQUIRING[pool] += 1
    try:
        return await pool.acquire()
    finally:
        _ACQUIRING[pool] -= 1
        if not _ACQUIRING[pool]:
            del _ACQUIRING[pool]


async def close_pools() -> None:
    """Close every shared pool of the process, with every sandbox in it (those envs hold
    included). Must be awaited on the engine's loop; a later reset starts new pools."""
    pools = list(_POOLS.values())
    _POOLS.clear()
    await asyncio.gather(*(pool.close() for pool in pools), *list(_CLOSING), return_exceptions=True)


async def on_engine_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the engine's loop, hopping there if we run on another loop."""
    loop = background_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def release_quietly(pool: AsyncSandboxPool, sb: AsyncSandbox) -> None:
    # A sandbox that cannot even be closed is the engine's business (its atexit reaps it);
    # a finalizer or a reset must not fail because of it.
    with contextlib.suppress(SandboxError):
        await pool.release(sb)


class _Lease:
    """The sandbox an env holds and the pool it came from.

    Kept apart from the env so the env's finalizer can give the sandbox back without
    keeping the env alive.
    """

    __slots__ = ("pool", "sandbox")

    def __init__(self) -> None:
        self.pool: AsyncSandboxPool | None = None
        self.sandbox: AsyncSandbox | None = None

    async def give_back(self) -> None:
        pool, sb = self.pool, self.sandbox
        self.sandbox = None
        if pool is not None and sb is not None:
            await release_quietly(pool, sb)

    def give_back_soon(self) -> None:
        """From a finalizer, on any thread (the engine's own included): schedule, never block."""
        pool, sb = self.pool, self.sandbox
        self.sandbox = None
        if pool is None or sb is None:
            return
        loop = background_loop()
        with contextlib.suppress(RuntimeError):  # loop closed at interpreter exit: atexit reaps
            loop.call_soon_threadsafe(lambda: loop.create_task(release_quietly(pool, sb)))


# ---- results -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    """The grade of a submission: the reward, the final observation, extra ``info``."""

    reward: float
    observation: str
    info: dict[str, Any] = field(default_factory=dict)


class Task(Protocol):
    id: str


def select_tasks(items: Sequence, task_ids: Sequence[str] | None) -> list:
    """The items whose ``id`` is in ``task_ids`` (all of them when ``task_ids`` is None)."""
    if task_ids is None:
        return list(items)
    if isinstance(task_ids, str):  # one id would be read as its characters
        raise TypeError(f"task_ids must be a list of task ids, not one str: task_ids=[{task_ids!r}]")
    known = [item.id for item in items]
    for task_id in task_ids:
        check_task_id(task_id, known, "task_ids")
    wanted = set(task_ids)
    return [item for item in items if item.id in wanted]


def check_task_id(task_id: Any, known: Sequence[str], field: str = "task_id") -> None:
    """Raise a short ``TypeError`` when ``task_id`` is not an id (a task object, say: its
    repr would fill a screen); it names the type expected and the first known ids."""
    if isinstance(task_id, str):
        return
    hint = " (pass its .id)" if isinstance(getattr(task_id, "id", None), str) else ""
    raise TypeError(f"{field}: expected a task id (str), got a {type(task_id).__name__}{hint}; "
                    f"ids are e.g. {_first_ids(known)}")


def _first_ids(known: Sequence[str], n: int = 3) -> str:
    shown = ", ".join(repr(i) for i in known[:n])
    return f"{shown}{', ...' if len(known) > n else ''} ({len(known)} in all: env.unwrapped.task_ids)"


def format_command_result(result: CommandResult, max_chars: int) -> str:
    """A command's outcome as the model reads it: exit code, stdout and stderr, labelled.

    stdout and stderr are truncated separately (each to about half of ``max_chars``) so a
    flood on one stream never hides the other.
    """
    status = f"exit code: {result.exit_code}"
    if result.timed_out:
        status += " (timed out: the command was killed)"
    if result.oom_killed:
        status += " (killed: out of memory)"
    if result.truncated:
        status += " (output over the sandbox's limit was dropped)"
    budget = max(64, (max_chars - len(status) - 40) // 2)
    parts = [status]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        parts.append(f"{name}:\n{truncate_observation(text, budget)}" if text else f"{name}: (empty)")
    return "\n".join(parts)


# ---- the env -------------------------------------------------------------------------------
class SandboxToolEnv(GemEnv):
    """A GEM env whose agent works in a sandbox with ``bash`` and ends with ``submit``.

    Contract on top of :class:`~rockroll.gem.core.GemEnv`:

    - ``reset`` picks a task (``options["task_id"]``, else drawn with ``np_random``, so a
      seed names a task), gives the previous sandbox back to the shared pool, acquires a
      fresh one and runs the task's setup; ``info["task_id"]`` names the task.
    - ``step``: a ``bash`` action runs in the sandbox's persistent session with
      ``step_timeout`` (a timeout kills the command, not the episode); the observation
      shows exit code, stdout and stderr. ``submit`` grades the sandbox
      (:meth:`_evaluate`) and terminates. An answer (``\\boxed{}``) or an unparseable
      reply is a format error. Any :class:`~rockroll.sandbox.SandboxError` (agent died,
      sandbox lost, start failure) or a sandbox that stops answering is reported as
      ``info["infra_error"]``, never as a policy's zero.
    - ``save_state()`` snapshots the sandbox (the tarball stays in the local snapshot
      store; the state holds its digest) and the episode; ``reset(options={"state": s})``
      restores it into a pooled sandbox and continues exactly from there (files and the
      bash sessions' cwd and variables; running processes are not part of a snapshot).
    - ``close()`` gives the sandbox back; an env dropped without ``close()`` gives it back
      from a ``weakref.finalize``, and the engine's atexit reaps anything left at exit.

    Subclasses set ``self.tasks`` (records with an ``id``) and implement the async hooks
    :meth:`_setup` and :meth:`_evaluate`; they may run env-internal commands with
    :meth:`_env_run`.
    """

    infra_errors: ClassVar[tuple[type[BaseException], ...]] = (InfraError, SandboxError)
    #: Extra seconds past a command's own timeout before a silent sandbox counts as lost.
    infra_grace_s: ClassVar[float] = 30.0

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        sandbox_spec: SandboxSpec | None = None,
        pool_size: int = 2,
        step_timeout: float = 60.0,
        max_turns: int = 30,
        format_penalty: float = -0.1,
        max_obs_chars: int = 16_384,
        render_mode: str | None = None,
        max_warm_pools: int = MAX_WARM_POOLS,
    ):
        super().__init__(
            max_turns=max_turns, format_penalty=format_penalty, max_obs_chars=max_obs_chars, render_mode=render_mode
        )
        if not tasks:
            raise ValueError("a tool env needs at least one task")
        self.tasks = list(tasks)
        self._tasks_by_id = {task.id: task for task in self.tasks}
        # Not `spec`: gymnasium keeps the env's registration (EnvSpec) there.
        self.sandbox_spec = sandbox_spec or SandboxSpec()
        self.pool_size = int(pool_size)
        self.max_warm_pools = int(max_warm_pools)
        self.step_timeout = float(step_timeout)
        self.task: Any = None
        self._lease = _Lease()
        self._prepared: Any = None  # the async core's result, handed to the base's sync hooks
        # Gives the sandbox back if the env is garbage-collected unclosed. Not at exit:
        # then the engine's atexit closes every sandbox anyway.
        self._finalizer = weakref.finalize(self, self._lease.give_back_soon)
        self._finalizer.atexit = False

    # ---- subclass hooks ------------------------------------------------------------------
    async def _setup(self, sandbox: AsyncSandbox, task: Any) -> str:
        """Prepare ``task`` in a fresh sandbox; return the first observation."""
        raise NotImplementedError

    async def _evaluate(self, sandbox: AsyncSandbox, task: Any, action: Action, text: str) -> Evaluation:
        """Grade the sandbox after ``submit`` (``action``, parsed from the raw reply ``text``)."""
        raise NotImplementedError

    def agent_instruction(self, task: Any) -> str:
        """The task as a self-contained instruction for an agent that brings its own prompt
        and tools (``rock/Agent-v0``): what to do, not how to act in this env."""
        raise NotImplementedError(f"{type(self).__name__} gives no instruction for agents")

    def expert_commands(self, task: Any) -> list[str]:
        """The shell commands that solve ``task`` (its oracle), run one a turn by
        :meth:`expert_action`; ``TypeError`` where the env has none."""
        raise TypeError(f"{type(self).__name__} has no expert")

    def agent_expert_reply(self, task: Any) -> str:
        """What an expert model answers an agent's call on ``task`` (``rock/Agent-v0``'s
        expert, :meth:`rockroll.gem.agent_env.AgentEnv.expert_action`); ``TypeError`` where
        the task set has none."""
        raise TypeError(f"{type(self).__name__} has no expert reply for agents")

    def expert_action(self) -> str:
        """The expert's reply on this turn: the ``turn``-th of :meth:`expert_commands` as a
        fenced bash block, then ``<submit/>`` (the trainer's SFT data). ``ValueError`` when no
        episode runs."""
        if self.task is None or self._done or not self._started:
            raise ValueError("no expert move: no episode is running")
        commands = self.expert_commands(self.task)
        return f"```bash\n{commands[self._turn]}\n```" if self._turn < len(commands) else "<submit/>"

    # ---- helpers for subclasses -------------------------------------------------------------
    @property
    def task_ids(self) -> list[str]:
        return [task.id for task in self.tasks]

    @property
    def sandbox(self) -> AsyncSandbox | None:
        """The sandbox of the current episode (None between episodes)."""
        return self._lease.sandbox

    async def _run(self, sandbox: AsyncSandbox, cmd: str, *, timeout: float, **kwargs: Any) -> CommandResult:
        """``sandbox.run`` with a watchdog: a sandbox that does not answer well past the
        command's own timeout is lost (an infra failure), not a slow command."""
        try:
            return await asyncio.wait_for(sandbox.run(cmd, timeout=timeout, **kwargs), timeout + self.infra_grace_s)
        except asyncio.TimeoutError:
            raise InfraError(f"the sandbox did not answer within {timeout + self.infra_grace_s:.0f}s") from None

    async def _env_run(self, sandbox: AsyncSandbox, name: str, script: str, *, timeout: float = 60.0) -> CommandResult:
        """Run an env-internal ``script`` as ``bash <ENV_DIR>/<name>`` in the env's own session,
        from the workdir. The script file is removed afterwards."""
        path = f"{ENV_DIR}/{name}"
        await sandbox.write_file(path, script, mode=0o700)
        cmd = f"cd {sandbox.spec.workdir} && bash {path}; __rc=$?; rm -f {path}; (exit $__rc)"
        return await self._run(sandbox, cmd, timeout=timeout, session=ENV_SESSION)

    def _task_by_id(self, task_id: Any) -> Any:
        check_task_id(task_id, self.task_ids)
        try:
            return self._tasks_by_id[task_id]
        except KeyError:
            raise ValueError(f"unknown task_id {reprlib.repr(task_id)}; ids are e.g. {_first_ids(self.task_ids)}") from None

    # ---- the async core --------------------------------------------------------------------
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Async ``reset`` (same contract)."""
        return await on_engine_loop(self._areset(seed, options))

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Async ``step`` (same contract)."""
        return await on_engine_loop(self._astep(action))

    async def asave_state(self) -> dict[str, Any]:
        """Async ``save_state`` (same contract)."""
        return await on_engine_loop(self._asave_state())

    async def aclose(self) -> None:
        """Async ``close``: give the sandbox back to the pool. Idempotent."""
        await on_engine_loop(self._lease.give_back())

    async def _capture(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await ``coro``; an infra failure becomes the value, for the base to report."""
        try:
            return await coro
        except self.infra_errors as exc:
            return exc

    def _take_prepared(self) -> Any:
        """Inside the base's sync hooks: the async core's result (or its infra error, raised)."""
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            raise RuntimeError("SandboxToolEnv hooks run only inside reset()/step() (or their async twins)")
        if isinstance(prepared, BaseException):
            raise prepared
        return prepared

    def _spec_for(self, task: Any) -> SandboxSpec:
        """The sandbox a task runs in (one spec for all tasks unless a subclass says otherwise)."""
        return self.sandbox_spec

    def _pool_for(self, task: Any) -> tuple[SandboxSpec, int, str | None]:
        """(spec, warm size, snapshot) of the pool a task's sandboxes come from. A subclass
        whose tasks start at a snapshot names it here: its sandboxes then wait, ready, at
        that state."""
        return self._spec_for(task), self.pool_size, None

    async def _acquire(self, task: Any) -> AsyncSandbox:
        pool = await shared_pool(*self._pool_for(task), max_pools=self.max_warm_pools)
        self._lease.pool = pool
        self._lease.sandbox = await _acquire_from(pool)
        return self._lease.sandbox

    async def _start(self, task: Any) -> tuple[str, dict[str, Any]]:
        sandbox = await self._acquire(task)
        self.task = task
        return await self._setup(sandbox, task), {"task_id": task.id}

    async def _resume(self, env_state: dict[str, Any]) -> bool:
        sandbox = await self._acquire(self._task_by_id(env_state["task_id"]))
        await sandbox.restore(env_state["snapshot"]["digest"])
        return True

    async def _areset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict]:
        # Seed first: the task is drawn from np_random before the base's reset runs (the
        # base then sees seed=None and keeps this generator).
        gymnasium.Env.reset(self, seed=seed)
        options = dict(options or {})
        await self._lease.give_back()
        self.task = None
        state = options.get("state")
        snapshot = options.get("snapshot")
        if state is None and isinstance(snapshot, dict) and snapshot.get("format") == STATE_FORMAT:
            state = snapshot  # the base accepts a saved state under "snapshot" too
        if isinstance(state, dict) and state.get("format") == STATE_FORMAT and state.get("env") == type(self).__name__:
            self._prepared = await self._capture(self._resume(state["env_state"]))
            if isinstance(self._prepared, BaseException):
                # Report it like a failed start: the base's _reset raises it as an infra error.
                options = {k: v for k, v in options.items() if k not in ("state", "snapshot")}
        elif state is None:
            task = self._task_by_id(options["task_id"]) if options.get("task_id") is not None else (
                self.tasks[int(self.np_random.integers(len(self.tasks)))])
            self._prepared = await self._capture(self._start(task))
        # (a malformed state goes straight to the base, which raises ValueError)
        return GemEnv.reset(self, options=options)

    async def _astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._started and not self._done and isinstance(action, str):
            self._prepared = await self._capture(self._act(action))
        return GemEnv.step(self, action)  # raises ResetNeeded when no episode runs

    async def _act(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        action = parse_action(text)
        sandbox = self._lease.sandbox
        if action.kind == "bash":
            result = await self._run(sandbox, action.command, timeout=self.step_timeout)
            info = {"exit_code": result.exit_code, "timed_out": result.timed_out}
            return format_command_result(result, self.max_obs_chars), 0.0, False, info
        if action.kind == "submit":
            grade = await self._evaluate(sandbox, self.task, action, text)
            return grade.observation, grade.reward, True, dict(grade.info)
        if action.kind == "answer":
            return self._format_error("this environment takes tool actions, not a final answer", TOOL_FORMATS)
        return self._format_error(action.error, TOOL_FORMATS)

    async def _asave_state(self) -> dict[str, Any]:
        if self._lease.sandbox is None:
            if not self._started:
                return GemEnv.save_state(self)  # raises ResetNeeded
            raise RuntimeError("no sandbox to save: the episode failed to start, or the env was closed")
        snap = await self._lease.sandbox.snapshot()
        self._prepared = {"digest": snap.digest, "image": snap.image}
        try:
            return GemEnv.save_state(self)
        finally:
            self._prepared = None

    def _render_text(self) -> str:
        # Reads like a terminal log: what the env showed, verbatim, and each agent turn marked.
        return "\n\n".join(text if role == "env" else f">>> agent\n{text}" for role, text in self._transcript)

    # ---- base hooks (sync; they only pick up what the async core prepared) -----------------
    def _reset(self, task_id: Any, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return self._take_prepared()

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return self._take_prepared()

    def _get_state(self) -> dict[str, Any]:
        return {"task_id": self.task.id, "snapshot": self._take_prepared()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._take_prepared()
        self.task = self._task_by_id(state["task_id"])

    # ---- gymnasium API: the sync face of the async core --------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        return run_sync(self._areset(seed, options))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return run_sync(self._astep(action))

    def save_state(self) -> dict[str, Any]:
        return run_sync(self._asave_state())

    def close(self) -> None:
        run_sync(self._lease.give_back())
