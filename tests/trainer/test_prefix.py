"""An episode's KV kept across its turns (trainer/engines/prefix.py), a group's one prompt
prefilled once, and log-probs taken from the first response position on (``trim_prompt``):
each must change the work done and nothing else.

The engine checks play the same multi-turn episodes (each turn's prompt is the last prompt, the
reply and new tokens, as a rollout builds it) on two engines over one tiny Llama, with and
without the cache: the tokens must be equal and the log-probs equal to float rounding, while
the tokens that went through the model in prefills must drop."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.engines.prefix import PrefixCache
from rockroll.trainer.engines.sampling import SamplingParams
from rockroll.trainer.roles.update import token_logp

VOCAB, STOP = 300, 7


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                        max_position_embeddings=2048)).eval()


def _tokens(g: torch.Generator, lo: int, hi: int, rows: int) -> list[list[int]]:
    return [torch.randint(STOP + 1, VOCAB, (int(n),), generator=g).tolist()
            for n in torch.randint(lo, hi, (rows,), generator=g)]


def _episodes(engine: TransformersEngine, temperature: float, turns: int = 4, rows: int = 6,
              load_after: int | None = None):
    """Every turn's (tokens, log-probs) of ``rows`` episodes; the prompts of the next turn extend
    the last ones by the reply and a random observation. ``load_after``: a weight load (the same
    weights) after that turn."""
    g = torch.Generator().manual_seed(1)
    prompts, seen = _tokens(g, 5, 40, rows), []
    for turn in range(turns):
        sp = SamplingParams(temperature=temperature, max_new_tokens=5 + turn, stop_token_ids=[STOP],
                            seeds=[100 * turn + i for i in range(rows)])
        outs = engine.generate(prompts, sp)
        seen.append([(o.token_ids, o.logprobs) for o in outs])
        prompts = [p + o.token_ids + x for p, o, x in zip(prompts, outs, _tokens(g, 1, 20, rows))]
        if turn == load_after:
            engine.load_weights(engine.model.state_dict(), engine.version + 1)
    return seen


def _same(a, b) -> float:
    """The largest log-prob difference of two plays, which must hold the same tokens."""
    assert [[t for t, _ in turn] for turn in a] == [[t for t, _ in turn] for turn in b]
    return max(abs(x - y) for ta, tb in zip(a, b) for (_, la), (_, lb) in zip(ta, tb) for x, y in zip(la, lb))


# ------------------------------------------------------------------------------ the cache alone
def test_take_finds_the_longest_stored_prefix_once():
    cache = PrefixCache(max_bytes=1000)
    cache.put([1, 2], "short", 10)
    cache.put([1, 2, 3, 4], "long", 10)
    cache.put([1, 9, 9], "other", 10)
    assert cache.take([1, 2, 3, 4, 5]) == (4, "long")
    assert cache.take([1, 2, 3, 4, 5]) == (2, "short")  # the long one was handed out: gone
    assert cache.take([1, 2, 3, 4, 5]) is None
    assert cache.take([1, 9, 9]) is None  # a prompt must leave a token to feed
    assert (cache.stats.hits, cache.stats.misses, cache.stats.reused_tokens) == (2, 2, 6)
    cache.put([4, 4], "first", 10)  # two episodes that played alike: one entry each
    cache.put([4, 4], "second", 10)
    assert cache.take([4, 4, 1]) == (2, "first") and cache.take([4, 4, 2]) == (2, "second")
    assert len(cache) == 1 and cache.nbytes == 10  # "other" is left


def test_the_byte_bound_drops_the_oldest_first():
    cache = PrefixCache(max_bytes=25)
    for i in range(4):
        cache.put([i, 0], i, 10)
    assert len(cache) == 2 and cache.nbytes == 20 and cache.stats.evicted == 2
    assert cache.take([0, 0, 1]) is None and cache.take([3, 0, 1]) == (2, 3)
    cache.put([5, 5], "too big", 26)
    assert cache.take([5, 5, 1]) is None
    off = PrefixCache(max_bytes=0)
    off.put([1], "x", 1)
    assert len(off) == 0


# ----------------------------------------------------------------------------- the engine's use
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_turns_from_the_cache_are_the_turns_without_it(temperature):
    model = _model()
    plain = TransformersEngine(copy.deepcopy(model), 0, prefix_cache_mb=0)
    cached = TransformersEngine(copy.deepcopy(model), 0, prefix_cache_mb=64)
    try:
        diff = _same(_episodes(plain, temperature), _episodes(cached, temperature))
        assert diff < 1e-5
        off, on = plain.prefill_stats, cached.prefill_stats
        assert off["hits"] == 0 and on["hits"] == 6 * 3  # every turn after the first, of every episode
        # the saving is exactly the reused tokens: nothing is prefilled twice, nothing skipped
        assert on["prefill_tokens"] == off["prefill_tokens"] - on["reused_tokens"]
        assert on["reused_tokens"] > on["prefill_tokens"]
    finally:
        plain.close()
        cached.close()


def test_a_weight_load_empties_the_cache():
    engine = TransformersEngine(_model(), 0, prefix_cache_mb=64)
    try:
        _episodes(engine, 1.0, turns=3, load_after=0)
        stats = engine.prefill_stats
        # turn 1's prompts found nothing (the load after turn 0 dropped it); turn 2's found turn 1's
        assert stats["hits"] == 6 and stats["misses"] == 12
    finally:
        engine.close()


def test_a_group_prompt_is_prefilled_once():
    model = _model()
    engine = TransformersEngine(copy.deepcopy(model), 0, prefix_cache_mb=0)
    try:
        prompt = list(range(10, 40))
        sp = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=[STOP], seeds=list(range(8)))
        group = engine.generate([prompt] * 8, sp)
        assert engine.prefill_stats["prefill_tokens"] == len(prompt)
        one = [engine.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=[STOP],
                                                        seeds=[s]))[0] for s in range(8)]
        assert [o.token_ids for o in group] == [o.token_ids for o in one]
        assert max(abs(a - b) for x, y in zip(group, one) for a, b in zip(x.logprobs, y.logprobs)) < 1e-5
    finally:
        engine.close()


# --------------------------------------------------------------------- log-probs from the response on
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_trimmed_logprobs_and_entropy_are_the_full_ones(penalty):
    from rockroll.trainer.engines.policy import ActorModule
    from rockroll.trainer.roles.update import collate
    from rockroll.trainer.rollout.types import Group, Sample

    def sample(prompt, reply):  # a row: its prompt at mask 0, its reply at 1
        ids = prompt + reply
        return Sample(token_ids=ids, mask=[0] * len(prompt) + [1] * len(reply), behav_logp=[0.0] * len(ids))

    module = ActorModule(_model(), with_value=False)
    # the first response token is predicted at position 5: rows' prompts of 6 and 7 tokens
    batch = collate([Group(0, "e", None, 0, [sample([3, 4, 5, 6, 9, 10], [11, 12, 13, 8]),
                                             sample([3, 4, 5, 6, 20, 21, 22], [30, 31])])], 0)
    full = token_logp(module, batch, 0.8, top_k=50, with_entropy=True, repetition_penalty=penalty)
    cut = token_logp(module, batch, 0.8, top_k=50, with_entropy=True, repetition_penalty=penalty, trim_prompt=True)
    m = batch.mask
    for f, c in ((full[0], cut[0]), (full[2], cut[2])):
        assert f.shape == c.shape
        assert torch.allclose(f[m], c[m], atol=1e-5)
        assert (c[:, :5] == 0).all()  # before the first response position: not computed


def test_the_sft_loss_from_the_first_assistant_token_is_the_full_one():
    """SFT's NLL asks for logits from the first assistant token on; it must be the NLL that
    the whole sequence's logits give (computed here by hand), over rows of different prompts."""
    from rockroll.trainer.config import EngineConfig
    from rockroll.trainer.engines.policy import ActorModule, make_policy
    from rockroll.trainer.rollout.sft_data import SFTExample
    from rockroll.trainer.sft import masked_nll

    model = _model()
    policy = make_policy(ActorModule(copy.deepcopy(model), with_value=False), EngineConfig(), 2)
    rows = [SFTExample([3, 4, 5, 6, 9, 10, 11, 12], [0, 0, 0, 0, 0, 1, 1, 1], "x"),
            SFTExample([3, 4, 5, 6, 20, 21, 22, 23, 30, 8], [0, 0, 0, 0, 0, 0, 0, 1, 1, 1], "x")]
    got = masked_nll(policy, rows, 0, 4096, train=False)["loss"]
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            logp = torch.log_softmax(model(input_ids=torch.tensor([r.token_ids])).logits[0, :-1], -1)
            for t in range(1, len(r.token_ids)):
                if r.mask[t]:
                    total -= float(logp[t - 1, r.token_ids[t]])
                    count += 1
    assert got == pytest.approx(total / count, rel=1e-5)
