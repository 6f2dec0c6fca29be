"""Helpers for tests and benchmarks of the trainer (not shipped; bench scripts put this folder
on sys.path): a scripted generation engine, and a simulated model for the continuous-batching
engine (:class:`SimStepper`).

``ScriptEngine`` answers every prompt with the token ids of a word chosen from the request's
seed (``words[seed % len(words)]``) followed by the stop token, with fixed log-probs, and can
simulate a batched accelerator: each call sleeps ``call_s + per_prompt_s * batch``. It also
records every call, so tests can check that samples hold exactly the generated ids.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from rockroll.trainer.engines.sampling import GenOutput, SamplingParams


class CharTok:
    """A stand-in tokenizer, one id per character and ``<|end|>`` id 0 (no chat template: use
    ``tokenizer.template: prefixes``), for runs that measure scheduling, not text."""

    unk_token_id, eos_token = -1, "<|end|>"

    def convert_tokens_to_ids(self, tok):
        return 0 if tok == "<|end|>" else None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i > 0)


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


class SimStepper:
    """A model stand-in for :class:`~.scheduler.ContinuousBatcher` (benchmarks of queue
    scheduling): replies of heavy-tailed length and an accelerator's cost per forward.

    A row at its t-th generated token stops (``stop_id``) with probability
    ``min(1, tail / (t + scale))``, else says ``word_id``: the length is about Lomax
    (P(L > t) ~ (scale / (t + scale))^tail: most replies a few tokens, a few very long),
    drawn by the row's own seeded generator. Each prefill sleeps ``prefill_s``, each decode
    step ``step_s + per_row_s * rows``."""

    def __init__(self, *, stop_id: int, word_id: int, tail: float = 1.2, scale: float = 4.0,
                 step_s: float = 0.005, per_row_s: float = 0.00005, prefill_s: float = 0.005):
        self.stop_id, self.word_id, self.tail, self.scale = stop_id, word_id, tail, scale
        self.step_s, self.per_row_s, self.prefill_s = step_s, per_row_s, prefill_s
        self.vocab_size = max(stop_id, word_id) + 1
        self.t: list[int] = []  # tokens generated so far, per row

    def _logits(self):
        import torch

        logits = torch.full((len(self.t), self.vocab_size), float("-inf"))
        for i, t in enumerate(self.t):
            h = min(1.0, self.tail / (t + self.scale))
            logits[i, self.stop_id] = math.log(h)
            if h < 1.0:
                logits[i, self.word_id] = math.log1p(-h)
        return logits

    def prefill(self, prompts):
        time.sleep(self.prefill_s)
        start = len(self.t)
        self.t += [0] * len(prompts)
        return self._logits()[start:]

    def decode(self, tokens):
        time.sleep(self.step_s + self.per_row_s * len(tokens))
        self.t = [t + 1 for t in self.t]
        return self._logits()

    def keep(self, rows):
        self.t = [self.t[i] for i in rows]

    def load_weights(self, state_dict) -> None:
        pass


def first_batch(manager: Any, timeout: float = 120) -> list:
    """Start a ``RolloutManager``, take the groups of step 0, close it (whatever happens)."""
    manager.start()
    try:
        groups, _ = manager.get_batch(0, timeout=timeout)
    finally:
        manager.close()
    return groups


def recording_resets(env: Any, seen: list) -> Any:
    """``env`` whose every ``reset`` appends its ``options`` to ``seen`` (which tasks and
    states an evaluation or a rollout started from)."""
    reset = env.reset

    def recording_reset(*, seed=None, options=None):
        seen.append(options)
        return reset(seed=seed, options=options)

    env.reset = recording_reset
    return env
