"""The processed distribution a generator samples from, written once for the generator and
the trainer: so the trainer's log-probs of generated tokens are those of the distribution the
generator drew them from, and every importance ratio compares like with like.

From a position's logits, in vLLM's order: constrained decoding (``allowed``: every other
token removed), the repetition penalty (CTRL's, as vLLM and Transformers apply it: a token
already in the context -- the prompt or the reply so far -- has its logit divided by the
penalty when positive, multiplied by it when negative; :class:`Seen` says which tokens were),
temperature, min-p (a token whose probability is below ``min_p`` times the
likeliest token's removed: vLLM applies it before top-k and top-p, as a logits processor),
top-k (the ``k`` largest logits, ties at the k-th kept), then top-p over what top-k left (the smallest set of most likely tokens whose mass reaches ``p``:
a token stays while the mass of the tokens above it is below ``p``). Removed tokens get
``-inf``; the softmax over the rest renormalises. The truncation is a set, decided without
gradient: the trainer differentiates the renormalised log-prob of the kept set.

Here too the request's settings (:class:`SamplingParams`) and what an engine answers
(:class:`GenOutput`), which :mod:`.generation` and :mod:`.scheduler` share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["GenOutput", "SamplingParams", "Seen", "processed_logits", "truncated"]


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0: greedy (log-probs then of the untempered softmax, as vLLM reports them)
    top_p: float = 1.0
    top_k: int = 0            # 0: no top-k truncation
    min_p: float = 0.0        # 0: no min-p truncation
    repetition_penalty: float = 1.0  # 1: none; > 1 discourages the tokens of the context
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
    version: int | None = None  # the weights' version that generated every token (None: ask the engine)


@dataclass(frozen=True)
class Seen:
    """Which tokens each position's context holds, for the repetition penalty: ``first`` (B, V),
    the position of each token's first occurrence in each row (the row's length or more where
    it never occurs). Position ``t`` has seen token ``v`` when ``first[b, v] <= t``."""

    first: torch.Tensor

    @classmethod
    @torch.no_grad()
    def of_rows(cls, ids: torch.Tensor, vocab_size: int) -> "Seen":
        """From token rows (B, T): position ``t``'s context is ``ids[:, :t + 1]``, as the logits
        of a forward over ``ids`` at ``t`` see it (padding after a row's end only reaches
        positions past it)."""
        B, T = ids.shape
        first = torch.full((B, vocab_size), T, dtype=torch.long, device=ids.device)
        pos = torch.arange(T, device=ids.device).expand(B, T)
        return cls(first.scatter_reduce_(1, ids.long(), pos, "amin"))

    @classmethod
    def of_contexts(cls, contexts: list[list[int]], vocab_size: int, device=None) -> "Seen":
        """One position per context (a generator's rows): every token of each list is seen."""
        first = torch.ones((len(contexts), vocab_size), dtype=torch.long, device=device)
        for i, c in enumerate(contexts):
            if c:
                first[i, torch.tensor(sorted(set(c)), device=device)] = 0
        return cls(first)

    def at(self, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Bool: (B, Tc, V) at ``positions`` (Tc,) or (1, Tc); (B, V) when None (one position,
        :meth:`of_contexts`)."""
        if positions is None:
            return self.first < 1
        return self.first[:, None, :] <= positions.reshape(1, -1, 1)


def penalized(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` with the repetition penalty on the ``seen`` tokens (a new tensor)."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


@torch.no_grad()
def truncated(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor | None:
    """Bool (..., V): True where min-p / top-k / top-p remove a token of ``logits``
    (temperature and masks already applied); None when none truncates."""
    V = logits.shape[-1]
    removed = None
    if min_p > 0:  # p < min_p * p_max, i.e. logit < max logit + log(min_p): no softmax needed
        removed = logits < logits.amax(-1, keepdim=True) + math.log(min_p)
        logits = logits.masked_fill(removed, float("-inf"))
    if 0 < top_k < V:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        removed = logits < kth if removed is None else removed | (logits < kth)
    if top_p < 1.0:
        lg = logits if removed is None else logits.masked_fill(removed, float("-inf"))
        sorted_lg, idx = lg.sort(-1, descending=True)
        p = sorted_lg.softmax(-1)
        above = p.cumsum(-1) - p  # mass of the tokens ranked above each one
        by_p = torch.zeros_like(removed if removed is not None else logits, dtype=torch.bool)
        by_p.scatter_(-1, idx, above >= top_p)
        removed = by_p if removed is None else removed | by_p
    return removed


def processed_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     allowed: torch.Tensor | None = None, min_p: float = 0.0, seen: torch.Tensor | None = None,
                     repetition_penalty: float = 1.0) -> torch.Tensor:
    """fp32 logits of the distribution sampled from (``log_softmax`` of them: its log-probs),
    ``-inf`` outside its support. ``allowed``: a LongTensor of the token ids constrained
    decoding may use (None: all); ``seen`` (bool, the shape of ``logits``): the tokens of each
    position's context, penalised by ``repetition_penalty`` (:meth:`Seen.at`)."""
    lg = logits.float() / temperature  # a new tensor: the masks below go in place (one fp32 copy)
    if seen is not None and repetition_penalty != 1.0:
        # after the temperature, which commutes with it (a positive scale keeps every sign)
        lg = penalized(lg, seen, repetition_penalty)
    if allowed is not None:
        mask = torch.full((lg.shape[-1],), float("-inf"), device=lg.device)
        mask[allowed.to(lg.device)] = 0.0
        lg.add_(mask)
    removed = truncated(lg, top_k, top_p, min_p)
    return lg if removed is None else lg.masked_fill_(removed, float("-inf"))
