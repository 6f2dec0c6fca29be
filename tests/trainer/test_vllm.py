"""vLLM generation engine (the optional ``vllm`` extra; skipped where vLLM is not installed,
except under ``ROCKROLL_REQUIRE_VLLM=1``, which ``make test-vllm`` sets in its own venv).

One training run with ``generation.backend: vllm`` on a tiny Llama (head dimension 64, what
vLLM's CPU kernels need) starts one engine; the tests then check that engine against the
trained policy: token ids in, token ids and behaviour log-probs (temperature applied) out,
per-request seeds, stop tokens, and the weight sync after a further training step.
"""

import os
import random

import pytest
import torch

if os.environ.get("ROCKROLL_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (an import error fails the run instead of skipping it)
else:
    pytest.importorskip("vllm")

from rockroll.trainer.config import AlgorithmConfig, load_config  # noqa: E402
from rockroll.trainer.controller import train  # noqa: E402
from rockroll.trainer.engines.sampling import SamplingParams, Seen  # noqa: E402
from rockroll.trainer.engines.generation import VLLMEngine  # noqa: E402
from rockroll.trainer.rollout.types import Group, Sample  # noqa: E402
from rockroll.trainer.rollout.manager import PromptTemplate  # noqa: E402
from rockroll.trainer.roles.update import collate, target_logp, update_policy  # noqa: E402

from _tiny import Held  # noqa: E402

T = 0.8  # a temperature != 1: the reported log-probs must be those of the sampled distribution


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    cfg = load_config({
        "steps": 2, "seed": 0,
        "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
        "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0, 1]}],
        "rollout": {"group_size": 2, "batch_groups": 2, "max_turns": 2},
        "engine": {"lr": 0.05},
        "generation": {"backend": "vllm", "gpu_memory_utilization": 0.3, "temperature": T,
                       "max_new_tokens": 2},
        "logging": {"dir": str(tmp / "run"), "progress": False, "tensorboard": False, "plot": False},
    })
    out = train(cfg)
    out["template"] = PromptTemplate(out["tokenizer"], cfg.tokenizer)
    return out


def _policy_logp(lm, prompt: list[int], out_ids: list[int]) -> list[float]:
    """log pi(out_ids | prompt) at temperature T, recomputed by the trainer's model."""
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([prompt + out_ids])).logits[0, len(prompt) - 1: -1].float() / T
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(out_ids)[:, None]).squeeze(-1).tolist()


def _prompts(run) -> list[list[int]]:
    tpl, tok = run["template"], run["tokenizer"]
    right = tok.encode("Right", add_special_tokens=False)
    return [tpl.first("FrozenLake. Reply with your moves."),
            tpl.first("P_G\n___") + right + tpl.next("Moves: Right.", reply_stopped=False),
            tpl.first("x")]


def _generate(run, prompts, seeds):
    sampling = SamplingParams(temperature=T, max_new_tokens=4, stop_token_ids=[run["template"].stop_id],
                              seeds=seeds)
    return run["generator"].generate(prompts, sampling)


def _check_against_policy(run, prompts, outs):
    lm = run["policy"].module.lm
    stop = run["template"].stop_id
    for p, o in zip(prompts, outs):
        assert 1 <= len(o.token_ids) <= 4 and len(o.logprobs) == len(o.token_ids)
        assert all(isinstance(t, int) and 0 <= t < len(run["tokenizer"]) for t in o.token_ids)
        assert o.finish_reason == ("stop" if o.token_ids[-1] == stop else "length")
        assert stop not in o.token_ids[:-1]
        assert o.logprobs == pytest.approx(_policy_logp(lm, p, o.token_ids), abs=2e-4)


def test_training_run_with_vllm_generator(run):
    assert isinstance(run["generator"], VLLMEngine)
    assert [h["step"] for h in run["history"]] == [0, 1]
    assert run["generator"].version == 2
    assert all(h["rollout/samples"] == 4 and h["rollout/staleness_max"] == 0 for h in run["history"])


def test_token_ids_and_logprobs_match_the_policy(run):
    prompts, seeds = _prompts(run), [11, 12, 13]
    outs = _generate(run, prompts, seeds)
    _check_against_policy(run, prompts, outs)
    # a request's sample depends on its seed, not on its batch-mates
    again = _generate(run, prompts[1:2], seeds[1:2])[0]
    assert again.token_ids == outs[1].token_ids and again.logprobs == pytest.approx(outs[1].logprobs, abs=1e-5)


def test_load_weights_after_a_training_step(run):
    prompts, seeds = _prompts(run), [21, 22, 23]
    before = _generate(run, prompts, seeds)
    # one more optimizer step of the trainer on a hand-made batch
    rng = random.Random(0)
    vocab = len(run["tokenizer"])
    groups = [Group(g, "e", None, 0, [
        Sample(token_ids=[rng.randrange(6, vocab) for _ in range(8)], mask=[0] * 5 + [1] * 3,
               behav_logp=[0.0] * 8, reward=float(i == g), group_id=g, version=2) for i in range(2)])
        for g in range(2)]
    policy = run["policy"]
    update_policy(policy, AlgorithmConfig(), collate(groups, run["tokenizer"].pad_token_id), T)
    run["generator"].load_weights(policy.sync_state_dict(), version=3)
    assert run["generator"].version == 3
    after = _generate(run, prompts, seeds)
    _check_against_policy(run, prompts, after)  # the new weights, not a stale prefix cache
    old_lp = [_policy_logp(policy.module.lm, p, o.token_ids) for p, o in zip(prompts, before)]
    moved = max(abs(a - b) for o, lp in zip(before, old_lp) for a, b in zip(o.logprobs, lp))
    assert moved > 1e-3, "the step did not change the policy enough for this test to mean anything"


def test_allowed_token_ids_constrain_and_renormalise(run):
    """Constrained decoding (``generation.allowed_tokens``): vLLM samples only the allowed
    ids, and reports log-probs of the softmax over those ids alone, which is what the
    trainer computes with ``allowed``."""
    tok, lm = run["tokenizer"], run["policy"].module.lm
    allowed = sorted(tok.convert_tokens_to_ids(["Up", "Down"]))
    prompts = _prompts(run)
    sampling = SamplingParams(temperature=T, max_new_tokens=3, seeds=[5, 6, 7], allowed_token_ids=allowed)
    outs = run["generator"].generate(prompts, sampling)
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == 3 and set(o.token_ids) <= set(allowed)
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([p + o.token_ids])).logits[0, len(p) - 1: -1].float() / T
        restricted = torch.log_softmax(logits[:, allowed], -1)
        expected = [restricted[i, allowed.index(t)].item() for i, t in enumerate(o.token_ids)]
        assert o.logprobs == pytest.approx(expected, abs=2e-4)
        whole = torch.log_softmax(logits, -1)  # over the whole vocabulary: lower, not what was sampled
        assert all(lp > whole[i, t].item() + 1e-3 for i, (t, lp) in enumerate(zip(o.token_ids, o.logprobs)))


@pytest.mark.parametrize("top_k, top_p", [(0, 0.6), (8, 1.0), (8, 0.9)])
def test_top_k_top_p_log_probs_are_the_trainers(run, top_k, top_p):
    """vLLM's processed log-probs under top-k and top-p are what the trainer computes under the
    same truncation (``trainer/sampling.py``: the ratios compare the sampled distribution);
    the untruncated softmax's would be lower on every sampled token."""
    lm, stop = run["policy"].module.lm, run["template"].stop_id
    prompts = _prompts(run)
    sampling = SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=4, stop_token_ids=[stop],
                              seeds=[31, 32, 33])
    outs = run["generator"].generate(prompts, sampling)
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([p + o.token_ids])).logits[:, len(p) - 1: -1]
            targets = torch.tensor([o.token_ids])
            lp = target_logp(logits, targets, T, top_k=top_k, top_p=top_p)[0].tolist()
            plain = target_logp(logits, targets, T)[0].tolist()
        assert o.logprobs == pytest.approx(lp, abs=2e-4)
        assert all(b > a + 1e-3 for a, b in zip(plain, o.logprobs))


def test_repetition_penalty_log_probs_are_the_trainers(run):
    """vLLM's repetition penalty (over the prompt and the reply so far) is the one the trainer
    applies at each position (:class:`~rockroll.trainer.engines.sampling.Seen`): the processed
    log-probs agree, and the unpenalised ones do not."""
    lm, stop = run["policy"].module.lm, run["template"].stop_id
    prompts = _prompts(run)
    sampling = SamplingParams(temperature=T, repetition_penalty=1.8, max_new_tokens=4, stop_token_ids=[stop],
                              seeds=[41, 42, 43])
    outs = run["generator"].generate(prompts, sampling)
    for p, o in zip(prompts, outs):
        row = torch.tensor([p + o.token_ids])
        with torch.no_grad():
            logits = lm(input_ids=row).logits[:, :-1]
            seen = Seen.of_rows(row[:, :-1], logits.shape[-1])
            lp = target_logp(logits, row[:, 1:], T, seen=seen, repetition_penalty=1.8)[0, len(p) - 1:].tolist()
            plain = target_logp(logits, row[:, 1:], T)[0, len(p) - 1:].tolist()
        assert o.logprobs == pytest.approx(lp, abs=2e-4)
        assert max(abs(a - b) for a, b in zip(plain, o.logprobs)) > 1e-2


def test_requests_join_the_running_batch(run):
    """Continuous batching through vLLM's engine: a request submitted while a long one decodes
    joins it and is answered first, with the tokens it has alone (its seed, not its batch)."""
    gen, stop = run["generator"], run["template"].stop_id
    prompts = _prompts(run)
    short = SamplingParams(temperature=T, max_new_tokens=2, stop_token_ids=[stop], seeds=[31])
    alone = gen.generate(prompts[:1], short)[0]
    order, joins = [], gen.joins
    # the loop held inside the long one's second engine step: the short one arrives while the
    # long one decodes, however the threads are scheduled
    held = Held(gen.llm.llm_engine, "step", 2)
    try:
        long_fut = gen.submit(prompts[1], SamplingParams(temperature=T, max_new_tokens=200, seeds=[32]))
        long_fut.add_done_callback(lambda f: order.append("long"))
        with held:
            short_fut = gen.submit(prompts[0], short)
            short_fut.add_done_callback(lambda f: order.append("short"))
    finally:
        held.undo()
    joined, long_out = short_fut.result(), long_fut.result()
    assert order == ["short", "long"] and len(long_out.token_ids) > 2  # (vLLM stops at EOS)
    assert joined.token_ids == alone.token_ids and joined.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert joined.version == long_out.version == gen.version
    assert gen.joins == joins + 1
