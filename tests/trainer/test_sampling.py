"""Sampling correctness (``trainer/sampling.py``): the trainer's log-probs of generated tokens
are those of the distribution the generator sampled them from -- temperature, top-k, top-p
and constrained decoding -- so the importance ratios of the first update are exactly 1.
Real envs, a real tiny Llama in the Transformers engine; the truncation itself on hand-made
logits."""

import copy
import math

import pytest
import torch

from rockroll.trainer.config import ConfigError, EnvConfig, load_config
from rockroll.trainer.engines.sampling import SamplingParams
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.models import build_model, load_tokenizer
from rockroll.trainer.roles.local import PolicyTrainer
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from rockroll.trainer.engines.sampling import Seen, processed_logits, truncated
from _scripted import first_batch
from rockroll.trainer.roles.update import collate, target_logp, token_logp

ENVS = [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0, 1]}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    return load_tokenizer(load_config({}).tokenizer, envs, tmp_path_factory.mktemp("tok"))


def test_top_k_keeps_ties_and_top_p_keeps_a_token_while_the_mass_above_it_is_below_p():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert truncated(logits) is None and truncated(logits, top_k=4) is None
    assert truncated(logits, top_k=2).tolist() == [False, False, True, True]
    # mass above each: 0, .5, .8, .95
    assert truncated(logits, top_p=0.8).tolist() == [False, False, True, True]
    assert truncated(logits, top_p=0.81).tolist() == [False, False, False, True]
    assert truncated(logits, top_p=0.01).tolist() == [False, True, True, True]  # the top one always stays
    assert truncated(torch.tensor([1.0, 1.0, 1.0, 0.0]), top_k=2).tolist() == [False, False, False, True]
    # top-p after top-k, over the renormalised top-2 (.625, .375): .625 < .7, so both stay
    assert truncated(logits, top_k=2, top_p=0.7).tolist() == [False, False, True, True]
    # the order matters: alone top-p .52 keeps two (.5 above the second); after top-3 the mass above
    # the second is .5/.95 = .526, and only the first stays
    assert truncated(logits, top_p=0.52).tolist() == [False, False, True, True]
    assert truncated(logits, top_k=3, top_p=0.52).tolist() == [False, True, True, True]
    # min-p: p < min_p * p_max goes (p_max .5: .3 keeps .15 and up, .31 keeps .3 and up)
    assert truncated(logits, min_p=0.3).tolist() == [False, False, False, True]
    assert truncated(logits, min_p=0.31).tolist() == [False, False, True, True]
    # before top-p, as vLLM orders them: over the renormalised (.5, .3, .15)/.95 the mass above
    # the third is .842 >= .8, so it goes too; top-p .8 alone keeps the first two as well
    assert truncated(logits, min_p=0.3, top_p=0.8).tolist() == [False, False, True, True]
    assert truncated(logits, min_p=0.3, top_p=0.85).tolist() == [False, False, False, True]


def test_processed_logits_renormalise_and_the_trainer_never_gives_minus_infinity():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    lp = torch.log_softmax(processed_logits(logits, 1.0, top_p=0.8), -1)[0]
    torch.testing.assert_close(lp[:2].exp(), torch.tensor([0.625, 0.375]))
    assert lp[2] == -math.inf
    # the trainer: inside the support the processed log-prob; outside (an observation token, or
    # a token the moved policy's own top-p set leaves out) finite: p_t / mass of the support
    leaf = logits.expand(4, 4)[None].clone().requires_grad_()
    got = target_logp(leaf, torch.tensor([[0, 1, 2, 3]]), 1.0, top_p=0.8)
    torch.testing.assert_close(got.detach().exp()[0], torch.tensor([0.625, 0.375, 0.15 / 0.8, 0.05 / 0.8]))
    got.sum().backward()  # and no NaN reaches the gradients
    assert torch.isfinite(leaf.grad).all()
    # temperature before the truncation: at T=2 the probabilities flatten, and top-p keeps three
    flat = truncated(logits / 2, top_p=0.8)
    assert flat.tolist() == [[False, False, False, True]]
    # allowed ids first: top-k among them
    only = processed_logits(logits, 1.0, top_k=1, allowed=torch.tensor([1, 3]))
    assert torch.isfinite(only).tolist() == [[False, True, False, False]]


def test_the_repetition_penalty_divides_seen_positive_logits_and_multiplies_seen_negative_ones():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    seen = torch.tensor([[True, True, False, True]])
    got = processed_logits(logits, 1.0, seen=seen, repetition_penalty=2.0)
    torch.testing.assert_close(got, torch.tensor([[1.0, -2.0, 0.5, 0.0]]))
    # after the temperature as before it (they commute), and before the truncation: at T 0.5 and
    # penalty 5 token 0 (4 -> 0.8) falls below token 2's 1.0, so top-1 keeps token 2 alone
    warm = processed_logits(logits, 0.5, top_k=1, seen=seen, repetition_penalty=5.0)
    assert torch.isfinite(warm).tolist() == [[False, False, True, False]]
    assert warm[0, 2] == pytest.approx(1.0)
    # a position's context is the row up to it: token 3 is seen from position 2 on, token 1 never
    first = Seen.of_rows(torch.tensor([[0, 2, 3]]), 4)
    assert first.at(torch.arange(3)).tolist() == [[[True, False, False, False], [True, False, True, False],
                                                   [True, False, True, True]]]
    assert Seen.of_contexts([[3, 3, 1], []], 4).at().tolist() == [[False, True, False, True], [False] * 4]


def test_the_trainers_log_probs_take_each_positions_own_context():
    """target_logp with the penalty, by hand: at each position the logits of the tokens before it
    (and itself) are penalised, then the softmax; in slices of one position as in one."""
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 1, 3, 2]])
    logits = torch.randn(1, 4, 5)
    seen = Seen.of_rows(ids[:, :4], 5)
    want = []
    for t in range(4):
        lg = logits[0, t].clone()
        for v in set(ids[0, : t + 1].tolist()):
            lg[v] = lg[v] / 1.5 if lg[v] > 0 else lg[v] * 1.5
        want.append(torch.log_softmax(lg / 0.7, -1)[ids[0, t + 1]])
    for chunk in (1, 4):
        got = target_logp(logits, ids[:, 1:], 0.7, chunk=chunk, seen=seen, repetition_penalty=1.5)
        torch.testing.assert_close(got[0], torch.stack(want))


def test_top_k_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"generation\.top_k: must be >= 0"):
        load_config({"generation": {"top_k": -1}})


CASES = {"top_p": {"top_p": 0.6},
         "top_k_and_top_p": {"top_k": 5, "top_p": 0.9},
         "allowed_and_top_k": {"top_k": 2, "allowed_tokens": ["Up", "Down", "Left", "Right"]},
         "min_p": {"min_p": 0.3},
         "min_p_then_top_p": {"min_p": 0.05, "top_p": 0.8},
         "repetition_penalty": {"repetition_penalty": 1.8},
         "repetition_penalty_and_top_k": {"repetition_penalty": 1.3, "top_k": 5}}


@pytest.mark.parametrize("case", list(CASES))
def test_trainer_logp_of_generated_tokens_equal_the_generators_under_truncation(tok, case):
    """A rollout sampled with temperature 0.7 and ``case``'s truncation: the trainer's log-probs
    of the generated tokens (same weights) equal the generator's behaviour log-probs to 1e-5,
    and the policy update's truncated IS weights pi/mu are 1. Without the truncation the
    trainer's would be the untruncated softmax's: smaller on every generated token."""
    gen = {"max_new_tokens": 3, "temperature": 0.7, **CASES[case]}
    cfg = load_config({"seed": 1, "envs": ENVS, "generation": gen,
                       "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
                       "rollout": {"group_size": 4, "batch_groups": 2, "max_turns": 2, "batch_wait_ms": 10_000}})
    model = build_model(cfg.model, tok, seed=0)
    engine = TransformersEngine(copy.deepcopy(model), tok.pad_token_id)
    mgr = RolloutManager(cfg, engine, PromptTemplate(tok, cfg.tokenizer))
    groups = first_batch(mgr, timeout=120)
    batch = collate(groups, tok.pad_token_id)
    m = batch.mask
    assert m.sum() >= 16
    g = cfg.generation
    allowed = mgr.sampling.allowed_token_ids
    allowed = None if allowed is None else torch.tensor(allowed)
    forward = lambda ids, a: (model(input_ids=ids, attention_mask=a).logits, None)  # noqa: E731
    with torch.no_grad():
        logp, _ = token_logp(forward, batch, g.temperature, allowed=allowed, top_k=g.top_k, top_p=g.top_p,
                             min_p=g.min_p, repetition_penalty=g.repetition_penalty)
        plain, _ = token_logp(forward, batch, g.temperature, allowed=allowed)
    torch.testing.assert_close(logp[m], batch.behav_logp[m], atol=1e-5, rtol=0)
    if g.repetition_penalty == 1.0:  # what the trainer computed before: biased
        assert (plain[m] < batch.behav_logp[m] - 1e-3).all()
    else:  # the penalty alone moves mass both ways: off from the seen tokens, onto the others
        assert (plain[m] - batch.behav_logp[m]).abs().max() > 1e-2
    # the whole update path (config -> PolicyTrainer -> update_policy): pi_old / mu is 1 everywhere
    metrics = PolicyTrainer(cfg, model, tok).update(groups)
    assert metrics["loss/tis_weight_mean"] == pytest.approx(1.0, abs=1e-5)


def test_greedy_log_probs_are_of_the_truncated_untempered_distribution(tok):
    """temperature 0 picks the argmax; its log-prob is that of the top-p set at temperature 1
    (what vLLM reports)."""
    model = build_model(load_config({}).model, tok, seed=0)
    engine = TransformersEngine(model, tok.pad_token_id)
    prompt = tok.encode("Go Up", add_special_tokens=False)
    out = engine.generate([prompt], SamplingParams(temperature=0, top_p=0.5, max_new_tokens=1))[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt], device=model.device)).logits[0, -1]  # the engine's device
    assert out.token_ids == [int(logits.argmax())]
    expect = torch.log_softmax(processed_logits(logits, 1.0, top_p=0.5), -1)[out.token_ids[0]]
    assert out.logprobs[0] == pytest.approx(float(expect), abs=1e-6)
