"""rock/Terminal-v0: the gymnasium checker, and every bundled task solved by its oracle and
failed by a do-nothing agent (one env looping over task ids: pooled sandboxes are reused)."""

from __future__ import annotations

from collections import Counter

import gymnasium
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids
from gymnasium.utils.env_checker import check_env
from rockroll.gem import TerminalEnv
from rockroll.gem.terminal import load_terminal_tasks


@pytest.fixture(scope="module")
def env():
    env = gymnasium.make("rock/Terminal-v0").unwrapped
    yield env
    env.close()


def test_bundled_tasks_cover_every_category():
    tasks = load_terminal_tasks()
    assert len(tasks) >= 20
    counts = Counter(task.category for task in tasks)
    assert set(counts) == {"files", "text", "git", "processes", "packaging"}
    assert min(counts.values()) >= 3
    assert all(task.instruction and task.check and task.solution for task in tasks)


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_first_observation_states_the_task_and_protocol(env):
    obs, info = env.reset(options={"task_id": "text-csv-total"})
    assert info["task_id"] == "text-csv-total"
    assert "sales.csv" in obs and "/workspace" in obs and "<submit/>" in obs and "```bash" in obs


def test_oracle_solves_every_task_and_doing_nothing_fails_every_task(env):
    failures = []
    for task_id in env.task_ids:
        env.reset(options={"task_id": task_id})  # the oracle, as the expert of SFT data plays it
        assert env.expert_action() == f"```bash\n{env.task.solution}\n```"
        env.step(env.expert_action())
        assert env.expert_action() == "<submit/>"
        obs, reward, term, _, info = env.step(env.expert_action())
        if reward != 1.0 or not term:
            failures.append(f"oracle failed {task_id}: {obs}")
        env.reset(options={"task_id": task_id})
        obs, reward, term, _, info = env.step("submit")
        if reward != 0.0 or not term or info["success"]:
            failures.append(f"do-nothing passed {task_id}")
        with pytest.raises(ValueError, match="no episode"):
            env.expert_action()
    assert not failures, "\n".join(failures)


def test_task_ids_select_a_subset():
    env = TerminalEnv(task_ids=["git-commit-file", "pkg-gzip-keep"])
    try:
        assert sorted(env.task_ids) == ["git-commit-file", "pkg-gzip-keep"]
        assert env.reset(seed=1)[1]["task_id"] in env.task_ids
    finally:
        env.close()


def test_a_task_object_for_an_id_is_a_short_type_error(env):
    """Passing the task instead of its id (#18) is named in one line with the ids expected,
    not answered with the task's repr (instruction, check and solution scripts)."""
    task = env.tasks[1]
    for call in (lambda: env.reset(options={"task_id": task}), lambda: TerminalEnv(task_ids=[task])):
        with pytest.raises(TypeError) as err:
            call()
        msg = str(err.value)
        assert "expected a task id (str), got a TerminalTask (pass its .id)" in msg, msg
        assert repr(env.task_ids[0]) in msg and "env.unwrapped.task_ids" in msg and len(msg) < 300, msg
    with pytest.raises(TypeError, match="not one str"):
        TerminalEnv(task_ids="git-commit-file")
    with pytest.raises(ValueError, match=r"unknown task_id 'nope'; ids are e\.g\. "):
        env.reset(options={"task_id": "nope"})
    assert env.reset(options={"task_id": task.id})[1]["task_id"] == task.id  # the id still works
