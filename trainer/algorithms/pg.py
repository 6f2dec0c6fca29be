"""Policy-gradient maths of the trainer: advantages, losses, off-policy weights.

Every function is a pure function of tensors. Shared conventions:

- a batch holds ``B`` sequences of ``T`` tokens;
- ``mask`` (B, T), bool or float: 1 on tokens the policy generated and is trained on,
  0 on prompt, padding and environment-observation tokens. Values of any other tensor at
  unmasked positions are ignored (they may be garbage, even ``inf``: they are selected
  away with ``torch.where``, never multiplied by 0, so they cannot turn the loss into NaN);
- ``logp`` current policy, ``old_logp`` the trainer's policy before this update (the
  *proximal* policy), ``ref_logp`` reference policy, ``behav_logp`` the generator that
  actually sampled (e.g. vLLM, possibly older weights in async rollout): all (B, T)
  per-token log-probabilities of the sampled tokens;
- ``rewards`` (B,) outcome reward per sequence; ``group_ids`` (B,) int, one GRPO group
  per distinct id;
- losses are minimised and return ``(loss, metrics)``: a scalar tensor and a dict of
  python floats; every per-token loss is reduced by :func:`aggregate`;
- standard deviations are population ones (``unbiased=False``) and every denominator that
  counts tokens or sequences is clamped to >= 1, so empty masks give 0, never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


# --------------------------------------------------------------------------- helpers


def _bool(mask: Tensor) -> Tensor:
    return mask.bool() if mask.dtype != torch.bool else mask


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x over mask) / max(#mask, 1): the mean over masked entries, 0 for an empty mask."""
    m = _bool(mask)
    return torch.where(m, x, 0.0).sum() / m.sum().clamp(min=1)


def _per_token(adv: Tensor, like: Tensor) -> Tensor:
    """Broadcast sequence-level (B,) advantages to (B, T); pass (B, T) through."""
    if adv.dim() == 1:
        return adv.unsqueeze(-1).expand_as(like)
    if adv.shape != like.shape:
        raise ValueError(f"advantages of shape {tuple(adv.shape)} do not match {tuple(like.shape)}")
    return adv


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


def agg_denominator(mask: Tensor, mode: str = "token-mean") -> Tensor:
    """What :func:`aggregate` divides by for ``mask``: its number of masked tokens
    (``"token-mean"``) or of sequences with at least one masked token (``"seq-mean-*"``),
    clamped to >= 1."""
    _check_mode(mode)
    m = _bool(mask)
    n = m.sum() if mode == "token-mean" else (m.sum(-1) > 0).sum()
    return n.clamp(min=1)


def aggregate(loss_tok: Tensor, mask: Tensor, mode: str = "token-mean", denom: Tensor | float | None = None) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the masked tokens.

    - ``"token-mean"``:  sum_{b,t} m*l / sum_{b,t} m  (every token weighs the same;
      DAPO's token-level loss: long answers are not down-weighted);
    - ``"seq-mean-token-mean"``: mean_b [ sum_t m*l / sum_t m ]  (original GRPO);
    - ``"seq-mean-token-sum"``:  mean_b [ sum_t m*l ]  (sequence log-likelihood, REINFORCE).

    The sequence means run over sequences with at least one masked token: a sequence whose
    mask was zeroed (e.g. dropped after an environment failure) must not dilute the others.
    ``denom`` replaces that count (:func:`agg_denominator` of this mask): a micro-batch of a
    larger mini-batch passes the mini-batch's, so that the micro-batch losses (and their
    gradients) add up exactly to the mini-batch's.
    """
    _check_mode(mode)
    if loss_tok.shape != mask.shape:
        raise ValueError(f"loss shape {tuple(loss_tok.shape)} != mask shape {tuple(mask.shape)}")
    m = _bool(mask)
    if denom is None:
        denom = agg_denominator(m, mode)
    tok = torch.where(m, loss_tok, 0.0)
    if mode == "seq-mean-token-mean":
        return (tok.sum(-1) / m.sum(-1).clamp(min=1)).sum() / denom
    return tok.sum() / denom  # token-mean and seq-mean-token-sum: a plain sum, divided differently


# --------------------------------------------------------------------------- advantages


def grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6,
                    std_normalize: bool = True, weights: Tensor | None = None) -> Tensor:
    """GRPO outcome advantages, (B,) -> (B,).

    A_i = (R_i - mean_g R) / (std_g R + eps)   for i in group g, std with ``unbiased=False``
    (the group's own spread: a group of one, or a group of equal rewards, gets A = 0 instead
    of NaN). ``std_normalize=False`` is Dr.GRPO: A_i = R_i - mean_g R, which avoids
    over-weighting groups whose rewards barely differ. ``weights`` (B,): each row's weight in
    its group's mean and std (default 1); rows of an episode split into n segments weigh 1/n
    each, so the statistics count episodes, not segments.
    """
    r = rewards.float()
    w = torch.ones_like(r) if weights is None else weights.to(r)
    _, g = torch.unique(group_ids, return_inverse=True)
    n_groups = int(g.max()) + 1 if g.numel() else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, g, w)
    mean = torch.zeros_like(count).index_add_(0, g, w * r) / count
    adv = r - mean[g]
    if not std_normalize:
        return adv
    var = torch.zeros_like(count).index_add_(0, g, w * adv * adv) / count
    return adv / (var.sqrt()[g] + eps)


def reinforce_pp_advantages(rewards: Tensor, mask: Tensor, logp_old: Tensor, ref_logp: Tensor,
                            *, kl_coef: float, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ (Hu 2025) token advantages, (B, T).

    Per-token reward  r_t = -kl_coef * (logp_old_t - ref_logp_t)  on response tokens, plus the
    outcome reward R on the last response token of the sequence (a sequence with an empty
    mask receives nothing). Return-to-go with gamma = 1, G_t = sum_{s >= t} r_s, then
    whitened over all response tokens of the batch: A = (G - mean) / (std + eps)
    (global statistics replace the critic / the group baseline). 0 on unmasked tokens.
    """
    m = _bool(mask)
    r_tok = torch.where(m, -kl_coef * (logp_old - ref_logp).detach(), 0.0).float()
    T = m.shape[-1]
    pos = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, pos, -1).max(-1).values  # -1 when the mask is empty
    has_resp = last >= 0
    r_tok[has_resp, last[has_resp]] += rewards.float()[has_resp]
    # reverse cumulative sum = return-to-go; unmasked tokens carry 0 reward so they are transparent
    returns = r_tok.flip(-1).cumsum(-1).flip(-1)
    mean = masked_mean(returns, m)
    std = masked_mean((returns - mean) ** 2, m).sqrt()
    return torch.where(m, (returns - mean) / (std + eps), 0.0)


def outcome_on_last_token(rewards: Tensor, mask: Tensor) -> Tensor:
    """Per-token rewards (B, T) for an outcome reward (B,): R on each row's last masked token,
    0 elsewhere (a row with an empty mask gets it on token 0, where the mask drops it)."""
    m = _bool(mask)
    pos = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    last = torch.where(m, pos, -1).max(-1).values.clamp(min=0)
    r_tok = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    r_tok[torch.arange(m.shape[0], device=m.device), last] = rewards.float()
    return r_tok


def gae(rewards_tok: Tensor, values: Tensor, mask: Tensor, *, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over response tokens, returns (advantages, returns).

    Backwards over t, on masked positions only:
        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next
    where V_next / A_next belong to the next *masked* position (0 after the last one).
    Unmasked tokens are skipped (A = returns = 0 there, and their r and V are ignored):
    in a multi-turn sequence the environment's observation tokens are transparent, so the
    last token of turn k bootstraps from the first token of turn k+1. Put turn rewards on a
    response token (e.g. the last of the turn). returns = A + V on masked tokens.
    """
    m = _bool(mask)
    B, T = m.shape
    r, v = rewards_tok.float(), values.detach().float()
    adv = torch.zeros(B, T, dtype=r.dtype, device=r.device)
    next_v = torch.zeros(B, dtype=r.dtype, device=r.device)
    next_a = torch.zeros_like(next_v)
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_v - v[:, t]
        a = delta + gamma * lam * next_a
        on = m[:, t]
        adv[:, t] = torch.where(on, a, 0.0)
        next_v = torch.where(on, v[:, t], next_v)
        next_a = torch.where(on, a, next_a)
    returns = torch.where(m, adv + v, 0.0)
    return adv, returns


# --------------------------------------------------------------------------- off-policy weights


def tis_weights(old_logp: Tensor, behav_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """Truncated importance-sampling weights for generator/trainer mismatch, (B, T).

    w_t = min(pi_old(y_t) / pi_behav(y_t), cap) = min(exp(old_logp - behav_logp), cap),
    detached (a weight, not a path for the gradient), 0 on unmasked tokens. The generator
    (vLLM: other kernels, other precision) samples from pi_behav, not from the trainer's
    pi_old; the cap (Yao et al. 2025, "TIS", C = 2) bounds the variance.
    """
    m = _bool(mask)
    log_w = torch.where(m, (old_logp - behav_logp).detach(), 0.0)
    return torch.where(m, log_w.exp().clamp(max=cap), 0.0)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman 2020), same shape as the inputs.

    k3 = exp(ref - logp) - (ref - logp) - 1  >= 0, unbiased for samples drawn from pi.
    """
    d = ref_logp - logp
    return d.exp() - d - 1


# --------------------------------------------------------------------------- losses


def clipped_surrogate(ratio: Tensor, adv: Tensor, *, clip_low: float, clip_high: float) -> Tensor:
    """PPO's per-token pessimistic loss: max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                  clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
                  is_weight: Tensor | None = None, agg: str = "token-mean",
                  denom: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """PPO clipped surrogate (GRPO, PPO, REINFORCE++, decoupled PPO), scalar loss + metrics.

    r_t = exp(logp - old_logp);  l_t = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))
    (asymmetric bounds: DAPO's clip-higher). ``advantages`` (B,) are broadcast over tokens.
    Dual clip (Ye et al. 2020), c = ``dual_clip`` > 1: for A < 0, l_t = min(l_t, c * |A|),
    so a token whose ratio exploded cannot dominate the batch.
    ``is_weight`` (B, T), detached, multiplies l_t: decoupled PPO (Hilton et al. 2021) passes
    pi_prox / pi_behav with ``old_logp`` = the proximal policy; or pass :func:`tis_weights`.
    ``denom``: see :func:`aggregate` (every loss here takes it, for micro-batches).
    Metrics: clip_frac (tokens where the clipped branch is taken), dual_clip_frac,
    approx_kl (k3 estimate of KL(pi_old || pi): r - 1 - log r), ratio_mean.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    m = _bool(mask)
    log_ratio = torch.where(m, logp - old_logp, 0.0)
    ratio = log_ratio.exp()
    adv = _per_token(advantages, ratio).detach()
    loss_tok = clipped_surrogate(ratio, adv, clip_low=clip_low, clip_high=clip_high)
    clipped = loss_tok > -adv * ratio  # the clipped branch won the max
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        cap = -adv * dual_clip  # = c * |A| where A < 0
        dual = (adv < 0) & (loss_tok > cap)
        loss_tok = torch.where(dual, cap, loss_tok)
    if is_weight is not None:
        loss_tok = loss_tok * is_weight.detach()
    loss = aggregate(loss_tok, m, agg, denom)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean(clipped.float(), m).item(),
            "dual_clip_frac": masked_mean(dual.float(), m).item(),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
        }
    return loss, metrics


def topr_loss(logp: Tensor, behav_logp: Tensor, rewards_or_adv: Tensor, mask: Tensor, *,
              agg: str = "seq-mean-token-sum", denom: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """Tapered Off-Policy REINFORCE (Le Roux et al. 2025), scalar loss + metrics.

    With trajectories y ~ mu (``behav_logp`` = log mu, the policy that sampled: the
    generator's log-probs, not a recomputation by the trainer) and
    R = ``rewards_or_adv`` (B,) (a reward, or a reward minus a baseline), the paper's
    gradient is
        sum_{R >= 0} R grad log pi(y)  +  sum_{R < 0} sg([pi(y)/mu(y)]_0^1) R grad log pi(y).
    Implemented per token:  l_t = -w * R * logp_t, with w = 1 for R >= 0 (plain REINFORCE,
    i.e. truncated IS at [1, 1]: no ratio at all) and, for R < 0,
    w = sg(clip(rho, 0, 1)), rho = exp(sum_t m_t (logp_t - behav_logp_t)) the *sequence* ratio.
    Positives are pushed up like SFT whatever their probability; negatives are pushed down
    only as much as pi still assigns to them, which keeps the update stable off-policy.
    ``agg="seq-mean-token-sum"`` (this function's default) makes sum_t logp_t = log pi(y),
    exactly the paper; "token-mean" is the length-normalised variant. The trainer passes
    ``algorithm.loss_agg``, whose default is token-mean (one default for every algorithm):
    set ``loss_agg: seq-mean-token-sum`` for the paper's form.
    Metrics: pos_frac, neg_weight_mean (mean w over negatives), log_seq_ratio_mean.
    """
    m = _bool(mask)
    R = rewards_or_adv.detach().float()
    log_rho = torch.where(m, logp - behav_logp, 0.0).sum(-1).detach()
    neg = R < 0
    # clip(exp(x), 0, 1) == exp(min(x, 0)): no overflow for long sequences
    w = torch.where(neg, log_rho.clamp(max=0.0).exp(), torch.ones_like(R))
    loss_tok = -(w * R).unsqueeze(-1) * logp
    loss = aggregate(loss_tok, m, agg, denom)
    with torch.no_grad():
        metrics = {
            "pos_frac": (~neg).float().mean().item() if R.numel() else 0.0,
            "neg_weight_mean": (w[neg].sum() / neg.sum().clamp(min=1)).item(),
            "log_seq_ratio_mean": log_rho.mean().item() if R.numel() else 0.0,
        }
    return loss, metrics


def cispo_loss(logp: Tensor, behav_logp: Tensor, advantages: Tensor, mask: Tensor, *,
               eps_high: float, eps_low: float | None = None, agg: str = "token-mean",
               denom: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """CISPO (MiniMax-M1, 2025), scalar loss + metrics.

    l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * logp_t,  r_t = exp(logp_t - behav_logp_t),
    the importance ratio to the policy that sampled the tokens (``behav_logp``: the generator's).
    MiniMax-M1 uses no lower bound (its eps_low is set "to a large value"): ``eps_low=None``
    (the default, and what the trainer passes) clips the weight to [0, 1 + eps_high].
    Unlike PPO, clipping the *weight* instead of the objective never zeroes a token's
    gradient: rare, high-ratio "fork" tokens still learn, just with a bounded weight.
    The loss value is a surrogate; its gradient  -clip(r) * A * grad logp  is what matters.
    Metrics: clip_frac (tokens whose ratio was clipped), approx_kl, ratio_mean.
    """
    m = _bool(mask)
    log_ratio = torch.where(m, logp - behav_logp, 0.0).detach()
    ratio = log_ratio.exp()
    w = ratio.clamp(max=1 + eps_high) if eps_low is None else ratio.clamp(1 - eps_low, 1 + eps_high)
    adv = _per_token(advantages, ratio).detach()
    loss = aggregate(-w * adv * logp, m, agg, denom)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((w != ratio).float(), m).item(),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
        }
    return loss, metrics


def sft_loss(logp: Tensor, weights: Tensor, mask: Tensor, *, agg: str = "token-mean",
             denom: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """Maximum likelihood on weighted sequences (RAFT's fine-tuning step), scalar loss + metrics.

    l_t = -w_b * logp_t with ``weights`` (B,) detached (RAFT: 1 on accepted samples, 0 on the
    rest). Rejected tokens stay in the denominator: the step shrinks when few samples are
    accepted, as a REINFORCE step with 0/1 rewards would. Metrics: accepted_frac (of the
    sequences), nll_accepted (mean -logp over the accepted sequences' tokens).
    """
    m = _bool(mask)
    w = weights.detach().float()
    loss = aggregate(-w.unsqueeze(-1) * logp, m, agg, denom)
    with torch.no_grad():
        acc = m & (w > 0).unsqueeze(-1)
        metrics = {
            "accepted_frac": (w > 0).float().mean().item() if w.numel() else 0.0,
            "nll_accepted": masked_mean(-logp, acc).item(),
        }
    return loss, metrics


def raft_accept(rewards: Tensor, group_ids: Tensor, *, top_k: int, min_reward: float | None = None,
                weights: Tensor | None = None) -> Tensor:
    """RAFT's rejection sampling (Dong et al. 2023), (B,) -> (B,) float: 1 accepted, 0 rejected.

    Within each group, rows are ranked by reward (ties: the earlier row first); a row is
    accepted if fewer than ``top_k`` episodes rank before it (``top_k`` = 0: no limit) and its
    reward is > ``min_reward`` (None: no threshold). ``weights`` (B,), as in
    :func:`grpo_advantages`: an episode split into n consecutive rows weighs 1/n per row, so
    the rank counts episodes.
    """
    r = rewards.float()
    w = torch.ones_like(r) if weights is None else weights.to(r)
    B = r.shape[0]
    idx = torch.arange(B, device=r.device)
    same = group_ids.unsqueeze(0) == group_ids.unsqueeze(1)                          # [i, j]: j in i's group
    rj, ri = r.unsqueeze(0), r.unsqueeze(1)
    before = (rj > ri) | ((rj == ri) & (idx.unsqueeze(0) < idx.unsqueeze(1)))       # [i, j]: j ranks before i
    ahead = (same & before).float() @ w                                              # episodes ranked before row i
    ok = torch.ones(B, dtype=torch.bool, device=r.device)
    if top_k > 0:
        ok &= ahead < top_k - 1e-6
    if min_reward is not None:
        ok &= r > min_reward
    return ok.float()


def uncertainty_masks(value_std: Tensor, mask: Tensor, *, mask_quantile: float,
                      entropy_quantile: float) -> tuple[Tensor, Tensor]:
    """AsyPPO's uncertainty-aware loss reconstruction (Liu et al. 2025): (agree, disagree), bool (B, T).

    ``value_std`` (B, T): the spread of the mini-critics' values per state. Of the n masked
    states of the batch ranked by std,
        agree    = the floor(mask_quantile * n) lowest: advantage masked to 0 (the critics are
                   sure, the gradient adds little signal),
        disagree = the floor((1 - entropy_quantile) * n) highest: left out of the entropy
                   bonus (exploring where the value is unknown is spurious),
    i.e. the states below / above those quantiles of the std. By rank rather than by
    comparing to the quantile's value: identical states (every episode's first turn on one
    map) tie, and a tie at the threshold would mask all or none of them. Ties go by position
    (the earlier state ranks lower). Quantile 0 / 1 switch each effect off.
    """
    m = _bool(mask)
    s = value_std.detach().float().flatten()
    on = m.flatten().nonzero().squeeze(-1)
    order = on[s[on].argsort(stable=True)]  # masked positions, lowest std first
    n = order.numel()
    n_agree = math.floor(mask_quantile * n + 1e-9)
    n_disagree = math.floor((1 - entropy_quantile) * n + 1e-9)
    agree = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    disagree = torch.zeros_like(agree)
    agree[order[:n_agree]] = True
    disagree[order[n - n_disagree:]] = True
    return agree.view_as(m), disagree.view_as(m)
