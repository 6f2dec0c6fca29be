"""What answers a model call: the small generator interface and its modes.

The server (``server.py``) turns an OpenAI request into a ``Call`` and asks a
``Generator`` for an ``Answer``; it never knows which mode it runs. So ``sandbox`` never
imports ``trainer``: the trainer implements ``Policy`` (token ids in, token ids and
log-probs out) and hands ``PolicyMode(its_policy)`` to the server.

- ``PolicyMode``: the trainer's generator answers; every call records the exact prompt
  ids, completion ids, their log-probs and the policy version.
- ``ProxyMode``: forwards to an upstream OpenAI-compatible URL, retrying 429/5xx.
- ``ReplayMode``: answers from recorded JSONL (``records.py``), deterministically.
- ``HandoffMode``: each call waits until someone outside answers it: an agent env
  (``rock/Agent-v0``, in ``gem``) whose ``step(completion)`` is the generator.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Protocol


class ModeError(Exception):
    """A call the mode cannot answer; the server returns it in OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


@dataclass(frozen=True)
class Caller:
    """Who made a call: resolved from the key, never from anything the caller sends.
    ``records``: a JSONL file this caller's records also go to (its training run's), set
    only in-process by whoever admitted it: services are shared by runs, files are not.
    ``ended``: set when its key is revoked; from then on nothing goes to ``records`` (a call
    still in flight, or refused because its episode ended, is recorded in the service's file
    only), so a run's file is final once its env is closed."""
    sandbox_id: str
    episode: str
    records: Path | None = None
    ended: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    logprobs: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class Call:
    """One request, parsed. ``kind`` is ``"chat"`` (``messages``) or ``"completion"``
    (``prompt``); ``index`` counts the caller's calls from 0; ``request`` is the raw body."""
    kind: str
    model: str
    caller: Caller
    index: int
    sampling: Sampling
    messages: list[dict] | None = None
    prompt: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    request: dict = field(default_factory=dict)


@dataclass
class Choice:
    """One generated continuation. ``tool_calls`` already in OpenAI form (proxy, replay)
    or None: the server then parses them out of ``text`` with its tool parser."""
    text: str
    finish_reason: str = "stop"
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens: list[str] | None = None   # the text of each completion token, for ``logprobs``
    tool_calls: list[dict] | None = None


@dataclass
class Answer:
    choices: list[Choice]
    prompt_ids: list[int] | None = None
    version: Any = None
    response: dict | None = None      # the upstream body (proxy), recorded as is


class Generator(Protocol):
    """Answers calls. One instance serves every sandbox; it must be safe to await
    concurrently.

    A generator may also have ``stream(call) -> AsyncIterator[Answer]``: the answer of a
    one-choice call as it is generated, each yielded ``Answer`` holding one ``Choice`` with
    the new text (and its ids, log-probs, tokens), ``finish_reason`` set on the last;
    ``join_pieces`` makes the whole answer of them. The server streams those pieces to a
    caller that asked for ``stream`` (without tools: a tool call is parsed from the whole
    text); a generator without it is streamed whole."""

    async def generate(self, call: Call) -> Answer:
        """The answer to ``call`` (``call.sampling.n`` choices), or ``ModeError``."""


def _joined(pieces: list[Choice], attr: str) -> list | None:
    """The pieces' lists of ``attr`` end to end; None if a piece has none."""
    values = [getattr(c, attr) for c in pieces]
    return None if any(v is None for v in values) else [x for v in values for x in v]


def join_pieces(pieces: list[Answer]) -> Answer:
    """The whole answer of a ``stream``'s pieces (the last piece's finish reason, prompt ids
    and version)."""
    choices = [p.choices[0] for p in pieces if p.choices]
    last = pieces[-1] if pieces else Answer([])
    choice = Choice(text="".join(c.text for c in choices),
                    finish_reason=choices[-1].finish_reason if choices else "stop",
                    completion_ids=_joined(choices, "completion_ids"),
                    logprobs=_joined(choices, "logprobs"), tokens=_joined(choices, "tokens"))
    return Answer([choice], prompt_ids=last.prompt_ids, version=last.version, response=last.response)


# --------------------------------------------------------------------------- policy


@dataclass
class Sample:
    """What a policy returns per choice: the tokens it generated, their log-probs under
    the policy that generated them, why it stopped (``"stop"`` or ``"length"``) and that
    policy's version."""
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    version: Any


class Policy(Protocol):
    """The trainer's side of policy mode (transformers or vLLM behind it)."""

    def prompt_ids(self, call: Call) -> list[int]:
        """The prompt tokens: ``call.messages`` and ``call.tools`` through the model's chat
        template (chat), or ``call.prompt`` encoded (completion)."""

    async def sample(self, prompt_ids: list[int], sampling: Sampling) -> list[Sample]:
        """``sampling.n`` samples, honouring ``max_tokens``, ``stop`` and ``temperature``.

        Optional, for real streaming: ``sample_stream(prompt_ids, sampling) ->
        AsyncIterator[Sample]``, one sample in pieces (each the new tokens and their
        log-probs; ``finish_reason`` set on the last)."""

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text."""


class PolicyMode:
    """Answers with a ``Policy``; the answer keeps the exact ids and log-probs."""

    def __init__(self, policy: Policy):
        self.policy = policy

    async def generate(self, call: Call) -> Answer:
        ids = self.policy.prompt_ids(call)
        samples = await self.policy.sample(ids, call.sampling)
        choices = [Choice(text=self.policy.decode(s.completion_ids), finish_reason=s.finish_reason,
                          completion_ids=list(s.completion_ids), logprobs=list(s.logprobs),
                          tokens=[self.policy.decode([t]) for t in s.completion_ids]) for s in samples]
        return Answer(choices=choices, prompt_ids=list(ids), version=samples[0].version if samples else None)

    async def stream(self, call: Call) -> AsyncIterator[Answer]:
        """The answer in pieces as the policy's ``sample_stream`` makes them (one piece,
        the whole answer, for a policy without it)."""
        sample_stream = getattr(self.policy, "sample_stream", None)
        if sample_stream is None:
            yield await self.generate(call)
            return
        ids = self.policy.prompt_ids(call)
        async for s in sample_stream(ids, call.sampling):
            piece = Choice(text=self.policy.decode(s.completion_ids), finish_reason=s.finish_reason,
                           completion_ids=list(s.completion_ids), logprobs=list(s.logprobs),
                           tokens=[self.policy.decode([t]) for t in s.completion_ids])
            yield Answer([piece], prompt_ids=list(ids), version=s.version)


# --------------------------------------------------------------------------- proxy

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ProxyMode:
    """Forwards each call to ``base_url`` (``.../v1``) of an OpenAI-compatible server,
    non-streaming (the server streams the answer itself), retrying 429/5xx and connection
    failures ``retries`` times with exponential back-off."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 600.0):
        self.base_url, self.api_key, self.model = base_url.rstrip("/"), api_key, model
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self._client = None

    def _http(self):
        if self._client is None:
            try:
                import httpx  # noqa: PLC0415 - the service extra
            except ImportError as e:
                raise ModeError(500, "proxy mode needs httpx: pip install 'rockroll[service]'") from e
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def generate(self, call: Call) -> Answer:
        import httpx  # noqa: PLC0415

        body = {k: v for k, v in call.request.items() if k not in ("stream", "stream_options")}
        if self.model:
            body["model"] = self.model
        url = self.base_url + ("/chat/completions" if call.kind == "chat" else "/completions")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = await self._http().post(url, json=body, headers=headers)
            except httpx.HTTPError as e:
                last = f"upstream unreachable: {e}"
                continue
            if resp.status_code in RETRY_STATUSES:
                last = f"upstream answered {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise ModeError(resp.status_code, f"upstream answered {resp.status_code}: {resp.text[:500]}",
                                code="upstream_error")
            return answer_of_response(call.kind, resp.json())
        raise ModeError(502, f"{last} (after {self.retries + 1} attempts)", code="upstream_error")

    async def aclose(self) -> None:
        """Close the HTTP client (in the loop that used it); the next call opens another."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def answer_of_response(kind: str, data: dict) -> Answer:
    """An OpenAI response body (chat or completion) as an ``Answer``."""
    choices = []
    for c in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0)):
        if kind == "chat":
            msg = c.get("message") or {}
            content = (c.get("logprobs") or {}).get("content") or []
            choices.append(Choice(text=msg.get("content") or "", finish_reason=c.get("finish_reason") or "stop",
                                  tool_calls=msg.get("tool_calls") or [],
                                  logprobs=[t["logprob"] for t in content] or None,
                                  tokens=[t["token"] for t in content] or None))
        else:
            lp = c.get("logprobs") or {}
            choices.append(Choice(text=c.get("text") or "", finish_reason=c.get("finish_reason") or "stop",
                                  logprobs=lp.get("token_logprobs"), tokens=lp.get("tokens")))
    return Answer(choices=choices, response=data)


# --------------------------------------------------------------------------- replay


def request_key(kind: str, messages: Any, prompt: Any, tools: Any) -> str:
    """What identifies a request for replay: its kind, conversation and tools."""
    canon = json.dumps([kind, messages, prompt, tools], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


class ReplayMode:
    """Answers from records (``records.py`` lines): the k-th call with a given request
    gets the k-th recorded answer to that request, so a recorded agent run replays
    exactly without a model. A request never recorded is a 404 (``replay_miss``)."""

    def __init__(self, records: str | Path | Iterable[dict]):
        if isinstance(records, (str, Path)):
            with open(records) as f:
                records = [json.loads(line) for line in f if line.strip()]
        self._answers: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        for rec in records:
            if rec.get("error"):
                continue
            key = request_key(rec["kind"], rec.get("messages"), rec.get("prompt"), rec.get("tools"))
            self._answers[key].append(rec)

    async def generate(self, call: Call) -> Answer:
        queue = self._answers.get(request_key(call.kind, call.messages, call.prompt, call.tools))
        if not queue:
            raise ModeError(404, "replay: no recorded answer for this request", code="replay_miss")
        rec = queue.popleft()
        # "content" is what the caller received (tool calls taken out); "text" the raw output
        choices = [Choice(text=c.get("content") or "", finish_reason=c.get("finish_reason") or "stop",
                          completion_ids=c.get("completion_ids"), logprobs=c.get("logprobs"),
                          tokens=c.get("tokens"), tool_calls=c.get("tool_calls") or [])
                   for c in rec.get("choices") or []]
        return Answer(choices=choices, prompt_ids=rec.get("prompt_ids"), version=rec.get("version"))


# --------------------------------------------------------------------------- hand-off


class PendingCall:
    """A call waiting for an answer from outside the service (``HandoffMode``).
    ``answer`` and ``refuse`` may be called from any thread, once; later calls are no-ops."""

    def __init__(self, call: Call):
        self.call = call
        self._future: concurrent.futures.Future = concurrent.futures.Future()

    @property
    def waiting(self) -> bool:
        """Whether the caller still waits (not answered, refused, or gone)."""
        return not self._future.done()

    def answer(self, answer: "Answer | str") -> bool:
        """Answer the caller (a completion text becomes one choice); False if it no longer waits."""
        if isinstance(answer, str):
            answer = Answer(choices=[Choice(text=answer)])
        return self._settle(lambda f: f.set_result(answer))

    def refuse(self, error: ModeError) -> bool:
        """Refuse the call with ``error``; False if it no longer waits."""
        return self._settle(lambda f: f.set_exception(error))

    def _settle(self, how) -> bool:
        try:
            how(self._future)
            return True
        except concurrent.futures.InvalidStateError:  # answered, refused, or the caller went away
            return False


class _Episode:
    __slots__ = ("queued", "waiters", "handed")

    def __init__(self) -> None:
        self.queued: collections.deque[PendingCall] = collections.deque()  # not yet handed out
        self.waiters: collections.deque[concurrent.futures.Future] = collections.deque()  # next_call()s
        self.handed: list[PendingCall] = []  # every call of the episode, refused on close if unanswered


def episode_ended(episode: str) -> ModeError:
    return ModeError(401, f"episode {episode!r} is not running (it ended, or never started)",
                     code="episode_ended")


class HandoffMode:
    """Calls wait until someone outside the service answers them: an agent env
    (``rock/Agent-v0``) whose ``step(completion)`` is the generator.

    Calls are grouped by episode (``Caller.episode``, from the key). ``open(episode)``
    accepts an episode's calls; ``await next_call(episode)`` hands them out in arrival
    order as ``PendingCall``s, whose ``answer(text)`` releases the waiting caller;
    ``close(episode)`` refuses the episode's waiting and later calls (401
    ``episode_ended``, a typed OpenAI error the client does not retry). A call for an
    episode that is not open is refused the same way, so nothing ever waits for an answer
    that cannot come. Thread-safe, loop-agnostic (``concurrent.futures`` futures): the
    server's loop, the env's loop and plain threads all use one instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._episodes: dict[str, _Episode] = {}

    def open(self, episode: str) -> None:
        with self._lock:
            self._episodes.setdefault(episode, _Episode())

    def close(self, episode: str) -> None:
        """End ``episode``: its unanswered calls are refused, its ``next_call``s return None."""
        with self._lock:
            ep = self._episodes.pop(episode, None)
        if ep is None:
            return
        for waiter in ep.waiters:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                waiter.set_result(None)
        for pending in [*ep.handed, *ep.queued]:
            pending.refuse(episode_ended(episode))

    def is_open(self, episode: str) -> bool:
        with self._lock:
            return episode in self._episodes

    async def next_call(self, episode: str) -> PendingCall | None:
        """The episode's next call (waiting for one if none is queued), or None once the
        episode is closed. Cancelling the wait loses no call."""
        with self._lock:
            ep = self._episodes.get(episode)
            if ep is None:
                return None
            while ep.queued:
                pending = ep.queued.popleft()
                if pending.waiting:  # else its caller went away meanwhile
                    return pending
            waiter: concurrent.futures.Future = concurrent.futures.Future()
            ep.waiters.append(waiter)
        try:
            return await asyncio.wrap_future(waiter)
        except asyncio.CancelledError:
            with self._lock:
                if waiter in ep.waiters:
                    ep.waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                    ep.queued.appendleft(waiter.result())  # handed to us as we were cancelled: keep it
            raise

    async def generate(self, call: Call) -> Answer:
        if call.sampling.n != 1:
            raise ModeError(400, "n: an env-driven service answers one choice per call", code="invalid_value",
                            param="n")
        pending = PendingCall(call)
        with self._lock:
            ep = self._episodes.get(call.caller.episode)
            if ep is None:
                raise episode_ended(call.caller.episode)
            ep.handed.append(pending)
            while ep.waiters:
                waiter = ep.waiters.popleft()
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # a cancelled waiter
                    waiter.set_result(pending)
                    break
            else:
                ep.queued.append(pending)
        try:
            return await asyncio.wrap_future(pending._future)
        finally:
            pending._future.cancel()  # the caller went away (or it is done: then a no-op)
