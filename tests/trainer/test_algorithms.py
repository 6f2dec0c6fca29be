"""Hand-computed checks of rockroll.trainer.algorithms.

Every expected number is written out with its arithmetic in a comment; none is obtained by
calling the formula under test.
"""

import math

import pytest

import torch  # a declared test dependency: a plain import, never a skip

from rockroll.trainer.algorithms.pg import (  # noqa: E402
    agg_denominator, aggregate, cispo_loss, gae, grpo_advantages, kl_k3, masked_mean, ppo_clip_loss,
    reinforce_pp_advantages, tis_weights, topr_loss,
)

from _tensors import LN, close, t  # noqa: E402


# --------------------------------------------------------------------------- aggregation

LOSS_2x3 = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
MASK_2x3 = [[1, 1, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2 = (1.5 + 4) / 2
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2
    ],
)
def test_aggregate_modes(mode, expected):
    close(aggregate(t(LOSS_2x3), t(MASK_2x3), mode), expected)
    # a third sequence with an empty mask is ignored, not averaged in as a zero
    loss3 = t(LOSS_2x3 + [[9.0, 9.0, 9.0]])
    mask3 = torch.tensor(MASK_2x3 + [[0, 0, 0]], dtype=torch.bool)
    close(aggregate(loss3, mask3, mode), expected)


@pytest.mark.parametrize(
    ("mode", "denom", "row0", "row1"),
    [
        # the mini-batch has 3 masked tokens: row 0 -> (1 + 2) / 3 = 1, row 1 -> 4 / 3; sum 7/3
        ("token-mean", 3, 1.0, 4 / 3),
        # 2 non-empty sequences: row 0 -> ((1 + 2) / 2) / 2 = 0.75, row 1 -> (4 / 1) / 2 = 2; sum 2.75
        ("seq-mean-token-mean", 2, 0.75, 2.0),
        # 2 non-empty sequences: row 0 -> (1 + 2) / 2 = 1.5, row 1 -> 4 / 2 = 2; sum 3.5
        ("seq-mean-token-sum", 2, 1.5, 2.0),
    ],
)
def test_aggregate_micro_batches_add_up_with_the_mini_batch_denominator(mode, denom, row0, row1):
    loss, mask = t(LOSS_2x3), t(MASK_2x3)
    assert agg_denominator(mask, mode).item() == denom
    d = agg_denominator(mask, mode)
    close(aggregate(loss[:1], mask[:1], mode, d), row0)
    close(aggregate(loss[1:], mask[1:], mode, d), row1)
    # an empty mask still divides by at least 1
    assert agg_denominator(torch.zeros(2, 3), mode).item() == 1


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_empty_mask_is_zero_not_nan(mode):
    out = aggregate(t(LOSS_2x3), torch.zeros(2, 3), mode)
    assert out.item() == 0.0


def test_aggregate_ignores_garbage_at_unmasked_positions():
    loss = t([[1.0, float("inf")], [float("nan"), 3.0]])
    close(aggregate(loss, t([[1, 0], [0, 1]]), "token-mean"), 2.0)  # (1 + 3) / 2


def test_aggregate_unknown_mode_names_it():
    with pytest.raises(ValueError, match="token-median"):
        aggregate(t(LOSS_2x3), t(MASK_2x3), "token-median")


def test_masked_mean():
    close(masked_mean(t([2.0, 4.0, 100.0]), t([1, 1, 0])), 3.0)  # (2 + 4) / 2
    assert masked_mean(t([1.0]), t([0])).item() == 0.0


# --------------------------------------------------------------------------- advantages


def test_grpo_advantages_two_groups():
    # group 0: rewards [1, 0], mean 0.5, population std 0.5 -> [+0.5/0.5, -0.5/0.5] = [1, -1]
    # group 1: rewards [1, 1], mean 1, std 0 -> [0, 0] (no NaN)
    adv = grpo_advantages(t([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    close(adv, [1.0, -1.0, 0.0, 0.0])


def test_grpo_advantages_interleaved_ids_and_singleton():
    # id 7: [1, 0] -> mean 0.5, std 0.5 -> [1, -1]; id 3: [2, 4] -> mean 3, std 1 -> [-1, 1];
    # id 5: a group of one -> 0
    adv = grpo_advantages(t([1.0, 2.0, 0.0, 4.0, 9.0]), torch.tensor([7, 3, 7, 3, 5]))
    close(adv, [1.0, -1.0, -1.0, 1.0, 0.0])


def test_grpo_advantages_population_std():
    # one group [1, 0, 0, 0]: mean 0.25; var = (0.75^2 + 3 * 0.25^2) / 4 = 0.75 / 4 = 0.1875
    # std = 0.4330127; A = [0.75, -0.25, -0.25, -0.25] / 0.4330127
    adv = grpo_advantages(t([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    close(adv, [1.7320508, -0.5773503, -0.5773503, -0.5773503])


def test_dr_grpo_advantages_no_std():
    # group means 0.5 and 1: [1 - 0.5, 0 - 0.5, 1 - 1, 1 - 1]
    adv = grpo_advantages(t([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), std_normalize=False)
    close(adv, [0.5, -0.5, 0.0, 0.0])


def test_reinforce_pp_advantages():
    # kl_coef 0.1, logp_old - ref = [[1, 2, g], [g, 0, 1]] (g = garbage on unmasked tokens)
    # seq 0, mask [1,1,0], R=1: r = [-0.1, -0.2 + 1, 0] = [-0.1, 0.8, 0] -> G = [0.7, 0.8, 0]
    # seq 1, mask [0,1,1], R=0: r = [0, -0.0, -0.1]                   -> G = [., -0.1, -0.1]
    # response returns [0.7, 0.8, -0.1, -0.1]: mean 1.3 / 4 = 0.325
    # deviations [0.375, 0.475, -0.425, -0.425]; var = (0.140625 + 0.225625 + 2 * 0.180625) / 4
    #   = 0.7275 / 4 = 0.181875; std = sqrt(0.181875) = 0.4264681
    logp_old = t([[1.0, 2.0, 100.0], [100.0, 0.0, 1.0]])
    ref = torch.zeros(2, 3)
    mask = t([[1, 1, 0], [0, 1, 1]])
    adv = reinforce_pp_advantages(t([1.0, 0.0]), mask, logp_old, ref, kl_coef=0.1)
    s = 0.4264681
    close(adv, [[0.375 / s, 0.475 / s, 0.0], [0.0, -0.425 / s, -0.425 / s]], tol=1e-4)


def test_reinforce_pp_empty_sequence_gets_nothing():
    # seq 1 has no response token: its reward is dropped; seq 0 has one token with G = 1,
    # the only response token, so (1 - 1) / (0 + eps) = 0.
    adv = reinforce_pp_advantages(t([1.0, 5.0]), t([[1, 0], [0, 0]]), torch.zeros(2, 2),
                                  torch.zeros(2, 2), kl_coef=0.1)
    close(adv, [[0.0, 0.0], [0.0, 0.0]])


def test_gae_three_steps():
    # gamma 0.9, lam 0.95 (gamma*lam = 0.855); V = [0.5, 0.4, 0.3], r = [0, 0, 1]
    # t=2: delta = 1 + 0 - 0.3 = 0.7;                 A2 = 0.7
    # t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13;         A1 = -0.13 + 0.855*0.7 = 0.4685
    # t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;         A0 = -0.14 + 0.855*0.4685 = 0.2605675
    # returns = A + V = [0.7605675, 0.8685, 1.0]
    adv, ret = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.4, 0.3]]), t([[1, 1, 1]]), gamma=0.9, lam=0.95)
    close(adv, [[0.2605675, 0.4685, 0.7]])
    close(ret, [[0.7605675, 0.8685, 1.0]])


def test_gae_skips_observation_tokens():
    # mask [1, 0, 1]: the middle (observation) token's r=5 and V=9 are ignored.
    # t=2: delta = 1 - 0.3 = 0.7, A2 = 0.7
    # t=0 bootstraps from t=2: delta = 0 + 0.9*0.3 - 0.5 = -0.23, A0 = -0.23 + 0.855*0.7 = 0.3685
    # second sequence: single token, r=2, V=0.5 -> A = 2 - 0.5 = 1.5, return 2
    adv, ret = gae(t([[0.0, 5.0, 1.0], [0.0, 2.0, 0.0]]), t([[0.5, 9.0, 0.3], [7.0, 0.5, 7.0]]),
                   t([[1, 0, 1], [0, 1, 0]]), gamma=0.9, lam=0.95)
    close(adv, [[0.3685, 0.0, 0.7], [0.0, 1.5, 0.0]])
    close(ret, [[0.8685, 0.0, 1.0], [0.0, 2.0, 0.0]])


# --------------------------------------------------------------------------- weights


def test_tis_weights_capped_detached_and_masked():
    # old - behav = [ln 1.5, ln 3, garbage]: weights [1.5, min(3, 2) = 2, 0 (unmasked)]
    old = t([[LN(1.5), LN(3.0), 50.0]], requires_grad=True)
    w = tis_weights(old, torch.zeros(1, 3), t([[1, 1, 0]]), cap=2.0)
    close(w, [[1.5, 2.0, 0.0]])
    assert not w.requires_grad


def test_kl_k3():
    # logp=0, ref=ln2: d = ln2 -> 2 - 0.6931472 - 1 = 0.3068528
    # logp=ln2, ref=0: d = -ln2 -> 0.5 + 0.6931472 - 1 = 0.1931472
    # equal -> 1 - 0 - 1 = 0
    close(kl_k3(t([0.0, LN(2.0), -3.0]), t([LN(2.0), 0.0, -3.0])), [0.3068528, 0.1931472, 0.0])


# --------------------------------------------------------------------------- PPO


def test_ppo_clip_ratio_1_5_positive_advantage_is_clipped_to_1_2():
    # ratio 1.5, A=+1: objective min(1.5*1, clip(1.5, 0.8, 1.2)*1) = 1.2 -> loss -1.2
    loss, metrics = ppo_clip_loss(t([[LN(1.5)]]), t([[0.0]]), t([1.0]), t([[1]]))
    close(loss, -1.2)
    assert metrics["clip_frac"] == 1.0
    # approx kl = r - 1 - ln r = 0.5 - 0.4054651 = 0.0945349
    assert metrics["approx_kl"] == pytest.approx(0.0945349, abs=1e-6)
    # clip-higher (DAPO): clip_high 0.28 -> -1.28
    loss, _ = ppo_clip_loss(t([[LN(1.5)]]), t([[0.0]]), t([1.0]), t([[1]]), clip_high=0.28)
    close(loss, -1.28)


def test_ppo_clip_four_cases_and_gradient():
    # (ratio, A) -> per-token loss max(-A r, -A clip(r, 0.8, 1.2)):
    #   (1.5, +1) -> max(-1.5, -1.2) = -1.2  clipped, no grad
    #   (0.5, +1) -> max(-0.5, -0.8) = -0.5  unclipped
    #   (0.5, -1) -> max( 0.5,  0.8) =  0.8  clipped, no grad
    #   (1.1, -2) -> max( 2.2,  2.2) =  2.2  inside the band
    # token mean (-1.2 - 0.5 + 0.8 + 2.2) / 4 = 0.325; clip_frac 2/4
    logp = t([[LN(1.5), LN(0.5), LN(0.5), LN(1.1)]], requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 4), t([[1.0, 1.0, -1.0, -2.0]]), t([[1, 1, 1, 1]]))
    close(loss, 0.325)
    assert metrics["clip_frac"] == 0.5
    loss.backward()
    # d/dlogp (-A r)/4 = -A r / 4: token 1 -> -0.5/4 = -0.125, token 3 -> 2*1.1/4 = 0.55
    close(logp.grad, [[0.0, -0.125, 0.0, 0.55]])


def test_ppo_sequence_advantages_broadcast():
    # A = [+1, -1]; ratios [[1.5, 1], [1, 0.5]]
    # seq 0: [-1.2, -1.0]; seq 1: [1.0, max(0.5, 0.8) = 0.8] -> mean (-1.2 - 1 + 1 + 0.8)/4 = -0.1
    logp = t([[LN(1.5), 0.0], [0.0, LN(0.5)]])
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, 2), t([1.0, -1.0]), torch.ones(2, 2))
    close(loss, -0.1)


def test_ppo_dual_clip():
    # A=-1, ratio 5: standard loss max(5, 1.2) = 5; dual clip c=3 caps it at 3*|A| = 3, no grad
    # A=-1, ratio 2: max(2, 1.2) = 2 < 3, untouched, grad -A r / 2 = 2/2 = 1
    # token mean (3 + 2) / 2 = 2.5
    logp = t([[LN(5.0), LN(2.0)]], requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 2), t([-1.0]), torch.ones(1, 2), dual_clip=3.0)
    close(loss, 2.5)
    assert metrics["dual_clip_frac"] == 0.5
    loss.backward()
    close(logp.grad, [[0.0, 1.0]])
    # without the dual clip: (5 + 2) / 2
    close(ppo_clip_loss(logp, torch.zeros(1, 2), t([-1.0]), torch.ones(1, 2))[0], 3.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, torch.zeros(1, 2), t([-1.0]), torch.ones(1, 2), dual_clip=0.5)


def test_ppo_is_weight_multiplies_and_stops_gradient():
    # ratio 1, A=1 -> -1 per token; decoupled weights [2, 0.5] -> [-2, -0.5], mean -1.25
    w = t([[2.0, 0.5]], requires_grad=True)
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), t([1.0]), torch.ones(1, 2), is_weight=w)
    close(loss, -1.25)
    loss.backward()
    assert w.grad is None
    close(logp.grad, [[-1.0, -0.25]])  # -w * A * r / 2


def test_ppo_garbage_on_padding_keeps_loss_and_grads_finite():
    logp = t([[-1.0, float("-inf")]], requires_grad=True)
    old = t([[-1.0, 0.0]])
    loss, metrics = ppo_clip_loss(logp, old, t([1.0]), t([[1, 0]]))
    close(loss, -1.0)  # one token, ratio 1, A 1
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


# --------------------------------------------------------------------------- TOPR


def _topr_batch(neg_log_ratio):
    # seq 0: R=+1, logp [-1, -2], ratio exp(0.3) > 1 (ignored for positives)
    # seq 1: R=-1, logp [-1, -1], sequence log ratio = neg_log_ratio
    logp = t([[-1.0, -2.0], [-1.0, -1.0]], requires_grad=True)
    old = t([[-1.1, -2.2], [-1.0 - neg_log_ratio, -1.0]])
    return logp, old, t([1.0, -1.0]), torch.ones(2, 2)


def test_topr_negative_truncated_weight():
    # seq ratio of seq 1 = 0.5 -> w = clip(0.5, 0, 1) = 0.5
    # loss = -(1/2) [ 1 * (-1 - 2) + 0.5 * (-1) * (-1 - 1) ] = -(1/2)(-3 + 1) = 1.0
    logp, old, R, mask = _topr_batch(LN(0.5))
    loss, metrics = topr_loss(logp, old, R, mask)
    close(loss, 1.0)
    assert metrics["neg_weight_mean"] == pytest.approx(0.5)
    assert metrics["pos_frac"] == 0.5
    loss.backward()
    # grad = -w R / 2 per token: seq 0 -> -1/2; seq 1 -> -(0.5 * -1)/2 = +0.25 (weight is stop-grad)
    close(logp.grad, [[-0.5, -0.5], [0.25, 0.25]])


def test_topr_negative_weight_capped_at_one():
    # seq ratio of seq 1 = 2 -> w = min(2, 1) = 1: loss = -(1/2)(-3 + (-1)(-2)) = 0.5
    logp, old, R, mask = _topr_batch(LN(2.0))
    loss, _ = topr_loss(logp, old, R, mask)
    close(loss, 0.5)
    loss.backward()
    close(logp.grad, [[-0.5, -0.5], [0.5, 0.5]])


def test_topr_token_mean():
    # per-token -w R logp: seq 0 -> [1, 2]; seq 1 (w 0.5) -> [-0.5, -0.5]; (3 - 1) / 4 = 0.5
    logp, old, R, mask = _topr_batch(LN(0.5))
    close(topr_loss(logp, old, R, mask, agg="token-mean")[0], 0.5)


# --------------------------------------------------------------------------- CISPO


def test_cispo_value_and_stop_gradient_weight():
    # ratios [1.5, 0.5, 1.0], A [1, -1, 2], eps 0.2 -> w = clip = [1.2, 0.8, 1.0]
    # loss_tok = -w A logp with logp [-1, -2, -0.5]: [1.2, -1.6, 1.0] -> mean 0.6/3 = 0.2
    logp = t([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = t([[-1.0 - LN(1.5), -2.0 - LN(0.5), -0.5]])
    loss, metrics = cispo_loss(logp, old, t([[1.0, -1.0, 2.0]]), torch.ones(1, 3), eps_high=0.2, eps_low=0.2)
    close(loss, 0.2)
    assert metrics["clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    # gradient = -clip(r) A / n on logp, even for clipped tokens (unlike PPO):
    # [-1.2/3, 0.8/3, -2/3] = [-0.4, 0.2666667, -0.6666667]
    close(logp.grad, [[-0.4, 0.2666667, -0.6666667]])


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("which", ["ppo", "ppo_dual", "topr", "cispo"])
def test_losses_backprop_from_logits(which):
    g = torch.Generator().manual_seed(0)
    B, T, V = 4, 6, 11
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    mask = t([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0]])
    adv = grpo_advantages(t([1.0, 0.0, 0.5, 1.0]), torch.tensor([0, 0, 1, 1]))
    if which == "ppo":
        loss, metrics = ppo_clip_loss(logp, old, adv, mask)
    elif which == "ppo_dual":
        loss, metrics = ppo_clip_loss(logp, old, adv, mask, dual_clip=3.0, agg="seq-mean-token-mean",
                                      is_weight=tis_weights(old, old - 0.1, mask))
    elif which == "topr":
        loss, metrics = topr_loss(logp, old, adv, mask)
    else:
        loss, metrics = cispo_loss(logp, old, adv, mask, eps_high=0.28, eps_low=0.2)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0
    assert logits.grad[3].abs().sum() == 0  # empty-mask sequence gets no gradient
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


# --------------------------------------------------------------------------- boundaries
# Each test below pins a boundary or a sign that a mutant of algorithms.py got past before
# (docs/testing.md, "Mutation score").


def test_masked_mean_of_one_entry():
    close(masked_mean(t([5.0, 7.0]), t([1, 0])), 5.0)  # 5 / max(1, 1), not 5 / 2


def test_reinforce_pp_kl_is_old_minus_ref_and_a_first_token_answer_gets_its_reward():
    # kl_coef 1; seq 0, mask [1, 1], R=0: old - ref = [1 - 0, 2 - 2] = [1, 0] -> r = [-1, 0], G = [-1, 0]
    # seq 1, mask [1, 0] (its only response token at position 0), R=1: old - ref = 3 - 3 = 0
    #   -> r = [0 + 1], G = [1]
    # response returns [-1, 0, 1]: mean 0, var (1 + 0 + 1) / 3 = 2/3, std 0.8164966
    # A = [-1, 0, 1] / 0.8164966 = [-1.2247449, 0, 1.2247449]
    adv = reinforce_pp_advantages(t([0.0, 1.0]), t([[1, 1], [1, 0]]), t([[1.0, 2.0], [3.0, 9.0]]),
                                  t([[0.0, 2.0], [3.0, 0.0]]), kl_coef=1.0)
    close(adv, [[-1.2247449, 0.0], [1.2247449, 0.0]])


def test_tis_default_cap_is_two():
    # exp(ln 3) = 3 capped at the default C = 2
    close(tis_weights(t([[LN(3.0)]]), t([[0.0]]), t([[1]])), [[2.0]])


def test_ppo_dual_clip_only_for_negative_advantages_and_strictly_above_the_cap():
    # c = 3; per-token A [0.5, 1, -1], ratios [1, 1, 3]:
    #   A=0.5, r=1: loss -0.5 (cap -1.5 lies below, but A > 0: no dual clip)
    #   A=1,   r=1: loss -1
    #   A=-1,  r=3: loss max(3, 1.2) = 3 == cap 3*|A|: not above it, not dual-clipped, keeps its grad
    # mean (-0.5 - 1 + 3) / 3 = 0.5; grads -A r / 3 = [-0.1666667, -0.3333333, 1.0]
    logp = t([[0.0, 0.0, LN(3.0)]], requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 3), t([[0.5, 1.0, -1.0]]), torch.ones(1, 3),
                                  dual_clip=3.0)
    close(loss, 0.5)
    assert metrics["dual_clip_frac"] == 0.0
    loss.backward()
    close(logp.grad, [[-0.1666667, -0.3333333, 1.0]])


def test_ppo_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), t([-1.0]), torch.ones(1, 1), dual_clip=1.0)
    # c = 1.5 is legal: A=-1, r=2: max(2, 1.2) = 2 > 1.5 -> capped at 1.5
    loss, metrics = ppo_clip_loss(t([[LN(2.0)]]), torch.zeros(1, 1), t([-1.0]), torch.ones(1, 1), dual_clip=1.5)
    close(loss, 1.5)
    assert metrics["dual_clip_frac"] == 1.0


def test_topr_zero_and_small_positive_rewards_are_positives():
    # R = [0, 0.5]: neither is negative, so w = 1 for both whatever their ratio
    # seq 1 has log ratio -2 - (-2 + ln 2) = -ln 2 (would give w 0.5 if it were a negative)
    # loss = -(1/2) [0 * (-1) + 1 * 0.5 * (-2)] = 0.5; pos_frac 2/2; no negative: weight mean 0
    # log_seq_ratio_mean = (0 - ln 2) / 2 = -0.3465736
    logp = t([[-1.0], [-2.0]])
    behav = t([[-1.0], [-2.0 + LN(2.0)]])
    loss, metrics = topr_loss(logp, behav, t([0.0, 0.5]), torch.ones(2, 1))
    close(loss, 0.5)
    assert metrics["pos_frac"] == 1.0
    assert metrics["neg_weight_mean"] == 0.0
    assert metrics["log_seq_ratio_mean"] == pytest.approx(-0.3465736)


def test_topr_empty_batch_metrics_are_zero():
    loss, metrics = topr_loss(torch.zeros(0, 2), torch.zeros(0, 2), torch.zeros(0), torch.zeros(0, 2))
    assert loss.item() == 0.0
    assert metrics == {"pos_frac": 0.0, "neg_weight_mean": 0.0, "log_seq_ratio_mean": 0.0}


def test_eps_is_added_to_the_std():
    # one group R = [1, 0]: deviations +-0.5, std 0.5; eps 0.5 -> +-0.5 / (0.5 + 0.5) = +-0.5
    close(grpo_advantages(t([1.0, 0.0]), torch.tensor([0, 0]), eps=0.5), [0.5, -0.5])
    # REINFORCE++ with no KL: returns [1] and [0] on one token each -> the same numbers
    adv = reinforce_pp_advantages(t([1.0, 0.0]), t([[1], [1]]), torch.zeros(2, 1), torch.zeros(2, 1),
                                  kl_coef=0.1, eps=0.5)
    close(adv, [[0.5], [-0.5]])


def test_grpo_advantages_of_an_empty_batch():
    assert grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


# --------------------------------------------------------------------------- the ALGORITHMS table
# What each row selects is part of each algorithm's definition: PPO learns a critic and
# uses GAE; REINFORCE++ puts the KL in the per-token reward; GRPO-style group advantages
# are what discounted turn credit and IPA replace; TOPR and PPO keep their own estimators.

def test_each_algorithm_runs_its_own_estimator_and_loss():
    from rockroll.trainer.algorithms.table import ALGORITHMS

    plain = {name: (spec.parts(), spec.value_head, spec.kl_in_reward) for name, spec in ALGORITHMS.items()}
    assert plain == {
        "grpo": (("grpo", "ppo_clip"), False, False),
        "ppo": (("gae", "ppo_clip"), True, False),
        "reinforce_pp": (("reinforce_pp", "ppo_clip"), False, True),
        "topr": (("dr_grpo", "topr"), False, False),
        "cispo": (("grpo", "cispo"), False, False),
        "asyppo": (("gae", "ppo_clip"), False, False),  # GAE on its mini-critics (critics=True), no value head
        "raft": (("raft", "sft"), False, False),
    }
    assert [name for name, spec in ALGORITHMS.items() if spec.critics] == ["asyppo"]


def test_credit_options_replace_the_estimator_only_where_they_apply():
    from rockroll.trainer.algorithms.table import ALGORITHMS

    parts = {name: (spec.parts("discounted", False), spec.parts("outcome", True), spec.parts("discounted", True))
             for name, spec in ALGORITHMS.items()}
    assert parts["grpo"] == (("turn", "ppo_clip"), ("ipa", "ipa"), ("turn", "ipa"))
    assert parts["cispo"] == (("turn", "cispo"), ("grpo", "cispo"), ("turn", "cispo"))
    for name in ("ppo", "reinforce_pp", "topr", "asyppo", "raft"):  # a critic or their own estimator: untouched
        plain = ALGORITHMS[name].parts()
        assert parts[name] == (plain, plain, plain), name


def test_reads_names_the_keys_of_what_runs():
    from rockroll.trainer.algorithms.table import ALGORITHMS

    assert ALGORITHMS["ppo"].reads() == {"gamma", "lam", "clip_low", "clip_high", "dual_clip", "tis_cap", "vf_coef"}
    assert ALGORITHMS["grpo"].reads() == {"std_normalize", "clip_low", "clip_high", "dual_clip", "tis_cap"}
    assert "gamma" in ALGORITHMS["grpo"].reads("discounted") and "gamma" not in ALGORITHMS["grpo"].reads()
    assert ALGORITHMS["topr"].reads() == frozenset()  # no clip, no std scaling


def test_topr_metrics_count_the_negatives_weights():
    # R = (+1, -1, -1); sequence log-ratios 0, log 0.5, log 2: negatives weigh min(1, rho) = 0.5 and 1
    logp = t([[0.0], [math.log(0.5)], [math.log(2.0)]])
    behav = t([[0.0], [0.0], [0.0]])
    mask = torch.ones(3, 1, dtype=torch.bool)
    _, metrics = topr_loss(logp, behav, t([1.0, -1.0, -1.0]), mask)
    close(metrics["pos_frac"], 1 / 3)
    close(metrics["neg_weight_mean"], 0.75)


def test_cispo_reports_the_k3_estimate_of_the_kl_to_the_generator():
    logp = t([[math.log(0.5), math.log(4.0)]])
    behav = t([[0.0, 0.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    _, metrics = cispo_loss(logp, behav, t([1.0]), mask, eps_low=0.2, eps_high=0.2)
    # k3 = ratio - 1 - log ratio, averaged: (0.5 - 1 + ln 2 + 4 - 1 - 2 ln 2) / 2 = (2.5 - ln 2) / 2
    close(metrics["approx_kl"], (2.5 - math.log(2.0)) / 2)


def test_the_table_is_constant():
    import dataclasses

    from rockroll.trainer.algorithms.table import ALGORITHMS

    with pytest.raises(dataclasses.FrozenInstanceError):
        ALGORITHMS["grpo"].loss = "topr"
