"""GemEnv base contract, TextSpace and observation truncation, on a tiny test env."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env
from rockroll.gem import GemEnv, InfraError, TextSpace, parse_action, truncate_observation
from rockroll.gem.core import STATE_FORMAT


class CounterEnv(GemEnv):
    """Adds a random number to a counter on "add", fails on "crash", errors on anything else."""

    def __init__(self, **kwargs: Any):
        super().__init__(**{"max_turns": 5, **kwargs})
        self.total = 0

    def _reset(self, task_id, options):
        if options.get("fail"):
            raise InfraError("could not start the sandbox")
        self.total = int(self._task_rng(task_id).integers(100))
        return f"counter at {self.total}", {"extra": 1}

    def _step(self, action):
        word = action.strip()
        if word == "crash":
            raise InfraError("sandbox vanished")
        if word == "boom":
            raise KeyError("a bug, not an infra failure")
        if word == "long":
            return "x" * 10_000, 0.0, False, {}
        if word != "add":
            return self._format_error(f"unknown word {word[:20]!r}", ["add"])
        self.total += int(self.np_random.integers(1, 10))
        return f"counter at {self.total}", 1.0, self.total > 10_000, {}

    def _get_state(self):
        return {"total": self.total}

    def _set_state(self, state):
        self.total = state["total"]


def test_text_space_contains_and_sample():
    space = TextSpace(max_length=10)
    assert "hello" in space and "" in space
    assert "x" * 11 not in space and 3 not in space and b"abc" not in space
    a, b = TextSpace(seed=7), TextSpace(seed=7)
    samples = [a.sample() for _ in range(50)]
    assert samples == [b.sample() for _ in range(50)]
    assert all(s in a and 8 <= len(s) <= 32 and s[0].isalpha() and s.isalnum() for s in samples)
    assert all(parse_action(s).kind == "invalid" for s in samples)
    assert TextSpace(max_length=3, seed=1).sample() in TextSpace(max_length=3)
    assert TextSpace(5) == TextSpace(5) != TextSpace(6)
    assert not TextSpace().is_np_flattenable
    with pytest.raises(ValueError):
        TextSpace(max_length=0)


@pytest.mark.parametrize("n", [0, 1, 50, 99, 100, 101, 1000, 123_456])
def test_truncate_observation_bounds(n):
    text = "".join(chr(ord("a") + i % 26) for i in range(n))
    out = truncate_observation(text, 100)
    assert len(out) <= 100
    if n <= 100:
        assert out == text
    else:
        assert "characters truncated" in out
        assert out.startswith(text[:30]) and out.endswith(text[-30:])
        dropped = int(out.split("[... ")[1].split(" characters")[0])
        head, tail = out.split("\n[... ")[0], out.split(" ...]\n")[1]
        assert len(head) + len(tail) + dropped == n


def test_truncate_observation_tiny_limit():
    assert truncate_observation("abcdefghij" * 10, 5) == "abcde"


def test_reset_step_info_turn_and_determinism():
    env = CounterEnv()
    obs, info = env.reset(seed=3)
    assert info == {"extra": 1, "turn": 0}
    steps = [env.step("add") for _ in range(3)]
    assert [s[4]["turn"] for s in steps] == [1, 2, 3]
    env2 = CounterEnv()
    assert env2.reset(seed=3)[0] == obs
    assert [env2.step("add") for _ in range(3)] == steps


def test_format_error_is_an_observation_not_an_exception():
    env = CounterEnv(format_penalty=-0.5)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("jump")
    assert reward == -0.5 and not terminated and not truncated
    assert "Invalid action" in obs and "add" in obs and info["format_error"].startswith("unknown word")
    obs, reward, *_, info = env.step(12345)  # not even a string
    assert reward == -0.5 and "expected text" in info["format_error"]
    obs, reward, *_ = env.step(env.action_space.sample())
    assert reward == -0.5


def test_max_turns_truncates():
    env = CounterEnv(max_turns=3)
    env.reset(seed=0)
    flags = [env.step("add")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(ResetNeeded):
        env.step("add")


def test_step_before_reset_raises():
    with pytest.raises(ResetNeeded):
        CounterEnv().step("add")
    with pytest.raises(ResetNeeded):
        CounterEnv().save_state()


def test_infra_error_is_flagged_and_terminal():
    env = CounterEnv()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("crash")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["infra_error"] == "InfraError: sandbox vanished" and info["turn"] == 1
    assert "sandbox vanished" in obs
    env.reset(seed=0)
    with pytest.raises(KeyError):  # bugs stay loud; only declared infra errors are caught
        env.step("boom")


def test_infra_failure_helper():
    env = CounterEnv()
    env.reset(seed=0)
    env.step("add")
    obs, reward, terminated, truncated, info = env._infra_failure("disk full")
    assert reward == 0.0 and terminated and not truncated
    assert info == {"turn": 1, "infra_error": "disk full"}


def test_long_observation_is_truncated():
    env = CounterEnv(max_obs_chars=500)
    env.reset(seed=0)
    obs = env.step("long")[0]
    assert len(obs) <= 500 and "characters truncated" in obs and obs in env.observation_space


def test_render_modes():
    env = CounterEnv(render_mode="ansi")
    env.reset(seed=0)
    env.step("add")
    text = env.render()
    assert "[agent]\nadd" in text and "counter at" in text
    quiet = CounterEnv()
    quiet.reset(seed=0)
    assert quiet.render() is None
    with pytest.raises(ValueError):
        CounterEnv(render_mode="human")


def test_save_state_resume_in_new_instance():
    env = CounterEnv(max_turns=50)
    env.reset(seed=11)
    env.step("add")
    last_obs = env.step("add")[0]
    state = json.loads(json.dumps(env.save_state()))
    assert state["format"] == STATE_FORMAT and state["env"] == "CounterEnv"
    rest = [env.step(a) for a in ["add", "jump", "add", "add"]]

    clone = CounterEnv(max_turns=50)
    obs, info = clone.reset(options={"state": state})
    assert info == {"turn": 2, "resumed": True} and obs == last_obs
    assert [clone.step(a) for a in ["add", "jump", "add", "add"]] == rest
    # also accepted under the DESIGN's "snapshot" option name
    again = CounterEnv(max_turns=50)
    again.reset(seed=999, options={"snapshot": state})
    assert [again.step(a) for a in ["add", "jump", "add", "add"]] == rest


def test_save_state_is_a_copy():
    env = CounterEnv()
    env.reset(seed=1)
    state = env.save_state()
    env.step("add")
    assert state["turn"] == 0 and state["env_state"]["total"] != env.total


def test_resume_rejects_foreign_state():
    env = CounterEnv()
    env.reset(seed=1)
    state = env.save_state()
    with pytest.raises(ValueError):
        CounterEnv().reset(options={"state": {**state, "env": "OtherEnv"}})


def test_task_id_fixes_the_task():
    env = CounterEnv()
    a = env.reset(seed=1, options={"task_id": "t-7"})
    b = env.reset(seed=2, options={"task_id": "t-7"})
    assert a[0] == b[0] and a[1]["task_id"] == "t-7"
    seeds = {env.reset(seed=s)[0] for s in range(10)}
    assert len(seeds) > 1


def test_check_env_on_test_env():
    check_env(CounterEnv(), skip_render_check=True)


def test_rng_roundtrip_is_json():
    from rockroll.gem.core import rng_from_json, rng_to_json

    rng = np.random.default_rng(5)
    rng.random(3)
    clone = rng_from_json(json.loads(json.dumps(rng_to_json(rng))))
    assert clone.random(5).tolist() == rng.random(5).tolist()


def test_infra_error_during_reset_is_flagged():
    env = CounterEnv()
    obs, info = env.reset(seed=0, options={"fail": True})
    assert info == {"turn": 0, "infra_error": "InfraError: could not start the sandbox"}
    assert "could not start" in obs and obs in env.observation_space
    with pytest.raises(ResetNeeded):
        env.step("add")
    assert env.reset(seed=0)[1] == {"extra": 1, "turn": 0}
