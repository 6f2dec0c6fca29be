"""Continuous batching: requests join a running batch between two decode steps and leave it
the step they finish, so a short reply is answered at once instead of waiting for the longest
reply of its batch (the queue scheduling of ROLL Flash / vLLM, for the torch engine).

:class:`ContinuousBatcher` is the scheduling loop, in a thread of its own; the model side is a
:class:`Stepper` (a batch of rows over a KV cache: prefill new rows, one decode step for every
row, drop rows). Each iteration:

1. one decode step for every running row (fed the token it sampled last);
2. rows that sampled a stop token or reached ``max_new_tokens`` leave: their future is resolved
   at once and their cache rows are dropped;
3. waiting requests (up to ``max_batch`` rows) are prefilled together and join the batch with
   their first token sampled.

Each row samples with its own ``torch.Generator`` seeded from the request's seed, and the
padding of a row is masked out of attention, so a request's tokens do not depend on what else
is in the batch (up to float rounding of batched kernels). Log-probs are those of the
distribution sampled from (:mod:`.sampling`: allowed tokens, temperature, top-k, top-p).

Weights change only between steps, and every output carries the version that generated all of
its tokens. ``on_load`` decides what happens to requests in flight when weights arrive:

- ``"wait"`` (default): admission stops, running rows finish on the old weights, then the
  weights load and admission resumes; the load waits at most ``max_new_tokens`` steps.
- ``"abort"``: running rows are dropped and requeued at the front, then restart from their
  prompt on the new weights (same seed); the load waits at most one step, the partial
  generations are wasted.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .lifecycle import GenerationLoop
from .sampling import GenOutput, SamplingParams, Seen, processed_logits

__all__ = ["ContinuousBatcher", "Stepper", "sample_rows"]


class Stepper(Protocol):
    """A batch of rows over a model's KV cache, in the order they were added."""

    vocab_size: int

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Append one row per prompt; the (n, V) logits of each one's next token."""

    def decode(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token to every row; the (B, V) logits of the next."""

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (indices, in order); the others leave the batch."""

    def load_weights(self, state_dict: dict[str, Any]) -> None: ...


def sample_rows(logits: torch.Tensor, rows: list["_Request"]) -> list[tuple[int, float]]:
    """One token for each row of ``logits`` (B, V) as its request's settings say, and its
    log-probability under the distribution it was sampled from (:func:`~.sampling.processed_logits`:
    allowed ids, repetition penalty over the prompt and the reply so far, temperature, min-p, top-k,
    top-p, as the trainer computes it; temperature 0: argmax,
    log-prob at temperature 1, as vLLM reports it). Rows with the same settings are processed
    together on the logits' device, and each draws with its own generator there; only the
    tokens and their log-probs leave it (on a GPU, one small copy a step instead of the
    vocabulary's log-probs of every row). On the CPU this draws exactly what one row at a time
    did: the batched log-softmax is the per-row one, bit for bit."""
    out: list[tuple[int, float]] = [(0, 0.0)] * len(rows)
    by_settings: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        sp = r.sampling
        allowed = None if sp.allowed_token_ids is None else tuple(sp.allowed_token_ids)
        by_settings.setdefault((sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repetition_penalty, allowed),
                               []).append(i)
    for idx in by_settings.values():
        sp, allowed = rows[idx[0]].sampling, rows[idx[0]].allowed
        seen = None if sp.repetition_penalty == 1.0 else Seen.of_contexts(
            [rows[i].prompt + rows[i].ids for i in idx], logits.shape[-1], logits.device).at()
        logp = torch.log_softmax(processed_logits(logits[idx], sp.temperature or 1.0, sp.top_k, sp.top_p, allowed,
                                                  sp.min_p, seen, sp.repetition_penalty), -1)
        probs = logp.exp()
        if sp.temperature == 0:
            toks = probs.argmax(-1)
        else:
            toks = torch.cat([torch.multinomial(probs[j], 1, generator=rows[i].generator(probs.device))
                              for j, i in enumerate(idx)])
        for i, tok, lp in zip(idx, toks.tolist(), logp.gather(-1, toks[:, None])[:, 0].tolist()):
            out[i] = (tok, lp)
    return out


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    seed: int
    future: concurrent.futures.Future
    allowed: torch.Tensor | None = None
    gen: torch.Generator | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = -1

    def restart(self, version: int) -> None:
        self.gen = None  # from the seed again, at the next draw
        self.ids, self.logprobs, self.version = [], [], version

    def generator(self, device: torch.device) -> torch.Generator:
        """The row's own generator on ``device`` (where it samples), seeded at its first draw."""
        if self.gen is None or self.gen.device != device:
            self.gen = torch.Generator(device=device).manual_seed(self.seed)
        return self.gen

    def add(self, tok: int, lp: float) -> bool:
        """Record a sampled token; whether the request is now finished."""
        self.ids.append(tok)
        self.logprobs.append(lp)
        return tok in self.sampling.stop_token_ids or len(self.ids) >= self.sampling.max_new_tokens

    def output(self) -> GenOutput:
        stopped = bool(self.ids) and self.ids[-1] in self.sampling.stop_token_ids
        return GenOutput(self.ids, self.logprobs, "stop" if stopped else "length", version=self.version)


class ContinuousBatcher(GenerationLoop):
    """The scheduling loop over a :class:`Stepper` (see the module docstring), in the thread of
    a :class:`~.lifecycle.GenerationLoop`.

    ``submit`` is thread-safe and returns a ``concurrent.futures.Future`` of a
    :class:`GenOutput`; counters: ``steps`` (decode steps), ``joins`` (requests admitted while
    other rows were mid-generation), ``requeued`` (aborted by a weight load), ``max_rows``."""

    thread_name = "rockroll-continuous"

    def __init__(self, stepper: Stepper, *, version: int = 0, max_batch: int = 256, on_load: str = "wait"):
        if on_load not in ("wait", "abort"):
            raise ValueError(f"on_load: {on_load!r} must be 'wait' or 'abort'")
        super().__init__()
        self.stepper, self.version, self.max_batch, self.on_load = stepper, version, max_batch, on_load
        self._rows: list[_Request] = []  # the running batch, in the stepper's row order
        self.steps = self.joins = self.requeued = self.max_rows = 0

    def submit(self, prompt: list[int], sampling: SamplingParams) -> concurrent.futures.Future:
        """Queue one request (``sampling.seeds``: None or one seed) for the next step."""
        return self.submit_many([(prompt, sampling)])[0]

    def submit_many(self, requests: list[tuple[list[int], SamplingParams]]) -> list[concurrent.futures.Future]:
        """Queue requests at once: they join the batch together (a blocking batch call's
        prompts are prefilled as one batch, as the same call always is: reproducible numerics)."""
        reqs = []
        for prompt, sampling in requests:
            seed = sampling.seeds[0] if sampling.seeds else int(torch.randint(0, 2**62, ()).item())
            allowed = None if sampling.allowed_token_ids is None else torch.tensor(sampling.allowed_token_ids)
            reqs.append(_Request(list(prompt), sampling, int(seed), concurrent.futures.Future(), allowed))
        self._put(reqs)
        return [r.future for r in reqs]

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load weights between two steps, as ``on_load`` says (module docstring)."""
        def load() -> None:
            with self._cv:
                if self._rows:  # "abort": back to the front of the queue, to restart on the new weights
                    self.requeued += len(self._rows)
                    self._queue.extendleft(reversed(self._rows))
                    self._rows = []
                    self.stepper.keep([])
                self.stepper.load_weights(state_dict)
                self.version = version

        self._load(load, drain=self.on_load == "wait")

    # ------------------------------------------------------------------ the loop
    def _in_flight(self) -> bool:
        return bool(self._rows)

    def _pending(self) -> list[concurrent.futures.Future]:
        reqs, self._rows = [*self._rows, *self._queue], []
        self._queue.clear()
        return [r.future for r in reqs]

    def _retire(self, rows: list["_Request | None"], finished: list[bool]) -> None:
        """Hand the stepper the rows about to leave that finished (not cancelled), with the
        tokens each one's KV holds (its prompt and reply but the last token, never fed), for a
        prompt that extends them (a stepper that keeps no prefixes has no ``retire``)."""
        retire = getattr(self.stepper, "retire", None)
        idx = [i for i, (r, f) in enumerate(zip(rows, finished)) if f and not r.future.cancelled()]
        if retire is not None and idx:
            retire(idx, [rows[i].prompt + rows[i].ids[:-1] for i in idx])

    def _step(self, taken: None) -> None:
        done: list[_Request] = []
        rows = self._rows
        if rows:  # 1. one decode step for every running row
            logits = self.stepper.decode([r.ids[-1] for r in rows])
            self.steps += 1
            # a cancelled caller (a redundant episode cut short) frees its row too
            finished = [r.add(*drawn) or r.future.cancelled() for r, drawn in zip(rows, sample_rows(logits, rows))]
            if any(finished):  # 2. finished rows leave now
                done = [r for r, f in zip(rows, finished) if f]
                self._retire(rows, finished)
                self.stepper.keep([i for i, f in enumerate(finished) if not f])
                rows = [r for r, f in zip(rows, finished) if not f]
        with self._cv:  # 3. waiting requests join
            admit = []
            while self._queue and not self._loading and len(rows) + len(admit) < self.max_batch:
                r = self._queue.popleft()
                if not r.future.cancelled():
                    admit.append(r)
            if admit and rows:
                self.joins += len(admit)
        if admit:
            for r in admit:
                r.restart(self.version)
            logits = self.stepper.prefill([r.prompt for r in admit])
            first = [r.add(*drawn) for r, drawn in zip(admit, sample_rows(logits, admit))]
            done += [r for r, f in zip(admit, first) if f]
            if any(first):
                n = len(rows)
                self._retire([None] * n + admit, [False] * n + first)
                self.stepper.keep(list(range(n)) + [n + i for i, f in enumerate(first) if not f])
            rows = rows + [r for r, f in zip(admit, first) if not f]
        with self._cv:
            self._rows = rows
            self.max_rows = max(self.max_rows, len(rows))
            self._cv.notify_all()  # a "wait" load may be waiting for the batch to drain
        for r in done:
            if not r.future.done():
                r.future.set_result(r.output())
