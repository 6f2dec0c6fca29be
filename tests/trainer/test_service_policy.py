"""The trainer's policy behind the model service (``trainer/service_policy.py``), called by
the real ``openai`` client: the prompt is the tokenizer's chat template over the call's
messages, the answer is what the Transformers engine generated (ids, behaviour log-probs,
version), recorded per call, and the OpenAI knobs (``n``, ``seed``, ``temperature=0``,
``max_tokens``, ``stop``) do what they say."""

import openai
import pytest
import torch

from rockroll.sandbox.modelservice import ModelService, PolicyMode
from rockroll.trainer.config import EnvConfig, load_config
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.models import build_model, load_tokenizer
from rockroll.trainer.rollout.manager import PromptTemplate
from rockroll.trainer.rollout.service_policy import EnginePolicy

MESSAGES = [{"role": "system", "content": "Walk to the goal."}, {"role": "user", "content": "P_G\n___"}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("svc")
    cfg = load_config({"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "intermediate_size": 64}})
    tok = load_tokenizer(cfg.tokenizer, [EnvConfig(id="rock/FrozenLake-v0")], tmp / "tok")
    model = build_model(cfg.model, tok, seed=0)
    engine = TransformersEngine(model, tok.pad_token_id, version=7)
    stop_id = PromptTemplate(tok, cfg.tokenizer).stop_id
    policy = EnginePolicy(engine, tok, stop_id=stop_id, max_tokens=8)
    svc = ModelService(PolicyMode(policy), records=tmp / "calls.jsonl")
    svc.start()
    client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb-policy", "episode-1"), max_retries=0)
    yield {"svc": svc, "client": client, "tok": tok, "model": model, "stop_id": stop_id}
    svc.stop()


def _ids(x):
    return list(x if isinstance(x, list) else x["input_ids"])


def _logp(model, prompt, completion, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_a_chat_call_is_answered_by_the_policy_and_recorded_exactly(setup):
    s = setup
    resp = s["client"].chat.completions.create(model="rockroll", messages=MESSAGES, max_tokens=6, seed=3)
    rec = s["svc"].recorder.records[-1]
    prompt = _ids(s["tok"].apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True))
    assert rec["prompt_ids"] == prompt and rec["episode"] == "episode-1" and rec["version"] == 7
    ids = rec["completion_ids"]
    assert 1 <= len(ids) <= 6 and resp.choices[0].message.content == s["tok"].decode(ids, skip_special_tokens=True)
    assert resp.choices[0].finish_reason == ("stop" if ids[-1] == s["stop_id"] else "length")
    torch.testing.assert_close(torch.tensor(rec["logprobs"]), _logp(s["model"], prompt, ids), atol=2e-4, rtol=1e-4)
    # the same seed, the same sample
    again = s["client"].chat.completions.create(model="rockroll", messages=MESSAGES, max_tokens=6, seed=3)
    assert s["svc"].recorder.records[-1]["completion_ids"] == ids and again.choices[0].message.content == \
        resp.choices[0].message.content


def test_n_greedy_and_a_completion_call(setup):
    s = setup
    resp = s["client"].chat.completions.create(model="rockroll", messages=MESSAGES, max_tokens=8, n=3, seed=1)
    assert len(resp.choices) == 3 and len(s["svc"].recorder.records[-1]["choices"]) == 3
    # temperature 0: the argmax path, every time
    s["client"].completions.create(model="rockroll", prompt="Say Up.", max_tokens=5, temperature=0)
    rec = s["svc"].recorder.records[-1]
    prompt = s["tok"].encode("Say Up.", add_special_tokens=False)
    assert rec["prompt_ids"] == prompt
    path = []
    with torch.no_grad():
        for _ in range(len(rec["completion_ids"])):
            path.append(int(s["model"](input_ids=torch.tensor([prompt + path])).logits[0, -1].argmax()))
    assert rec["completion_ids"] == path
    s["client"].completions.create(model="rockroll", prompt="Say Up.", max_tokens=5, temperature=0)
    assert s["svc"].recorder.records[-1]["completion_ids"] == path


def _first_new_token(tok, ids):
    """A position k > 0 whose token's text does not occur in the text before it, or None."""
    return next((i for i in range(1, len(ids)) if (t := tok.decode([ids[i]], skip_special_tokens=True))
                 and t not in tok.decode(ids[:i], skip_special_tokens=True)), None)


def test_stop_strings_cut_the_ids_and_max_tokens_is_capped(setup):
    s, tok = setup, setup["tok"]
    for seed in range(50):  # a seeded sample with a token whose text is new at position k
        s["client"].completions.create(model="rockroll", prompt="Now", max_tokens=8, seed=seed)
        sampled = s["svc"].recorder.records[-1]["completion_ids"]
        if (k := _first_new_token(tok, sampled)) is not None:
            break
    stop = tok.decode([sampled[k]], skip_special_tokens=True)
    resp = s["client"].completions.create(model="rockroll", prompt="Now", max_tokens=8, seed=seed, stop=[stop])
    rec = s["svc"].recorder.records[-1]
    assert rec["completion_ids"] == sampled[:k] and stop not in resp.choices[0].text  # cut before it
    assert resp.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as err:
        s["client"].chat.completions.create(model="rockroll", messages=MESSAGES, max_tokens=9)
    assert err.value.body["param"] == "max_tokens"
