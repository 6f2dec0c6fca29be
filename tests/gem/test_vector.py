"""Vector GEM envs: concurrent sandbox steps (one loop, no thread per env), subsets, NEXT_STEP
autoreset, make_vec."""

from __future__ import annotations

import threading

import gymnasium
import numpy as np
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids
from gymnasium.vector import AutoresetMode
from rockroll.gem import GemVectorEnv, MathEnv, TerminalEnv, make_vec
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.sync import run_sync

TASK_IDS = ["files-project-skeleton", "text-csv-total", "git-commit-file", "proc-exit-status",
            "pkg-gzip-keep", "text-count-errors", "files-large-files", "git-tag-release"]
N = len(TASK_IDS)


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```"


@pytest.fixture(scope="module")
def vec():
    vec = make_vec("rock/Terminal-v0", N)
    yield vec
    vec.close()


def script_for(env: TerminalEnv) -> list[str]:
    return [bash("ls -1 | sort"), "not an action", bash(env.task.solution), "<submit/>"]


def test_concurrent_steps_equal_stepping_one_by_one(vec):
    obs, infos = vec.reset(options=[{"task_id": t} for t in TASK_IDS])
    assert len(obs) == N and list(infos["task_id"]) == TASK_IDS and infos["_task_id"].all()
    scripts = [script_for(env) for env in vec.envs]
    batched = [vec.step([s[k] for s in scripts]) for k in range(4)]
    assert batched[-1][1].tolist() == [1.0] * N and batched[-1][2].all()
    assert batched[1][1].tolist() == [vec.envs[0].format_penalty] * N

    single = TerminalEnv()
    try:
        for i, task_id in enumerate(TASK_IDS):
            single.reset(options={"task_id": task_id})
            for k, action in enumerate(scripts[i]):
                o, r, term, trunc, info = single.step(action)
                assert (o, r, term, trunc) == (batched[k][0][i], batched[k][1][i], batched[k][2][i], batched[k][3][i])
                assert info["turn"] == batched[k][4]["turn"][i]
    finally:
        single.close()


def test_next_step_autoreset(vec):
    assert vec.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    vec.reset(seed=0, options={"task_id": "proc-exit-status"})
    obs, rewards, terms, *_ = vec.step(["submit"] * N)
    assert terms.all() and (rewards == 0.0).all()
    # The next step ignores its actions and starts a new episode in every ended env.
    obs, rewards, terms, truncs, infos = vec.step([bash("exit 1")] * N)
    assert not terms.any() and not truncs.any() and (rewards == 0.0).all()
    assert all("Task:" in o for o in obs) and (infos["turn"] == 0).all() and infos["_task_id"].all()
    obs, *_ = vec.step([bash("echo after-reset")] * N)
    assert all("after-reset" in o for o in obs)


def test_step_some_steps_only_a_subset(vec):
    vec.reset(options={"task_id": "text-csv-total"})
    obs, rewards, terms, truncs, infos = vec.step_some([5, 2], [bash("echo five"), bash("echo two")])
    assert len(obs) == 2 and "five" in obs[0] and "two" in obs[1] and infos["turn"].tolist() == [1, 1]
    assert [env._turn for env in vec.envs] == [0, 0, 1, 0, 0, 1, 0, 0]
    # An env that ended in a subset step autoresets at its own next step only.
    _, rewards, terms, *_ = vec.step_some([2], ["submit"])
    assert terms.tolist() == [True]
    obs, rewards, terms, _, infos = vec.step_some([2, 3], [bash("echo ignored"), bash("echo three")])
    assert "Task:" in obs[0] and infos["turn"].tolist() == [0, 1] and "three" in obs[1]
    with pytest.raises(ValueError):
        vec.step_some([1, 1], ["a", "b"])


def test_reset_mask(vec):
    vec.reset(options={"task_id": "text-csv-total"})
    vec.step([bash("echo x")] * N)
    mask = np.zeros(N, dtype=np.bool_)
    mask[[0, 7]] = True
    obs, infos = vec.reset(options={"reset_mask": mask, "task_id": "pkg-gzip-keep"})
    assert len(obs) == 2 and [env._turn for env in vec.envs] == [0, 1, 1, 1, 1, 1, 1, 0]


def test_gymnasium_make_vec_entry_point_and_no_leaks():
    vec = gymnasium.make_vec("rock/Terminal-v0", num_envs=3, vectorization_mode="vector_entry_point")
    assert isinstance(vec.unwrapped, GemVectorEnv) and vec.num_envs == 3
    obs, infos = vec.reset(seed=7)
    again = vec.reset(seed=7)[1]["task_id"].tolist()
    assert infos["task_id"].tolist() == again
    held = {env.sandbox.id for env in vec.unwrapped.envs}
    pool = vec.unwrapped.envs[0]._lease.pool
    vec.close()
    assert all(env.sandbox is None for env in vec.unwrapped.envs)
    # Given back: none is busy; each is closed or (reset) idle in the shared pool, and
    # closing the pool leaves nothing of these envs alive in the engine's run.
    assert not {sb.id for sb in pool._busy} & held
    run_sync(pool.close())
    assert not held & set(current_run().live())


def test_non_sandbox_envs_loop_synchronously():
    vec = make_vec("rock/Math-v0", 3)
    try:
        obs, infos = vec.reset(seed=1)
        assert len(obs) == 3 and not vec._concurrent
        # Env i is seeded 1 + i: the same problem a lone MathEnv gets from that seed.
        assert list(obs) == [MathEnv().reset(seed=1 + i)[0] for i in range(3)]
        answers = [f"\\boxed{{{env.answer}}}" for env in vec.envs]
        obs, rewards, terms, truncs, infos = vec.step([answers[0], "\\boxed{not a number}", answers[2]])
        assert rewards.tolist() == [1.0, 0.0, 1.0] and terms.all() and not truncs.any()
        assert infos["success"].tolist() == [True, False, True]
    finally:
        vec.close()


def test_sandbox_steps_run_concurrently_on_one_loop_without_new_threads():
    vec = make_vec("rock/Terminal-v0", 4)
    try:
        vec.reset(options={"task_id": "text-csv-total"})  # sandbox creation may start executor threads
        before = set(threading.enumerate())
        # Timestamps from inside each sandbox: run one after another, an env would start only
        # after the previous one ended.
        stamp = "python3 -c 'import time; print(time.time())'"
        obs, *_ = vec.step([bash(f"{stamp}; sleep 1; {stamp}")] * 4)
        new_threads = set(threading.enumerate()) - before
        assert not new_threads, [t.name for t in new_threads]
        starts, ends = zip(*(map(float, o.split("stdout:\n")[1].split()[:2]) for o in obs))
        assert max(starts) < min(ends), (starts, ends)
    finally:
        vec.close()


@pytest.mark.parametrize("env_id, action", [("rock/Math-v0", "\\boxed{0}"), ("rock/FrozenLake-v0", "Right")])
def test_gymnasium_make_vec_entry_point_for_cheap_envs(env_id, action):
    vec = gymnasium.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point")
    try:
        assert isinstance(vec.unwrapped, GemVectorEnv) and vec.num_envs == 2
        obs, infos = vec.reset(seed=3)
        assert obs == vec.reset(seed=3)[0] and len(obs) == 2
        obs, rewards, terms, truncs, infos = vec.step([action] * 2)
        assert len(obs) == 2 and rewards.shape == (2,) and infos["turn"].tolist() == [1, 1]
    finally:
        vec.close()
