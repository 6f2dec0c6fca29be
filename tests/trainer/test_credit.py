"""Hand-computed checks of rockroll.trainer.credit (chunk-level IPA credit)."""

import math

import pytest

torch = pytest.importorskip("torch")

from rockroll.trainer.credit import (  # noqa: E402
    chunk_ids,
    chunk_ratio_mask,
    chunk_ratios,
    chunk_returns,
    ipa_advantages,
    ipa_loss,
    num_chunks,
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


def test_chunk_returns():
    # gamma 0.5, seq 0: K=3, R=2 -> chunks [0.5^2 * 2, 0.5 * 2, 2] = [0.5, 1, 2]
    # seq 1: K=1, R=-1 -> -1 on its chunk; seq 2: nothing
    ret = chunk_returns(t([2.0, -1.0, 5.0]), t(MASK), 0.5)
    close(ret, [
        [0.5, 0.5, 0.0, 0.0, 1.0, 0.0, 2.0],
        [0.0, 0.0, -1.0, -1.0, -1.0, 0.0, 0.0],
        [0.0] * 7,
    ])


def test_chunk_returns_k3_is_quarter_half_one():
    # K = 3, gamma = 0.5, R = 1: [0.25 R, 0.5 R, R]
    close(chunk_returns(t([1.0]), t([[1, 0, 1, 0, 1]]), 0.5), [[0.25, 0.0, 0.5, 0.0, 1.0]])


def test_chunk_ratios_geometric_mean_and_gradient():
    # mask [1, 1, 0, 1]; logp - old = [ln 2, ln 8, garbage, ln 0.5]
    # chunk 0: exp((ln 2 + ln 8) / 2) = sqrt(16) = 4 on both tokens; chunk 1: 0.5; 1 off the chunks
    logp = t([[LN(2.0), LN(8.0), 99.0, LN(0.5)]], requires_grad=True)
    rho = chunk_ratios(logp, torch.zeros(1, 4), t([[1, 1, 0, 1]]))
    close(rho, [[4.0, 4.0, 1.0, 0.5]])
    # d rho_0 / d logp_t = rho_0 / n_0 = 4 / 2 = 2 for both tokens of chunk 0, 0 elsewhere
    rho[0, 0].backward()
    close(logp.grad, [[2.0, 2.0, 0.0, 0.0]])


def test_chunk_ratio_mask():
    # bounds [0.5, 2] inclusive: 4 is out, 1 sits on a non-response token, 0.5 is in
    keep = chunk_ratio_mask(t([[4.0, 4.0, 1.0, 0.5]]), t([[1, 1, 0, 1]]), low=0.5, high=2.0)
    close(keep, [[0.0, 0.0, 0.0, 1.0]])


def test_ipa_advantages():
    # one group, R = [1, 0]: GRPO advantages [1, -1] (mean 0.5, std 0.5); gamma 0.5
    # seq 0 mask [1,0,1,0,1], K=3: chunks get [0.25, 0.5, 1] * 1
    # seq 1 mask [1,1,0,1,0], K=2: chunk 0 (tokens 0,1) 0.5 * -1, chunk 1 (token 3) 1 * -1
    mask = t([[1, 0, 1, 0, 1], [1, 1, 0, 1, 0]])
    adv = ipa_advantages(t([1.0, 0.0]), torch.tensor([0, 0]), mask, 0.5)
    close(adv, [[0.25, 0.0, 0.5, 0.0, 1.0], [-0.5, -0.5, 0.0, -1.0, 0.0]])
    # Dr.GRPO variant: R - mean = [0.5, -0.5], same discounts
    adv = ipa_advantages(t([1.0, 0.0]), torch.tensor([0, 0]), mask, 0.5, std_normalize=False)
    close(adv, [[0.125, 0.0, 0.25, 0.0, 0.5], [-0.25, -0.25, 0.0, -0.5, 0.0]])


def test_ipa_advantages_gamma_one_is_grpo():
    # gamma 1: every chunk gets its sequence's GRPO advantage; groups {0,1} -> [1,-1], {2,3} -> [0,0]
    mask = t([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]])
    adv = ipa_advantages(t([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask, 1.0)
    close(adv, [[1.0, 0.0, 1.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_ipa_loss_clips_and_drops_chunks():
    # mask [1,1,0,1,1,0,1]: chunks {0,1}, {3,4}, {6}; ratio bounds [0.5, 2], clip 0.2
    # chunk 0: log ratios [ln 2, 0] -> rho = sqrt(2) = 1.4142136, A = +1
    #          loss max(-1.4142, -1.2) = -1.2 (clipped, no gradient)
    # chunk 1: log ratios [ln 4, ln 4] -> rho = 4 > 2: dropped (not in loss, not in denominator)
    # chunk 2: log ratio ln 1.1 -> rho 1.1, A = -1: loss max(1.1, 1.1) = 1.1
    # token mean over the 3 kept tokens: (-1.2 - 1.2 + 1.1) / 3 = -0.4333333
    mask = t([[1, 1, 0, 1, 1, 0, 1]])
    logp = t([[LN(2.0), 0.0, 7.0, LN(4.0), LN(4.0), 7.0, LN(1.1)]], requires_grad=True)
    adv = t([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0, -1.0]])
    loss, metrics = ipa_loss(logp, torch.zeros(1, 7), adv, mask, ratio_low=0.5, ratio_high=2.0)
    close(loss, -0.4333333)
    assert metrics["chunk_mask_frac"] == pytest.approx(2 / 5)  # 2 of 5 response tokens dropped
    assert metrics["clip_frac"] == pytest.approx(2 / 3)  # chunk 0's two tokens of 3 kept
    loss.backward()
    # only chunk 2 carries gradient: d/dlogp_6 (-A rho / 3) = 1.1 / 3 = 0.3666667
    close(logp.grad, [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3666667]])


def test_ipa_loss_gradient_through_chunk_ratio():
    # one chunk of 2 tokens, log ratios [0.1, -0.1] -> rho = exp(0) = 1, A = 1
    # token mean of [-A rho, -A rho] = -rho = -1; d rho / d logp_t = rho / n = 1/2
    #   -> grad [-0.5, -0.5] (the chunk ratio, not the token ratio, carries the gradient)
    logp = t([[0.1, -0.1]], requires_grad=True)
    loss, _ = ipa_loss(logp, torch.zeros(1, 2), t([[1.0, 1.0]]), torch.ones(1, 2),
                       ratio_low=0.5, ratio_high=2.0)
    close(loss, -1.0)
    loss.backward()
    close(logp.grad, [[-0.5, -0.5]])


def test_ipa_end_to_end_from_logits():
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 7, 9
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    mask = t(MASK)
    adv = ipa_advantages(t([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), mask, 0.9)
    loss, metrics = ipa_loss(logp, old, adv, mask, ratio_low=0.5, ratio_high=2.0, agg="seq-mean-token-mean")
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    assert logits.grad[2].abs().sum() == 0  # no response tokens, no gradient
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
