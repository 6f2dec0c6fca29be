"""rock/TerminalTmux-v0: Terminal-v0's tasks driven through tmux keys and screen captures."""

from __future__ import annotations

import gymnasium
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids


@pytest.fixture(scope="module")
def env():
    env = gymnasium.make("rock/TerminalTmux-v0", settle_s=5.0).unwrapped
    yield env
    env.close()


def test_the_agent_types_and_reads_the_screen_then_solves_a_task(env):
    task = next(t for t in env.tasks if t.id == "text-csv-total")
    obs, info = env.reset(options={"task_id": task.id})
    assert "tmux pane" in obs and "<keys>C-c</keys>" in obs and "sales.csv" in obs
    assert obs.rstrip().endswith("#")  # the screen: a prompt waiting
    obs, reward, term, _, _ = env.step("```bash\necho typed-$((6*7)); tput cols\n```")
    assert "typed-42" in obs and "\n100\n" in obs and not term  # the pane's size, seen by the program
    obs, _, _, _, _ = env.step("```bash\nsleep 1000\n```")
    obs, _, _, _, _ = env.step("<keys>C-c</keys>")  # a key, not a command: Ctrl-C reaches sleep
    obs, _, _, _, _ = env.step("```bash\necho rc=$?\n```")
    assert "rc=130" in obs, obs
    env.step(f"```bash\n{task.solution}\n```")
    obs, reward, term, _, info = env.step("<submit/>")
    assert (reward, term, info["success"]) == (1.0, True, True), obs


def test_bad_keys_are_a_format_error(env):
    env.reset(options={"task_id": "text-csv-total"})
    obs, reward, term, _, info = env.step("<keys> </keys>")
    assert "format_error" in info and reward <= 0 and not term
    obs, reward, term, _, info = env.step("submit")  # nothing done: the checker fails
    assert reward == 0.0 and term
