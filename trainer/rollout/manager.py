"""Token-in/token-out multi-turn rollout, asynchronous at the level of single environments.

Pieces, bottom up:

- :class:`PromptTemplate` turns env observations into token ids (mask 0); the policy's own
  tokens are kept exactly as generated (mask 1) and only *decoded* for the env, never
  re-tokenised.
- :func:`run_episode` plays one episode: generate -> env.step -> append observation tokens.
- :class:`BatchingGenerator` gathers generation requests from every running episode and
  sends them to the engine as one batch: when the batch is full, when every running episode
  is waiting (nothing more can arrive), or ``batch_wait_ms`` after the first request. With
  ``generation.continuous`` and an engine that batches continuously (``engine.submit``), each
  request goes to the engine at once instead and joins its running batch (queue scheduling).
- :class:`RolloutManager` runs groups of G (+ r redundant) episodes that share a task and a
  seed on an asyncio loop in a background thread, admits new groups under the staleness
  bound ``async_ratio`` (alpha), and hands the trainer whole groups with
  :meth:`RolloutManager.get_batch`. Infra failures, stale samples and (with dynamic sampling)
  zero-advantage groups are dropped, counted, and replaced by new groups; dynamic sampling
  gives up with :class:`ZeroAdvantageError` after ``algorithm.dynamic_sampling_max_batches``
  batches' worth of zero-advantage groups in a row, rather than sampling forever. With
  ``rollout.curriculum`` enabled, groups of a task start from states saved along one of its
  successful episodes (:mod:`.curriculum`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from rockroll.gem.core import TokenReply

from ..algorithms.stats import wilson_interval
from ..config import EnvConfig, TokenizerConfig, TrainConfig
from ..engines.sampling import GenOutput, SamplingParams
from ..envs import make_env
from ..models import allowed_token_ids
from .curriculum import Curriculum, Start, Trajectory, initialized_metrics, task_key
from .types import Group, Sample

log = logging.getLogger(__name__)

__all__ = ["PromptTemplate", "RolloutManager", "ZeroAdvantageError", "is_request", "request_ids", "run_episode",
           "filter_stale", "zero_advantage"]


class PromptTemplate:
    """Framing of observations as token ids: the first turn's prompt, and what goes between
    a reply and the next reply (the rest of the assistant turn, the observation's user turn,
    the next assistant header). Token-in/token-out: the generated reply ids are kept as they
    are and never re-rendered.

    ``tokenizer.template: chat`` renders with the tokenizer's chat template. A later turn is
    the template's rendering of ``base + [user obs]`` (generation prompt on) minus that of
    ``base`` (a fixed user/assistant exchange), after what the template writes behind
    ``stop`` at the end of an assistant turn (ChatML's newline): so the whole sequence is the
    template's own rendering of the conversation, as a chat template in any serving stack
    would give it. ``prefixes``:

    first turn:  system + user_prefix + obs + user_suffix + assistant_prefix
    later turns: [stop if the reply did not end with it] + user_prefix + obs + user_suffix + assistant_prefix
    """

    _BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]

    def __init__(self, tokenizer: Any, cfg: TokenizerConfig):
        self.tok, self.cfg = tokenizer, cfg
        self.stop = cfg.stop or tokenizer.eos_token  # empty: the model's own end of turn
        stop = tokenizer.convert_tokens_to_ids(self.stop) if self.stop else None
        if stop is None or stop == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer.stop: {self.stop!r} is not a token of the tokenizer")
        self.stop_id = int(stop)
        if cfg.template == "chat":
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("tokenizer.template: chat, but the tokenizer has no chat template "
                                 "(set tokenizer.template: prefixes and the prefix strings)")
            self._system = [{"role": "system", "content": cfg.system}] if cfg.system else []
            self._base = self.render(self._system + self._BASE, generation=False)
            if self.stop_id not in self._base:
                raise ValueError(f"tokenizer.stop: the chat template does not end an assistant turn with {self.stop!r}")
            last = len(self._base) - 1 - self._base[::-1].index(self.stop_id)
            self._after_stop = self._base[last + 1:]  # e.g. ChatML's "\n" after <|im_end|>

    def render(self, messages: list[dict], generation: bool, tools: list[dict] | None = None) -> list[int]:
        ids = self.tok.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                           add_generation_prompt=generation)
        return list(ids if isinstance(ids, list) else ids["input_ids"])  # a BatchEncoding in newer transformers

    def _enc(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def first(self, obs: str, tools: list[dict] | None = None) -> list[int]:
        """The first prompt; ``tools`` (OpenAI function schemas an env offers in its reset
        ``info["tools"]``) go to the chat template, which shows them as it was made to."""
        c = self.cfg
        if c.template == "chat":
            return self.render(self._system + [{"role": "user", "content": obs}], generation=True, tools=tools)
        if tools:
            raise ValueError("tokenizer.template: prefixes cannot show the tools the env offers "
                             "(use a tokenizer with a chat template and template: chat)")
        return self._enc(f"{c.system}{c.user_prefix}{obs}{c.user_suffix}{c.assistant_prefix}")

    def next(self, obs: str, reply_stopped: bool) -> list[int]:
        c = self.cfg
        head = [] if reply_stopped else [self.stop_id]
        if c.template == "chat":
            full = self.render(self._system + self._BASE + [{"role": "user", "content": obs}], generation=True)
            if full[: len(self._base)] != self._base:
                raise ValueError("tokenizer.template: chat, but the chat template does not render a new turn "
                                 "as a suffix of the conversation so far (use tokenizer.template: prefixes)")
            return head + self._after_stop + full[len(self._base):]
        return head + self._enc(f"{c.user_prefix}{obs}{c.user_suffix}{c.assistant_prefix}")

    def decode_reply(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)

    def request(self, info: dict[str, Any]) -> list[int]:
        """The prompt ids of an agent's model call (an agent env's observation ``info``)."""
        return request_ids(self.tok, info["kind"], info.get("messages"), info.get("tools"), info.get("prompt"))


def is_request(info: dict[str, Any]) -> bool:
    """Whether an observation is an agent's model call (``rock/Agent-v0``): the prompt is
    what the agent sent, rendered by the tokenizer, not the observation text."""
    return info.get("kind") in ("chat", "completion") and "messages" in info


def request_ids(tokenizer: Any, kind: str, messages: list[dict] | None, tools: list[dict] | None,
                prompt: str | None) -> list[int]:
    """The prompt ids of a model call: a chat call's ``messages`` (and ``tools``) through the
    tokenizer's own chat template with the generation prompt; a completion call's ``prompt``
    encoded as is. ``ValueError`` when the template cannot render the messages."""
    if kind != "chat":
        return tokenizer.encode(prompt or "", add_special_tokens=False)
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001  (jinja's errors: a message the template cannot render)
        raise ValueError(f"the model's chat template cannot render these messages: {e}") from e
    return list(ids if isinstance(ids, list) else ids["input_ids"])  # a BatchEncoding in newer transformers


def mix_seeds(*xs: int) -> int:
    """A 62-bit seed from integers (stable across processes, unlike hash())."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (int(x) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & ((1 << 62) - 1)


class BatchingGenerator:
    """Collects ``generate`` requests from many episodes into batched engine calls.

    A batch leaves when it holds ``max_batch`` requests, when every active episode is waiting
    on generation (no request can come before this batch answers), or ``wait_s`` after its
    first request. One engine call at a time, in a dedicated thread, so envs keep stepping.

    ``continuous``: no batching here; each request is ``engine.submit``-ted at once and joins
    the engine's running batch, and its answer comes back the step it is done (the engine
    orders weight loads itself, so no lock is held around it).
    """

    def __init__(self, engine: Any, sampling: SamplingParams, *, max_batch: int, wait_s: float,
                 lock: threading.Lock | None = None, continuous: bool = False):
        self.engine, self.sampling, self.continuous = engine, sampling, continuous
        self.max_batch, self.wait_s = max_batch, wait_s
        # Held around each engine call and by whoever loads new weights (RolloutManager.load_weights),
        # so the version a batch is labelled with is the one whose weights generated it.
        self.lock = lock or threading.Lock()
        self.active = 0  # episodes running (between reset and their last step)
        self._pending: list[tuple[list[int], int, asyncio.Future]] = []
        self._changed: asyncio.Event | None = None
        self._exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-gen")
        self._task: asyncio.Task | None = None
        self.calls = 0
        self.batch_sizes: list[int] = []

    def start(self) -> None:
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._exec.shutdown(wait=True, cancel_futures=True)

    def poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def generate(self, prompt: list[int], seed: int) -> tuple[GenOutput, int]:
        if self.continuous:
            self.calls += 1
            out = await asyncio.wrap_future(self.engine.submit(prompt, dataclasses.replace(self.sampling, seeds=[seed])))
            return out, out.version
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, seed, fut))
        self.poke()
        return await fut

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams) -> tuple[list[GenOutput], int]:
        with self.lock:
            outs = self.engine.generate(prompts, sampling)
            # read after the call: a remote engine reports the version that served it
            return outs, self.engine.version

    def _live(self) -> int:
        self._pending = [p for p in self._pending if not p[2].done()]
        return len(self._pending)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._live():
                self._changed.clear()
                await self._changed.wait()
            deadline = loop.time() + self.wait_s
            while self._live() < self.max_batch and self.active > 0:
                left = deadline - loop.time()
                if left <= 0:
                    break
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    break
            if not self._live():
                continue
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            sampling = dataclasses.replace(self.sampling, seeds=[s for _, s, _ in batch])
            self.calls += 1
            self.batch_sizes.append(len(batch))
            try:
                outs, version = await loop.run_in_executor(self._exec, self._generate, [p for p, _, _ in batch],
                                                           sampling)
            except Exception as e:  # noqa: BLE001  (fail the waiting episodes, keep serving)
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, _, fut), out in zip(batch, outs):
                if not fut.done():  # an output labelled by its engine (generators routed per sample) keeps it
                    fut.set_result((out, version if out.version is None else out.version))


async def _env_call(env: Any, name: str, executor, *args, **kwargs):
    async_fn = getattr(env, "a" + name, None)
    if async_fn is not None:
        return await async_fn(*args, **kwargs)
    fn = getattr(env, name)
    if executor is not None:
        return await asyncio.get_running_loop().run_in_executor(executor, lambda: fn(*args, **kwargs))
    return fn(*args, **kwargs)


async def run_episode(env: Any, template: PromptTemplate, gen: BatchingGenerator, *, seed: int,
                      task_id: Any, sample_seed: int, max_turns: int, max_seq_len: int,
                      max_new_tokens: int, executor=None, start: Start | None = None,
                      trace: list | None = None) -> Sample:
    """Play one episode token-in/token-out and return it as a :class:`Sample`.

    An agent env (``rock/Agent-v0``: each observation's ``info`` is the agent's model call,
    :func:`is_request`): every prompt is the call rendered by the tokenizer's chat template;
    a call that extends the sequence so far merges into it, one that does not (the agent
    rewrote its history) starts a new segment (docs/trainer.md, "Agent-native training").

    ``start``: resume a saved state, after the exact tokens the recorded episode had there
    (mask 0). ``trace``: a list that receives ``(env.save_state(), len(token_ids),
    len(transcript))`` before each turn, from which a :class:`Trajectory` is made.
    """
    s = Sample(task_id=task_id)
    gen.active += 1
    try:
        if start is None:
            options = {"task_id": task_id} if task_id is not None else None
        else:
            options = {"state": start.state}
        obs, info = await _env_call(env, "reset", executor, seed=seed, options=options)
        s.transcript = [["env", obs]] if start is None else [list(e) for e in start.transcript]
        if info.get("infra_error"):
            s.infra_error = str(info["infra_error"])
            return s
        if start is not None and obs != start.transcript[-1][1]:
            # the prefix's last observation is what the policy acts on: it must be the env's
            s.infra_error = "curriculum: the resumed state's observation differs from the recorded one"
            return s
        agent = is_request(info)  # an agent's model calls: token-in/token-out across its requests
        if agent:
            ids = _request(template, info, s)
            if ids is None:
                return s
        else:
            ids = template.first(obs, info.get("tools")) if start is None else start.token_ids
        s.token_ids, s.mask, s.behav_logp = list(ids), [0] * len(ids), [0.0] * len(ids)
        for turn in range(max_turns):
            if trace is not None:
                state = await _env_call(env, "save_state", executor)
                trace.append((state, len(s.token_ids), len(s.transcript)))
            gen.active -= 1  # waiting on generation counts as "not about to send a request"
            try:
                out, version = await gen.generate(s.token_ids, mix_seeds(sample_seed, turn))
            finally:
                gen.active += 1
            s.versions.append(version)
            s.token_ids += out.token_ids
            s.mask += [1] * len(out.token_ids)
            s.behav_logp += out.logprobs
            reply = template.decode_reply(out.token_ids)
            if agent:  # the model call is answered with the tokens the sample trains on
                reply = TokenReply(reply, prompt_ids=s.token_ids[:len(s.token_ids) - len(out.token_ids)],
                                   completion_ids=out.token_ids, logprobs=out.logprobs, version=version)
            s.transcript.append(["agent", str(reply)])  # the transcript holds plain text
            obs, reward, terminated, truncated, info = await _env_call(env, "step", executor, reply)
            s.transcript.append(["env", obs])
            s.num_turns += 1
            s.turn_rewards.append(float(reward))
            s.reward += float(reward)
            s.format_errors += int(bool(info.get("format_error")))
            s.success = bool(info.get("success", s.success))
            if info.get("agent_status"):
                s.agent_status = str(info["agent_status"])
                s.agent_error = str(info.get("agent_stderr", ""))[-1500:]
            if info.get("infra_error"):
                s.infra_error = str(info["infra_error"])
                break
            if terminated or truncated:
                s.truncated = bool(truncated)
                break
            if agent:
                nxt = _request(template, info, s)
                if nxt is None:
                    break
                # The call extends the conversation so far (its prompt + the reply, as generated):
                # merge, its new tokens are observation. Else the agent rewrote its history: a
                # new segment. Never merge on an empty suffix: each call stays one chunk.
                if len(nxt) > len(s.token_ids) and nxt[: len(s.token_ids)] == s.token_ids:
                    nxt = nxt[len(s.token_ids):]
                elif len(nxt) + max_new_tokens <= max_seq_len and turn < max_turns - 1:
                    s.new_segment(nxt)
                    continue
            else:
                nxt = template.next(obs, out.finish_reason == "stop")
            if len(s.token_ids) + len(nxt) + max_new_tokens > max_seq_len or turn == max_turns - 1:
                s.truncated = True
                break
            s.token_ids += nxt
            s.mask += [0] * len(nxt)
            s.behav_logp += [0.0] * len(nxt)
        s.version = min(s.versions) if s.versions else -1
        return s
    finally:
        gen.active -= 1
        gen.poke()


def _request(template: PromptTemplate, info: dict[str, Any], s: Sample) -> list[int] | None:
    """An agent call's prompt ids, or None with ``s.infra_error`` set: a request the chat
    template cannot render is the agent's fault, not the policy's; the episode is dropped."""
    try:
        return template.request(info)
    except ValueError as e:
        s.infra_error = f"agent request: {e}"
        return None


def filter_stale(groups: list[Group], step: int, alpha: int) -> tuple[list[Group], list[Group]]:
    """Split groups into (fresh, stale): a group started at version v is usable at step t
    iff t - v <= alpha."""
    fresh = [g for g in groups if step - g.version <= alpha]
    stale = [g for g in groups if step - g.version > alpha]
    return fresh, stale


def zero_advantage(samples: list[Sample], turn_credit: str = "outcome") -> bool:
    """Whether a group gives every token a zero group-normalised advantage: its episodes all
    earned the same summed reward, or, with ``turn_credit="discounted"``, the same reward after
    every turn. (Equal sums are not enough there: rewards [0.5, 0] and [0, 0.5] have the same
    sum but different returns-to-go, hence non-zero per-turn advantages.) Rewards are compared
    rounded to 1e-9, against float noise."""
    per_turn = turn_credit == "discounted"
    return len({tuple(round(r, 9) for r in s.turn_rewards) if per_turn else round(s.reward, 9)
                for s in samples}) == 1


class RolloutError(RuntimeError):
    """The rollout thread failed; the message names why (its ``__cause__`` is the error)."""


class InfraErrorStreak(RuntimeError):
    """``rollout.infra_error_streak`` episodes in a row were dropped for infrastructure errors
    (none valid in between): the env cannot run here, and retrying would never fill a batch."""


class ZeroAdvantageError(RuntimeError):
    """Dynamic sampling dropped ``algorithm.dynamic_sampling_max_batches`` x ``batch_groups``
    groups in a row, every one with zero advantage: the policy earns the same in every episode
    (it has collapsed, or solved the task), and more sampling would never fill a batch."""


class RolloutManager:
    """Produces GRPO groups in the background; the trainer takes them with :meth:`get_batch`.

    Admission (the staleness bound): a new group may start while
        started < (version + alpha + 1) * batch_groups + replaced
    where ``replaced`` counts groups dropped (stale, zero-advantage, too few valid samples).
    With alpha = 0 the rollout of step t only starts once weights of version t are loaded:
    synchronous RL. With alpha > 0 it runs up to alpha steps ahead of the trainer.
    """

    def __init__(self, cfg: TrainConfig, engine: Any, template: PromptTemplate, *,
                 env_factory: Callable[[EnvConfig], Any] | None = None, reward: Any = None,
                 call_records: str | Path | None = None):
        self.cfg, self.engine, self.template = cfg, engine, template
        self.call_records = call_records  # where an agent env's model calls are recorded (a training run's)
        r = cfg.rollout
        self.G, self.r, self.alpha, self.bg = r.group_size, r.redundant, r.async_ratio, r.batch_groups
        # spare groups: started beyond what a step needs; a step trains on the first to finish
        # ("first") or on a random batch_groups of them once all are in ("quorum", no length bias)
        self.spare, self.quorum = r.spare_groups, r.spare_selection == "quorum"
        self.max_groups = r.max_concurrent_groups or self.bg * (self.alpha + 1) + self.spare
        self._pick_rng = random.Random(mix_seeds(cfg.seed, 0x5BA7E))  # quorum's pick; self.rng draws tasks
        self.finished = [0, 0.0, 0.0]  # groups finished (trained or not), sums of their mean turns and reward
        fp = cfg.algorithm.format_penalty
        self.env_factory = env_factory or (lambda spec: make_env(spec, fp))
        self.sampling = SamplingParams(temperature=cfg.generation.temperature, top_p=cfg.generation.top_p,
                                       top_k=cfg.generation.top_k, min_p=cfg.generation.min_p,
                                       repetition_penalty=cfg.generation.repetition_penalty,
                                       max_new_tokens=cfg.generation.max_new_tokens,
                                       stop_token_ids=[template.stop_id],
                                       allowed_token_ids=allowed_token_ids(template.tok, cfg.generation.allowed_tokens))
        self.rng = random.Random(cfg.seed)
        # verifiers and the judge score each episode as it finishes: in this process, or
        # ``reward`` (a reward.RemoteReward: the role in a Ray actor)
        if reward is None and cfg.reward.active:  # (reward.py builds on this module, not the other way)
            raise ValueError("reward: this config scores episodes with a reward role: pass "
                             "reward=RewardRole(cfg, tokenizer) (rockroll.trainer.reward), as EnvWorker does")
        self.reward = reward
        cur = r.curriculum
        self.curriculum = Curriculum(cur.promote_at, cur.window) if cur.enabled else None
        self.version = 0
        self.started = 0
        self.replaced = 0
        self.zero_adv_streak = 0  # groups dropped by dynamic sampling since the last group kept
        self.infra_streak: list[str] = []  # errors of the episodes dropped since the last valid one
        self.next_gid = 0
        self.in_flight = 0
        self.paused = False
        self.ready: list[Group] = []
        self.counters: dict[str, int] = defaultdict(int)
        self.counters.update(infra_samples_dropped=0, agent_crashes=0)  # in every step's metrics, 0 or not
        self._reported: dict[str, int] = {}
        self._cond = threading.Condition()
        self._engine_lock = threading.Lock()  # engine calls vs weight loads, see BatchingGenerator
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._stop = False
        self._env_exec = (concurrent.futures.ThreadPoolExecutor(r.env_threads, thread_name_prefix="rockroll-env")
                          if r.env_threads else None)

    # ------------------------------------------------------------------ trainer side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="rockroll-rollout", daemon=True)
        started = threading.Event()
        self._started_evt = started
        self._thread.start()
        started.wait()

    def close(self) -> None:
        self._stop = True
        self._notify()
        if self._thread:
            self._thread.join(timeout=30)
        if self._env_exec:
            self._env_exec.shutdown(wait=False, cancel_futures=True)

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load ``version``'s weights into the engine between two generate calls (so every batch
        is labelled with the version that generated it), then :meth:`set_version`."""
        with self._engine_lock:
            self.engine.load_weights(state_dict, version)
        self.set_version(version)

    def set_version(self, version: int) -> None:
        """The generator now holds weights of ``version``: admit the groups it allows."""
        with self._cond:
            self.version = version
        self._notify()

    def get_batch(self, step: int, timeout: float | None = None) -> tuple[list[Group], dict[str, float]]:
        """Block until ``batch_groups`` fresh groups are ready; return them and rollout metrics."""
        deadline = None if timeout is None else time.monotonic() + timeout
        batch: list[Group] = []
        with self._cond:
            while True:
                if self._error:
                    raise RolloutError(f"rollout failed: {self._error}") from self._error
                if self.ready:
                    fresh, stale = filter_stale(self.ready, step, self.alpha)
                    self.ready = []
                    for g in stale:
                        self.counters["stale_samples_dropped"] += len(g.samples)
                        self.counters["stale_groups_dropped"] += 1
                        self.replaced += 1
                    take = self.bg - len(batch)
                    picked = self._quorum_pick(fresh, take) if self.quorum else fresh[:take]
                    batch += picked
                    self.ready = [g for g in fresh if all(g is not p for p in picked)]
                    if stale:
                        self._notify()
                if len(batch) >= self.bg:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rollout: {len(batch)}/{self.bg} groups after {timeout}s")
                self._cond.wait(timeout=left if left is not None else 1.0)
        # counters since the previous batch (events between batches belong to the next one)
        with self._cond:
            now = dict(self.counters)
        metrics = {f"rollout/{k}": float(v - self._reported.get(k, 0)) for k, v in now.items()}
        self._reported = now
        metrics.update(batch_metrics(batch, step))
        with self._cond:  # every finished group's means: the trained ones' bias shows against them
            n, turns, reward = self.finished
        if n:
            metrics.update({"rollout/finished_turns": turns / n, "rollout/finished_reward": reward / n})
        if self.curriculum is not None:
            with self._cond:
                metrics.update(self.curriculum.metrics())
            metrics.update(initialized_metrics(batch))
        return batch, metrics

    def _quorum_pick(self, fresh: list[Group], take: int) -> list[Group]:
        """``rollout.spare_selection: quorum``: ``take`` groups chosen at random among the first
        ``take + spare_groups`` started, once they have all finished (or nothing else is
        running): which groups train then does not depend on how long their episodes took.
        Too few in yet: none (get_batch waits)."""
        pool = sorted(fresh, key=lambda g: g.group_id)[: take + self.spare]
        if not take or len(pool) < take or (len(pool) < take + self.spare and self.in_flight):
            return []
        return [pool[i] for i in sorted(self._pick_rng.sample(range(len(pool)), take))]

    def pause(self) -> None:
        """Start no new group and wait for the running ones to finish (for a checkpoint)."""
        with self._cond:
            self.paused = True
            while self.in_flight and not self._error:
                self._cond.wait(timeout=1.0)

    def resume(self) -> None:
        with self._cond:
            self.paused = False
        self._notify()

    def state_dict(self) -> dict[str, Any]:
        with self._cond:
            return {"ready": [dataclasses.asdict(g) for g in self.ready], "rng": self.rng.getstate(),
                    "started": self.started, "replaced": self.replaced, "next_gid": self.next_gid,
                    "counters": dict(self.counters), "reported": dict(self._reported), "version": self.version,
                    "curriculum": self.curriculum.state_dict() if self.curriculum else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self.ready = [Group(**{**g, "samples": [Sample(**s) for s in g["samples"]]}) for g in state["ready"]]
            self.rng.setstate(state["rng"])
            self.started, self.replaced, self.next_gid = state["started"], state["replaced"], state["next_gid"]
            self.counters = defaultdict(int, state["counters"])
            self._reported = dict(state.get("reported", state["counters"]))
            self.version = state["version"]
            if self.curriculum is not None and state.get("curriculum"):
                self.curriculum.load_state_dict(state["curriculum"])
        self._notify()

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        """Play ``episodes`` fresh episodes per env with the generator's current weights and
        return ``eval/...`` metrics (per env too when there are several).

        Every episode starts at its task's first observation (never at a curriculum state),
        tasks cycle through ``eval.task_ids`` (held-out) or else the env's ``task_ids``, and the env and sampling seeds come from
        ``seed`` alone: evaluations at different steps play the same episodes, so their success
        rates compare. Training rollouts keep running meanwhile and share the generator's
        batches; the reward role scores them as it scores training episodes; episodes that hit
        an infrastructure error (the judge's included) are left out and counted."""
        if self._loop is None:
            raise RuntimeError("evaluate() needs a started RolloutManager")
        return asyncio.run_coroutine_threadsafe(self._evaluate(episodes, seed), self._loop).result()

    async def _evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        cfg = self.cfg

        async def episode(spec: EnvConfig, j: int, gen: BatchingGenerator) -> Sample:
            env = self._make_env(spec)
            tasks = cfg.eval.task_ids or spec.task_ids
            try:
                task = tasks[j % len(tasks)] if tasks else None
                s = await run_episode(
                    env, self.template, gen, seed=mix_seeds(seed, j), task_id=task, sample_seed=mix_seeds(seed + 1, j),
                    max_turns=cfg.rollout.max_turns, max_seq_len=cfg.rollout.max_seq_len,
                    max_new_tokens=cfg.generation.max_new_tokens, executor=self._env_exec)
                s.env_id = spec.id
                if self.reward is not None:  # eval rewards mean what training rewards mean
                    await self.reward.ascore(s)
                return s
            finally:
                env.close()

        gen = self.gen
        if cfg.eval.temperature is not None:  # its own batches, on the same engine and lock
            r = cfg.rollout
            gen = BatchingGenerator(self.engine, dataclasses.replace(self.sampling, temperature=cfg.eval.temperature),
                                    max_batch=r.max_batch_size, wait_s=r.batch_wait_ms / 1000, lock=self._engine_lock,
                                    continuous=self._continuous())
            gen.start()
        try:
            done = await asyncio.gather(*(episode(spec, j, gen) for spec in cfg.envs for j in range(episodes)))
        finally:
            if gen is not self.gen:
                await gen.aclose()
        valid = [s for s in done if not s.infra_error]
        for s in done:
            if s.infra_error:
                log.warning("eval %s task %r: episode left out, infrastructure error: %s", s.env_id, s.task_id,
                            s.infra_error)
        out = {**(eval_means(valid, "eval") if valid else {"eval/episodes": 0.0}),
               "eval/infra_errors": float(len(done) - len(valid)), "eval/seed": float(seed)}
        if len(cfg.envs) > 1:
            for spec in cfg.envs:
                out.update(eval_means([s for s in valid if s.env_id == spec.id], f"eval/{spec.id}"))
        return out

    # ------------------------------------------------------------------ rollout thread
    def _notify(self) -> None:
        if self._loop is not None and self._wake is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop is closed: the rollout thread has ended, none to wake
                pass

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001
            self._error = e
            with self._cond:
                self._cond.notify_all()
        finally:
            loop.close()

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        r = self.cfg.rollout
        self.gen = BatchingGenerator(self.engine, self.sampling, max_batch=r.max_batch_size,
                                     wait_s=r.batch_wait_ms / 1000, lock=self._engine_lock,
                                     continuous=self._continuous())
        self.gen.start()
        self._started_evt.set()
        tasks: set[asyncio.Task] = set()
        try:
            while not self._stop:
                while self._can_start():
                    t = asyncio.get_running_loop().create_task(self._guard(self._run_group(**self._next_group())))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                self._wake.clear()
                await self._wake.wait()
                if self._error:
                    raise self._error
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.gen.aclose()
            if self.reward is not None:
                await self.reward.aclose()

    def _continuous(self) -> bool:
        """Requests go to the engine one by one into its running batch (``generation.continuous``
        and an engine with ``submit``), except under ``deterministic: true``: which requests
        share a step then depends on timing, and batched kernels round differently per batch,
        so a rerun would differ in the last bits; blocking calls keep batches reproducible."""
        return self.cfg.generation.continuous and not self.cfg.deterministic and hasattr(self.engine, "submit")

    async def _guard(self, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001  (surface in get_batch, not in a lost task)
            self._error = e
            with self._cond:
                self._cond.notify_all()
            self._wake.set()

    def _can_start(self) -> bool:
        with self._cond:
            allowed = (self.version + self.alpha + 1) * self.bg + self.replaced + self.spare
            return (not self.paused and self.in_flight < self.max_groups and self.started < allowed)

    def _next_group(self) -> dict[str, Any]:
        with self._cond:
            envs = self.cfg.envs
            spec = self.rng.choices(envs, weights=[e.weight for e in envs])[0] if len(envs) > 1 else envs[0]
            task = self.rng.choice(spec.task_ids) if spec.task_ids else None
            seed = self.rng.randrange(2**31)
            gid = self.next_gid
            self.next_gid += 1
            self.started += 1
            self.in_flight += 1
            level, start, trace = 0, None, False
            if self.curriculum is not None and task is not None:
                key = task_key(spec.id, task)
                level, start = self.curriculum.start(key)
                trace = self.curriculum.tracing(key)
        return {"gid": gid, "spec": spec, "task": task, "seed": seed, "level": level, "start": start,
                "trace": trace}

    async def _run_group(self, gid: int, spec: EnvConfig, task: Any, seed: int, level: int = 0,
                         start: Start | None = None, trace: bool = False) -> None:
        cfg = self.cfg

        async def episode(i: int, env: Any) -> tuple[Sample, list | None]:
            turns = [] if trace else None
            s = await run_episode(
                env, self.template, self.gen, seed=seed, task_id=task, sample_seed=mix_seeds(cfg.seed, gid, i),
                max_turns=cfg.rollout.max_turns, max_seq_len=cfg.rollout.max_seq_len,
                max_new_tokens=cfg.generation.max_new_tokens, executor=self._env_exec, start=start, trace=turns)
            s.env_id = spec.id
            if self.reward is not None and not s.infra_error:  # while the group's other episodes play on
                await self.reward.ascore(s)
                self.counters["reward_infra_errors"] += int(bool(s.infra_error))
            return s, turns

        envs = [self._make_env(spec) for _ in range(self.G + self.r)]
        tasks = [asyncio.get_running_loop().create_task(episode(i, env)) for i, env in enumerate(envs)]
        valid: list[Sample] = []
        try:
            for fut in asyncio.as_completed(tasks):
                s, turns = await fut
                if s.infra_error:
                    self.counters["infra_samples_dropped"] += 1
                    log.warning("%s task %r: episode dropped, infrastructure error: %s", spec.id, task, s.infra_error)
                    self._infra_dropped(spec, task, s.infra_error)
                    continue
                self.infra_streak.clear()
                if s.agent_status == "crashed":  # the policy's outcome (reward 0), but a person wants to know
                    self.counters["agent_crashes"] += 1
                    log.warning("%s task %r: the agent crashed: %s", spec.id, task, s.agent_error)
                if turns and s.success:  # copies: the sample goes on to the trainer
                    traj = Trajectory(list(s.token_ids), [list(e) for e in s.transcript], turns)
                    with self._cond:
                        self.curriculum.record(task_key(spec.id, task), traj)
                s.env_id, s.group_id = spec.id, gid
                valid.append(s)
                if len(valid) == self.G:
                    break
        finally:
            cancelled = 0
            for t in tasks:
                if not t.done():
                    t.cancel()
                    cancelled += 1
            await asyncio.gather(*tasks, return_exceptions=True)
            for env in envs:
                try:
                    env.close()
                except Exception:  # noqa: BLE001
                    pass
            self.gen.poke()
        self.counters["redundant_cancelled"] += cancelled
        if level and valid:  # before dynamic sampling: an all-success group is what moves the level
            success = sum(s.success for s in valid) / len(valid)
            with self._cond:
                moved = self.curriculum.observe(task_key(spec.id, task), level, success)
            self.counters["curriculum_promotions"] += int(moved)
        keep = len(valid) >= min(self.G, 2)
        a = cfg.algorithm
        zero_adv = keep and a.dynamic_sampling and zero_advantage(valid, a.turn_credit)
        if zero_adv:
            self.counters["zero_adv_groups_dropped"] += 1
            keep = False
        elif not keep:
            self.counters["groups_too_few_valid"] += 1
        with self._cond:
            self.in_flight -= 1
            if keep:
                self.ready.append(Group(gid, spec.id, task, seed, valid, start_level=level))
                self.counters["groups_done"] += 1
                self.finished[0] += 1
                self.finished[1] += sum(s.num_turns for s in valid) / len(valid)
                self.finished[2] += sum(s.reward for s in valid) / len(valid)
                self.zero_adv_streak = 0
            else:
                self.replaced += 1
                self.zero_adv_streak += zero_adv
            streak = self.zero_adv_streak
            self._cond.notify_all()
        self._wake.set()
        limit = a.dynamic_sampling_max_batches * self.bg
        if streak >= limit:  # surfaces in get_batch, which would otherwise wait forever
            raise ZeroAdvantageError(
                f"dynamic sampling dropped {streak} groups in a row, each with zero advantage (every "
                f"episode of a group earned the same reward): the policy has collapsed or solved the "
                f"task. Raise algorithm.dynamic_sampling_max_batches ({a.dynamic_sampling_max_batches}) "
                f"or set algorithm.dynamic_sampling: false")


    def _make_env(self, spec: EnvConfig) -> Any:
        """An env for ``spec``; one that answers model calls (an agent env) records them in
        ``call_records`` (a training run's: ``<logging.dir>/model_calls.jsonl``)."""
        env = self.env_factory(spec)
        if self.call_records is not None and hasattr(env, "record_calls"):
            env.record_calls(self.call_records)
        return env

    def _infra_dropped(self, spec: EnvConfig, task: Any, error: str) -> None:
        """Count an episode dropped for an infrastructure error; fail the rollout once
        ``rollout.infra_error_streak`` were dropped in a row (a run must never retry forever)."""
        self.infra_streak.append(f"{spec.id} task {task!r}: {error}")
        r = self.cfg.rollout
        limit = r.infra_error_streak or 2 * (self.G + self.r) * self.bg
        if len(self.infra_streak) >= limit:
            first, last = self.infra_streak[0], self.infra_streak[-1]
            raise InfraErrorStreak(
                f"{len(self.infra_streak)} episodes in a row were dropped for infrastructure errors, none valid "
                f"in between (rollout.infra_error_streak: {limit}); the env cannot run as configured. "
                f"First: {first[:1500]}" + (f" | last: {last[:1500]}" if last != first else ""))


def batch_metrics(groups: list[Group], step: int) -> dict[str, float]:
    """Reward / success / length / staleness of a batch, overall and per env id."""
    out: dict[str, float] = {}
    by_env: dict[str, list[Sample]] = defaultdict(list)
    for g in groups:
        by_env["all"].extend(g.samples)
        if len({g.env_id for g in groups}) > 1:
            by_env[g.env_id].extend(g.samples)
    for env_id, ss in by_env.items():
        out.update(sample_means(ss, "rollout" if env_id == "all" else f"env/{env_id}"))
    ss = by_env["all"]
    if ss:
        out["rollout/samples"] = float(len(ss))
        out["rollout/response_tokens"] = sum(sum(s.mask) for s in ss) / len(ss)
        out["rollout/seq_len"] = sum(len(s.token_ids) for s in ss) / len(ss)
        out["rollout/staleness_max"] = float(max(step - s.version for s in ss))
        for part in sorted({k for s in ss for k in s.reward_parts}):  # the reward role's, by source
            out[f"reward/{part}"] = sum(s.reward_parts.get(part, 0.0) for s in ss) / len(ss)
    return out


def eval_means(samples: list[Sample], prefix: str) -> dict[str, float]:
    """:func:`sample_means` with the episode count and the success rate's 95 % Wilson
    interval (``prefix/success_lo``, ``prefix/success_hi``)."""
    lo, hi = wilson_interval(sum(float(s.success) for s in samples), len(samples))
    return {**sample_means(samples, prefix), f"{prefix}/episodes": float(len(samples)),
            f"{prefix}/success_lo": lo, f"{prefix}/success_hi": hi}


def sample_means(samples: list[Sample], prefix: str) -> dict[str, float]:
    """Mean reward, success, turns and format errors of some samples, as ``prefix/<name>``."""
    n = max(len(samples), 1)
    return {f"{prefix}/reward": sum(s.reward for s in samples) / n,
            f"{prefix}/success": sum(s.success for s in samples) / n,
            f"{prefix}/turns": sum(s.num_turns for s in samples) / n,
            f"{prefix}/format_errors": sum(s.format_errors for s in samples) / n}
