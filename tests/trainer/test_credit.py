"""Hand-computed checks of rockroll.trainer.credit (chunk-level IPA credit)."""

import math

import pytest

import torch  # a declared test dependency: a plain import, never a skip

from rockroll.trainer.algorithms.pg import grpo_advantages  # noqa: E402
from rockroll.trainer.algorithms.credit import (  # noqa: E402
    chunk_ids, chunk_ratios, ipa_group_returns, ipa_loss, ipa_mask, ipa_returns, num_chunks, per_chunk, turn_advantages,
    turn_returns,
)

from _tensors import LN, close, t  # noqa: E402


MASK = [
    [1, 1, 0, 0, 1, 0, 1],  # 3 chunks: tokens {0,1}, {4}, {6}
    [0, 0, 1, 1, 1, 0, 0],  # 1 chunk after a prompt
    [0, 0, 0, 0, 0, 0, 0],  # no response at all
]


def test_chunk_ids_and_num_chunks():
    for mask in (t(MASK), torch.tensor(MASK, dtype=torch.bool)):
        ids = chunk_ids(mask)
        assert ids.dtype == torch.long
        assert ids.tolist() == [
            [0, 0, -1, -1, 1, -1, 2],
            [-1, -1, 0, 0, 0, -1, -1],
            [-1, -1, -1, -1, -1, -1, -1],
        ]
        assert num_chunks(mask).tolist() == [3, 1, 0]


def test_turn_returns():
    # gamma 0.5: [0, 0, 1] -> [0 + 0.5 * (0 + 0.5 * 1), 0 + 0.5 * 1, 1] = [0.25, 0.5, 1]
    #            [1, 2, 0] -> [1 + 0.5 * 2, 2 + 0, 0] = [2, 2, 0]  (zero padding adds nothing)
    #            [-1, 0, 4] -> [-1 + 0.5 * (0 + 0.5 * 4), 0 + 0.5 * 4, 4] = [0, 2, 4]
    close(turn_returns(t([[0.0, 0.0, 1.0], [1.0, 2.0, 0.0], [-1.0, 0.0, 4.0]]), 0.5),
          [[0.25, 0.5, 1.0], [2.0, 2.0, 0.0], [0.0, 2.0, 4.0]])


def test_per_chunk_puts_turn_values_on_their_tokens():
    # MASK chunks: seq 0 {0,1} {4} {6}; seq 1 {2,3,4}; seq 2 none
    values = t([[1.0, 2.0, 3.0], [7.0, 8.0, 9.0], [5.0, 5.0, 5.0]])
    close(per_chunk(values, t(MASK)), [
        [1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 3.0],
        [0.0, 0.0, 7.0, 7.0, 7.0, 0.0, 0.0],
        [0.0] * 7,
    ])
    with pytest.raises(ValueError, match=r"has 3 chunks \(turns\) but only 2 turn values"):
        per_chunk(values[:, :2], t(MASK))


# group 0 of the turn-credit tests: A plays 2 turns with rewards [0, 1], B one turn with -0.1
# (its second reward slot is padding: garbage that must be ignored)
TURN_MASK = [[1, 1, 0, 1, 0], [0, 1, 1, 0, 0]]
TURN_REWARDS = [[0.0, 1.0], [-0.1, 9.0]]


def test_turn_advantages():
    # gamma 0.5: G_A = [0 + 0.5 * 1, 1] = [0.5, 1]; G_B = [-0.1]
    # turn 1: {0.5, -0.1}: mean 0.2, deviations +-0.3, std 0.3 -> A 0.3 / (0.3 + 1e-6) = 0.9999967, B -it
    # turn 2: only A reached it -> nothing to compare with -> 0
    adv = turn_advantages(t(TURN_REWARDS), t(TURN_MASK), torch.tensor([0, 0]), 0.5)
    close(adv, [[0.9999967, 0.9999967, 0.0, 0.0, 0.0], [0.0, -0.9999967, -0.9999967, 0.0, 0.0]])
    # Dr.GRPO variant: the deviations themselves
    adv = turn_advantages(t(TURN_REWARDS), t(TURN_MASK), torch.tensor([0, 0]), 0.5, std_normalize=False)
    close(adv, [[0.3, 0.3, 0.0, 0.0, 0.0], [0.0, -0.3, -0.3, 0.0, 0.0]])


def test_turn_advantages_identical_correct_episodes_get_zero():
    # four identical episodes answering both turns right (0.5 each), gamma 1: G = [1, 0.5] for all.
    # Every turn equals its position's baseline -> 0 everywhere. (One baseline pooled over both
    # positions, mean 0.75 std 0.25, gave turn 1 +1 and the correct turn 2 -1.)
    mask = t([[1, 0, 1]] * 4)
    adv = turn_advantages(t([[0.5, 0.5]] * 4), mask, torch.tensor([3, 3, 3, 3]), 1.0)
    close(adv, [[0.0] * 3] * 4)


def test_turn_advantages_credit_the_turn_that_differs():
    # C answers both turns right [0.5, 0.5], D misses turn 1 [0, 0.5]; gamma 1:
    # G_C = [1, 0.5], G_D = [0.5, 0.5]. Turn 1: {1, 0.5} -> mean 0.75, std 0.25 -> C +1, D -1
    # (0.25 / (0.25 + 1e-6) = 0.999996). Turn 2: both 0.5 -> 0: both right, neither is blamed.
    # (Pooled: mean 0.625, std 0.2165 gave C's correct turn 2 -0.577.)
    adv = turn_advantages(t([[0.5, 0.5], [0.0, 0.5]]), t([[1, 0, 1], [1, 0, 1]]), torch.tensor([0, 0]), 1.0)
    close(adv, [[0.999996, 0.0, 0.0], [-0.999996, 0.0, 0.0]])


def test_turn_advantages_unequal_lengths_compare_the_episodes_that_reached_the_turn():
    # gamma 0.5, one group; padding rewards (9) are ignored
    #   A 3 turns [0, 0, 1] -> G_A = [0.25, 0.5, 1]   mask [1,0,1,0,1,0]: chunks {0} {2} {4}
    #   B 2 turns [0, 1]    -> G_B = [0.5, 1]         mask [0,1,1,0,1,0]: chunks {1,2} {4}
    #   C 1 turn  [0]       -> G_C = [0]              mask [1,1,1,0,0,0]: chunk {0,1,2}
    # turn 1: {0.25, 0.5, 0}: mean 0.25, deviations [0, 0.25, -0.25], var 0.125 / 3, std 0.2041241
    #         -> A 0, B 1.2247449, C -1.2247449 (1e-6 in the denominator: 1.2247389)
    # turn 2: {0.5, 1} (C has ended and is left out): mean 0.75, std 0.25 -> A -1, B +1 (0.999996)
    # turn 3: only A -> 0
    mask = t([[1, 0, 1, 0, 1, 0], [0, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    rewards = t([[0.0, 0.0, 1.0], [0.0, 1.0, 9.0], [0.0, 9.0, 9.0]])
    adv = turn_advantages(rewards, mask, torch.tensor([5, 5, 5]), 0.5)
    close(adv, [[0.0, 0.0, -0.999996, 0.0, 0.0, 0.0],
                [0.0, 1.2247389, 1.2247389, 0.0, 0.999996, 0.0],
                [-1.2247389, -1.2247389, -1.2247389, 0.0, 0.0, 0.0]])
    close(turn_advantages(rewards, mask, torch.tensor([5, 5, 5]), 0.5, std_normalize=False),
          [[0.0, 0.0, -0.25, 0.0, 0.0, 0.0], [0.0, 0.25, 0.25, 0.0, 0.25, 0.0], [-0.25, -0.25, -0.25, 0.0, 0.0, 0.0]])


def test_turn_advantages_outcome_only_gamma_one_is_grpo():
    # E wins after 3 turns ([0, 0, 1]), F loses after 3 ([0, 0, 0]): gamma 1 -> G_E = [1, 1, 1],
    # G_F = [0, 0, 0]; at every turn mean 0.5, std 0.5: E +1 on every token, F -1 (GRPO on R = [1, 0]).
    # A group of one episode, G = [2]: mean 2, deviation 0 -> 0 (no NaN).
    mask = t([[1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1], [0, 0, 1, 1, 0, 0]])
    adv = turn_advantages(t([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]), mask,
                          torch.tensor([4, 4, 7]), 1.0)
    close(adv, [[1.0, 0.0, 1.0, 0.0, 1.0, 0.0], [-1.0, -1.0, 0.0, -1.0, 0.0, -1.0], [0.0] * 6])


def test_chunk_ratios_geometric_mean_and_gradient():
    # mask [1, 1, 0, 1]; logp - old = [ln 2, ln 8, garbage, ln 0.5]
    # chunk 0: exp((ln 2 + ln 8) / 2) = sqrt(16) = 4 on both tokens; chunk 1: 0.5; 1 off the chunks
    logp = t([[LN(2.0), LN(8.0), 99.0, LN(0.5)]], requires_grad=True)
    rho = chunk_ratios(logp, torch.zeros(1, 4), t([[1, 1, 0, 1]]))
    close(rho, [[4.0, 4.0, 1.0, 0.5]])
    # d rho_0 / d logp_t = rho_0 / n_0 = 4 / 2 = 2 for both tokens of chunk 0, 0 elsewhere
    rho[0, 0].backward()
    close(logp.grad, [[2.0, 2.0, 0.0, 0.0]])


# --------------------------------------------------------------------------- IPA (issue #40)
# The ROME paper (arXiv 2512.24873, section 3.2.4): Eq 7 G_k = gamma^Delta(j,k) R_final, absolute;
# Eq 8 rho_c = geometric mean over chunk c of pi_theta / pi_old, m_c = 1[geometric mean of
# pi_old / mu <= H]; Eq 9 positive chunk G grad log pi (no ratio), negative chunk
# sg(clip(rho_c, 0, 1)) G grad log pi. The tests before issue #40 pinned a PPO-clipped loss on
# pi_theta / mu with a two-sided [0.5, 2] mask and group-normalised returns (not the paper's).


def test_ipa_returns_are_eq7_absolute_discounted_outcomes():
    # gamma 0.5, R = [1, 0, 2]; seq 0 has 3 chunks -> [0.25, 0.5, 1] * 1; seq 1 (R 0) all 0;
    # seq 2 has 2 chunks -> [0.5, 1] * 2. No group baseline: a group where every episode
    # succeeds still gets positive returns (group-normalised it would learn nothing)
    mask = t([[1, 0, 1, 0, 1], [1, 1, 0, 1, 0], [1, 1, 0, 1, 0]])
    close(ipa_returns(t([1.0, 0.0, 2.0]), mask, 0.5),
          [[0.25, 0.0, 0.5, 0.0, 1.0], [0.0] * 5, [1.0, 1.0, 0.0, 2.0, 0.0]])
    # all succeed: gamma 1, every token of both gets 1 (GRPO would give 0)
    close(ipa_returns(t([1.0, 1.0]), t([[1, 0, 1], [0, 1, 1]]), 1.0), [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])


def test_ipa_group_returns_the_named_pre_40_option():
    # ipa.returns: group_normalized: one group, R = [1, 0]: GRPO advantages [1, -1]; gamma 0.5
    # seq 0 mask [1,0,1,0,1], 3 chunks: [0.25, 0.5, 1] * 1; seq 1 [1,1,0,1,0], 2 chunks: [0.5, 1] * -1
    mask = t([[1, 0, 1, 0, 1], [1, 1, 0, 1, 0]])
    close(ipa_group_returns(t([1.0, 0.0]), torch.tensor([0, 0]), mask, 0.5),
          [[0.25, 0.0, 0.5, 0.0, 1.0], [-0.5, -0.5, 0.0, -1.0, 0.0]])
    # all succeed: nothing to learn (the absolute returns give 1 each)
    close(ipa_group_returns(t([1.0, 1.0]), torch.tensor([0, 0]), mask, 1.0), [[0.0] * 5] * 2)


def test_ipa_mask_is_eq8_one_sided_on_pi_old_over_mu():
    # chunks {0,1}, {3}, {5}: pi_old / mu per token [5, 5], [6], [0.01]; H = 5
    # geometric means 5 (kept: <= H inclusive), 6 (masked), 0.01 (kept: one-sided, no lower bound)
    old = t([[LN(5.0), LN(5.0), 0.0, LN(6.0), 0.0, LN(0.01)]])
    mask = t([[1, 1, 0, 1, 0, 1]])
    close(ipa_mask(old, torch.zeros(1, 6), mask, 5.0), [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]])


def test_ipa_loss_positive_chunk_has_no_ratio():
    # one positive two-token chunk, G = 1, pi_theta / pi_old = 1.5 on both tokens (rho = 1.5):
    # l_t = -G log pi_t, gradient -G / n per token under token-mean = -0.5 each, however far
    # pi_theta moved (PPO's clip at 1.28 would give it zero gradient)
    logp = t([[LN(1.5), LN(1.5)]], requires_grad=True)
    loss, metrics = ipa_loss(logp, torch.zeros(1, 2), torch.zeros(1, 2), t([[1.0, 1.0]]), torch.ones(1, 2),
                             threshold=5.0)
    close(loss, -LN(1.5))
    loss.backward()
    close(logp.grad, [[-0.5, -0.5]])
    assert metrics["ratio_mean"] == pytest.approx(1.5)


def test_ipa_loss_negative_chunk_weight_is_truncated_ratio():
    # chunks {0,1} and {3}, both negative. Chunk 0: pi_theta / pi_old = [2, 8] -> rho = 4,
    # sg(clip(4, 0, 1)) = 1, G = -1. Chunk 1: rho 0.25 -> weight 0.25, G = -2.
    # token-mean over 3 tokens: l = -(w G log pi); grads -w G / 3 = [1/3, 1/3, 0, 0.5/3]
    logp = t([[LN(2.0), LN(8.0), 9.0, LN(0.25)]], requires_grad=True)
    g = t([[-1.0, -1.0, 0.0, -2.0]])
    loss, metrics = ipa_loss(logp, torch.zeros(1, 4), torch.zeros(1, 4), g, t([[1, 1, 0, 1]]), threshold=5.0)
    close(loss, (LN(2.0) + LN(8.0) + 0.25 * 2 * LN(0.25)) / 3)
    loss.backward()
    close(logp.grad, [[1 / 3, 1 / 3, 0.0, 0.5 / 3]])
    assert metrics["neg_weight_mean"] == pytest.approx((1 + 1 + 0.25) / 3)


def test_ipa_loss_hand_computed_example_with_mask():
    # three one-token chunks (mask [1, 0, 1, 0, 1]), pi_old = 0.5 on each, H = 5:
    #   chunk a: G = +0.81, pi_theta 0.6 (rho 1.2), mu 0.5                         -> kept, w 1
    #   chunk b: G = -1, pi_theta 0.4 (rho 0.8), mu 0.05 (pi_old / mu = 10 > H)     -> masked
    #   chunk c: G = -1, pi_theta 0.3 (rho 0.6), mu 0.25 (pi_old / mu = 2)          -> w 0.6
    # seq-mean-token-mean over one sequence of 3 response tokens: grads -w G m / 3
    old = torch.full((1, 5), LN(0.5))
    logp = t([[LN(0.6), 0.0, LN(0.4), 0.0, LN(0.3)]], requires_grad=True)
    mu = t([[LN(0.5), 0.0, LN(0.05), 0.0, LN(0.25)]])
    g = t([[0.81, 0.0, -1.0, 0.0, -1.0]])
    mask = t([[1, 0, 1, 0, 1]])
    loss, metrics = ipa_loss(logp, old, mu, g, mask, threshold=5.0, agg="seq-mean-token-mean")
    close(loss, -(0.81 * LN(0.6) - 0.6 * LN(0.3)) / 3)
    loss.backward()
    close(logp.grad, [[-0.81 / 3, 0.0, 0.0, 0.0, 0.6 / 3]])
    assert metrics["chunk_mask_frac"] == pytest.approx(1 / 3)
    assert metrics["neg_weight_mean"] == pytest.approx((0.8 + 0.6) / 2)  # over the negative chunks' tokens


def test_ipa_end_to_end_from_logits():
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 7, 9
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    mask = t(MASK)
    adv = ipa_returns(t([1.0, -1.0, 1.0]), mask, 0.9)
    loss, metrics = ipa_loss(logp, old, old, adv, mask, threshold=5.0, agg="seq-mean-token-mean")
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    assert logits.grad[2].abs().sum() == 0  # no response tokens, no gradient
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


def test_ipa_matches_rolls_topr_on_segment_ratios():
    """docs/algorithms.md's line-by-line claim: with absolute returns, ``ipa_returns`` + ``ipa_loss``
    give ROLL's agentic ``pg_variant: topr`` with ``ratio_type: segment`` (positive / negative by
    the episode *score*, not the return's sign), the score on the last token discounted per
    segment, segments whose geometric mean of pi_old / mu is outside [0, H] filtered, the loss
    divided by the token count before the filter. ROLL's form is written out here token by
    token: the gradients must agree on every token."""
    gen = torch.Generator().manual_seed(1)
    mask = t([[1, 1, 0, 1, 0, 1, 1], [0, 1, 1, 0, 1, 1, 0], [1, 0, 1, 1, 1, 0, 1]])
    score, gamma, H = t([1.0, -1.0, 0.0]), 0.9, 1.3
    logp = (0.3 * torch.randn(3, 7, generator=gen) - 1.0).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(3, 7, generator=gen)
    mu = old + 0.4 * torch.randn(3, 7, generator=gen)
    # the negative episode: one chunk pi_theta rose on (ratio e^0.5, truncated to 1), one it fell on
    old[1, 1:3], old[1, 4:6] = logp.detach()[1, 1:3] - 0.5, logp.detach()[1, 4:6] + 0.5
    mu[1] = old[1]  # neither masked
    loss, metrics = ipa_loss(logp, old, mu, ipa_returns(score, mask, gamma), mask, threshold=H)
    loss.backward()
    ours = logp.grad.clone()

    lp = logp.detach().clone().requires_grad_()
    m = mask.bool()
    roll_loss = torch.zeros(())
    for b in range(3):
        segs, start = [], None  # runs of 1s, as compute_segment_masked_mean finds them
        for i in range(8):
            on = i < 7 and bool(m[b, i])
            if on and start is None:
                start = i
            if not on and start is not None:
                segs.append(range(start, i))
                start = None
        G = 0.0
        for k, seg in reversed(list(enumerate(segs))):  # compute_agentic_reinforce_return
            G = (float(score[b]) if k == len(segs) - 1 else 0.0) + gamma * G
            idx = list(seg)
            ratio = (lp[b, idx] - old[b, idx]).mean().exp()
            if (old[b, idx] - mu[b, idx]).mean().exp() > H:  # the segment filter, ratio_low 0
                continue
            w = 1.0 if score[b] > 0 else ratio.clamp(0, 1).detach()
            roll_loss = roll_loss - (w * G * lp[b, idx]).sum()
    (roll_loss / m.sum()).backward()  # token-mean over the pre-filter response tokens
    close(ours, lp.grad.tolist())
    assert 0 < metrics["chunk_mask_frac"] < 1  # the filter acted on some chunk, not on all


# --------------------------------------------------------------------------- boundaries
# Each test below pins a boundary that a mutant of credit.py could move unnoticed
# (docs/testing.md, "Mutation score").


def test_per_chunk_one_turn_and_no_turn_batches():
    # at most one chunk: chunk 0 (tokens 1, 2) gets values[:, 0] = 3
    close(per_chunk(t([[3.0]]), t([[0, 1, 1]])), [[0.0, 3.0, 3.0]])
    # no chunk at all, no turn values: zeros of the mask's shape
    out = per_chunk(torch.zeros(2, 0), torch.zeros(2, 3))
    assert out.shape == (2, 3) and out.abs().sum() == 0


def test_turn_advantages_episode_without_turns_does_not_count_in_its_group():
    # gamma 1, one group: A wins in 1 turn (G = [1]), B loses in 1 (G = [0]), C has no response
    # token: 2 episodes with turns -> mean 0.5, std 0.5 -> A +1, B -1, C 0 (were C counted,
    # the mean would be 1/3)
    mask = t([[1, 1, 0], [0, 1, 0], [0, 0, 0]])
    adv = turn_advantages(t([[1.0], [0.0], [5.0]]), mask, torch.tensor([0, 0, 0]), 1.0)
    close(adv, [[1.0, 1.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])


def test_turn_advantages_more_turn_columns_than_sequences():
    # 2 sequences, 3 turn columns (the padding past each one's single turn is garbage):
    # gamma 1, G_A = [1], G_B = [0] -> mean 0.5, std 0.5 -> A +1, B -1
    mask = t([[1, 0, 0], [0, 1, 1]])
    adv = turn_advantages(t([[1.0, 9.0, 9.0], [0.0, 9.0, 9.0]]), mask, torch.tensor([0, 0]), 1.0)
    close(adv, [[1.0, 0.0, 0.0], [0.0, -1.0, -1.0]])


def test_eps_is_added_to_the_std():
    # one chunk each, gamma 1, R = [1, 0]: deviations +-0.5, std 0.5, eps 0.5 -> +-0.5
    mask = t([[1], [1]])
    close(turn_advantages(t([[1.0], [0.0]]), mask, torch.tensor([0, 0]), 1.0, eps=0.5), [[0.5], [-0.5]])


def test_an_episode_split_into_rows_gets_the_returns_it_would_get_whole():
    """An agent episode split into segments (rows, issue #13) numbers its chunks to the
    episode's end (``chunks_after``), so every chunk gets exactly the Eq 7 return it would get
    were the episode one row; without the offset its first row's chunks look like the
    episode's last. Group statistics weigh its rows 1/n (grpo_advantages)."""
    rewards = torch.tensor([1.0, 0.0, 0.0])
    whole_mask = torch.tensor([[0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0]])
    whole = ipa_returns(rewards, whole_mask, 0.5)
    # episode 0 as two rows: its chunks 1-2, then chunk 3
    split_mask = torch.tensor([[0, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1], [0, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0]])
    split = ipa_returns(torch.tensor([1.0, 1.0, 0.0, 0.0]), split_mask, 0.5, chunks_after=torch.tensor([1, 0, 0, 0]))
    assert torch.allclose(split[0] + split[1], whole[0]) and torch.allclose(split[2:], whole[1:])
    close(whole[0], [0.0, 0.25, 0.0, 0.5, 0.0, 1.0])
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]),
                          weights=torch.tensor([0.5, 0.5, 1.0, 1.0]))
    assert torch.allclose(adv, grpo_advantages(rewards, torch.tensor([0, 0, 0]))[[0, 0, 1, 2]])
