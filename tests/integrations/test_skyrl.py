"""rockroll's envs under the real skyrl_gym, driven the way SkyRL's generator drives them.

The calls are those of skyrl-train (NovaSky-AI/SkyRL @ a9564572eb8e, read, not installed):
``skyrl/train/dataset/dataset.py`` 86-94 (a row's ``prompt`` and ``env_class`` popped, every
other column is the env's ``extras``), ``skyrl/train/generators/skyrl_gym_generator.py``
333-337 (``extras["max_turns"] = generator.max_turns``; ``skyrl_gym.make(env_class,
env_config=..., extras=extras)``), 343 (``env.init(prompt)``), 446-450 (``env.step(reply)``
until ``done``), 519-521 (``get_metrics``, ``close``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import gymnasium
import pytest
import skyrl_gym
from rockroll.gem.core import GemEnv, InfraError
from rockroll.integrations import skyrl
from rockroll.integrations.episodes import EnvSpec, InfraFailure, MissingTrainer
from rockroll.registry.hub import is_base_image
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.sync import run_sync


@pytest.fixture(scope="module", autouse=True)
def registered():
    return skyrl.register_all()


def from_row(row: dict[str, Any], max_turns: int = 1):
    """What SkyRL does with one dataset row: the env made, and the prompt to init it with."""
    extras = dict(row)
    prompt, env_class = extras.pop("prompt"), extras.pop("env_class")
    extras["max_turns"] = max_turns
    return skyrl_gym.make(env_class, env_config={}, extras=extras), prompt


def math_rows(tmp_path):
    """Rows written to parquet and read back as SkyRL's PromptDataset reads them."""
    import datasets

    train, test = skyrl.dataset_rows("rock/Math-v0", list(range(10)), held_out=2, system_prompt="Be exact.")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    loaded = []
    for rows, name in ((train, "train"), (test, "validation")):
        path = skyrl.write_dataset(rows, tmp_path / f"{name}.parquet")
        loaded.append(list(datasets.load_dataset("parquet", data_files=str(path), keep_in_memory=True)["train"]))
    return loaded


def test_math_dataset_rows_play_through_skyrl_gym(tmp_path):
    train, test = math_rows(tmp_path)
    def task(row):
        return EnvSpec.from_row(json.loads(row["rockroll"])).task_id

    assert [task(r) for r in train] == list(range(8)) and [task(r) for r in test] == [8, 9]
    assert {r["extra_info"]["split"] for r in test} == {"test"} and all(r["env_class"] == "rock/Math-v0" for r in train)

    replies = {"right": lambda env: f"\\boxed{{{env.env.answer}}}", "wrong": lambda env: "\\boxed{123456789}",
               "malformed": lambda env: "I think it is seven"}
    rewards = {}
    for kind, reply in replies.items():
        env, prompt = from_row(train[3])
        messages, info = env.init(prompt)
        # the system prompt stays, the placeholder turn is the env's problem
        assert messages[0] == {"role": "system", "content": "Be exact."}
        assert messages[1]["role"] == "user" and "\\boxed" in messages[1]["content"] and len(messages) == 2
        assert info["task_id"] == 3
        out = env.step(reply(env))
        assert out["done"] and out["observations"] == [] and out["postprocessed_action"] is None
        rewards[kind] = out["reward"]
        env.close()
    assert rewards == {"right": 1.0, "wrong": 0.0, "malformed": pytest.approx(-0.1)}


def test_frozenlake_plays_many_turns_to_the_goal():
    env = skyrl_gym.make("rock/FrozenLake-v0", env_config={},
                         extras={"rockroll": EnvSpec("rock/FrozenLake-v0", seed=3).to_row(), "max_turns": 20})
    messages, _ = env.init([{"role": "user", "content": skyrl.PLACEHOLDER}])
    assert "FrozenLake" in messages[-1]["content"]
    steps = []
    while not steps or not steps[-1]["done"]:
        steps.append(env.step(f"<answer>{env.env.expert_action()}</answer>"))
    env.close()
    assert len(steps) > 2 and steps[-1]["reward"] == 1.0 and steps[-1]["metadata"]["terminated"]
    # every turn before the last is answered with the next board, as one user message
    assert all(len(s["observations"]) == 1 and s["observations"][0]["role"] == "user" for s in steps[:-1])
    assert env.get_metrics() == {"turns": float(len(steps)), "infra_error": 0.0, "success": 1.0, "format_errors": 0.0}


def test_skyrl_max_turns_ends_the_episode():
    # SkyRL's loop stops only on done: generator.max_turns must end an episode the env would go on with
    env = skyrl_gym.make("rock/FrozenLake-v0", env_config={},
                         extras={"rockroll": EnvSpec("rock/FrozenLake-v0", seed=3).to_row(), "max_turns": 2})
    env.init([])
    first = env.step("<answer>Down</answer>")
    second = env.step("<answer>Down</answer>")
    env.close()
    assert not first["done"] and second["done"] and second["metadata"]["truncated"]
    assert not second["metadata"]["terminated"] and second["reward"] == 0.0


class BrokenEnv(GemEnv):
    """Its tool fails at the infrastructure level on the first step (or at reset)."""

    closed: list[str] = []

    def __init__(self, fail_at: str = "step", **kwargs):
        super().__init__(**kwargs)
        self.fail_at = fail_at

    def _reset(self, task_id, options):
        if self.fail_at == "reset":
            raise InfraError("sandbox died before the episode")
        return "go", {}

    def _step(self, action):
        raise InfraError("sandbox died")

    def close(self):
        BrokenEnv.closed.append(self.fail_at)


@pytest.fixture
def broken():
    gymnasium.register("rocktest/Broken-v0", entry_point=BrokenEnv)
    BrokenEnv.closed.clear()
    yield
    for registry in (gymnasium.registry, skyrl_gym.registry):
        registry.pop("rocktest/Broken-v0", None)


def test_infra_failure_raises_and_gives_the_env_back(broken):
    skyrl.register("rocktest/Broken-v0")
    env = skyrl_gym.make("rocktest/Broken-v0", env_config={}, extras={"max_turns": 5})
    env.init([])
    with pytest.raises(InfraFailure, match="sandbox died"):
        env.step("anything")
    assert BrokenEnv.closed == ["step"] and env.infra_error
    env.close()  # SkyRL never gets here after a raise; when it does, nothing closes twice
    assert BrokenEnv.closed == ["step"]

    env = skyrl_gym.make("rocktest/Broken-v0", env_config={},
                         extras={"rockroll": EnvSpec("rocktest/Broken-v0", {"fail_at": "reset"}).to_row()})
    with pytest.raises(InfraFailure, match="before the episode"):
        env.init([])
    assert BrokenEnv.closed == ["step", "reset"]


def test_infra_failure_marked_is_flagged_not_scored(broken):
    skyrl.register("rocktest/Broken-v0", on_infra_error="mark")
    for fail_at in ("step", "reset"):
        env = skyrl_gym.make("rocktest/Broken-v0", env_config={},
                             extras={"rockroll": EnvSpec("rocktest/Broken-v0", {"fail_at": fail_at}).to_row()})
        env.init([])
        out = env.step("anything")
        env.close()
        assert out["done"] and out["reward"] == 0.0 and out["observations"] == []
        assert "sandbox died" in out["metadata"]["infra_error"] and out["metadata"]["dropped"]
        assert env.get_metrics()["infra_error"] == 1.0  # what SkyRL logs and hands a generator as env_metrics
    # SkyRL's per-env config may choose too
    env = skyrl_gym.make("rocktest/Broken-v0", env_config={"on_infra_error": "raise"}, extras={})
    env.init([])
    with pytest.raises(InfraFailure):
        env.step("anything")


def test_close_gives_a_sandbox_envs_sandbox_back():
    from rockroll.gem.tools import shared_pool

    extras = {"rockroll": EnvSpec("rock/Terminal-v0", task_id="text-csv-total").to_row(), "max_turns": 10}
    env = skyrl_gym.make("rock/Terminal-v0", env_config={}, extras=extras)
    env.init([])
    mine = env.env.sandbox.id
    assert mine in current_run().live()
    steps = []
    while not steps or not steps[-1]["done"]:
        steps.append(env.step(env.env.expert_action()))
    assert steps[-1]["reward"] == 1.0
    env.close()
    env.close()
    pool = run_sync(shared_pool(env.env.sandbox_spec, 0))
    assert all(sb.id != mine for sb in pool._busy)
    # whatever the pool keeps warm is reset, never this env's: closed, nothing of it is live
    run_sync(pool.close())
    assert mine not in current_run().live()


def test_register_all_covers_every_rock_id(registered):
    expected = sorted(i for i in gymnasium.registry if i.startswith("rock/") and not is_base_image(i))
    assert registered == expected and {"rock/Math-v0", "rock/FrozenLake-v0", "rock/SWE-v0"} <= set(registered)
    for env_id in registered:
        spec = skyrl_gym.spec(env_id)
        assert spec.entry_point == skyrl.ENTRY_POINT and spec.kwargs["env_id"] == env_id
    assert skyrl.register_all() == registered  # again: replaced, not refused
    with pytest.raises(skyrl_gym.error.RegistrationError):
        skyrl.register("rock/Math-v0", skyrl_id="gsm8k")  # SkyRL's own id is never shadowed


def test_a_row_naming_another_env_is_refused():
    with pytest.raises(ValueError, match="env_class"):
        skyrl_gym.make("rock/Math-v0", env_config={}, extras={"rockroll": EnvSpec("rock/FrozenLake-v0").to_row()})


def test_gem_llm_ids_register_under_their_own_name():
    skyrl.register("gem:game:GuessTheNumber-v0-easy")
    env = skyrl_gym.make("gem:game:GuessTheNumber-v0-easy", env_config={}, extras={"max_turns": 20})
    messages, _ = env.init([])
    low, high, out = 1, 10, {"done": False}
    while not out["done"]:  # bisect: gem-llm's game says higher / lower
        guess = (low + high) // 2
        out = env.step(f"\\boxed{{{guess}}}")
        text = out["observations"][0]["content"].lower() if out["observations"] else ""
        low, high = (guess + 1, high) if "higher" in text else (low, guess - 1) if "lower" in text else (low, high)
    env.close()
    assert out["reward"] == 1.0 and env.get_metrics()["turns"] <= 5


def test_without_skyrl_gym_the_adapter_names_the_extra(monkeypatch):
    for name in ("skyrl_gym", "skyrl_gym.envs.base_text_env"):
        monkeypatch.setitem(sys.modules, name, None)  # import of it fails, as when not installed
    skyrl._text_env_class.cache_clear()
    try:
        with pytest.raises(MissingTrainer, match=r"rockroll\[skyrl\]"):
            skyrl.RockrollTextEnv  # noqa: B018
        with pytest.raises(MissingTrainer, match=r"rockroll\[skyrl\]"):
            skyrl.register("rock/Math-v0")
        assert skyrl.dataset_rows("rock/Math-v0", [1, 2], held_out=1)[1][0]["env_class"] == "rock/Math-v0"
    finally:
        monkeypatch.undo()
        skyrl._text_env_class.cache_clear()
