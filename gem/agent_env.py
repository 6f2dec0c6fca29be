"""``rock/Agent-v0``: an unmodified agent program works on a task in a sandbox; the
env's ``step`` is its model.

An episode: a sandbox (no network; its only way out is the model endpoint, see
docs/modelservice.md) is prepared for a task of a task set (``terminal``: the
``rock/Terminal-v0`` tasks; ``swe``: the ``rock/SWE-v0`` tasks, in their env's variant
with the agent installed when it needs installing, e.g. ``mini-swe-agent``; any
:class:`~rockroll.gem.tools.SandboxToolEnv` by entry point), the task's instruction is
written to a file, and the agent (``gem/agents.py``) starts on it. Each model call it
makes waits in the model service (``HandoffMode``) until the env answers it:

- ``reset()`` returns the agent's first request: the observation is the prompt rendered
  as text (``render``, ChatML with Hermes tools by default; a completion call's prompt as
  is), ``info`` holds the structured request (``messages``, ``tools``, ``tool_choice``,
  ``sampling``, ``kind``, ``call_index``) and ``episode``, the id the model service's
  records carry for this episode.
- ``step(completion_text)`` answers that call (tool calls in the text are parsed by the
  service, Hermes ``<tool_call>`` by default) and returns the agent's next request, reward 0.
- When the agent exits 0, the task's checker grades the sandbox: the final step is
  terminal with the checker's reward and its ``info`` (``agent_status="exited"``).
- The agent exits non-zero: terminal, reward 0, ``agent_status="crashed"`` (its exit code
  and stderr tail in ``info``). It neither calls nor exits within ``call_timeout``
  (a hung agent): terminal, reward 0, ``agent_status="timeout"``. A call past
  ``max_turns``: the agent is stopped, the checker grades what it left, ``truncated``,
  ``agent_status="turn_limit"``. These are the policy's outcomes, not the env's.
- The sandbox dies (or the checker cannot run): terminal with ``info["infra_error"]``,
  as in every GEM env: drop the sample. An agent that exits or hangs before its first
  call never saw the policy: that is an ``infra_error`` of ``reset``.

Each episode gets its own key (``ModelService.admit(sandbox_id, episode)``), revoked
when the episode ends; so are the hand-off's pending calls: a call after the episode
ended is refused (401 ``episode_ended`` / ``invalid_api_key``), and every recorded call
is attributed to its episode. Envs share one process-wide model service unless given
their own (``model_service=``, in ``HandoffMode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import shlex
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable

from rockroll.sandbox import AsyncSandbox, CommandResult, SandboxError, SandboxSpec
from rockroll.sandbox.modelservice import Answer, Choice, HandoffMode, ModelService, PendingCall
from rockroll.sandbox.protocol.tokens import TOKEN_ENV
from rockroll.sandbox.runtime.model_channel import sandbox_env
from rockroll.sandbox.sync import run_sync

from .actions import Action
from .agents import AgentSpec, agent_spec
from .core import InfraError, TokenReply, truncate_observation
from .tools import MAX_WARM_POOLS, SandboxToolEnv, on_engine_loop

__all__ = ["TASK_SETS", "AgentEnv", "render_chatml", "shared_model_service"]

#: Task sets by name: a SandboxToolEnv whose tasks, setup and checker the agent env uses.
TASK_SETS: dict[str, str] = {
    "terminal": "rockroll.gem.terminal:TerminalEnv",
    "swe": "rockroll.gem.swe:SWEEnv",
    "corridor": "rockroll.gem.corridor:CorridorTasks",
}
#: The agent's session, and where its task file goes (readable by the agent: it is its task).
AGENT_SESSION = "rockroll-agent"
TASK_FILE = "/tmp/.rockroll-agent/task.md"


# ---- the model service ------------------------------------------------------------------
_SHARED: ModelService | None = None
_SHARED_LOCK = threading.Lock()


def shared_model_service() -> ModelService:
    """The process's model service in ``HandoffMode`` (started on first use), shared by
    every agent env without one of its own. It takes ``$ROCKROLL_MODEL_TOKEN`` as its
    admin token when that is set, else sets it: sandbox hosts read it to get keys."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            service = ModelService(HandoffMode(), token=os.environ.get(TOKEN_ENV) or None)
            service.start()
            os.environ.setdefault(TOKEN_ENV, service.token)
            _SHARED = service
        return _SHARED


# ---- rendering ---------------------------------------------------------------------------
def _text(content: Any) -> str:
    """A message's content as text (OpenAI content parts: their text joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def render_chatml(messages: list[dict], tools: list[dict] | None) -> str:
    """A chat request as one prompt: ChatML with tools in the Hermes style (the format of
    Qwen's chat template, which the service's default ``hermes`` tool parser reads back),
    ending with the open assistant turn the completion continues."""
    messages = list(messages)
    system = _text(messages.pop(0)["content"]) if messages and messages[0].get("role") == "system" else ""
    if tools:
        system += ("\n\n" if system else "") + (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    out = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    for m in messages:
        role, text = m.get("role"), _text(m.get("content"))
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    args = fn.get("arguments")
                text += ("\n" if text else "") + "<tool_call>\n" + json.dumps(
                    {"name": fn.get("name"), "arguments": args}, ensure_ascii=False) + "\n</tool_call>"
        elif role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


# ---- one episode's agent -------------------------------------------------------------------
class _Run:
    """An episode's agent: its key, its hand-off episode, its process, its pending call.
    ``end()`` is sync and thread-safe (the env's finalizer calls it)."""

    def __init__(self, service: ModelService, sandbox_id: str, records: Path | None = None):
        self.service, self.mode = service, service.mode
        self.id = "agent-" + uuid.uuid4().hex[:16]
        self.mode.open(self.id)
        self.key = service.admit(sandbox_id, self.id, records)
        self.process: asyncio.Future | None = None
        self.pending: PendingCall | None = None

    def end(self) -> None:
        """From now on the episode's calls, waiting or new, are refused. The key goes first:
        a waiting call refused here is recorded in the service's file only, so the run's file
        holds what it held when the episode ended."""
        self.service.revoke(self.key)
        self.mode.close(self.id)


class _Runs:
    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: _Run | None = None

    def end(self) -> None:
        run, self.current = self.current, None
        if run is not None:
            run.end()


# ---- the env --------------------------------------------------------------------------------
class AgentEnv(SandboxToolEnv):
    """An agent program in a sandbox, driven through its model calls; see the module docstring.

    ``agent``: an ``AGENTS`` name or an ``AgentSpec``. ``task_set``: a ``TASK_SETS`` name or
    a ``module:Class`` entry point of a ``SandboxToolEnv``; ``task_kwargs`` go to it (e.g.
    ``{"task_ids": [...]}``, ``{"tasks_file": ...}``); a task set that ``takes_agent`` (SWE:
    its tasks carry their images) is given ``agent=`` the agent's name when the agent has
    ``install`` steps, so its tasks run where the agent is installed (``{"agent": None}``
    in ``task_kwargs``: where they are). ``sandbox_spec``: the sandboxes (the
    image must hold the agent, see ``AgentSpec.install``; never ``network=True``);
    ``snapshot``: a snapshot every episode's sandbox starts from instead (e.g. the agent
    installed); ``image``: the sandboxes' image (what a hub env built by
    ``agents.agent_package`` passes). ``call_timeout``: seconds the agent may go without a call or an exit (after
    start, or after an answer); ``episode_timeout``: the agent process's own time limit.
    ``render``: ``(messages, tools) -> str`` for observations. ``model_service``: a started
    or startable ``ModelService`` in ``HandoffMode`` (default: the process's shared one).
    """

    def __init__(
        self,
        *,
        agent: str | AgentSpec = "openai-tool-agent",
        task_set: str = "terminal",
        task_kwargs: dict[str, Any] | None = None,
        sandbox_spec: SandboxSpec | None = None,
        snapshot: str | None = None,
        image: str | None = None,
        model_service: ModelService | None = None,
        call_timeout: float = 600.0,
        episode_timeout: float = 3600.0,
        render: Callable[[list[dict], list[dict] | None], str] = render_chatml,
        max_turns: int = 50,
        max_obs_chars: int = 1_000_000,
        pool_size: int = 2,
        max_warm_pools: int = MAX_WARM_POOLS,
        render_mode: str | None = None,
        format_penalty: float = 0.0,
    ):
        del format_penalty  # the trainer passes every env one: an agent parses its own replies
        self.agent = agent_spec(agent)
        spec = sandbox_spec or SandboxSpec()
        if image is not None:  # a hub env holding the agent (agents.agent_package) passes its image
            spec = dataclasses.replace(spec, image=image)
        if spec.network:
            raise ValueError("sandbox_spec.network must be False: the agent reaches its model through the "
                             "model service, and nothing else")
        if call_timeout <= 0 or episode_timeout <= 0:
            raise ValueError("call_timeout and episode_timeout must be > 0")
        service = model_service or shared_model_service()
        if not isinstance(service.mode, HandoffMode):
            raise ValueError(f"model_service must run HandoffMode, not {type(service.mode).__name__}")
        if service.url is None:
            service.start()
        token = os.environ.setdefault(TOKEN_ENV, service.token)
        if token != service.token:
            raise ValueError(f"${TOKEN_ENV} holds another model service's token: sandboxes could not get keys "
                             "from this one (set it to model_service.token)")
        self.service = service
        spec = dataclasses.replace(spec, model_endpoint=service.url)
        #: The task set: its tasks, setup and checker (it is never reset or stepped itself).
        self.task_env = _task_env(task_set, task_kwargs or {}, spec, pool_size, max_warm_pools, self.agent)
        super().__init__(self.task_env.tasks, sandbox_spec=spec, pool_size=pool_size, max_turns=max_turns,
                         max_obs_chars=max_obs_chars, render_mode=render_mode, max_warm_pools=max_warm_pools,
                         format_penalty=0.0)
        # Its checker may take a grading sandbox from the pool of the episode's sandbox (SWE).
        self.task_env._lease = self._lease
        self.start_snapshot = snapshot
        self.call_timeout, self.episode_timeout = float(call_timeout), float(episode_timeout)
        self.render = render
        self._runs = _Runs()
        self._records: Path | None = None  # record_calls
        weakref.finalize(self, self._runs.end).atexit = False

    def record_calls(self, path: str | os.PathLike) -> None:
        """Append the record of every model call of this env's episodes to ``path`` (JSONL, the
        schema of docs/modelservice.md): ``rockroll train`` names ``<logging.dir>/model_calls.jsonl``.
        Per env, not per service: the process-wide service is shared by every run's envs, and
        one run's records must not go to, or depend on, another run's folder."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._records = Path(path)

    # ---- where and how tasks run: the task set's ------------------------------------------
    def _pool_for(self, task: Any) -> tuple[SandboxSpec, int, str | None]:
        spec, size, snapshot = self.task_env._pool_for(task)
        return spec, size, self.start_snapshot or snapshot

    @property
    def episode(self) -> str | None:
        """The running episode's id (the ``episode`` of its model-call records)."""
        run = self._runs.current
        return run.id if run else None

    # ---- the expert (SFT data): the task set's answer to a model call --------------------------
    @property
    def action_words(self) -> tuple[str, ...]:
        """The replies a noisy expert draws from (the task set's ``agent_action_words``)."""
        return tuple(getattr(self.task_env, "agent_action_words", ()))

    def expert_action(self) -> str:
        """The task set's expert reply to the agent's pending call
        (:meth:`~rockroll.gem.tools.SandboxToolEnv.agent_expert_reply`; the corridor's: the goal's
        direction). ``TypeError`` for a task set without one, ``ValueError`` when no episode runs."""
        if self.task is None or self._done or not self._started:
            raise ValueError("no expert move: no episode is running")
        return self.task_env.agent_expert_reply(self.task)

    # ---- the episode ----------------------------------------------------------------------
    async def _start(self, task: Any) -> tuple[str, dict[str, Any]]:
        sandbox = await self._acquire(task)
        self.task = task
        await self.task_env._setup(sandbox, task)  # its tool-format first observation is not used
        await sandbox.write_file(TASK_FILE, self.task_env.agent_instruction(task))
        run = self._runs.current = _Run(self.service, sandbox.id, self._records)
        cmd = self.agent.command.replace("{task}", shlex.quote(TASK_FILE))
        env = {**self.agent.env, **sandbox_env(run.key)}
        run.process = asyncio.ensure_future(sandbox.run(cmd, timeout=self.episode_timeout, session=AGENT_SESSION,
                                                        env=env, cwd=sandbox.spec.workdir))
        event = await self._next_event(run)
        if isinstance(event, PendingCall):
            obs, info = self._observe(run, event)
            return obs, {**info, "task_id": task.id}
        await self._stop(run, sandbox)
        if event is None:
            raise InfraError(f"the agent made no model call and did not exit within {self.call_timeout:g}s "
                             "of its start")
        out = "; ".join(f"its {name}: {text.strip()[-1500:]}" for name, text in
                        (("stdout", event.stdout), ("stderr", event.stderr)) if text.strip())
        raise InfraError(f"the agent exited (code {event.exit_code}) before its first model call"
                         f"{': ' + out if out else ' and printed nothing'}")

    async def _act(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        run, sandbox = self._runs.current, self._lease.sandbox
        answer: Answer | str = text
        if isinstance(text, TokenReply):  # the trainer's tokens: the call's record is token-exact
            answer = Answer([Choice(text=str(text), completion_ids=text.completion_ids, logprobs=text.logprobs)],
                            prompt_ids=text.prompt_ids, version=text.version)
        run.pending.answer(answer)  # False if its caller went away: the next event says what became of it
        run.pending = None
        event = await self._next_event(run)
        if isinstance(event, PendingCall):
            if self._turn + 1 < self.max_turns:
                obs, info = self._observe(run, event)
                return obs, 0.0, False, info
            await self._stop(run, sandbox)  # a call past the turn limit: what the agent did is graded
            obs, reward, info = await self._grade(sandbox)
            return (f"The agent reached the turn limit ({self.max_turns}) and was stopped.\n{obs}", reward, False,
                    {**info, "agent_status": "turn_limit"})
        await self._stop(run, sandbox)
        if event is None:
            return (f"The agent made no model call and did not exit within {self.call_timeout:g}s: it was stopped.",
                    0.0, True, {"agent_status": "timeout"})
        tail = truncate_observation(event.stderr.strip(), 2000)
        if event.timed_out or event.exit_code != 0:
            status = "timeout" if event.timed_out else "crashed"
            return (f"The agent {'ran past its time limit' if event.timed_out else 'crashed'} "
                    f"(exit code {event.exit_code}).\n{tail}".rstrip(), 0.0, True,
                    {"agent_status": status, "agent_exit_code": event.exit_code, "agent_stderr": tail})
        obs, reward, info = await self._grade(sandbox)
        return (f"The agent exited.\n{obs}", reward, True,
                {**info, "agent_status": "exited", "agent_exit_code": 0, "agent_stdout":
                 truncate_observation(event.stdout.strip(), 2000)})

    async def _grade(self, sandbox: AsyncSandbox) -> tuple[str, float, dict[str, Any]]:
        grade = await self.task_env._evaluate(sandbox, self.task, Action(kind="submit"), "")
        return grade.observation, grade.reward, dict(grade.info)

    async def _next_event(self, run: _Run) -> PendingCall | CommandResult | None:
        """The agent's next call, its exit (``CommandResult``; a dead sandbox raises), or
        None: neither within ``call_timeout``."""
        getter = asyncio.ensure_future(self.service.mode.next_call(run.id))
        try:
            done, _ = await asyncio.wait({getter, run.process}, timeout=self.call_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
        if run.process in done:  # an exit wins: a call it left behind can no longer be answered
            if run.process.exception() is not None:
                run.end()  # the sandbox is gone: so is the episode
            return run.process.result()
        if getter in done and getter.result() is not None:
            run.pending = getter.result()
            return run.pending
        return None

    def _observe(self, run: _Run, pending: PendingCall) -> tuple[str, dict[str, Any]]:
        call = pending.call
        obs = self.render(call.messages, call.tools) if call.kind == "chat" else call.prompt
        return obs, {"episode": run.id, "call_index": call.index, "kind": call.kind, "model": call.model,
                     "messages": call.messages, "tools": call.tools, "tool_choice": call.tool_choice,
                     "prompt": call.prompt, "sampling": dataclasses.asdict(call.sampling)}

    async def _stop(self, run: _Run, sandbox: AsyncSandbox | None) -> None:
        """End ``run``: its calls are refused from now on, its process is killed."""
        run.end()
        if run.process is not None and not run.process.done():
            if sandbox is not None:
                with contextlib.suppress(SandboxError):
                    await sandbox.close_session(AGENT_SESSION)
            run.process.cancel()
        if run.process is not None:
            with contextlib.suppress(asyncio.CancelledError, SandboxError):
                await run.process

    async def _end(self) -> None:
        run, self._runs.current = self._runs.current, None
        if run is not None:
            await self._stop(run, self._lease.sandbox)

    # ---- lifecycle: an episode ends before its sandbox goes back ---------------------------------
    async def _areset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict]:
        if isinstance((options or {}).get("state"), dict) or isinstance((options or {}).get("snapshot"), dict):
            raise NotImplementedError("an agent episode cannot be resumed: its running process is no part of "
                                      "a snapshot")
        await self._end()
        return await super()._areset(seed, options)

    async def _asave_state(self) -> dict[str, Any]:
        raise NotImplementedError("an agent episode cannot be saved: its running process is no part of a snapshot")

    async def _close(self) -> None:
        await self._end()
        await self._lease.give_back()

    async def aclose(self) -> None:
        await on_engine_loop(self._close())

    def close(self) -> None:
        run_sync(self._close())


def _task_env(task_set: str, kwargs: dict[str, Any], spec: SandboxSpec, pool_size: int,
              max_warm_pools: int, agent: AgentSpec) -> SandboxToolEnv:
    entry = TASK_SETS.get(task_set, task_set)
    if not isinstance(entry, str) or ":" not in entry:
        raise ValueError(f"task_set must be one of {sorted(TASK_SETS)} or a 'module:Class' entry point, "
                         f"not {task_set!r}")
    module, _, name = entry.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, SandboxToolEnv)):
        raise ValueError(f"task_set {task_set!r} is not a SandboxToolEnv")
    if agent.install and getattr(cls, "takes_agent", False):
        # Its tasks carry their own images (SWE): the agent is in their variant (build-swe --agent).
        kwargs = {"agent": agent.name, **kwargs}
    return cls(sandbox_spec=spec, pool_size=pool_size, max_warm_pools=max_warm_pools, **kwargs)
