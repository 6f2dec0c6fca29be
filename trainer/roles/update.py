"""The update step, shared by every way of running the trainer: groups -> a padded
:class:`Batch` -> log-probs -> advantages -> loss -> optimizer steps (:func:`update_policy`).

The maths is in :mod:`rockroll.trainer.algorithms` (pure functions); the estimator and loss
that run are the configured algorithm's entry of the one table,
:data:`~rockroll.trainer.algorithms.table.ALGORITHMS` (``algorithm.estimator`` /
``algorithm.policy_loss``, credit options applied).
"""

from __future__ import annotations

import copy

import torch
import torch.utils.checkpoint

from ..algorithms import credit as C
from ..algorithms import pg as A
from ..algorithms import rhythm as R
from ..config import AlgorithmConfig, EngineConfig
from ..engines.sampling import Seen, penalized, processed_logits
from ..rollout.types import Group

__all__ = ["Batch", "collate", "compute_advantages", "compute_loss", "target_logp",
           "token_logp", "update_policy"]


_BATCH_TENSORS = ("input_ids", "attention_mask", "targets", "mask", "behav_logp", "rewards", "group_ids",
                  "turn_rewards", "num_turn_rewards", "row_weights", "chunks_after")


class Batch:
    """Groups as padded tensors, one row per trained sequence, aligned on *predicted* tokens:
    position t of ``mask``, ``targets``, ``behav_logp`` is token t+1 of the sequence, predicted
    by logits at t. ``turn_rewards`` (B, K): each row's per-turn rewards, zero-padded to the
    longest (``num_turn_rewards`` of them are real).

    An episode is one row, or several when an agent rewrote its history (``Sample.rows``):
    its rows share its reward and group; ``row_weights`` (1 / its number of rows) makes the
    group statistics count each episode once, and ``chunks_after`` (the episode's chunks in
    its later rows) numbers its turns across rows, for per-turn discounts."""

    def __init__(self, groups: list[Group], pad_id: int):
        samples = [s for g in groups for s in g.samples]
        rows, weights, episode = [], [], []  # (sample, segment); 1 / rows of its episode; its episode
        for e, s in enumerate(samples):
            segs = s.rows()
            rows += [(s, seg) for seg in segs]
            weights += [1.0 / len(segs)] * len(segs)
            episode += [e] * len(segs)
        L = max(len(seg.token_ids) for _, seg in rows)
        K = max(len(s.turn_rewards) for s in samples)
        B = len(rows)
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        attn = torch.zeros(B, L, dtype=torch.long)
        mask = torch.zeros(B, L, dtype=torch.bool)
        blp = torch.zeros(B, L)
        self.turn_rewards = torch.zeros(B, K)
        for i, (s, seg) in enumerate(rows):
            n = len(seg.token_ids)
            ids[i, :n] = torch.tensor(seg.token_ids)
            attn[i, :n] = 1
            mask[i, :n] = torch.tensor(seg.mask, dtype=torch.bool)
            blp[i, :n] = torch.tensor(seg.behav_logp)
            self.turn_rewards[i, : len(s.turn_rewards)] = torch.tensor(s.turn_rewards, dtype=torch.float32)
        self.input_ids, self.attention_mask = ids, attn
        self.targets, self.mask, self.behav_logp = ids[:, 1:], mask[:, 1:], blp[:, 1:]
        self.rewards = torch.tensor([s.reward for s, _ in rows], dtype=torch.float32)
        self.group_ids = torch.tensor([s.group_id for s, _ in rows])
        self.num_turn_rewards = torch.tensor([len(s.turn_rewards) for s, _ in rows])
        self.row_weights = torch.tensor(weights)
        chunks, after = C.num_chunks(self.mask).tolist(), [0] * B
        for i in reversed(range(B - 1)):  # an episode's rows are consecutive
            after[i] = after[i + 1] + chunks[i + 1] if episode[i + 1] == episode[i] else 0
        self.chunks_after = torch.tensor(after, dtype=torch.long)
        self.size = B

    def select(self, idx: torch.Tensor) -> "Batch":
        b = copy.copy(self)
        for k in _BATCH_TENSORS:
            setattr(b, k, getattr(self, k)[idx])
        b.size = len(idx)
        return b

    def to(self, device) -> "Batch":
        b = copy.copy(self)
        for k in _BATCH_TENSORS:
            setattr(b, k, getattr(self, k).to(device))
        return b


def collate(groups: list[Group], pad_id: int) -> Batch:
    return Batch(groups, pad_id)


LOGP_CHUNK = 1024  # sequence positions per slice of the fp32 log-prob computation


def _slice_logp(logits, targets, positions, temperature: float, allowed=None, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, seen: Seen | None = None, repetition_penalty: float = 1.0):
    # the only fp32 copy of (a slice of) the logits: the generator's processed distribution.
    # The target's logit is read from the unmasked logits: a target outside the support (an
    # observation token, masked out of every loss; a sampled token that a moved policy's own
    # top-p set leaves out) gets logit - logsumexp(support), finite, never -inf (whose ratios
    # and gradients would be NaN); inside it, this is exactly the processed log-prob.
    mask = None if seen is None else seen.at(positions)
    lse = processed_logits(logits, temperature, top_k, top_p, allowed, min_p, mask, repetition_penalty).logsumexp(-1)
    target = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
    if mask is not None:
        target = penalized(target, mask.gather(-1, targets.unsqueeze(-1)).squeeze(-1), repetition_penalty)
    return target / temperature - lse


def target_logp(logits, targets, temperature: float, chunk: int = LOGP_CHUNK, allowed=None, top_k: int = 0,
                top_p: float = 1.0, min_p: float = 0.0, seen: Seen | None = None, repetition_penalty: float = 1.0,
                start: int = 0):
    """log softmax(logits / temperature)[target], (B, T), without a full-vocabulary fp32 tensor
    for all positions: ``logit[target] - logsumexp(logits)`` in fp32, ``chunk`` positions at a
    time. Under autograd each slice is checkpointed (recomputed in backward rather than
    keeping its fp32 logits), which keeps the peak near 1.5x the fp32 size of ``logits``
    instead of about 4x (bf16 logits of a 0.5B model: 150k vocabulary x 16k tokens is 10 GB
    in fp32). ``allowed`` (a LongTensor of token ids, constrained decoding), ``top_k``, ``top_p``
    and ``min_p``: the softmax is over the tokens the generator could sample from, renormalised
    (:func:`~rockroll.trainer.engines.sampling.processed_logits`). ``seen``: the context of each
    position (:meth:`Seen.of_rows` of the forward's input ids), for ``repetition_penalty``;
    ``start``: the sequence position of ``logits``' first column (``seen`` is indexed by it)."""
    positions = torch.arange(start, start + logits.shape[1], device=logits.device)[None]
    return _by_slices(_slice_logp, chunk, logits, targets, positions, temperature, allowed, top_k, top_p, min_p,
                      seen, repetition_penalty)


def _by_slices(fn, chunk: int, logits, *args):
    """``fn(logits slice, args slices...)`` over ``chunk`` positions at a time, concatenated:
    tensor ``args`` are sliced along dim 1 like ``logits``, others passed whole. Checkpointed
    under autograd (see :func:`target_logp`)."""
    parts = []
    for i, lg in enumerate(logits.split(chunk, 1)):
        sl = [a[:, i * chunk:(i + 1) * chunk] if torch.is_tensor(a) and a.dim() >= 2 else a for a in args]
        if torch.is_grad_enabled() and lg.requires_grad:
            parts.append(torch.utils.checkpoint.checkpoint(fn, lg, *sl, use_reentrant=False))
        else:
            parts.append(fn(lg, *sl))
    return torch.cat(parts, 1)


def _slice_entropy(logits, positions, temperature: float, allowed=None, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0, seen: Seen | None = None, repetition_penalty: float = 1.0):
    mask = None if seen is None else seen.at(positions)
    logp = processed_logits(logits, temperature, top_k, top_p, allowed, min_p, mask,
                            repetition_penalty).log_softmax(-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, 0.0).sum(-1)  # 0 * log 0 = 0 outside the support


def token_entropy(logits, temperature: float, chunk: int = LOGP_CHUNK, allowed=None, top_k: int = 0,
                  top_p: float = 1.0, min_p: float = 0.0, seen: Seen | None = None, repetition_penalty: float = 1.0,
                  start: int = 0):
    """The entropy of the distribution sampled from (:func:`~rockroll.trainer.engines.sampling.processed_logits`) per
    position, (B, T): the policy's entropy at each predicted token, computed like
    :func:`target_logp`, ``chunk`` positions at a time in fp32 (checkpointed under autograd)."""
    positions = torch.arange(start, start + logits.shape[1], device=logits.device)[None]
    return _by_slices(_slice_entropy, chunk, logits, positions, temperature, allowed, top_k, top_p, min_p, seen,
                      repetition_penalty)


def micro_rows(engine: EngineConfig, batch: Batch, vocab: int) -> int:
    """Sequences a forward takes (0: the whole batch): ``engine.micro_batch_size`` when it is
    set, else the most whose fp32 logits (rows x the batch's longest row x ``vocab`` x 4 bytes)
    fit in ``engine.logits_mib``, at least one; 0 when the whole batch fits or the limit is off."""
    if engine.micro_batch_size or not engine.logits_mib:
        return engine.micro_batch_size
    longest = int(batch.attention_mask.sum(-1).max())
    fit = max(1, int(engine.logits_mib * 2**20 // (longest * vocab * 4)))
    return 0 if fit >= batch.size else fit


def token_logp(policy_forward, batch: Batch, temperature: float, micro_batch_size: int = 0, allowed=None,
               top_k: int = 0, top_p: float = 1.0, with_entropy: bool = False, min_p: float = 0.0,
               repetition_penalty: float = 1.0, trim_prompt: bool = False):
    """log pi(target_t) with logits / temperature, top-k and top-p (the distribution the generator
    sampled), and values if the module has a value head (else None), by :func:`target_logp`; with
    ``with_entropy`` a third item, the policy's entropy per position (:func:`token_entropy`).

    Forwards ``micro_batch_size`` sequences at a time (0: all at once) and concatenates: for
    no-grad passes (under autograd every micro-batch's graph would be kept). Each forward
    drops the columns of right padding that none of its sequences reaches. ``trim_prompt``: the
    forward takes ``logits_to_keep`` (the policy's, the reference's) and is asked for the logits
    from the first position any row's mask holds on, so the LM head, log-softmax and entropy
    skip the prompt that every row starts with (TRL's ``logits_to_keep``); the positions before
    it get log-prob 0, masked out of every loss like any prompt token.
    """
    step = micro_batch_size or batch.size
    parts = [batch] if step >= batch.size else [batch.select(i) for i in torch.arange(batch.size).split(step)]
    width = batch.targets.shape[1]
    logps, values, ents = [], [], []
    for mb in parts:
        n = int(mb.attention_mask.sum(-1).max())  # sequences are left-aligned: columns >= n are padding
        held = mb.mask[:, : n - 1].any(0).nonzero()
        first = int(held[0]) if trim_prompt and len(held) else 0  # logits from here on
        if trim_prompt:
            logits, v = policy_forward(mb.input_ids[:, :n], mb.attention_mask[:, :n], logits_to_keep=n - first)
        else:
            logits, v = policy_forward(mb.input_ids[:, :n], mb.attention_mask[:, :n])
        # the repetition penalty's context at each position: the row's tokens up to it, the
        # prompt the generator had plus what it generated of the reply
        seen = None if repetition_penalty == 1.0 else Seen.of_rows(mb.input_ids[:, : n - 1], logits.shape[-1])
        dist = dict(allowed=allowed, top_k=top_k, top_p=top_p, min_p=min_p, seen=seen,
                    repetition_penalty=repetition_penalty, start=first)
        lp = target_logp(logits[:, :-1], mb.targets[:, first: n - 1], temperature, **dist)
        if with_entropy:
            ents.append(torch.nn.functional.pad(token_entropy(logits[:, :-1], temperature, **dist),
                                                (first, width - (n - 1))))
        del logits  # this micro-batch's logits go before the next forward
        # back to the batch's width (the prompt and padding positions are masked out everywhere)
        logps.append(torch.nn.functional.pad(lp, (first, width - (n - 1))))
        values.append(None if v is None else torch.nn.functional.pad(v[:, :-1], (0, width - (n - 1))))
    logp = logps[0] if len(logps) == 1 else torch.cat(logps)
    value = None if values[0] is None else values[0] if len(values) == 1 else torch.cat(values)
    if with_entropy:
        return logp, value, ents[0] if len(ents) == 1 else torch.cat(ents)
    return logp, value


def compute_advantages(a: AlgorithmConfig, batch: Batch, old_logp, ref_logp, values):
    """Advantages (B,) or (B, T) for the configured algorithm, and PPO returns (or None)."""
    return a.estimator.run(a, batch, old_logp, ref_logp, values)




def compute_loss(a: AlgorithmConfig, logp, old_logp, adv, batch: Batch, ref_logp=None, values=None,
                 returns=None, norm_mask=None, entropy=None,
                 entropy_mask=None) -> tuple[torch.Tensor, dict[str, float]]:
    """The configured policy loss over masked response tokens (+ KL, + value loss, - entropy bonus).

    Ratios: PPO's clip (grpo, ppo, reinforce_pp) is taken against the proximal policy
    ``old_logp``, times the truncated IS weight pi_old / mu when ``tis_cap`` > 0 (decoupled
    PPO); TOPR, CISPO and IPA take their ratio pi_theta / mu against the behaviour policy mu
    itself (``batch.behav_logp``, the generator's log-probs), as their papers define it.
    ``norm_mask``: the mask of the whole mini-batch when ``batch`` is one micro-batch of it,
    whose counts then normalise every term, so the micro-batch losses add up to the
    mini-batch's (None: ``batch`` is the whole mini-batch).
    ``entropy`` (B, T): the policy's entropy per token, logged as ``loss/entropy`` (token mean)
    and, with ``entropy_coef`` > 0, a bonus  - entropy_coef * aggregate(H, entropy_mask)  on the
    tokens of ``entropy_mask`` (default: ``batch.mask``; AsyPPO leaves out the states its
    critics disagree on).
    """
    m, spec = batch.mask, a.spec
    nm = m if norm_mask is None else norm_mask
    denom = A.agg_denominator(nm, a.loss_agg)
    loss, met = a.policy_loss.run(a, logp, old_logp, adv, batch, denom)
    met = {f"loss/{k}": v for k, v in met.items()}
    met["loss/pg"] = float(loss.detach())
    if a.kl_coef > 0 and not spec.kl_in_reward and ref_logp is not None:
        kl = A.aggregate(A.kl_k3(logp, ref_logp), m, a.loss_agg, denom)
        loss = loss + a.kl_coef * kl
        met["loss/kl"] = float(kl.detach())
    if spec.value_head and values is not None:
        vf = A.aggregate((values - returns) ** 2, m, "token-mean", A.agg_denominator(nm, "token-mean"))
        loss = loss + a.vf_coef * vf
        met["loss/value"] = float(vf.detach())
    if entropy is not None:
        met["loss/entropy"] = float(A.aggregate(entropy.detach(), m, "token-mean", A.agg_denominator(nm, "token-mean")))
        if a.entropy_coef > 0:
            bonus = A.aggregate(entropy, m if entropy_mask is None else entropy_mask, a.loss_agg, denom)
            loss = loss - a.entropy_coef * bonus
            met["loss/entropy_bonus"] = float(bonus.detach())
    met["loss/total"] = float(loss.detach())
    return loss, met


# Each micro-batch's loss is its share of the mini-batch's: these add up, other metrics average.
ADDITIVE_METRICS = ("loss/pg", "loss/kl", "loss/value", "loss/total", "loss/entropy", "loss/entropy_bonus")


def combine_metrics(parts: list[dict[str, float]], additive=()) -> dict[str, float]:
    return {k: sum(p[k] for p in parts) / (1 if k in additive else len(parts)) for k in parts[0]}


def _rows(x, idx):
    return None if x is None else x[idx]


def update_policy(policy, a: AlgorithmConfig, batch: Batch, temperature: float,
                  allowed_ids: list[int] | None = None, aux: dict[str, torch.Tensor] | None = None,
                  shard: tuple[int, int] = (0, 1), top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0, repetition_penalty: float = 1.0) -> dict[str, float]:
    """One training step on a batch: advantages, then ppo_epochs x mini_batches optimizer steps.

    A mini-batch runs in micro-batches of ``engine.micro_batch_size`` sequences (0: as many as
    keep each forward's logits within ``engine.logits_mib``, :func:`micro_rows`):
    each is forwarded and backwarded with its loss normalised by the *mini-batch's* token /
    sequence counts, and their gradients accumulate into the mini-batch's one optimizer step,
    the same step as unsplit. The batch moves to the policy's device first. ``allowed_ids``:
    the token ids of constrained decoding (``generation.allowed_tokens``), None for all;
    ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``: the generator's processing, applied to
    every log-prob here too.
    ``aux``: what the batch roles computed on this batch (:class:`~.base.BatchRole`), tensors
    aligned with its rows: ``ref_logp`` (B, T), the frozen reference's log-probs (KL);
    ``credit_scale`` (B, T), the attention-rhythm scale of each token's advantage; AsyPPO's
    ``values`` and ``value_std`` (B, T), the mini-critics' mean value and its spread.

    ``shard = (rank, world)``, data parallel: every rank gets the whole batch, computes the
    proximal log-probs and the advantages over all of it (as one rank would), and trains on
    its own slice of each mini-batch, normalised by the whole mini-batch's counts and scaled
    by ``world`` because DeepSpeed averages the ranks' gradients: their sum is then the
    gradient one rank takes on the whole batch. Additive loss metrics are this rank's share.
    """
    rank, world = shard
    batch = batch.to(policy.device)
    allowed = None if allowed_ids is None else torch.tensor(allowed_ids, device=policy.device)
    micro = micro_rows(policy.cfg, batch, policy.module.lm.config.vocab_size)
    # One optimizer step over one forward: the proximal policy is the current one, so that
    # forward's log-probs serve as old_logp, and no separate no-grad pass is needed.
    single = a.ppo_epochs == 1 and a.mini_batches == 1 and not 0 < micro < batch.size and world == 1
    aux = {k: v.to(policy.device) for k, v in (aux or {}).items()}
    ref_logp, credit = aux.get("ref_logp"), aux.get("credit_scale")
    # AsyPPO: the mini-critics' mean value is the baseline (values), their spread (value_std)
    # masks the advantages where they agree and the entropy bonus where they disagree
    critic_values = aux.get("values")
    agree, disagree = (A.uncertainty_masks(aux["value_std"], batch.mask, mask_quantile=a.critics.mask_quantile,
                                           entropy_quantile=a.critics.entropy_quantile)
                       if a.spec.critics else (None, None))
    with torch.no_grad():
        old_logp, old_values = (None, None) if single else token_logp(policy.forward, batch, temperature, micro,
                                                                      allowed, top_k, top_p, min_p=min_p,
                                                                      repetition_penalty=repetition_penalty,
                                                                      trim_prompt=True)

    def advantages(old, values):
        ref = ref_logp if ref_logp is not None else old
        values = values if values is not None else critic_values
        adv, returns = compute_advantages(a, batch, old, ref, None if values is None else values.detach())
        if agree is not None:
            adv = torch.where(agree, 0.0, adv)
        return (adv, returns) if credit is None else (R.scale_advantages(adv, credit), returns)

    adv, returns = (None, None) if single else advantages(old_logp, old_values)
    steps = []
    for _ in range(a.ppo_epochs):
        for mini in torch.arange(batch.size).chunk(a.mini_batches):
            norm_mask = batch.mask[mini]
            mine = mini.tensor_split(world)[rank]
            # as many micro-batches on every rank: ZeRO's collectives in each forward (ZeRO-3) and backward pair
            # up across ranks (a rank with one micro-batch more brings ZeRO-2's gloo group down)
            parts = mine.tensor_split(-(-len(mini.tensor_split(world)[0]) // micro)) if micro else [mine]
            micro_metrics = []
            for i, idx in enumerate(parts):
                mb = batch if single else batch.select(idx)
                logp, values, entropy = token_logp(policy.forward, mb, temperature, allowed=allowed, top_k=top_k,
                                                   top_p=top_p, with_entropy=True, min_p=min_p,
                                                   repetition_penalty=repetition_penalty, trim_prompt=True)
                if a.entropy_coef == 0:  # a metric only: its graph would keep this micro-batch's logits alive
                    entropy = entropy.detach()
                if single:
                    old_logp = logp.detach()
                    adv, returns = advantages(old_logp, values)
                loss, met = compute_loss(a, logp, old_logp[idx], adv[idx], mb, _rows(ref_logp, idx), values,
                                         _rows(returns, idx), norm_mask=norm_mask, entropy=entropy,
                                         entropy_mask=None if disagree is None else mb.mask & ~disagree[idx])
                policy.backward(loss * world, last=i == len(parts) - 1)
                micro_metrics.append(met)
            steps.append({**combine_metrics(micro_metrics, ADDITIVE_METRICS), "grad_norm": policy.step()})
    metrics = combine_metrics(steps)
    if agree is not None:
        metrics["asyppo/adv_masked_frac"] = A.masked_mean(agree.float(), batch.mask).item()
        metrics["asyppo/entropy_excluded_frac"] = A.masked_mean(disagree.float(), batch.mask).item()
    return metrics
