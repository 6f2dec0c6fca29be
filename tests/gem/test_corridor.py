"""The ``corridor`` task set (the agent-native CPU task): its game in a sandbox, its oracle
and its checker. Played here through ``CorridorTasks`` directly (bash actions); with an
agent it is ``rock/Agent-v0``'s ``task_set="corridor"`` (tests/trainer/test_agent_rollout.py)."""

from __future__ import annotations

import pytest

from rockroll.gem.corridor import CORRIDOR_TASKS, CorridorTasks


@pytest.fixture(scope="module")
def env():
    env = CorridorTasks()
    yield env
    env.close()


def test_oracle_wins_every_task_and_the_other_end_loses_it(env):
    assert sorted(env.task_ids) == ["left-1", "left-2", "left-3", "right-1", "right-2", "right-3"]
    for task in CORRIDOR_TASKS:
        env.reset(options={"task_id": task.id})
        env.step(env.expert_action())  # the oracle through the expert of SFT data
        assert env.step(env.expert_action())[1] == 1.0, task.id
        goal = task.id.split("-")[0]
        # rock/Agent-v0's expert answers each of the agent's calls with the goal's direction
        assert env.agent_expert_reply(task) == goal.title() and env.agent_action_words == ("Left", "Right")
        wrong = ("Right" if goal == "left" else "Left")
        env.reset(options={"task_id": task.id})
        env.step(f"```bash\nfor i in 1 2 3 4; do ./play {wrong}; done\n```")
        assert env.step("<submit/>")[1] == 0.0, task.id


def test_the_game_protocol(env):
    """``./play`` prints the state and exits 0 while the game goes on, 100 once it is over;
    a reply that is not a move costs a move; after four moves it is over, lost."""
    env.reset(options={"task_id": "right-2"})
    obs = env.step("```bash\n./play; echo code=$?\n./play Up; echo code=$?\n./play Left; echo code=$?\n```")[0]
    assert "__P__ Left or Right? The goal is the right end.\ncode=0" in obs
    assert "__P__ Left or Right? The goal is the right end.\ncode=0" in obs.split("code=0", 1)[1]  # Up: no move
    assert "_P___ Left or Right? The goal is the right end.\ncode=0" in obs
    obs = env.step("```bash\n./play Right; ./play Right; echo code=$?; ./play Right; echo code=$?\n```")[0]
    assert "__P__ Left or Right? The goal is the right end.\n___P_ You lost.\ncode=100" in obs  # 4 moves
    assert obs.count("___P_ You lost.\ncode=100") == 2  # over: a move does nothing
    assert env.step("<submit/>")[1] == 0.0
