"""The one table of algorithms: ``algorithm.name`` -> the advantage estimator and the policy
loss that run, as functions, and the ``algorithm.*`` keys each reads.

An estimator or a loss is a :class:`Part`: the function that applies the pure maths of
:mod:`.pg` and :mod:`.credit` to a batch (a ``roles.update.Batch``: padded tensors, ``mask``
on the policy's tokens) with the algorithm's config, and the keys it reads (config
validation rejects a non-default value of a key that the configured run would not read).
An :class:`AlgorithmSpec` holds its two parts themselves, so running an algorithm is one
lookup: ``ALGORITHMS[name].select(turn_credit, ipa)`` -> (estimator, loss).

Signatures: an estimator ``run(a, batch, old_logp, ref_logp, values) -> (advantages, PPO
returns or None)``, a loss ``run(a, logp, old_logp, adv, batch, denom) -> (loss, metrics)``
(``a``: the :class:`~rockroll.trainer.config.AlgorithmConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import credit as C
from . import pg as A

__all__ = ["ADVANTAGES", "ADVANTAGE_KEYS", "ALGORITHMS", "AlgorithmSpec", "LOSSES", "LOSS_KEYS", "Part"]


@dataclass(frozen=True)
class Part:
    """An advantage estimator or a policy loss: its name, the function that runs it on a
    batch, and the ``algorithm.*`` keys it reads."""

    name: str
    run: Callable[..., Any]
    keys: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- advantages


def _grpo(a, b, old, ref, v):
    return A.grpo_advantages(b.rewards, b.group_ids, std_normalize=a.std_normalize, weights=b.row_weights), None


def _dr_grpo(a, b, old, ref, v):  # a group baseline, no std scaling (TOPR weighs by the sign)
    return A.grpo_advantages(b.rewards, b.group_ids, std_normalize=False, weights=b.row_weights), None


def _gae(a, batch, old_logp, ref_logp, values):
    # outcome reward on the last response token; GAE over response tokens (observations transparent)
    r_tok = A.outcome_on_last_token(batch.rewards, batch.mask)
    adv, returns = A.gae(r_tok, values, batch.mask, gamma=a.gamma, lam=a.lam)
    mean = A.masked_mean(adv, batch.mask)
    std = A.masked_mean((adv - mean) ** 2, batch.mask).sqrt()
    return torch.where(batch.mask, (adv - mean) / (std + 1e-6), 0.0), returns


def _reinforce_pp(a, b, old, ref, v):  # kl_coef shapes its per-token reward
    return A.reinforce_pp_advantages(b.rewards, b.mask, old, ref, kl_coef=a.kl_coef), None


def _turn(a, batch, old_logp, ref_logp, values):  # turn_credit=discounted
    if bool((batch.row_weights < 1).any()):
        raise ValueError("turn_credit=discounted: an agent episode was split into segments (it rewrote its "
                         "history), whose turns have no common position; use turn_credit: outcome, or ipa.enabled")
    # every turn's reward must sit on its own chunk: a turn without tokens would shift the credit
    if not torch.equal(C.num_chunks(batch.mask), batch.num_turn_rewards):
        raise ValueError("turn_credit=discounted: a sample's response chunks do not match its turn rewards")
    return C.turn_advantages(batch.turn_rewards, batch.mask, batch.group_ids, a.gamma,
                             std_normalize=a.std_normalize), None


def _ipa(a, b, old, ref, v):  # ipa.enabled (ipa.gamma, ipa.returns): Eq 7's chunk returns
    if a.ipa.returns == "group_normalized":  # rockroll's pre-#40 credit, a named option
        return C.ipa_group_returns(b.rewards, b.group_ids, b.mask, a.ipa.gamma, weights=b.row_weights,
                                   chunks_after=b.chunks_after), None
    return C.ipa_returns(b.rewards, b.mask, a.ipa.gamma, chunks_after=b.chunks_after), None


def _raft(a, b, old, ref, v):  # 0/1 acceptance weights (algorithm.raft.*), not advantages
    return A.raft_accept(b.rewards, b.group_ids, top_k=a.raft.top_k, min_reward=a.raft.min_reward,
                         weights=b.row_weights), None


ADVANTAGES: dict[str, Part] = {p.name: p for p in (
    Part("grpo", _grpo, ("std_normalize",)),
    Part("dr_grpo", _dr_grpo),
    Part("gae", _gae, ("gamma", "lam")),
    Part("reinforce_pp", _reinforce_pp),
    Part("turn", _turn, ("std_normalize", "gamma")),
    Part("ipa", _ipa),
    Part("raft", _raft),
)}


# ----------------------------------------------------------------------------- losses


def _ppo_clip(a, logp, old_logp, adv, batch, denom):  # PPO's clipped ratio to the proximal policy
    m = batch.mask
    is_w = A.tis_weights(old_logp, batch.behav_logp, m, cap=a.tis_cap) if a.tis_cap > 0 else None
    loss, met = A.ppo_clip_loss(logp, old_logp, adv, m, clip_low=a.clip_low, clip_high=a.clip_high,
                                dual_clip=a.dual_clip, is_weight=is_w, agg=a.loss_agg, denom=denom)
    if is_w is not None:
        met["tis_weight_mean"] = A.masked_mean(is_w, m).item()
    return loss, met


def _topr(a, logp, old, adv, b, denom):  # no clip: TOPR tapers by the sequence ratio
    return A.topr_loss(logp, b.behav_logp, adv, b.mask, agg=a.loss_agg, denom=denom)


def _cispo(a, logp, old, adv, b, denom):  # the ratio to the generator, directly; no lower clip (MiniMax-M1)
    return A.cispo_loss(logp, b.behav_logp, adv, b.mask, eps_high=a.clip_high, agg=a.loss_agg, denom=denom)


def _ipa_loss(a, logp, old, adv, b, denom):  # Eq 9 on chunk ratios to pi_old, Eq 8's mask (ipa.mask_threshold)
    return C.ipa_loss(logp, old, b.behav_logp, adv, b.mask, threshold=a.ipa.mask_threshold, agg=a.loss_agg,
                      denom=denom)


def _sft(a, logp, old, adv, b, denom):  # maximum likelihood, no ratio (raft)
    return A.sft_loss(logp, adv, b.mask, agg=a.loss_agg, denom=denom)


LOSSES: dict[str, Part] = {p.name: p for p in (
    Part("ppo_clip", _ppo_clip, ("clip_low", "clip_high", "dual_clip", "tis_cap")),
    Part("topr", _topr),
    Part("cispo", _cispo, ("clip_high",)),
    Part("ipa", _ipa_loss),
    Part("sft", _sft),
)}

# the keys each part reads, by name
ADVANTAGE_KEYS: dict[str, tuple[str, ...]] = {name: p.keys for name, p in ADVANTAGES.items()}
LOSS_KEYS: dict[str, tuple[str, ...]] = {name: p.keys for name, p in LOSSES.items()}


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class AlgorithmSpec:
    """One entry of :data:`ALGORITHMS`: the advantage estimator and policy loss it runs, a
    critic (value head, GAE, ``vf_coef``), whether the KL to the reference is part of the
    reward (then not of the loss), and which credit options apply (``turn_credit:
    discounted``, ``ipa.enabled``: group-normalised advantages only). ``critics``: separate
    mini-critics (:mod:`rockroll.trainer.roles.critics`, AsyPPO) give the values, and their
    disagreement reshapes the loss (``algorithm.critics.*``)."""

    advantages: Part
    loss: Part
    value_head: bool = False
    kl_in_reward: bool = False
    turn_credit: bool = False
    ipa: bool = False
    critics: bool = False

    def select(self, turn_credit: str = "outcome", ipa: bool = False) -> tuple[Part, Part]:
        """(estimator, loss) that run with these credit options, where they apply: discounted
        turn credit replaces the estimator, IPA the estimator and the loss."""
        ipa = ipa and self.ipa
        adv = ADVANTAGES["ipa"] if ipa else self.advantages
        if turn_credit == "discounted" and self.turn_credit:
            adv = ADVANTAGES["turn"]
        return adv, LOSSES["ipa"] if ipa else self.loss

    def parts(self, turn_credit: str = "outcome", ipa: bool = False) -> tuple[str, str]:
        """The names of :meth:`select`'s parts."""
        adv, loss = self.select(turn_credit, ipa)
        return adv.name, loss.name

    def reads(self, turn_credit: str = "outcome", ipa: bool = False) -> frozenset[str]:
        """The ``algorithm.*`` keys this algorithm reads with these credit options."""
        adv, loss = self.select(turn_credit, ipa)
        return frozenset((*adv.keys, *loss.keys, *(("vf_coef",) if self.value_head else ())))


ALGORITHMS: dict[str, AlgorithmSpec] = {
    "grpo": AlgorithmSpec(ADVANTAGES["grpo"], LOSSES["ppo_clip"], turn_credit=True, ipa=True),
    "ppo": AlgorithmSpec(ADVANTAGES["gae"], LOSSES["ppo_clip"], value_head=True),
    "reinforce_pp": AlgorithmSpec(ADVANTAGES["reinforce_pp"], LOSSES["ppo_clip"], kl_in_reward=True),
    "topr": AlgorithmSpec(ADVANTAGES["dr_grpo"], LOSSES["topr"]),
    "cispo": AlgorithmSpec(ADVANTAGES["grpo"], LOSSES["cispo"], turn_credit=True),
    "asyppo": AlgorithmSpec(ADVANTAGES["gae"], LOSSES["ppo_clip"], critics=True),
    "raft": AlgorithmSpec(ADVANTAGES["raft"], LOSSES["sft"]),
}
