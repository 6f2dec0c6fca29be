"""Initialized sampling (rollback curriculum): the level bookkeeping on hand-written sequences,
then a rollout on real FrozenLake envs with the scripted engine of the other rollout tests."""

import pytest

from rockroll.trainer.config import EnvConfig, load_config
from rockroll.trainer.rollout.curriculum import Curriculum, Start, Trajectory, initialized_metrics, task_key
from rockroll.trainer.models import load_tokenizer
from rockroll.trainer.rollout.types import Group
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from rockroll.trainer.envs import make_env
from _scripted import ScriptEngine

K = "rock/FrozenLake-v0/0"


def test_levels_move_from_the_goal_back_to_the_start():
    c = Curriculum(promote_at=0.75, window=2)
    assert c.tracing(K) and c.start(K) == (0, None)
    assert c.record(K, ["s0", "s1", "s2"])           # states before turns 1, 2, 3 of a success
    assert not c.tracing(K)
    assert c.start(K) == (1, "s2")                   # level 1: one turn before the goal
    assert not c.observe(K, 1, 1.0)                  # the window is not full yet
    assert c.observe(K, 1, 0.5)                      # mean 0.75 >= promote_at: one turn earlier
    assert c.start(K) == (2, "s1")
    for success in (0.0, 0.0, 0.5, 1.0):             # window means: -, 0.0, 0.25, 0.75
        assert c.observe(K, 2, success) == (success == 1.0)
    assert c.start(K) == (3, "s0")
    assert c.metrics()[f"curriculum/{K}/level"] == 3.0
    c.observe(K, 3, 1.0)
    c.observe(K, 3, 1.0)
    assert c.start(K) == (0, None)                   # graduated: from the beginning again
    m = c.metrics()
    assert m[f"curriculum/{K}/level"] == 4.0 and m["curriculum/tasks_graduated"] == 1.0
    assert not c.observe(K, 3, 1.0)                  # no level beyond graduation


def test_low_success_and_stale_levels_do_not_move():
    c = Curriculum(promote_at=0.8, window=2)
    c.record(K, ["s0", "s1", "s2", "s3"])
    for _ in range(10):
        assert not c.observe(K, 1, 0.5)
    assert c.start(K) == (1, "s3")
    c.observe(K, 1, 1.0)
    c.observe(K, 1, 1.0)
    assert c.start(K) == (2, "s2")
    # a group started at level 1 that finished after the move does not count for level 2
    assert not c.observe(K, 1, 1.0) and not c.observe(K, 1, 1.0)
    assert c.tasks[K].recent == []
    assert not c.observe(K, 0, 1.0) and not c.observe("other/1", 1, 1.0)
    assert c.metrics()["curriculum/tasks_recorded"] == 1.0


def test_shorter_success_replaces_the_trajectory_and_levels_keep_their_meaning():
    c = Curriculum(promote_at=1.0, window=1)
    c.record(K, ["a0", "a1", "a2", "a3"])
    assert not c.record(K, ["b0", "b1", "b2", "b3", "b4"])  # longer: kept the old one
    c.observe(K, 1, 1.0)
    assert c.start(K) == (2, "a2")
    assert c.record(K, ["c0", "c1", "c2"])
    assert c.start(K) == (2, "c1")                           # still two turns before the goal
    restored = Curriculum(promote_at=1.0, window=1)
    restored.load_state_dict(c.state_dict())
    assert restored.start(K) == (2, "c1") and restored.metrics() == c.metrics()


def test_trajectory_starts_are_prefixes():
    transcript = [["env", "o0"], ["agent", "a1"], ["env", "o1"], ["agent", "a2"], ["env", "o2"]]
    traj = Trajectory(token_ids=list(range(10)), transcript=transcript,
                      turns=[({"turn": 0}, 3, 1), ({"turn": 1}, 7, 3)])
    assert len(traj) == 2
    assert traj[1] == Start({"turn": 1}, [0, 1, 2, 3, 4, 5, 6], transcript[:3])
    traj[0].transcript[0][1] = "changed"                     # a start is a copy
    assert transcript[0][1] == "o0"


def test_initialized_metrics():
    gs = [Group(0, "a", 0, 0, [], start_level=2), Group(1, "a", 0, 0, []), Group(2, "b", 0, 0, [], start_level=1)]
    m = initialized_metrics(gs)
    assert m["curriculum/initialized"] == pytest.approx(2 / 3)
    assert m["curriculum/a/initialized"] == 0.5 and m["curriculum/b/initialized"] == 1.0
    assert initialized_metrics(gs[:1]) == {"curriculum/initialized": 1.0}


# ----------------------------------------------------------------------------- real envs

ENV = {"id": "rock/FrozenLake-v0", "task_ids": [0],
       "kwargs": {"size": 3, "p": 1.0, "max_turns": 6, "max_actions_per_turn": 1}}  # no holes


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    return load_tokenizer(load_config({}).tokenizer, envs, tmp_path_factory.mktemp("tok"))


def _check_initialized_sample(s, start: Start, template: PromptTemplate, spec: EnvConfig, engine: ScriptEngine):
    """The sample begins with the recorded tokens (mask 0), the engine was prompted with
    exactly them, and the env resumes the state whose observation those tokens end with."""
    n = len(start.token_ids)
    assert s.token_ids[:n] == start.token_ids and not any(s.mask[:n]) and not any(s.behav_logp[:n])
    assert any(s.mask[n:]) and s.num_turns >= 1
    assert any(p == start.token_ids for prompts, _ in engine.calls for p in prompts)
    env = make_env(spec)
    obs, info = env.reset(options={"state": start.state})
    assert info["resumed"] and info["turn"] == start.state["turn"]
    assert obs == start.transcript[-1][1] == s.transcript[len(start.transcript) - 1][1]
    assert start.token_ids[-len(template.next(obs, True)):] == template.next(obs, True)


def test_rollout_starts_groups_from_saved_states_and_rolls_back(tok):
    cfg = load_config({
        "seed": 0, "envs": [ENV], "generation": {"max_new_tokens": 2},
        "rollout": {"group_size": 4, "batch_groups": 1, "max_turns": 6, "async_ratio": 0,
                    "batch_wait_ms": 10_000, "curriculum": {"enabled": True, "promote_at": 0.5, "window": 1}}})
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = ScriptEngine(tok, ["Right", "Down"], stop_id=template.stop_id)  # a random walk to the goal
    mgr = RolloutManager(cfg, engine, template)
    key = task_key(ENV["id"], 0)
    step = 0

    def next_batch():
        """The group of this step. With alpha = 0 the next group starts only at advance()."""
        (g,), m = mgr.get_batch(step, timeout=60)
        return g, m

    def advance():
        nonlocal step
        step += 1
        engine.load_weights({}, step)
        mgr.set_version(step)

    mgr.start()
    try:
        # 1. fresh groups until an episode succeeds: its states are recorded
        for _ in range(5):
            g, m = next_batch()
            if key in mgr.curriculum.tasks:
                break
            assert g.start_level == 0 and m["curriculum/initialized"] == 0.0
            advance()
        assert g.start_level == 0 and any(s.success for s in g.samples)
        traj = mgr.curriculum.tasks[key].trajectory
        assert 4 <= len(traj) <= 6 and [t[0]["turn"] for t in traj.turns] == list(range(len(traj)))
        # 2. the random walk succeeds often near the goal: the start moves back turn by turn
        levels, promotions = [1.0], 0
        while levels[-1] < 3 and len(levels) < 8:
            advance()
            g, m = next_batch()
            assert g.start_level == levels[-1] and m["curriculum/initialized"] == 1.0
            start = traj[len(traj) - g.start_level]
            assert start.state["turn"] == len(traj) - g.start_level
            for s in g.samples:
                _check_initialized_sample(s, start, template, cfg.envs[0], engine)
            levels.append(m[f"curriculum/{key}/level"])
            promotions += m.get("rollout/curriculum_promotions", 0)
        assert levels[-1] == 3 and levels == sorted(levels) and promotions == 2
        # 3. a policy that never reaches the goal (Up, away from it) holds the level where it is
        engine.words = ["Up"]
        for _ in range(3):
            advance()
            g, m = next_batch()
            assert g.start_level == 3 and not any(s.success for s in g.samples)
            assert m[f"curriculum/{key}/level"] == 3.0 and m.get("rollout/curriculum_promotions", 0) == 0
    finally:
        mgr.close()
    assert mgr.state_dict()["curriculum"]["tasks"][key][1] == 3
