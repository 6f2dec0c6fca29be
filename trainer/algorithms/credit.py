"""Chunk-level credit for multi-turn agents (IPA, "Chunked" credit as in ROLL).

In an agentic rollout one sequence interleaves the policy's turns with the environment's
observations. A *chunk* is one agent turn: a maximal run of consecutive response tokens
(mask == 1) in a sequence, delimited by observation or prompt tokens (mask == 0).
IPA assigns credit and importance ratios per chunk rather than per token or per sequence:
a turn is the unit the environment reacts to, so it is the unit that earns the outcome.
:func:`turn_advantages` gives each turn the discounted return-to-go of per-turn rewards
(``algorithm.turn_credit: discounted``).

Conventions are those of :mod:`.pg`: ``mask`` (B, T) marks trained
response tokens, ``rewards`` (B,) outcome rewards, ``group_ids`` (B,) GRPO groups; chunk
indices ``k`` are 0-based in code (chunk 0 is the first turn), ``K`` is a sequence's number
of chunks. Functions returning (B, T) put 0 (or -1 for ids, 1 for ratios) off the chunks.
Token tensors are 2-D by contract, so the token axis is written ``1``, never ``-1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .pg import aggregate, grpo_advantages, masked_mean


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
    ids = _chunk_starts(m).long().cumsum(1) - 1
    return torch.where(m, ids, -1)


def num_chunks(mask: Tensor) -> Tensor:
    """Number of chunks (agent turns) K_b of every sequence, (B,) long."""
    return _chunk_starts(mask).long().sum(1)


def _discount_to_end(mask: Tensor, gamma: float, chunks_after: Tensor | None = None) -> Tensor:
    """gamma^(K_b - 1 - k + a_b) on the tokens of chunk k (0-based), 0 elsewhere, (B, T) float;
    ``chunks_after`` a_b (B,): the episode's chunks in later rows (default 0)."""
    m = mask.bool()
    turns_left = num_chunks(m).unsqueeze(1) - 1 - chunk_ids(m)  # >= 0: K_b - 1 - k, or K_b off the chunks
    if chunks_after is not None:
        turns_left = turns_left + chunks_after.unsqueeze(1)
    return torch.where(m, gamma ** turns_left, 0.0)


def turn_returns(turn_rewards: Tensor, gamma: float) -> Tensor:
    """Discounted return-to-go of per-turn rewards, (B, K) -> (B, K) float.

    G_k = r_k + gamma * G_{k+1}, G = 0 after the last turn; zero padding past a sequence's
    last turn adds nothing. e.g. gamma = 0.5, r = [0, 0, 1] -> [0.25, 0.5, 1]: an outcome R
    arriving after the last of K turns gives turn k (1-based) gamma^(K - k) * R.
    """
    r = turn_rewards.float()
    out = torch.zeros_like(r)
    g = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for k in reversed(range(r.shape[1])):
        g = r[:, k] + gamma * g
        out[:, k] = g
    return out


def per_chunk(values: Tensor, mask: Tensor) -> Tensor:
    """Per-turn values (B, K) on the tokens of each chunk, (B, T): chunk k gets ``values[:, k]``,
    0 off the chunks. Every sequence must have at most K chunks."""
    m = mask.bool()
    if not m.any():  # no turn (or no sequence): nothing to gather, and ``values`` may have no column
        return torch.zeros(m.shape, dtype=values.dtype, device=values.device)
    k_max = int(num_chunks(m).max())
    if k_max > values.shape[1]:
        raise ValueError(f"a sequence has {k_max} chunks (turns) but only {values.shape[1]} turn values")
    return torch.where(m, values.gather(1, chunk_ids(m).clamp(min=0)), 0.0)


def turn_advantages(turn_rewards: Tensor, mask: Tensor, group_ids: Tensor, gamma: float, *,
                    eps: float = 1e-6, std_normalize: bool = True) -> Tensor:
    """GRPO over per-turn discounted returns with a per-position baseline, broadcast to each
    turn's tokens, (B, T).

    ``turn_rewards`` (B, K): the reward after each turn (chunk) of a sequence, zero-padded.
    G_bk = :func:`turn_returns` for the K_b turns of sequence b (K_b = its number of chunks).
    Turn k of sequence b is compared with turn k of the other episodes of its group g that
    reached a k-th turn, S_gk = {b' in g : K_b' > k}:
        A_bk = (G_bk - mean_{S_gk} G_.k) / (std_{S_gk} G_.k + eps)      (population std)
    The baseline of a turn estimates the return-to-go *from that turn*, so it must be taken at
    the same turn index: one baseline pooled over all positions compares the return-to-go of
    turn 1 (which includes turn 2's reward) with that of turn 2, and hands the last turn of a
    group of identical, correct episodes a negative advantage. Here identical episodes get 0.
    Episodes of different lengths: an episode that has ended has no k-th turn and is left out
    of position k's baseline (counting it as G = 0 would make a turn look good merely because
    a sibling finished - e.g. succeeded - sooner). A position only one episode of the group
    reached has nothing to be compared with and gets 0, as a GRPO group of one does.
    With equal lengths, gamma = 1 and only an outcome reward (G_bk = R_b) this is exactly
    :func:`grpo_advantages`. ``std_normalize=False`` is the Dr.GRPO variant.
    """
    m = mask.bool()
    K_b = num_chunks(m)
    valid = torch.arange(turn_rewards.shape[1], device=m.device).unsqueeze(0) < K_b.unsqueeze(1)
    G = turn_returns(torch.where(valid, turn_rewards.float(), 0.0), gamma)  # 0 past the last turn
    v = valid.to(G.dtype)
    groups, g = torch.unique(group_ids, return_inverse=True)
    zeros = torch.zeros(len(groups), G.shape[1], dtype=G.dtype, device=G.device)
    # (groups, K): episodes that reached turn k; where none did, the 0/1 below is never read
    n = zeros.index_add(0, g, v).clamp(min=1)
    mean = zeros.index_add(0, g, G) / n
    adv = G - mean[g]
    if std_normalize:
        var = zeros.index_add(0, g, v * adv * adv) / n
        adv = adv / (var.sqrt()[g] + eps)
    # per_chunk reads turn k of sequence b only where b played it (k < K_b): the turns not
    # played, whose values above are meaningless, are never read
    return per_chunk(adv, m)


def chunk_ratios(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Chunk importance ratio, broadcast to the chunk's tokens, (B, T); 1 off the chunks.

    rho_k = exp( mean_{t in chunk k} (logp_t - old_logp_t) ) = (prod_t r_t)^(1/n_k), the
    geometric mean of the token ratios: a per-turn analogue of GSPO's length-normalised
    sequence ratio, stable for long turns where the product of ratios would explode.
    Differentiable in ``logp`` (d rho_k / d logp_t = rho_k / n_k).
    """
    m = mask.bool()
    # chunk k sums into slot k of a (B, T) tensor (a sequence has at most T chunks); the
    # tokens off the chunks add 0 to slot 0, in both the sum and the count
    slot = chunk_ids(m).clamp(min=0)
    log_ratio = torch.where(m, logp - old_logp, 0.0)  # padding may hold inf - inf
    total = torch.zeros_like(log_ratio).scatter_add(1, slot, log_ratio)
    count = torch.zeros_like(log_ratio).scatter_add(1, slot, m.to(log_ratio.dtype))
    mean = total / count.clamp(min=1)  # a slot of no chunk: 0/1, never read on a chunk
    return torch.where(m, mean.gather(1, slot).exp(), 1.0)


def ipa_mask(old_logp: Tensor, behav_logp: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """IPA's chunk mask (ROME paper, arXiv 2512.24873, Eq 8), 1.0 / 0.0 on response tokens, (B, T):
    m_c = 1[ (prod_{t in c} pi_old(t) / mu(t))^(1/|c|) <= H ], ``threshold`` H.

    One-sided, and on the *proximal* policy pi_old against the generator mu (``behav_logp``),
    never on the moving pi_theta: a turn the generator sampled far less likely than the trainer's
    policy would (a stale async sample or a generator/trainer mismatch) is dropped whole.
    H = 5 by default, the value issue #40 quotes from ROLL's IPA example. ROLL's code
    (``train_infer_corrections``) filters the same segment-level geometric mean two-sided,
    ``ratio_low <= . <= ratio_high``; this is its ``ratio_low: 0``.
    """
    m = mask.bool()
    gap = chunk_ratios(old_logp.detach(), behav_logp.detach(), m)
    return (m & (gap <= threshold)).float()


def ipa_returns(rewards: Tensor, mask: Tensor, gamma: float, *, chunks_after: Tensor | None = None) -> Tensor:
    """IPA's chunk returns (ROME paper, arXiv 2512.24873, Eq 7) broadcast to each chunk's tokens, (B, T):
    G_k = gamma^Delta(k, j) * R_final, where Delta counts the chunks from k to the episode's
    last chunk j (0 for the last one). Absolute: no group baseline and no whitening (ROLL's
    IPA example: no advantage whitening, identity reward normalisation), so a group whose
    episodes all succeed still learns, and the sign of a chunk's credit is the sign of R.

    An agent episode split into segments (rows of one episode, see ``update.Batch``):
    ``chunks_after`` (B,), the episode's chunks in its later rows, so Delta counts to the
    episode's end, not to the row's.
    """
    return _discount_to_end(mask, gamma, chunks_after) * rewards.float().unsqueeze(1)


def ipa_group_returns(rewards: Tensor, group_ids: Tensor, mask: Tensor, gamma: float, *, eps: float = 1e-6,
                      weights: Tensor | None = None, chunks_after: Tensor | None = None) -> Tensor:
    """rockroll's IPA returns before issue #40 (``algorithm.ipa.returns: group_normalized``),
    broadcast to each chunk's tokens, (B, T): Eq 7's discount applied to the GRPO-normalised
    outcome instead of the absolute one,
        A_bk = gamma^Delta(k, j) * (R_b - mean_g R) / (std_g R + eps).
    Not the paper's: a group where every episode succeeds learns nothing, and failures are
    pushed down (under Eq 9's loss: at weight sg(clip(rho, 0, 1))). Kept because it measured
    better on the tiny two-turn task of ``tests/trainer/test_learning.py``, whose rewards are
    never negative: with absolute returns nothing pushes a wrong second turn down, and 2 of 3
    seeds stalled at eval 0.5 (docs/algorithms.md, "Per-turn credit"). ``weights``, ``chunks_after``: an episode
    split into rows (:func:`~.pg.grpo_advantages`, :func:`ipa_returns`).
    """
    adv_seq = grpo_advantages(rewards, group_ids, eps=eps, weights=weights)
    return _discount_to_end(mask, gamma, chunks_after) * adv_seq.unsqueeze(1)


def ipa_loss(logp: Tensor, old_logp: Tensor, behav_logp: Tensor, returns: Tensor, mask: Tensor, *,
             threshold: float, agg: str = "token-mean",
             denom: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """IPA's chunk-level, TOPR-style loss (ROME paper, arXiv 2512.24873, Eq 9), scalar loss + metrics.

    Per token t of chunk c with return G_c (``returns``, :func:`ipa_returns`):
        positive chunk (G_c > 0):  l_t = -m_c * G_c * log pi_theta(t)                 (no ratio)
        negative chunk (G_c < 0):  l_t = -m_c * sg(clip(rho_c, 0, 1)) * G_c * log pi_theta(t)
    rho_c = :func:`chunk_ratios` of pi_theta against pi_old (``old_logp``, Eq 8), m_c =
    :func:`ipa_mask` (pi_old against mu, one-sided, ``threshold`` H). The gradient of a token
    is -m_c * w_c * G_c * grad log pi (w_c = 1 on a positive chunk): a positive chunk is pushed
    up in full however far pi_theta moved (no PPO clip to stop it), a negative one is pushed
    down at most at weight 1, less once pi_theta already lowered it. Aggregated over ``mask``
    with ``agg``: a masked chunk still counts in the denominator (zero loss, like a PPO token
    whose clipped branch carries no gradient). Metrics: chunk_mask_frac (response tokens
    masked), neg_weight_mean (sg(clip(rho, 0, 1)) over negative chunks' tokens), ratio_mean.

    ROLL's agentic actor with ``ratio_type: segment`` and ``pg_variant: topr`` computes the
    same, except that it splits positive from negative by the episode score (> 0 / <= 0)
    rather than by the sign of G_c: identical under :func:`ipa_returns` (gamma > 0, so
    sign G_c = sign R; R = 0 gives zero loss either way), not under
    :func:`ipa_group_returns`, whose G_c is an advantage.
    """
    m = mask.bool()
    rho = chunk_ratios(logp.detach(), old_logp.detach(), m)
    keep = ipa_mask(old_logp, behav_logp, m, threshold).bool()
    g = returns.detach()
    w = torch.where(g < 0, rho.clamp(0.0, 1.0), 1.0)
    per_token = torch.where(keep, -w * g * logp, 0.0)
    loss = aggregate(per_token, m, agg, denom)
    with torch.no_grad():
        neg = m & (g < 0)
        metrics = {
            "chunk_mask_frac": masked_mean((~keep).float(), m).item(),
            "neg_weight_mean": masked_mean(w, neg).item() if bool(neg.any()) else 1.0,
            "ratio_mean": masked_mean(rho, m).item(),
        }
    return loss, metrics
