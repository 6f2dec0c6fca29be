"""rock/SWE-v0 on the default task set (real sdists, real sandboxes, real pytest runs).

The set is the one `make test` publishes to the user's default hub (the `swe_hub`
fixture builds it if it is missing). Oracle (the reference fix) and null (submit at once)
agents run over every task."""

from __future__ import annotations

import json

import gymnasium
import pytest

from rockroll.gem.swe import SWEEnv, hub_swe_tasks
from rockroll.registry.hub import register_hub


def bash(command: str) -> str:
    # The JSON tool-call form: a patch may hold anything a fence or a tag could trip on.
    return json.dumps({"name": "bash", "arguments": {"command": command}})


def apply_patch(patch: str) -> str:
    return bash(f"git apply <<'ROCKROLL_PATCH'\n{patch}ROCKROLL_PATCH")


@pytest.fixture(scope="module")
def tasks(swe_hub):
    return hub_swe_tasks(swe_hub)


@pytest.fixture(scope="module")
def env(swe_hub):
    e = SWEEnv(hub=swe_hub)
    yield e
    e.close()


def test_default_set_is_three_packages_times_ten(tasks):
    repos = {t.repo for t in tasks}
    assert len(repos) >= 3 and len(tasks) >= 30
    for repo in repos:
        assert sum(t.repo == repo for t in tasks) >= 10
    kinds = {t.extra["mutation"]["kind"] for t in tasks}
    assert len(kinds) >= 4  # bugs of several kinds, not one operator everywhere
    for t in tasks:
        assert t.fail_to_pass and t.pass_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert t.patch.startswith("diff --git") and "fail" in t.problem_statement


def test_oracle_solves_and_null_fails_every_task(env, tasks):
    failures = []
    for task in tasks:
        obs, info = env.reset(options={"task_id": task.id})
        assert info["task_id"] == task.id and task.problem_statement in obs
        _, reward, terminated, _, info = env.step("<submit/>")
        if not (terminated and reward == 0.0 and info["f2p_pass_fraction"] < 1.0 and info["p2p_pass_fraction"] == 1.0):
            failures.append(("null", task.id, reward, info))
        env.reset(options={"task_id": task.id})
        obs, reward, terminated, _, info = env.step(apply_patch(task.patch))
        assert "exit code: 0" in obs, obs
        obs, reward, terminated, _, info = env.step("<submit/>")
        if not (terminated and reward == 1.0 and info["resolved"]):
            failures.append(("oracle", task.id, reward, obs))
    assert failures == []


def _module(path: str) -> str:
    return path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _stdout(obs: str) -> str:
    return obs.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].rstrip("\n") if "stdout:\n" in obs else ""


def test_the_repository_is_at_the_buggy_commit_and_task_data_is_hidden(env, tasks):
    task = tasks[0]
    env.reset(options={"task_id": task.id})
    obs, *_ = env.step(bash(f"git rev-parse HEAD; git status --porcelain | wc -l; "
                            f"cd /tmp && python3 -c 'import {_module(task.extra['mutation']['file'])}; print(1)'"))
    assert _stdout(obs) == f"{task.base_commit}\n0\n1", obs  # clean, at the bug, installed
    # Neither the task records (test ids, the fix) nor any file naming the task is in the
    # sandbox. (The id is assembled at run time so this command itself holds no copy.)
    half = len(task.id) // 2
    obs, *_ = env.step(bash(f"ls -A /rockenv 2>/dev/null; ID=$(printf %s '{task.id[:half]}' '{task.id[half:]}'); "
                            "grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                            "-e \"$ID\" -e FAIL_TO_PASS / 2>/dev/null | head -5; echo scanned"))
    assert _stdout(obs) == "scanned", obs


def test_editing_the_tests_does_not_count(env, tasks):
    task = tasks[0]
    test_file = task.fail_to_pass[0].split("::")[0]
    env.reset(options={"task_id": task.id})
    # The classic reward hack: make the failing tests pass by gutting them (and a conftest
    # that skips everything); the grader runs the original tests on the code changes only.
    env.step(bash(f"printf 'import pytest\\ndef pytest_collection_modifyitems(items):\\n    items.clear()\\n' > conftest.py; "
                  f": > {test_file}"))
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert terminated and reward == 0.0 and info["f2p_pass_fraction"] < 1.0 and info["p2p_pass_fraction"] == 1.0
    assert "conftest.py" in info["ignored_files"] and test_file in info["ignored_files"]
    # A fix plus the same hack: graded on the fix alone, so it passes.
    env.reset(options={"task_id": task.id})
    env.step(apply_patch(task.patch))
    env.step(bash(f": > {test_file}"))
    _, reward, *_ = env.step("<submit/>")
    assert reward == 1.0
    # Without its git repository the change cannot be read: a zero, said plainly.
    env.reset(options={"task_id": task.id})
    env.step(bash("rm -rf .git"))
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert (terminated, reward) == (True, 0.0) and "could not be read" in obs


def test_resume_from_a_saved_state_continues_exactly(env, tasks, swe_hub):
    task = tasks[-1]
    env.reset(options={"task_id": task.id})
    env.step(bash("mkdir -p notes && cd notes && echo first > a.txt && export MARK=42"))
    state = env.save_state()
    probe = bash("pwd; cat a.txt; echo $MARK; git -C .. status --porcelain")
    original = env.step(probe)
    other = SWEEnv(hub=swe_hub, task_ids=[task.id])
    try:
        obs, info = other.reset(options={"state": state})
        assert info["task_id"] == task.id
        resumed = other.step(probe)
        assert resumed[0] == original[0] and "/workspace/notes\nfirst\n42\n?? notes/" in resumed[0]
        other.step(bash("cd /workspace && rm -rf notes"))
        other.step(apply_patch(task.patch))
        assert other.step("<submit/>")[1] == 1.0
    finally:
        other.close()


def test_a_hub_swe_env_is_makeable_by_its_own_id(swe_hub, tasks):
    ids = register_hub(swe_hub)
    swe_ids = sorted(i for i in ids if i.startswith("rock/swe-"))
    assert len(swe_ids) >= 3
    env = gymnasium.make(swe_ids[0])
    try:
        inner = env.unwrapped
        assert isinstance(inner, SWEEnv) and len(inner.tasks) == 10
        assert {t.repo for t in inner.tasks} == {inner.tasks[0].repo}
        task = inner.tasks[3]
        env.reset(options={"task_id": task.id})
        env.step(apply_patch(task.patch))
        assert env.step("<submit/>")[1] == 1.0
    finally:
        env.close()


def test_unknown_task_and_empty_hub_are_clear_errors(swe_hub, tmp_path):
    with pytest.raises(ValueError, match="none of task_ids"):
        SWEEnv(hub=swe_hub, task_ids=["nope"])
    with pytest.raises(ValueError, match="no SWE tasks on the hub .*build-swe"):
        SWEEnv(hub=str(tmp_path / "empty-hub"))


def test_vector_envs_step_concurrently_from_per_task_pools(swe_hub, tasks):
    from rockroll.gem import make_vec

    picked = [tasks[0].id, tasks[10].id]
    vec = make_vec("rock/SWE-v0", 4, hub=swe_hub, task_ids=picked)
    try:
        obs, info = vec.reset(seed=0)
        assert set(info["task_id"]) <= set(picked) and all("Issue:" in o for o in obs)
        obs, rewards, terminated, truncated, info = vec.step(['```bash\ngit status --porcelain | wc -l\n```'] * 4)
        assert all("exit code: 0\nstdout:\n0\n" in o for o in obs) and not terminated.any()
        obs, rewards, terminated, truncated, info = vec.step(["<submit/>"] * 4)
        assert terminated.all() and (rewards == 0.0).all()
    finally:
        vec.close()
