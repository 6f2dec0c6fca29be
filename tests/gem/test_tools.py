"""SandboxToolEnv: pooled sandboxes, bash observations, infra errors, save/resume, no leaks."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal

import pytest
from gymnasium.error import ResetNeeded
from rockroll.gem import TerminalEnv, TerminalTask
from rockroll.gem.tools import ENV_DIR, parse_records, shared_pool
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.sync import run_sync

TASKS = [
    TerminalTask(
        id="counter",
        category="test",
        instruction="Append lines to log.txt until it has 3 lines.",
        setup="echo start > log.txt",
        check='[ "$(wc -l < log.txt)" -eq 3 ]',
        solution="echo a >> log.txt; echo b >> log.txt",
    ),
    TerminalTask(
        id="hello",
        category="test",
        instruction="Write hello into hello.txt.",
        setup="",
        check='[ "$(cat hello.txt)" = hello ]',
        solution="echo hello > hello.txt",
    ),
]


@pytest.fixture
def env():
    env = TerminalEnv(tasks=TASKS, step_timeout=5.0, max_obs_chars=2000)
    yield env
    env.close()


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```"


def live_sandboxes() -> set[str]:
    return set(current_run().live())


def wait_until(cond, timeout: float = 30.0) -> bool:
    """Poll ``cond`` on the engine's loop (where pool releases run) until true."""
    for _ in range(int(timeout / 0.05)):
        if cond():
            return True
        run_sync(asyncio.sleep(0.05))
    return cond()


def test_parse_records():
    text = "# comment\n=== a\n--- x\nline 1\n\nline 2\n\n--- y\nz\n# not a comment inside\n=== b\n--- x\n1\n"
    assert parse_records(text) == [{"id": "a", "x": "line 1\n\nline 2", "y": "z\n# not a comment inside"}, {"id": "b", "x": "1"}]
    with pytest.raises(ValueError, match="duplicate"):
        parse_records("=== a\n=== a\n")
    with pytest.raises(ValueError, match="repeated"):
        parse_records("=== a\n--- x\n--- x\n")


def test_bash_observation_format_error_and_submit(env):
    obs, info = env.reset(options={"task_id": "counter"})
    assert info["task_id"] == "counter" and "Append lines" in obs and "<submit/>" in obs
    obs, reward, term, trunc, info = env.step(bash("cat log.txt; echo oops >&2; false"))
    assert obs == "exit code: 1\nstdout:\nstart\n\nstderr:\noops\n"
    assert (reward, term, trunc, info["exit_code"]) == (0.0, False, False, 1)
    # The persistent session keeps cwd between steps.
    env.step(bash("mkdir -p sub && cd sub"))
    assert env.step(bash("pwd"))[0].startswith("exit code: 0\nstdout:\n/workspace/sub")
    # Unparseable replies and answers are format errors, not commands.
    obs, reward, term, _, info = env.step("just words")
    assert reward == env.format_penalty and not term and "format_error" in info and "Accepted formats" in obs
    obs, reward, *_ = env.step("\\boxed{42}")
    assert reward == env.format_penalty and "tool actions" in obs
    env.step(bash("cd /workspace && echo a >> log.txt && echo b >> log.txt"))
    obs, reward, term, _, info = env.step("<submit/>")
    assert (reward, term, info["success"]) == (1.0, True, True) and "passed" in obs
    with pytest.raises(ResetNeeded):
        env.step(bash("ls"))


def test_output_is_truncated_per_stream_and_timeouts_are_reported(env):
    env.reset(options={"task_id": "hello"})
    obs, *_ = env.step(bash("head -c 50000 /dev/zero | tr '\\0' x; echo tail-of-stdout; echo err >&2"))
    assert len(obs) <= env.max_obs_chars and "characters truncated" in obs
    assert "tail-of-stdout" in obs and "stderr:\nerr" in obs
    obs, reward, term, _, info = env.step(bash("sleep 30"))
    assert info["timed_out"] and "timed out" in obs and not term and reward == 0.0
    assert env.step(bash("echo still-alive"))[0].startswith("exit code: 0\nstdout:\nstill-alive")


def test_checker_is_hidden_until_submit(env):
    env.reset(options={"task_id": "hello"})
    obs, *_ = env.step(bash(f"ls -a {ENV_DIR} /tmp /workspace 2>&1"))
    assert "check" not in obs and "setup" not in obs
    obs, reward, *_ = env.step("submit")
    assert reward == 0.0 and "failed" in obs


def test_seed_picks_tasks_deterministically_and_reset_reuses_the_pool(env):
    ids = [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    assert ids == [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    assert set(ids) == {"counter", "hello"}
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": "nope"})
    # Each reset gave the previous sandbox back: the env holds one sandbox at a time, and
    # a reused sandbox starts clean.
    env.reset(options={"task_id": "hello"})
    first = env.sandbox
    env.step(bash("echo leftover > hello.txt"))
    env.reset(options={"task_id": "hello"})
    assert first not in env._lease.pool._busy and env.sandbox in env._lease.pool._busy
    assert "leftover" not in env.step(bash("cat hello.txt"))[0]


def test_save_state_then_resume_continues_exactly():
    script = [bash("echo one >> log.txt; cd /tmp; export X=42"), bash("echo $X; pwd; cat /workspace/log.txt"),
              bash("echo two >> /workspace/log.txt"), "<submit/>"]
    env = TerminalEnv(tasks=TASKS)
    try:
        env.reset(seed=3, options={"task_id": "counter"})
        env.step(script[0])
        state = env.save_state()
        json.dumps(state)  # JSON-serializable
        assert state["env_state"]["snapshot"]["digest"].startswith("sha256:")
        original = [env.step(a) for a in script[1:]]
    finally:
        env.close()
    resumed_env = TerminalEnv(tasks=TASKS)
    try:
        obs, info = resumed_env.reset(options={"state": json.loads(json.dumps(state))})
        assert info["resumed"] and resumed_env.task.id == "counter"
        resumed = [resumed_env.step(a) for a in script[1:]]
        assert resumed == original
        assert original[0][0].startswith("exit code: 0\nstdout:\n42\n/tmp\nstart\none")
        assert original[-1][1] == 1.0
    finally:
        resumed_env.close()


def test_infra_failure_is_flagged_and_the_next_reset_works(env):
    env.reset(options={"task_id": "hello"})
    pids = json.loads((current_run().dir / env.sandbox.id / "guest.json").read_text())
    os.kill(pids["init_pid"], signal.SIGKILL)  # the agent: pid 1 of the sandbox
    obs, reward, term, trunc, info = env.step(bash("echo hi"))
    assert info["infra_error"] and term and reward == 0.0 and "Environment error" in obs
    obs, info = env.reset(options={"task_id": "hello"})
    assert "infra_error" not in info
    env.step(bash("echo hello > hello.txt"))
    assert env.step("<submit/>")[1] == 1.0


def test_failed_start_is_flagged_not_raised():
    broken = TerminalTask(id="broken", category="test", instruction="x", setup="exit 7", check="true", solution="")
    env = TerminalEnv(tasks=[broken])
    try:
        obs, info = env.reset()
        assert "setup of task 'broken' failed" in info["infra_error"]
        with pytest.raises(ResetNeeded):
            env.step("submit")
    finally:
        env.close()


def test_close_and_finalizer_give_the_sandbox_back():
    env = TerminalEnv(tasks=TASKS)
    env.reset(options={"task_id": "hello"})
    sb_id = env.sandbox.id
    pool = env._lease.pool
    assert sb_id in live_sandboxes()
    env.close()
    env.close()  # idempotent
    assert all(sb.id != sb_id for sb in pool._busy)

    env = TerminalEnv(tasks=TASKS)
    env.reset(options={"task_id": "hello"})
    sb = env.sandbox
    del env
    gc.collect()
    # The finalizer schedules the release on the engine's loop: the sandbox is reset back
    # into the pool, or closed when the pool is full.
    assert wait_until(lambda: sb not in pool._busy and (sb in pool._idle or sb.id not in live_sandboxes()))


def test_no_sandbox_of_a_closed_env_stays_live():
    env = TerminalEnv(tasks=TASKS)
    env.reset(options={"task_id": "hello"})
    mine = env.sandbox.id
    env.close()
    pool = run_sync(shared_pool(env.sandbox_spec, 0))
    # Whatever the pool keeps warm is idle and reset, never the env's: close the pool and
    # nothing of the env is left in the engine's run.
    run_sync(pool.close())
    assert mine not in live_sandboxes()


async def test_async_api_from_another_event_loop():
    env = TerminalEnv(tasks=TASKS)
    try:
        obs, info = await env.areset(options={"task_id": "hello"})
        obs, *_ = await env.astep(bash("echo hello > hello.txt && echo ok"))
        assert "ok" in obs
        state = await env.asave_state()
        assert state["turn"] == 1
        assert (await env.astep("<submit/>"))[1] == 1.0
    finally:
        await env.aclose()
