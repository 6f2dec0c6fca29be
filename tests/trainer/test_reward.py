"""The reward role (``trainer/reward.py``): verifiers and an LLM-as-judge scoring finished
episodes. The judge is a real OpenAI-compatible HTTP server on 127.0.0.1 (rockroll's model
service over a scripted mode: it answers, fails with 500, hangs, or talks nonsense, as the
episode's answer says) called through the proxy mode, or a tiny local Llama whose replies are
constrained to digits. A judge failure must make the episode an infra error, which the rollout
drops, never a reward of 0."""

import asyncio
import os

import pytest
import torch

from rockroll.sandbox.modelservice import Answer, Choice, ModelService, ModeError
from rockroll.trainer.config import ConfigError, EnvConfig, ModelConfig, load_config
from rockroll.trainer.models import build_model, load_tokenizer, save_word_tokenizer
from rockroll.trainer.rollout.reward import RewardRole, episode_fields, parse_score
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from rockroll.trainer.rollout.types import Sample
from _scripted import ScriptEngine

TEMPLATE = "Q: {question}\nA: {answer}\nScore 0-10:"


class QAEnv:
    """One question, one reply: 0.5 for "Right", 0 otherwise (the env's own reward)."""

    def reset(self, seed=None, options=None):
        self.task = (options or {}).get("task_id", 0)
        return f"Question {self.task}", {}

    def step(self, action):
        right = action.strip() == "Right"
        return "Thanks", 0.5 if right else 0.0, True, False, {"success": right}

    def close(self):
        pass


class ScriptedJudge:
    """The judge server's mode: "8" for a Right answer; for a Left one, what ``left`` says:
    a score, ``500``, ``hang`` or ``garbage``. Counts the calls in flight at once."""

    def __init__(self, left="3", delay_s=0.2):
        self.left, self.delay_s = left, delay_s
        self.prompts, self.in_flight, self.max_in_flight = [], 0, 0

    async def generate(self, call):
        self.prompts.append((call.model, call.messages))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if "A: Right" in call.messages[-1]["content"]:
                return Answer([Choice("8")])
            if self.left == "500":
                raise ModeError(500, "judge backend exploded")
            if self.left == "hang":
                await asyncio.sleep(3)
            return Answer([Choice("I would rather not say" if self.left == "garbage" else self.left)])
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    return load_tokenizer(load_config({}).tokenizer, envs, tmp_path_factory.mktemp("tok"))


@pytest.fixture
def judge_server(monkeypatch):
    servers = []

    def start(mode):
        svc = ModelService(mode)
        svc.start()
        monkeypatch.setenv("JUDGE_KEY", svc.admit("judge"))
        servers.append(svc)
        return svc.url + "/v1"

    yield start
    for svc in servers:
        svc.stop()


def says_right(question, answer, transcript, bonus=1.0):
    """A verifier: ``bonus`` when the reply is Right."""
    return bonus if answer.strip() == "Right" else 0.0


def broken_verifier(question, answer, transcript):
    raise RuntimeError("verifier bug")


def _cfg(judge=None, verifiers=(), **rollout):
    data = {"seed": 1, "envs": [{"id": "qa", "task_ids": [0, 1, 2]}],
            "rollout": {"group_size": 2, "batch_groups": 2, "max_turns": 1, "batch_wait_ms": 10_000, **rollout},
            "generation": {"max_new_tokens": 2}, "reward": {"verifiers": list(verifiers)}}
    if judge:
        data["reward"]["judge"] = {"template": TEMPLATE, **judge}
    return load_config(data)


def _openai(url, **kw):
    return {"backend": "openai", "url": url, "api_key_env": "JUDGE_KEY", "model": "judge-7b", **kw}


def _sample(answer, env_reward=0.0):
    return Sample(transcript=[["env", "Question 1"], ["agent", answer], ["env", "Thanks"]], reward=env_reward,
                  turn_rewards=[env_reward], num_turns=1, env_id="qa", task_id=1)


def _run(tok, cfg, what, reward=None):
    """``what(manager)`` on a started rollout of QAEnv episodes answered Right or Left."""
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = ScriptEngine(tok, ["Right", "Left"], stop_id=template.stop_id)
    mgr = RolloutManager(cfg, engine, template, env_factory=lambda spec: QAEnv(),
                         reward=reward if reward is not None else RewardRole(cfg, tok))
    mgr.start()
    try:
        return what(mgr)
    finally:
        mgr.close()


def _rollout(tok, cfg, reward=None):
    return _run(tok, cfg, lambda mgr: mgr.get_batch(0, timeout=120), reward)


def _evaluate(tok, cfg):
    return _run(tok, cfg, lambda mgr: mgr.evaluate(6, seed=7))


def test_parse_score_maps_the_range_and_refuses_what_is_outside():
    pat = r"(-?\d+(?:\.\d+)?)"
    assert parse_score("Score: 7/10", pat, 0, 10) == pytest.approx(0.7)
    assert parse_score("2.5", pat, 0, 10) == pytest.approx(0.25)
    assert parse_score("no number", pat, 0, 10) is None
    assert parse_score("11", pat, 0, 10) is None
    assert parse_score("-1", pat, -1, 1) == 0.0
    assert parse_score("VERDICT: good (3)", r"\((\d)\)", 1, 5) == pytest.approx(0.5)


def test_the_rollout_adds_the_judges_score_to_the_env_reward_with_calls_in_flight_at_once(tok, judge_server):
    """Four episodes finish together: their judge calls are in flight at once (the server counts
    them), each prompt is the template over the episode, and each reward is the env's plus the
    judge's score mapped to [0, 1] times the weight, on the last turn."""
    mode = ScriptedJudge(left="3")
    cfg = _cfg(_openai(judge_server(mode), weight=2.0))
    groups, metrics = _rollout(tok, cfg)
    samples = [s for g in groups for s in g.samples]
    assert len(samples) == 4 and mode.max_in_flight >= 2
    for s in samples:
        right = s.transcript[1][1] == "Right"
        assert s.reward_parts == {"judge": pytest.approx(2.0 * (0.8 if right else 0.3))}
        assert s.reward == pytest.approx((0.5 if right else 0.0) + s.reward_parts["judge"])
        assert s.turn_rewards == [pytest.approx(s.reward)]
    sent = {m[-1]["content"] for _, m in mode.prompts}
    assert all(f"Q: Question {s.task_id}\nA: {s.transcript[1][1]}\nScore 0-10:" in sent for s in samples)
    assert {model for model, _ in mode.prompts} == {"judge-7b"}
    assert metrics["reward/judge"] == pytest.approx(sum(s.reward_parts["judge"] for s in samples) / 4)
    assert metrics["rollout/reward_infra_errors"] == 0


@pytest.mark.parametrize("failure", ["500", "hang", "garbage"])
def test_a_failed_judge_call_is_an_infra_error_not_a_zero_reward(tok, judge_server, failure):
    """A server error (after the retries), a timeout and a reply without a score: the sample
    carries an infra error naming it, its reward stays the env's, nothing is added."""
    mode = ScriptedJudge(left=failure, delay_s=0.0)
    role = RewardRole(_cfg(_openai(judge_server(mode), timeout_s=1.0, retries=1)))
    try:
        right, left = role.score_batch([_sample("Right", 0.5), _sample("Left", 0.0)])
    finally:
        role.close()
    assert right.infra_error is None and right.reward == pytest.approx(0.5 + 0.8)
    expected = {"500": "upstream answered 500", "hang": "timed out after 1.0s", "garbage": "has no score"}[failure]
    assert left.infra_error and left.infra_error.startswith("reward: judge") and expected in left.infra_error
    assert left.reward == 0.0 and left.turn_rewards == [0.0] and left.reward_parts == {}
    assert role.counters["judge_errors"] == 1
    if failure == "500":  # retried once by the proxy mode
        assert sum("A: Left" in m[-1]["content"] for _, m in mode.prompts) == 2


def test_the_rollout_drops_episodes_whose_judge_failed_and_fills_the_batch_with_others(tok, judge_server):
    """Left answers make the judge fail with 500: those episodes are dropped and counted (no
    sample of the batch is a Left one, none has a zero judge score), groups refill from the
    redundant episodes or are replaced."""
    mode = ScriptedJudge(left="500", delay_s=0.0)
    cfg = _cfg(_openai(judge_server(mode), retries=0), redundant=2, batch_groups=1)
    groups, metrics = _rollout(tok, cfg)
    samples = [s for g in groups for s in g.samples]
    assert len(samples) == 2
    assert all(s.transcript[1][1] == "Right" and s.reward_parts["judge"] == pytest.approx(0.8) for s in samples)
    # every drop was the judge's (QAEnv never fails); a group still running may have counted its
    # judge failure and not yet its drop
    dropped = metrics["rollout/infra_samples_dropped"]
    assert dropped >= 1 and metrics["rollout/reward_infra_errors"] >= dropped


def test_evaluation_episodes_are_judged_like_training_ones(tok, judge_server):
    """eval/reward means what rollout/reward means: the env's reward plus the judge's (0.8 for
    every answer here), and a failing judge leaves episodes out of the eval, counted."""
    out = _evaluate(tok, _cfg(_openai(judge_server(ScriptedJudge(left="8", delay_s=0.0)))))
    assert out["eval/episodes"] == 6 and 0 < out["eval/success"] < 1
    assert out["eval/reward"] == pytest.approx(0.5 * out["eval/success"] + 0.8)
    out = _evaluate(tok, _cfg(_openai(judge_server(ScriptedJudge(left="garbage", delay_s=0.0)))))
    assert out["eval/infra_errors"] >= 1 and out["eval/episodes"] == 6 - out["eval/infra_errors"]
    assert out["eval/success"] == 1.0 and out["eval/reward"] == pytest.approx(0.5 + 0.8)


def test_the_reward_role_runs_as_a_ray_actor(tok, judge_server):
    """The role in a Ray actor (an async one), the rollout calling it through RemoteReward: the
    episodes' judge calls still overlap, scores come back into the samples, and a failed call
    is still an infra error that the rollout drops."""
    import ray

    from rockroll.trainer.roles.ray import init_local_ray
    from rockroll.trainer.rollout.reward import RemoteReward

    mode = ScriptedJudge(left="garbage")
    cfg = _cfg(_openai(judge_server(mode)), redundant=2, batch_groups=1)
    had = os.environ.get("RAY_AUTH_MODE")
    init_local_ray(num_cpus=2)  # sets RAY_AUTH_MODE=token in this process: put back afterwards
    try:
        actor = ray.remote(RewardRole).options(
            runtime_env={"env_vars": {"JUDGE_KEY": os.environ["JUDGE_KEY"]}}).remote(cfg)
        groups, metrics = _rollout(tok, cfg, reward=RemoteReward(actor))
        counters = ray.get(actor.__ray_call__.remote(lambda self: dict(self.counters)))
    finally:
        ray.shutdown()
        if had is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = had
    samples = groups[0].samples
    assert len(samples) == 2 and mode.max_in_flight >= 2
    assert all(s.transcript[1][1] == "Right" and s.reward == pytest.approx(0.5 + 0.8) for s in samples)
    assert all(s.reward_parts == {"judge": pytest.approx(0.8)} for s in samples)
    assert metrics["rollout/reward_infra_errors"] >= metrics["rollout/infra_samples_dropped"] >= 1
    assert counters["judge_errors"] >= 1 and counters["judge_calls"] >= 3


def test_verifiers_add_their_weighted_values_and_a_failing_one_is_an_infra_error(tok):
    role = RewardRole(_cfg(verifiers=[{"fn": "test_reward:says_right", "weight": 0.5, "kwargs": {"bonus": 4.0}},
                                      {"fn": "test_reward:says_right", "name": "again"}]))
    right, left = role.score_batch([_sample("Right", 0.5), _sample("Left")])
    role.close()
    assert right.reward_parts == {"says_right": 2.0, "again": 1.0} and right.reward == 3.5
    assert left.reward_parts == {"says_right": 0.0, "again": 0.0} and left.reward == 0.0 and not left.infra_error
    role = RewardRole(_cfg(verifiers=[{"fn": "test_reward:broken_verifier"}]))
    (s,) = role.score_batch([_sample("Right", 0.5)])
    role.close()
    assert "verifier broken_verifier failed" in s.infra_error and "verifier bug" in s.infra_error
    assert s.reward == 0.5 and s.reward_parts == {}


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"reward\.verifiers\[0\]\.fn: cannot import test_reward:nope"):
        RewardRole(_cfg(verifiers=[{"fn": "test_reward:nope"}]))
    with pytest.raises(ConfigError, match=r"reward\.judge\.template: unknown field\(s\) \['score'\]"):
        _cfg({"backend": "openai", "url": "http://127.0.0.1:1/v1", "template": "{score}"})
    with pytest.raises(ConfigError, match=r"reward\.judge\.url"):
        _cfg({"backend": "openai"})
    with pytest.raises(ConfigError, match=r"reward\.judge\.score_regex: needs a group"):
        _cfg({"backend": "openai", "url": "u", "score_regex": r"\d"})
    with pytest.raises(ConfigError, match=r"reward\.judge\.max_concurency: unknown key"):
        _cfg({"backend": "openai", "url": "u", "max_concurency": 3})


@pytest.fixture(scope="module")
def local_judge(tmp_path_factory):
    """A tiny Llama and a word tokenizer (with its Jinja chat template) saved as a checkpoint."""
    folder = tmp_path_factory.mktemp("judge")
    words = set("0123456789 :\n-?") | {"Q", "A", "Score", "Question", "Right", "Left", "Up"}
    tok = save_word_tokenizer(words, folder)
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=32), tok, seed=2)
    with torch.no_grad():  # larger weights: the prompt moves the argmax (at init every prompt gets the same digit)
        for p in model.parameters():
            p.mul_(3.0)
    model.save_pretrained(folder)
    return folder, tok, model


def _local(folder, **kw):
    return {"backend": "local", "model": str(folder), "allowed_tokens": [str(d) for d in range(10)],
            "max_tokens": 1, **kw}


def test_a_local_judge_answers_a_digit_in_batched_engine_calls(local_judge):
    """Eight episodes scored at once by the local judge (greedy, digits only): its requests go
    in engine calls of max_batch_size, and each score is the digit the model's argmax gives."""
    folder, tok, model = local_judge
    role = RewardRole(_cfg(_local(folder, max_batch_size=3)))
    answers = ["Right", "Left", "Up", "Left Left", "Right Up", "Up Up", "Left Right", "Q"]
    try:
        scored = role.score_batch([_sample(a) for a in answers])
    finally:
        role.close()
    assert role.judge.gen.batch_sizes == [3, 3, 2]
    digits = tok.convert_tokens_to_ids([str(d) for d in range(10)])
    for a, s in zip(answers, scored):
        assert s.infra_error is None
        msgs = [{"role": "user", "content": TEMPLATE.format(**episode_fields(_sample(a)))}]
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        digit = int(logits[digits].argmax())
        assert s.reward_parts["judge"] == pytest.approx(digit / 10)
    assert len({s.reward_parts["judge"] for s in scored}) > 1  # the answer changes the prompt, and the score


def test_a_local_judge_reply_without_a_score_is_an_infra_error(local_judge):
    folder, _, _ = local_judge
    role = RewardRole(_cfg(_local(folder, allowed_tokens=["Up"])))
    (s,) = role.score_batch([_sample("Right", 0.5)])
    role.close()
    assert "has no score" in s.infra_error and "'Up'" in s.infra_error and s.reward == 0.5
    with pytest.raises(ConfigError, match=r"reward\.judge\.allowed_tokens: 'Upward'"):
        RewardRole(_cfg(_local(folder, allowed_tokens=["Upward"])))
