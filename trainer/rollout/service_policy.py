"""The trainer's policy behind the model service (policy mode): agents in sandboxes call an
OpenAI endpoint and the policy being trained answers.

:class:`EnginePolicy` implements ``rockroll.sandbox.modelservice.Policy`` over a generation
engine (:mod:`rockroll.trainer.engines`: Transformers, vLLM, or a Ray generator) and the
tokenizer: a chat call's prompt is the tokenizer's own chat template over the call's
``messages`` and ``tools``; a completion call's prompt is its text, encoded. Each answer keeps
the exact ids the engine generated, their behaviour log-probs and the weights' version,
which the service records per call.

    svc = ModelService(PolicyMode(EnginePolicy(engine, tokenizer, stop_id=template.stop_id)))
"""

from __future__ import annotations

import asyncio
from typing import Any

from rockroll.sandbox.modelservice import ModeError, Sample

from ..engines.sampling import SamplingParams
from .manager import request_ids

DEFAULT_MAX_TOKENS = 256


class EnginePolicy:
    """``Policy`` over ``engine`` and ``tokenizer``. ``stop_id``: the end-of-turn token (a
    reply that generates it finishes with ``"stop"``); ``max_tokens``: the default and the
    cap of a call's ``max_tokens``; ``temperature``: the default when a call gives none
    (0: greedy); ``allowed_token_ids``: constrained decoding, as ``generation.allowed_tokens``."""

    def __init__(self, engine: Any, tokenizer: Any, *, stop_id: int, max_tokens: int = DEFAULT_MAX_TOKENS,
                 temperature: float = 1.0, top_p: float = 1.0, allowed_token_ids: list[int] | None = None,
                 top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0):
        self.engine, self.tok, self.stop_id = engine, tokenizer, int(stop_id)
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        # top_k, min_p, repetition_penalty: generation's (no OpenAI field)
        self.allowed_token_ids, self.top_k, self.min_p = allowed_token_ids, top_k, min_p
        self.repetition_penalty = repetition_penalty

    def prompt_ids(self, call) -> list[int]:
        try:
            return request_ids(self.tok, call.kind, call.messages, call.tools, call.prompt)
        except ValueError as e:  # a message the template cannot render is the caller's error
            raise ModeError(400, str(e), code="invalid_messages", param="messages") from e

    async def sample(self, prompt_ids: list[int], sampling) -> list[Sample]:
        want = sampling.max_tokens if sampling.max_tokens is not None else self.max_tokens
        if want > self.max_tokens:
            raise ModeError(400, f"max_tokens must be <= {self.max_tokens}, not {want}", code="invalid_value",
                            param="max_tokens")
        temperature = self.temperature if sampling.temperature is None else sampling.temperature
        seeds = None if sampling.seed is None else [sampling.seed + i for i in range(sampling.n)]
        params = SamplingParams(temperature=temperature, top_p=self.top_p if sampling.top_p is None else sampling.top_p,
                                top_k=self.top_k, min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                                max_new_tokens=want, stop_token_ids=[self.stop_id], seeds=seeds,
                                allowed_token_ids=self.allowed_token_ids)
        outs = await asyncio.to_thread(self.engine.generate, [list(prompt_ids)] * sampling.n, params)
        version = self.engine.version
        return [self._stop_at_strings(Sample(list(o.token_ids), list(o.logprobs), o.finish_reason, version),
                                      sampling.stop) for o in outs]

    def _stop_at_strings(self, s: Sample, stops) -> Sample:
        """Cut a completion before the first token whose text completes a ``stop`` string, so
        the text holds no stop sequence (OpenAI's rule) and the ids stay a prefix of those
        generated: never re-tokenised text."""
        if not stops or s.finish_reason == "stop":
            return s
        for k in range(1, len(s.completion_ids) + 1):
            if any(stop in self.decode(s.completion_ids[:k]) for stop in stops):
                return Sample(s.completion_ids[:k - 1], s.logprobs[:k - 1], "stop", s.version)
        return s

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)
