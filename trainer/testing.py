"""Helpers for tests and benchmarks of the trainer: a scripted generation engine.

``ScriptEngine`` answers every prompt with the token ids of a word chosen from the request's
seed (``words[seed % len(words)]``) followed by the stop token, with fixed log-probs, and can
simulate a batched accelerator: each call sleeps ``call_s + per_prompt_s * batch``. It also
records every call, so tests can check that samples hold exactly the generated ids.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .engines import GenOutput, SamplingParams


class ScriptEngine:
    def __init__(self, tokenizer: Any, words: list[str], *, stop_id: int, call_s: float = 0.0,
                 per_prompt_s: float = 0.0, logprob: float = -0.5):
        self.tok, self.words, self.stop_id = tokenizer, words, stop_id
        self.call_s, self.per_prompt_s, self.logprob = call_s, per_prompt_s, logprob
        self.version = 0
        self.calls: list[tuple[list[list[int]], list[GenOutput]]] = []
        self._lock = threading.Lock()

    def _word_ids(self, word: str) -> list[int]:
        if self.tok is None:
            return [ord(c) for c in word]
        return self.tok.encode(word, add_special_tokens=False)

    def generate(self, prompts, sampling: SamplingParams) -> list[GenOutput]:
        with self._lock:
            if self.call_s or self.per_prompt_s:
                time.sleep(self.call_s + self.per_prompt_s * len(prompts))
            seeds = sampling.seeds or [0] * len(prompts)
            outs = []
            for seed in seeds:
                ids = (self._word_ids(self.words[seed % len(self.words)]) + [self.stop_id])[: sampling.max_new_tokens]
                outs.append(GenOutput(ids, [self.logprob] * len(ids), "stop" if ids[-1] == self.stop_id else "length"))
            self.calls.append(([list(p) for p in prompts], outs))
            return outs

    def load_weights(self, state_dict, version: int) -> None:
        with self._lock:
            self.version = version


class RecordingEngine:
    """Wraps an engine and records (prompt, output) of every request."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.records: list[tuple[list[int], GenOutput]] = []

    @property
    def version(self) -> int:
        return self.inner.version

    def generate(self, prompts, sampling):
        outs = self.inner.generate(prompts, sampling)
        self.records += [(list(p), o) for p, o in zip(prompts, outs)]
        return outs

    @property
    def submit(self):
        """The inner engine's continuous ``submit``, recorded (absent when the inner has none)."""
        inner = self.inner.submit

        def submit(prompt, sampling):
            fut = inner(prompt, sampling)
            fut.add_done_callback(lambda f: f.cancelled() or f.exception() or self.records.append((list(prompt), f.result())))
            return fut

        return submit

    def load_weights(self, state_dict, version):
        self.inner.load_weights(state_dict, version)
