"""The reward role: rule-based verifiers and an LLM-as-judge, run on each finished episode.

The env's own reward stays; each configured verifier's and the judge's weighted score is
added to it (on the episode's last turn, so ``reward == sum(turn_rewards)`` still holds) and
recorded in ``Sample.reward_parts``. Configured by the ``reward:`` section
(:class:`~rockroll.trainer.config.RewardConfig`); docs/trainer.md, "Rewards: verifiers and LLM-as-judge".

- A **verifier** is a function ``fn(question, answer, transcript, **kwargs) -> float``
  (``module:function``), run in a thread.
- The **judge** fills a prompt template with the episode, asks a model, and parses a score
  out of its reply. Its backend is any OpenAI-compatible endpoint, called through the model
  service's proxy mode (retries on 429/5xx with back-off), or a local Transformers engine
  over a checkpoint folder whose requests are batched (:class:`~.manager.BatchingGenerator`:
  requests that arrive while the engine is busy go together in its next call).
- Asynchronous: :meth:`RewardRole.ascore` runs in the rollout's event loop as each episode
  finishes, up to ``judge.max_concurrency`` judge calls in flight, while other episodes play;
  or in a Ray actor of its own, which the rollout calls through :class:`RemoteReward`.
- A failure (a verifier's exception, a judge timeout, an HTTP error, a reply without a score
  in range) is an **infra error** (``Sample.infra_error``): the rollout drops the episode and
  counts it, as it does for env failures, instead of training on a fake zero reward.

:class:`RewardRole` is built from ``(cfg, tokenizer)`` and its methods take and return plain
:class:`~.types.Sample` dataclasses, so a Ray actor can wrap it as it is.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import threading
from collections import defaultdict
from typing import Any, Callable

from ..config import ConfigError, JudgeConfig, TrainConfig
from ..engines.sampling import SamplingParams
from .manager import BatchingGenerator, mix_seeds, request_ids
from .types import Sample

__all__ = ["RemoteReward", "RewardRole", "episode_fields", "parse_score"]


def episode_fields(s: Sample) -> dict[str, Any]:
    """What a judge template and a verifier see of an episode: the first observation
    (``question``), the last reply (``answer``), the whole ``transcript`` as text, the env,
    the task, and the env's reward."""
    first = next((text for role, text in s.transcript if role == "env"), "")
    last = next((text for role, text in reversed(s.transcript) if role == "agent"), "")
    transcript = "\n".join(f"{role}: {text}" for role, text in s.transcript)
    return {"question": first, "answer": last, "transcript": transcript, "env_id": s.env_id,
            "task_id": s.task_id, "reward": s.reward}


def parse_score(text: str, pattern: str, low: float, high: float) -> float | None:
    """The first match of ``pattern`` (its first group) in ``text`` mapped from [low, high]
    to [0, 1]; None when there is none, or it lies outside the range."""
    m = re.search(pattern, text)
    if m is None:
        return None
    try:
        value = float(m.group(1))
    except (TypeError, ValueError):
        return None
    if not low <= value <= high:
        return None
    return (value - low) / (high - low)


def _resolve(fn: str, key: str) -> Callable:
    module, _, name = fn.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(key, f"cannot import {fn}: {e}") from None


class _ProxyJudge:
    """An OpenAI-compatible endpoint, through the model service's ``ProxyMode``."""

    def __init__(self, j: JudgeConfig):
        from rockroll.sandbox.modelservice import ProxyMode

        self.j = j
        self.mode = ProxyMode(j.url, api_key=os.environ.get(j.api_key_env), model=j.model or None,
                              retries=j.retries, timeout_s=j.timeout_s)

    async def ask(self, messages: list[dict], seed: int) -> str:
        from rockroll.sandbox.modelservice import Call, Caller, Sampling

        j = self.j
        body = {"model": j.model or "judge", "messages": messages, "max_tokens": j.max_tokens,
                "temperature": j.temperature, "seed": seed % 2**31}
        call = Call(kind="chat", model=body["model"], caller=Caller("rockroll-judge", "judge"), index=0,
                    sampling=Sampling(max_tokens=j.max_tokens, temperature=j.temperature), messages=messages,
                    request=body)
        answer = await self.mode.generate(call)  # ModeError after the retries
        if not answer.choices:
            raise ValueError("the judge answered no choice")
        return answer.choices[0].text

    async def aclose(self) -> None:
        await self.mode.aclose()


class _LocalJudge:
    """A Transformers engine over the checkpoint folder ``judge.model`` (its own tokenizer and
    chat template), requests batched across episodes."""

    def __init__(self, j: JudgeConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..engines.generation import TransformersEngine
        from ..models import allowed_token_ids

        self.j = j
        self.tok = AutoTokenizer.from_pretrained(j.model)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        self.engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(j.model), pad)
        try:
            allowed = allowed_token_ids(self.tok, j.allowed_tokens)
        except ConfigError as e:
            raise ConfigError("reward.judge.allowed_tokens", str(e).split(": ", 1)[-1]) from None
        stop = [] if self.tok.eos_token_id is None else [self.tok.eos_token_id]
        self.sampling = SamplingParams(temperature=j.temperature, max_new_tokens=j.max_tokens, stop_token_ids=stop,
                                       allowed_token_ids=allowed)
        self.gen: BatchingGenerator | None = None

    async def ask(self, messages: list[dict], seed: int) -> str:
        if self.gen is None:  # in the loop that asks: the batcher's worker task lives there
            # wait_s 0: a request goes as soon as the engine is free; those that arrive while it
            # is busy go together in its next call
            self.gen = BatchingGenerator(self.engine, self.sampling, max_batch=self.j.max_batch_size, wait_s=0.0)
            self.gen.start()
        ids = request_ids(self.tok, "chat", messages, None, None)
        out, _ = await self.gen.generate(ids, seed)
        return self.tok.decode(out.token_ids, skip_special_tokens=True)

    async def aclose(self) -> None:
        if self.gen is not None:
            await self.gen.aclose()


JUDGES = {"openai": _ProxyJudge, "local": _LocalJudge}


class RewardRole:
    """Verifiers and the judge of ``cfg.reward`` over finished episodes (see the module doc).

    One instance is used from one event loop (:meth:`ascore`: the rollout's, or a Ray async
    actor's, :class:`RemoteReward`) or synchronously (:meth:`score_batch`, which runs its own
    loop in a thread)."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any = None):
        self.cfg = cfg.reward
        self.verifiers = [(v.name or v.fn.partition(":")[2], _resolve(v.fn, f"reward.verifiers[{i}].fn"), v)
                          for i, v in enumerate(self.cfg.verifiers)]
        j = self.cfg.judge
        self.judge = JUDGES[j.backend](j) if j.backend else None
        self.seed = cfg.seed
        self.counters: dict[str, int] = defaultdict(int)
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # score_batch's
        self._loop_lock = threading.Lock()  # score_batch may be called from several threads
        self._calls = 0

    async def ascore(self, s: Sample) -> Sample:
        """Score a finished episode in place (and return it): add the weighted verifier and
        judge scores to its reward, or set its ``infra_error``. An episode that already has
        one is left as it is."""
        if s.infra_error:
            return s
        self.counters["episodes_scored"] += 1
        fields = episode_fields(s)
        parts: dict[str, float] = {}
        for name, fn, v in self.verifiers:
            try:
                value = await asyncio.to_thread(fn, fields["question"], fields["answer"], s.transcript, **v.kwargs)
                parts[name] = v.weight * float(value)
            except Exception as e:  # noqa: BLE001  (a broken verifier must not become reward 0)
                self.counters["verifier_errors"] += 1
                s.infra_error = f"reward: verifier {name} failed: {e!r}"
                return s
        if self.judge is not None:
            score, error = await self._judge(fields)
            if error:
                self.counters["judge_errors"] += 1
                s.infra_error = f"reward: judge {error}"
                return s
            parts["judge"] = self.cfg.judge.weight * score
        extra = sum(parts.values())
        s.reward_parts.update(parts)
        s.reward += extra
        if s.turn_rewards:
            s.turn_rewards[-1] += extra
        else:
            s.turn_rewards.append(extra)
        return s

    async def _judge(self, fields: dict[str, Any]) -> tuple[float, str | None]:
        j = self.cfg.judge
        messages = ([{"role": "system", "content": j.system}] if j.system else []) + \
            [{"role": "user", "content": j.template.format(**fields)}]
        if self._sem is None:
            self._sem = asyncio.Semaphore(j.max_concurrency)
        self._calls += 1
        seed = mix_seeds(self.seed, self._calls)
        async with self._sem:
            self.counters["judge_calls"] += 1
            try:
                reply = await asyncio.wait_for(self.judge.ask(messages, seed), j.timeout_s)
            except asyncio.TimeoutError:
                return 0.0, f"timed out after {j.timeout_s}s"
            except Exception as e:  # noqa: BLE001  (HTTP errors after the retries, a broken engine)
                return 0.0, f"call failed: {e}"
        score = parse_score(reply, j.score_regex, *j.score_range)
        if score is None:
            return 0.0, f"reply has no score in {j.score_range} (score_regex {j.score_regex!r}): {reply[:200]!r}"
        return score, None

    def score_batch(self, samples: list[Sample]) -> list[Sample]:
        """:meth:`ascore` on every sample concurrently, from synchronous code: samples in,
        scored samples out."""
        with self._loop_lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="rockroll-reward", daemon=True).start()

        async def all_() -> list[Sample]:
            return list(await asyncio.gather(*(self.ascore(s) for s in samples)))

        return asyncio.run_coroutine_threadsafe(all_(), self._loop).result()

    async def aclose(self) -> None:
        if self.judge is not None:
            await self.judge.aclose()

    def close(self) -> None:
        """Release the judge (and :meth:`score_batch`'s loop); idempotent."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


class RemoteReward:
    """The rollout's side of a :class:`RewardRole` in a Ray actor, in place of an in-process one
    (``RolloutManager(..., reward=RemoteReward(handle))``): one actor can serve every env
    worker (one local judge model instead of one per worker). ``RewardRole`` has ``async``
    methods, so Ray makes it an async actor: the episodes' :meth:`RewardRole.ascore` calls run
    concurrently on its event loop, as they do in the rollout's::

        handle = ray.remote(RewardRole).remote(cfg, tokenizer)
    """

    def __init__(self, handle: Any):
        self.handle = handle

    async def ascore(self, s: Sample) -> Sample:
        scored = await self.handle.ascore.remote(s)  # the sample travels by value
        s.__dict__.update(scored.__dict__)  # in place, as RewardRole.ascore
        return s

    async def aclose(self) -> None:
        pass  # the actor is its owner's to end
