"""Token-in/token-out rollout and the async manager: masks, staleness, redundancy, infra
failures, dynamic sampling. Real envs, real tokenizer; a scripted engine where a test needs
to control what the policy says, the real Transformers engine for the mask checks."""

import itertools
import time

import pytest
import torch

from rockroll.trainer.config import ConfigError, EnvConfig, load_config
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.algorithms.credit import turn_advantages
from rockroll.trainer.models import allowed_token_ids, build_model, load_tokenizer
from rockroll.trainer.rollout.types import Group, Sample
from rockroll.trainer.rollout.manager import (
    InfraErrorStreak, PromptTemplate, RolloutManager, ZeroAdvantageError, filter_stale, zero_advantage,
)
from rockroll.trainer.envs import make_env
from _synthetic import LatencyEnv, TwoStepEnv
from _scripted import RecordingEngine, ScriptEngine, first_batch, recording_resets
from rockroll.trainer.roles.update import collate, token_logp

LAT = "_synthetic:LatencyEnv"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    return load_tokenizer(load_config({}).tokenizer, envs, tmp_path_factory.mktemp("tok"))


def _cfg(**rollout):
    base = {"group_size": 2, "batch_groups": 1, "max_turns": 3, "batch_wait_ms": 10_000}
    return {"seed": 1, "rollout": {**base, **rollout}, "generation": {"max_new_tokens": 2}}


def _manager(tok, data, engine=None, env_factory=None, words=("Right", "Left")):
    cfg = load_config(data)
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = engine or ScriptEngine(tok, list(words), stop_id=template.stop_id)
    return RolloutManager(cfg, engine, template, env_factory=env_factory), engine, template


def _first_batch(mgr):
    """Start ``mgr``, take the batch of step 0 (the timeout only catches a hang), close it."""
    mgr.start()
    try:
        return mgr.get_batch(0, timeout=60)
    finally:
        mgr.close()


def test_masks_and_exact_generated_ids(tok):
    """Observation tokens are mask 0, the policy's tokens mask 1 and exactly what the engine
    produced; the trainer's recomputed log-probs match the generator's on those tokens."""
    data = {**_cfg(group_size=3, max_turns=3), "envs": [
        {"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0]}]}
    cfg = load_config(data)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, seed=0)
    engine = RecordingEngine(TransformersEngine(model, tok.pad_token_id))
    mgr, _, template = _manager(tok, data, engine=engine)
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=120)
    finally:
        mgr.close()
    samples = groups[0].samples
    assert len(samples) == 3 and metrics["rollout/samples"] == 3
    by_prompt = {}
    for p, o in engine.records:  # group members share their first prompt: keep every answer
        by_prompt.setdefault(tuple(p), []).append(o)
    for s in samples:
        assert len(s.token_ids) == len(s.mask) == len(s.behav_logp)
        assert s.token_ids[: len(template.first(s.transcript[0][1]))] == template.first(s.transcript[0][1])
        # walk the sequence: every mask-1 run is one engine output, after a prompt it was given
        i, turns = 0, 0
        while i < len(s.mask):
            if s.mask[i]:
                outs = [o for o in by_prompt[tuple(s.token_ids[:i])]
                        if s.token_ids[i: i + len(o.token_ids)] == o.token_ids]
                assert outs, "a mask-1 run that the engine did not generate after this prompt"
                out = outs[0]
                n = len(out.token_ids)
                assert all(s.mask[i: i + n])
                assert s.behav_logp[i: i + n] == pytest.approx(out.logprobs)
                i, turns = i + n, turns + 1
            else:
                assert s.behav_logp[i] == 0.0
                i += 1
        assert turns == s.num_turns == len(s.versions)
        # observation tokens after turn k are the template's encoding of the env's text
        env_obs = [text for role, text in s.transcript if role == "env"]
        if s.num_turns > 1:
            nxt = template.next(env_obs[1], reply_stopped=True)[1:]
            assert any(s.token_ids[j: j + len(nxt)] == nxt for j in range(len(s.token_ids)))
    batch = collate(groups, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logp(lambda ids, a: (model(input_ids=ids, attention_mask=a).logits, None), batch, 1.0)
    torch.testing.assert_close(logp[batch.mask], batch.behav_logp[batch.mask], atol=2e-4, rtol=1e-4)


def test_constrained_decoding_samples_only_allowed_tokens_and_the_trainer_agrees(tok):
    """``generation.allowed_tokens``: every generated token is one of them, and the trainer's
    log-probs (softmax over the allowed ids only) are the generator's; over the whole
    vocabulary they would not be (the generator's are larger: renormalised over 2 ids)."""
    data = {**_cfg(group_size=4, max_turns=3), "generation": {"max_new_tokens": 2, "allowed_tokens": ["Up", "Down"]},
            "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0]}]}
    cfg = load_config(data)
    allowed = allowed_token_ids(tok, cfg.generation.allowed_tokens)
    assert allowed == sorted(tok.convert_tokens_to_ids(["Up", "Down"]))
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, seed=0)
    mgr, _, _ = _manager(tok, data, engine=TransformersEngine(model, tok.pad_token_id))
    groups = first_batch(mgr, timeout=120)
    batch = collate(groups, tok.pad_token_id)
    generated = batch.targets[batch.mask]
    assert generated.numel() >= 8 and set(generated.tolist()) <= set(allowed)
    forward = lambda ids, a: (model(input_ids=ids, attention_mask=a).logits, None)  # noqa: E731
    with torch.no_grad():
        logp, _ = token_logp(forward, batch, 1.0, allowed=torch.tensor(allowed))
        whole, _ = token_logp(forward, batch, 1.0)
    torch.testing.assert_close(logp[batch.mask], batch.behav_logp[batch.mask], atol=2e-4, rtol=1e-4)
    assert (whole[batch.mask] < batch.behav_logp[batch.mask] - 0.1).all()


def test_allowed_tokens_must_each_be_one_token(tok):
    with pytest.raises(ConfigError, match=r"generation\.allowed_tokens: 'Upward'"):
        allowed_token_ids(tok, ["Up", "Upward"])
    with pytest.raises(ConfigError, match=r"generation\.allowed_tokens"):
        load_config({"generation": {"allowed_tokens": ["Up", ""]}})
    assert allowed_token_ids(tok, []) is None


def test_filter_stale_pure():
    g = lambda v: Group(0, "e", None, 0, [Sample(version=v)])  # noqa: E731
    fresh, stale = filter_stale([g(5), g(4), g(3), g(2)], step=5, alpha=2)
    assert [x.version for x in fresh] == [5, 4, 3] and [x.version for x in stale] == [2]
    fresh, stale = filter_stale([g(5), g(4)], step=5, alpha=0)
    assert len(fresh) == 1 and len(stale) == 1


def test_staleness_bound_drops_and_counts(tok):
    data = {**_cfg(async_ratio=1, group_size=2), "envs": [{"id": LAT}]}
    mgr, engine, _ = _manager(tok, data)
    mgr.start()
    try:
        g0, _ = mgr.get_batch(0, timeout=60)
        assert g0[0].version == 0
        # alpha = 1 admits a second group ahead of the trainer: it was generated at version 0
        deadline = __import__("time").monotonic() + 30
        while not mgr.ready and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.01)
        assert mgr.ready and mgr.ready[0].version == 0
        engine.load_weights({}, 3)
        mgr.set_version(3)
        groups, metrics = mgr.get_batch(3, timeout=60)
        assert all(3 - g.version <= 1 for g in groups)
        assert metrics["rollout/stale_samples_dropped"] == 2
        assert metrics["rollout/stale_groups_dropped"] == 1
        assert metrics["rollout/staleness_max"] <= 1
    finally:
        mgr.close()


def test_alpha_zero_is_synchronous(tok):
    data = {**_cfg(async_ratio=0, batch_groups=2), "envs": [{"id": LAT}]}
    mgr, engine, _ = _manager(tok, data)
    mgr.start()
    try:
        groups, _ = mgr.get_batch(0, timeout=60)
        __import__("time").sleep(0.2)
        assert mgr.started == 2 and not mgr.ready  # nothing starts before the weights of step 1
        engine.load_weights({}, 1)
        mgr.set_version(1)
        groups, m = mgr.get_batch(1, timeout=60)
        assert {g.version for g in groups} == {1} and m["rollout/staleness_max"] == 0
    finally:
        mgr.close()


def test_redundant_envs_first_g_complete_the_group(tok):
    latencies = itertools.cycle([0.6, 0.0, 0.3, 0.0])  # per env of a group: two fast, two slow

    def factory(spec):
        return LatencyEnv(fixed_latency_s=next(latencies), max_turns=3)

    data = {**_cfg(group_size=2, redundant=2), "envs": [{"id": LAT}]}
    mgr, engine, _ = _manager(tok, data, env_factory=factory, words=["Right"])
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=60)
    finally:
        mgr.close()
    assert len(groups[0].samples) == 2
    assert metrics["rollout/redundant_cancelled"] == 2
    assert len({s.group_id for s in groups[0].samples}) == 1


def test_infra_errors_are_dropped_not_scored(tok):
    fail = itertools.cycle([True, False, False])

    def factory(spec):
        bad = next(fail)  # the failing env is fast, so it ends before its group completes
        return LatencyEnv(infra_error_rate=1.0 if bad else 0.0, fixed_latency_s=0.0 if bad else 0.2, max_turns=3)

    data = {**_cfg(group_size=2, redundant=1, batch_groups=2), "envs": [{"id": LAT}]}
    mgr, _, _ = _manager(tok, data, env_factory=factory)
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=60)
    finally:
        mgr.close()
    assert metrics["rollout/infra_samples_dropped"] == 2
    assert all(len(g.samples) == 2 and not any(s.infra_error for s in g.samples) for g in groups)


def test_dynamic_sampling_drops_zero_advantage_groups(tok):
    data = {**_cfg(group_size=4, batch_groups=3),
            "envs": [{"id": LAT, "task_ids": ["easy", "hard"]}],
            "algorithm": {"dynamic_sampling": True}}
    mgr, _, _ = _manager(tok, data)
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=60)
    finally:
        mgr.close()
    assert len(groups) == 3
    for g in groups:  # every kept group has a reward spread: a non-zero GRPO advantage
        assert len({s.reward for s in g.samples}) > 1
    assert metrics["rollout/zero_adv_groups_dropped"] >= 1  # every "easy" group is all-wins


def test_dynamic_sampling_stops_when_every_group_has_zero_advantage(tok):
    """Every reply wins the "easy" task, so every group has zero advantage (a collapsed or
    solved policy looks the same): the rollout must fail with a ZeroAdvantageError after exactly
    dynamic_sampling_max_batches x batch_groups dropped groups, not sample forever."""
    data = {**_cfg(group_size=2, batch_groups=1), "envs": [{"id": LAT, "task_ids": ["easy"]}],
            "algorithm": {"dynamic_sampling": True, "dynamic_sampling_max_batches": 3}}
    mgr, _, _ = _manager(tok, data)
    with pytest.raises(RuntimeError, match="rollout failed") as err:
        _first_batch(mgr)  # it used to sample forever (its timeout caught it after 60 s)
    mgr.close()  # idempotent, also once the failed rollout thread has closed its loop
    assert isinstance(err.value.__cause__, ZeroAdvantageError)
    assert "dropped 3 groups in a row" in str(err.value.__cause__)
    assert "algorithm.dynamic_sampling_max_batches" in str(err.value.__cause__)
    # one group in flight at a time (batch_groups 1, async_ratio 0): the third drop, not a fourth
    assert mgr.counters["zero_adv_groups_dropped"] == 3 and mgr.counters["groups_done"] == 0


def test_a_rollout_whose_every_episode_is_an_infra_error_stops_with_the_errors(tok):
    """Issue #41: an env that never runs (here every step an infrastructure error) made the
    run retry forever (7,752 drops in 5 minutes). After rollout.infra_error_streak episodes
    dropped in a row the rollout fails, quoting the first error (the groups already in flight,
    two of two episodes, may drop theirs before it stops)."""
    data = {**_cfg(group_size=2, batch_groups=2), "rollout": {**_cfg()["rollout"], "group_size": 2,
                                                              "batch_groups": 2, "infra_error_streak": 5},
            "envs": [{"id": LAT, "kwargs": {"infra_error_rate": 1.0}}]}
    mgr, _, _ = _manager(tok, data)
    with pytest.raises(RuntimeError, match=r"rollout failed: [5-8] episodes in a row were dropped") as err:
        _first_batch(mgr)
    mgr.close()
    assert isinstance(err.value.__cause__, InfraErrorStreak)
    assert "rollout.infra_error_streak: 5" in str(err.value) and "First: _synthetic:LatencyEnv task" in str(err.value)
    assert 5 <= mgr.counters["infra_samples_dropped"] <= 8 and mgr.counters["groups_done"] == 0


def test_infra_errors_below_the_bound_do_not_stop_the_run(tok):
    """The first six envs made fail every step, the rest never: six drops in a row stay under
    the default bound (twice a batch's episodes: 8), the run fills its batch, and the metrics
    count exactly the six."""
    made = itertools.count()
    data = {**_cfg(group_size=2, batch_groups=2), "envs": [{"id": LAT}]}
    factory = lambda spec: LatencyEnv(infra_error_rate=1.0 if next(made) < 6 else 0.0)  # noqa: E731
    mgr, _, _ = _manager(tok, data, env_factory=factory)
    groups, metrics = _first_batch(mgr)
    assert len(groups) == 2 and metrics["rollout/infra_samples_dropped"] == 6


class _CrashingAgent(LatencyEnv):
    """Ends every episode as an agent env does when its agent program crashed."""

    def _step(self, action):
        return "The agent crashed (exit code 1).", 0.0, True, {"agent_status": "crashed",
                                                               "agent_stderr": "Traceback ...\nKeyError: 'x'"}


def test_agent_crashes_are_counted_and_said(tok, caplog):
    """Issue #41: a run whose agent crashed in every episode finished with reward 0 and nothing
    on the console. A crash stays the policy's outcome (the sample trains, reward 0), and it
    is counted in the metrics and logged with the agent's stderr."""
    data = {**_cfg(group_size=2, batch_groups=2), "envs": [{"id": LAT}]}
    mgr, _, _ = _manager(tok, data, env_factory=lambda spec: _CrashingAgent())
    with caplog.at_level("WARNING"):
        groups, metrics = _first_batch(mgr)
    assert len(groups) == 2 and metrics["rollout/agent_crashes"] == 4
    assert all(s.agent_status == "crashed" and s.agent_error.endswith("KeyError: 'x'") for g in groups
               for s in g.samples)
    assert "the agent crashed: Traceback ...\nKeyError: 'x'" in caplog.text


def test_dynamic_sampling_with_per_turn_credit_keeps_groups_whose_turns_differ(tok):
    """TwoStepEnv pays 0.5 per right turn; the scripted policy says Up, Down or Left (by seed) each
    turn, so groups of two often tie on the sum ((Up, Up) and (Down, Down) both earn 0.5) while
    their turns differ: per-turn credit learns from them, and dynamic sampling must keep them."""
    data = {**_cfg(group_size=2, batch_groups=8, max_turns=2),
            "envs": [{"id": "_synthetic:TwoStepEnv", "kwargs": {"first": "Up", "second": "Down"}}],
            "algorithm": {"dynamic_sampling": True, "turn_credit": "discounted"}}
    mgr, _, _ = _manager(tok, data, words=("Up", "Down", "Left"))
    groups, _ = _first_batch(mgr)
    turns = [[tuple(s.turn_rewards) for s in g.samples] for g in groups]
    assert all(len(set(t)) > 1 for t in turns), turns  # no kept group has zero advantage
    assert any(len({s.reward for s in g.samples}) == 1 for g in groups), turns  # some tie on the sum


def test_two_step_env_task_names_its_two_words():
    """A task id "First-Second" sets the words each turn asks for (scripts/compare_credit.py trains
    on some pairs and evaluates on held-out ones); without one, the constructor's pair."""
    env = TwoStepEnv(first="Up", second="Down")
    obs, _ = env.reset(options={"task_id": "Left-Up"})
    assert obs == "Say Left."
    obs, r, *_ = env.step("Left")
    assert (obs, r) == ("Now say Up.", 0.5)
    *_, info = env.step("Down")  # the constructor's second word is not this task's
    assert info["success"] is False
    assert env.reset()[0] == "Say Up." and env.step("Up")[:2] == ("Now say Down.", 0.5)


def test_zero_advantage_with_per_turn_credit_compares_every_turn():
    # equal sums (0.5) from different turns: no spread for GRPO on the sum, but per-turn credit
    # (gamma 1) has G = [0.5, 0] and [0.5, 0.5]: turn 1 {0.5, 0.5} -> 0; turn 2 {0, 0.5}: mean
    # 0.25, std 0.25 -> -1 and +1 (0.25 / (0.25 + 1e-6) = 0.999996)
    a = Sample(turn_rewards=[0.5, 0.0], reward=0.5)
    b = Sample(turn_rewards=[0.0, 0.5], reward=0.5)
    assert zero_advantage([a, b]) and zero_advantage([a, b], "outcome")
    assert not zero_advantage([a, b], "discounted")
    adv = turn_advantages(torch.tensor([a.turn_rewards, b.turn_rewards]), torch.tensor([[1, 0, 1], [1, 0, 1]]),
                          torch.tensor([0, 0]), 1.0)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.0, -0.999996], [0.0, 0.0, 0.999996]]), atol=1e-6)
    # the same turns (0.1 + 0.2 is 0.30000000000000004: float noise is not a spread)
    c = Sample(turn_rewards=[0.1 + 0.2, 0.0], reward=0.1 + 0.2)
    d = Sample(turn_rewards=[0.3, 0.0], reward=0.3)
    assert zero_advantage([c, d], "discounted") and zero_advantage([c, d])
    # different sums: a spread either way
    e = Sample(turn_rewards=[0.5, 0.5], reward=1.0)
    assert not zero_advantage([a, e]) and not zero_advantage([a, e], "discounted")


def test_mixture_and_per_env_metrics(tok):
    data = {**_cfg(group_size=2, batch_groups=6),
            "envs": [{"id": LAT, "weight": 1.0},
                     {"id": "rock/FrozenLake-v0", "weight": 1.0, "kwargs": {"max_actions_per_turn": 1}}]}
    mgr, _, _ = _manager(tok, data)
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=60)
    finally:
        mgr.close()
    ids = {g.env_id for g in groups}
    assert ids == {LAT, "rock/FrozenLake-v0"}
    assert f"env/{LAT}/success" in metrics and "env/rock/FrozenLake-v0/reward" in metrics


def test_evaluate_plays_the_same_fresh_episodes_each_time(tok):
    """Evaluation: a fixed list of seeds (same result twice with the same weights), per-env
    metrics in a mixture, infrastructure failures left out and counted, FrozenLake tasks cycled
    through its task_ids from their first observation."""
    fail = itertools.cycle([True, False, False, False])
    seen = []

    def factory(spec):
        if spec.id == LAT:
            return LatencyEnv(infra_error_rate=1.0 if next(fail) else 0.0, max_turns=3)
        return recording_resets(make_env(spec), seen)

    data = {**_cfg(group_size=2, batch_groups=1),
            "envs": [{"id": LAT}, {"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1},
                                   "task_ids": [0, 1, 2]}]}
    mgr, engine, _ = _manager(tok, data, env_factory=factory, words=("Right", "Down", "Left", "Up"))
    mgr.start()
    mgr.pause()  # no training groups: the env factory is called by the evaluations alone
    try:
        first = mgr.evaluate(episodes=8, seed=7)
        calls = len(engine.calls)
        second = mgr.evaluate(episodes=8, seed=7)
        other = mgr.evaluate(episodes=8, seed=8)
    finally:
        mgr.close()
    assert len(engine.calls) > calls
    assert first == second and first["eval/seed"] == 7 and other["eval/seed"] == 8
    assert {k: v for k, v in first.items() if k != "eval/seed"} != {k: v for k, v in other.items() if k != "eval/seed"}
    assert first["eval/infra_errors"] == 2 and first["eval/episodes"] == 14  # 2 of the 8 LatencyEnvs failed
    assert {f"eval/{LAT}/success", "eval/rock/FrozenLake-v0/success", "eval/success"} <= set(first)
    # the FrozenLake evaluation episodes cycled through task_ids 0, 1, 2 and started fresh
    assert sorted(o["task_id"] for o in seen[:8]) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert all(set(o) == {"task_id"} for o in seen)  # never a saved state


class VersionedScript(ScriptEngine):
    """A ScriptEngine whose log-probs tell which weights answered, -(version + 1), and whose
    calls spend ``prepare_s`` before taking the engine's lock (as VLLMEngine builds its
    sampling params first): a weight load can land between a call's start and its sampling."""

    prepare_s = 0.02

    def generate(self, prompts, sampling):
        time.sleep(self.prepare_s)
        return super().generate(prompts, sampling)

    def load_weights(self, state_dict, version: int) -> None:
        with self._lock:
            self.version, self.logprob = version, -(version + 1.0)


def test_every_turn_is_labelled_with_the_version_that_generated_it(tok):
    """Weight loads land while generation runs (alpha 8: the rollout never waits for the
    trainer): every turn must carry the version of the weights that generated it. Reading the
    engine's version when a call starts, outside the lock that weight loads take, labels a
    call that a load overtook one version too old."""
    data = {**_cfg(group_size=2, batch_groups=2, async_ratio=8, max_concurrent_groups=4, max_turns=3),
            "envs": [{"id": LAT, "kwargs": {"max_turns": 3}}]}
    cfg = load_config(data)
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = VersionedScript(tok, ["Left"], stop_id=template.stop_id)  # never wins: 3 turns each
    engine.load_weights({}, 0)
    mgr = RolloutManager(cfg, engine, template)
    mgr.start()
    turns, STEPS = 0, 12
    try:
        for step in range(STEPS):
            groups, _ = mgr.get_batch(step, timeout=60)
            time.sleep(VersionedScript.prepare_s / 2)  # let the next call start: the load overtakes it
            mgr.load_weights({}, step + 1)
            for s in (s for g in groups for s in g.samples):
                runs, prev = [], 0  # the behaviour log-prob of each mask-1 run (one turn)
                for m, lp in zip(s.mask, s.behav_logp):
                    if m and not prev:
                        runs.append(lp)
                    prev = m
                assert runs == [-(v + 1.0) for v in s.versions], (runs, s.versions)
                turns += len(runs)
    finally:
        mgr.close()
    assert turns == STEPS * 2 * 2 * 3 and engine.version == STEPS


def test_format_penalty_overrides_the_envs_and_turn_rewards_add_up(tok):
    """algorithm.format_penalty reaches the env built by the manager: every unparsable reply
    ("blah") scores it instead of FrozenLake's default -0.1, turn by turn."""
    env = {"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0]}
    for penalty, expected in ((-0.37, -0.37), (None, -0.1)):
        data = {**_cfg(group_size=2, max_turns=3), "envs": [env], "algorithm": {"format_penalty": penalty}}
        mgr, _, _ = _manager(tok, data, words=("blah",))
        groups = first_batch(mgr, timeout=60)
        for s in groups[0].samples:
            assert s.num_turns == s.format_errors == 3
            assert s.turn_rewards == pytest.approx([expected] * 3)
            assert s.reward == pytest.approx(sum(s.turn_rewards))


def test_a_groups_samples_share_task_and_seed(tok):
    """Without task_ids FrozenLake draws its map from the reset seed: every sample of a group
    starts on the same board (same seed), while groups (other seeds) see different boards."""
    data = {**_cfg(group_size=3, batch_groups=4, max_turns=2),
            "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}}]}
    mgr, _, _ = _manager(tok, data, words=("Right", "Down", "Left"))
    groups = first_batch(mgr, timeout=60)
    boards = []
    for g in groups:
        assert {s.transcript[0][1] for s in g.samples} == {g.samples[0].transcript[0][1]}
        assert {s.task_id for s in g.samples} == {g.task_id} and {s.group_id for s in g.samples} == {g.group_id}
        boards.append(g.samples[0].transcript[0][1])
    assert len({g.seed for g in groups}) == 4 and len(set(boards)) > 1


def test_the_word_tokenizer_is_built_from_entry_point_envs_too(tmp_path):
    """``envs[].id`` may be ``module:Class`` (make_env): the tokenizer builder plays those
    envs as well, so their words are single tokens."""
    envs = [EnvConfig(id=LAT, kwargs={"target": "Correct"})]
    tok = load_tokenizer(load_config({}).tokenizer, envs, tmp_path / "tok")
    assert len(tok.encode("Correct", add_special_tokens=False)) == 1


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture()
def chatml_tok(tmp_path):
    """A word tokenizer with a ChatML chat template (Qwen's framing: a newline after each
    <|im_end|> that the policy never generates)."""
    from rockroll.trainer.models import save_word_tokenizer

    tok = save_word_tokenizer(["system", "user", "assistant", "\n", " ", "Up", "Down", "Say", "Now", "Be", "brief",
                               "."], tmp_path / "chatml")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


@pytest.mark.parametrize("system", ["", "Be brief."])
def test_chat_template_turns_are_the_templates_own_rendering_of_the_conversation(chatml_tok, system):
    """first + reply + next + reply + next ... is token for token what the tokenizer's chat
    template renders for the whole conversation, with the generated reply ids kept as they
    are: one reply ended with the stop token, one was cut (the stop is then added as an
    observation token), and ChatML's newline after <|im_end|> is an observation token."""
    cfg = load_config({"tokenizer": {"template": "chat", "system": system, "stop": "<|im_end|>"}}).tokenizer
    tpl = PromptTemplate(chatml_tok, cfg)
    enc = lambda text: chatml_tok.encode(text, add_special_tokens=False)  # noqa: E731
    stop = chatml_tok.convert_tokens_to_ids("<|im_end|>")
    seq = tpl.first("Say Up.") + enc("Up") + [stop]              # stopped by itself
    seq += tpl.next("Say Down.", reply_stopped=True) + enc("Down")  # cut at max_new_tokens
    seq += tpl.next("Now Up.", reply_stopped=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "Say Up."}, {"role": "assistant", "content": "Up"},
        {"role": "user", "content": "Say Down."}, {"role": "assistant", "content": "Down"},
        {"role": "user", "content": "Now Up."}]
    expected = chatml_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = list(expected if isinstance(expected, list) else expected["input_ids"])
    assert seq == expected
    turn = chatml_tok.decode(tpl.next("Say Up.", reply_stopped=True))
    assert turn == "\n<|im_start|>user\nSay Up.<|im_end|>\n<|im_start|>assistant\n"


def test_the_built_tokenizers_chat_template_frames_turns_as_the_prefixes_do(tok, tmp_path):
    """template: chat (the default) and template: prefixes give the same ids with a built
    word tokenizer, whose chat template is made from the prefixes (so the learning tests'
    sequences did not change when chat became the default)."""
    chat = load_config({}).tokenizer
    prefixes = load_config({"tokenizer": {"template": "prefixes"}}).tokenizer
    a, b = PromptTemplate(tok, chat), PromptTemplate(tok, prefixes)
    for obs in ["FrozenLake.\nP___", "Moves: Right.\n\n_P__"]:
        assert a.first(obs) == b.first(obs)
        assert a.next(obs, True) == b.next(obs, True) and a.next(obs, False) == b.next(obs, False)
    # hand-typed prefixes frame turns only for template: prefixes; with chat they are an error
    custom = load_config({"tokenizer": {"template": "prefixes", "user_prefix": "<|bos|>"}})
    t = load_tokenizer(custom.tokenizer, [EnvConfig(id=LAT)], tmp_path / "tok")
    assert t.decode(PromptTemplate(t, custom.tokenizer).first("Say")) == "<|bos|>Say<|end|><|assistant|>"
    with pytest.raises(ConfigError, match=r"tokenizer\.user_prefix: read only with template: prefixes"):
        load_config({"tokenizer": {"user_prefix": "<|bos|>"}})


def test_chat_framing_needs_a_chat_template(chatml_tok):
    chatml_tok.chat_template = None
    with pytest.raises(ValueError, match="tokenizer.template: chat, but the tokenizer has no chat template"):
        PromptTemplate(chatml_tok, load_config({"tokenizer": {"stop": "<|im_end|>"}}).tokenizer)
    with pytest.raises(ConfigError, match="tokenizer.template: must be chat or prefixes"):
        load_config({"tokenizer": {"template": "jinja"}})
