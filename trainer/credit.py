"""Chunk-level credit for multi-turn agents (IPA, "Chunked" credit as in ROLL).

In an agentic rollout one sequence interleaves the policy's turns with the environment's
observations. A *chunk* is one agent turn: a maximal run of consecutive response tokens
(mask == 1) in a sequence, delimited by observation or prompt tokens (mask == 0).
IPA assigns credit and importance ratios per chunk rather than per token or per sequence:
a turn is the unit the environment reacts to, so it is the unit that earns the outcome.

Conventions are those of :mod:`rockroll.trainer.algorithms`: ``mask`` (B, T) marks trained
response tokens, ``rewards`` (B,) outcome rewards, ``group_ids`` (B,) GRPO groups; chunk
indices ``k`` are 0-based in code (chunk 0 is the first turn), ``K`` is a sequence's number
of chunks. Functions returning (B, T) put 0 (or -1 for ids, 1 for ratios) off the chunks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rockroll.trainer.algorithms import aggregate, clipped_surrogate, grpo_advantages, masked_mean


def _chunk_starts(mask: Tensor) -> Tensor:
    """True on the first token of every chunk: a response token whose left neighbour is not one."""
    m = mask.bool()
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    return m & ~prev


def chunk_ids(mask: Tensor) -> Tensor:
    """Chunk index of every token, (B, T) long: 0..K_b-1 on response tokens, -1 elsewhere.

    Example: mask [1,1,0,0,1,0,1] -> [0,0,-1,-1,1,-1,2].
    """
    m = mask.bool()
    ids = _chunk_starts(m).long().cumsum(-1) - 1
    return torch.where(m, ids, -1)


def num_chunks(mask: Tensor) -> Tensor:
    """Number of chunks (agent turns) K_b of every sequence, (B,) long."""
    return _chunk_starts(mask).long().sum(-1)


def _discount_to_end(mask: Tensor, gamma: float) -> Tensor:
    """gamma^(K_b - 1 - k) on the tokens of chunk k (0-based), 0 elsewhere, (B, T) float."""
    m = mask.bool()
    ids = chunk_ids(m)
    turns_left = (num_chunks(m).unsqueeze(-1) - 1 - ids).clamp(min=0).float()
    return torch.where(m, torch.full_like(turns_left, gamma) ** turns_left, 0.0)


def chunk_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted outcome return of each chunk, broadcast to its tokens, (B, T).

    With K chunks and the outcome R arriving after the last one, chunk k (1-based) gets
    G_k = gamma^(K - k) * R: the last turn gets R, the one before gamma * R, ...
    e.g. gamma = 0.5, K = 3 -> [0.25 R, 0.5 R, R]. 0 on non-response tokens.
    """
    return _discount_to_end(mask, gamma) * rewards.float().unsqueeze(-1)


def _chunk_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over each chunk's tokens, broadcast back to the chunk's tokens (0 elsewhere)."""
    m = mask.bool()
    ids = chunk_ids(m)
    B, T = m.shape
    k_max = int(num_chunks(m).max()) if B else 0
    # non-response tokens go to a spare slot k_max that is never read back
    slot = torch.where(ids >= 0, ids, k_max)
    zeros = torch.zeros(B, k_max + 1, dtype=x.dtype, device=x.device)
    total = zeros.scatter_add(1, slot, torch.where(m, x, 0.0))
    count = zeros.scatter_add(1, slot, m.to(x.dtype))
    mean = total / count.clamp(min=1)
    return torch.where(m, mean.gather(1, slot), 0.0)


def chunk_ratios(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Chunk importance ratio, broadcast to the chunk's tokens, (B, T); 1 off the chunks.

    rho_k = exp( mean_{t in chunk k} (logp_t - old_logp_t) ) = (prod_t r_t)^(1/n_k), the
    geometric mean of the token ratios: a per-turn analogue of GSPO's length-normalised
    sequence ratio, stable for long turns where the product of ratios would explode.
    Differentiable in ``logp`` (d rho_k / d logp_t = rho_k / n_k).
    """
    m = mask.bool()
    mean_log = _chunk_mean(torch.where(m, logp - old_logp, 0.0), m)
    return torch.where(m, mean_log.exp(), 1.0)


def chunk_ratio_mask(ratios: Tensor, mask: Tensor, *, low: float, high: float) -> Tensor:
    """1.0 on response tokens whose chunk ratio lies in [low, high], 0.0 elsewhere, (B, T).

    A turn whose policy drifted too far from the rollout policy (stale async sample, or a
    generator/trainer mismatch) is dropped whole rather than token by token.
    """
    r = ratios.detach()
    return (mask.bool() & (r >= low) & (r <= high)).float()


def ipa_advantages(rewards: Tensor, group_ids: Tensor, mask: Tensor, gamma: float, *,
                   eps: float = 1e-6, std_normalize: bool = True) -> Tensor:
    """IPA chunk advantages broadcast to each chunk's tokens, (B, T); 0 on non-response tokens.

    Chunk k of sequence b (K_b chunks) has return G_bk = gamma^(K_b - k) R_b. Its baseline
    is the same discount applied to the group's mean outcome, gamma^(K_b - k) mean_g R, so
        A_bk = gamma^(K_b - k) * (R_b - mean_g R) / (std_g R + eps)
             = gamma^(K_b - k) * grpo_advantage_b.
    Why this baseline rather than the group mean of returns at the same chunk position:
    sequences of a group end after different numbers of turns, so position k is not
    comparable across them (and missing in short ones); a per-position baseline can hand
    positive credit to a turn of a failed episode merely because its siblings were longer.
    Ours keeps every turn's sign equal to its episode's outcome relative to the group,
    reduces exactly to GRPO when gamma = 1, and with gamma < 1 gives turns far from the
    outcome less credit. ``std_normalize=False`` is the Dr.GRPO variant.
    """
    adv_seq = grpo_advantages(rewards, group_ids, eps=eps, std_normalize=std_normalize)
    return _discount_to_end(mask, gamma) * adv_seq.unsqueeze(-1)


def ipa_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
             ratio_low: float, ratio_high: float, clip: float = 0.2,
             agg: str = "token-mean") -> tuple[Tensor, dict]:
    """PPO-style loss on chunk ratios, scalar loss + metrics.

    rho = :func:`chunk_ratios`; keep = :func:`chunk_ratio_mask` (rho in [ratio_low, ratio_high]);
        l_t = max(-A_t rho_k, -A_t clip(rho_k, 1 - clip, 1 + clip))   on kept tokens,
    aggregated over mask * keep: a dropped chunk is treated as if it had not been sampled
    (it neither contributes nor counts in the denominator). ``advantages`` is (B, T),
    e.g. :func:`ipa_advantages`. Metrics: chunk_mask_frac (response tokens dropped),
    clip_frac, ratio_mean.
    """
    m = mask.bool()
    rho = chunk_ratios(logp, old_logp, m)
    keep = chunk_ratio_mask(rho, m, low=ratio_low, high=ratio_high).bool()
    adv = advantages.detach()
    loss_tok = clipped_surrogate(rho, adv, clip_low=clip, clip_high=clip)
    loss = aggregate(loss_tok, keep, agg)
    with torch.no_grad():
        metrics = {
            "chunk_mask_frac": masked_mean((~keep).float(), m).item(),
            "clip_frac": masked_mean((loss_tok > -adv * rho).float(), keep).item(),
            "ratio_mean": masked_mean(rho, m).item(),
        }
    return loss, metrics
