"""Warm pools: acquire/release with reset, refill, health checks, replacement."""

import asyncio
import json
import os
import signal
import time

import pytest

from rockroll.sandbox import SandboxSpec, SpecError
from rockroll.sandbox.pool import AsyncSandboxPool, SandboxPool
from rockroll.sandbox.deployment.reaper import current_run

SPEC = SandboxSpec(memory_mb=128, timeout_s=30)


def _wait(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_acquire_release_resets_and_reuses():
    with SandboxPool(SPEC, size=2) as pool:
        assert pool.idle == 2
        a = pool.acquire()
        # the pool owns 2 sandboxes: one handed out, one idle; nothing is created to replace a
        time.sleep(0.3)
        assert (pool.idle, pool.busy) == (1, 1)
        a.run("echo dirty > /workspace/x; cd /tmp")
        pool.release(a)
        # release resets in the background and the same sandbox rejoins the idle ones
        assert _wait(lambda: pool.idle == 2 and pool.busy == 0)
        assert a.id in {sb.id for sb in pool.aio._idle}
        seen = [pool.acquire() for _ in range(3)]  # more than the pool holds: one created on demand
        assert a.id in {sb.id for sb in seen}
        for sb in seen:
            assert sb.run("ls -A /workspace; pwd").stdout == "/workspace\n"
            pool.release(sb)
        # the surplus is closed on release: the pool owns 2 again
        assert _wait(lambda: pool.idle == 2 and pool.busy == 0)


def test_dead_idle_sandbox_is_replaced():
    with SandboxPool(SPEC, size=2, health_interval_s=0.2) as pool:
        victim = pool.aio._idle[0]
        pid = json.loads((current_run().dir / victim.id / "guest.json").read_text())["init_pid"]
        os.kill(pid, signal.SIGKILL)
        assert _wait(lambda: pool.replaced >= 1 and pool.idle == 2)
        # the replacement is another sandbox; the dead one is closed and gone from the run
        assert victim.id not in {sb.id for sb in pool.aio._idle}
        assert victim.id not in current_run().live()
        for _ in range(2):
            sb = pool.acquire()
            assert sb.id != victim.id and sb.run("echo ok").stdout == "ok\n"


LEAVE = "echo secret > /workspace/leftover; export LEFT=behind; (sleep 4242 &); cd /tmp"
LOOK = "ls -A /workspace; echo \"[$LEFT]\"; pgrep -fx 'sleep 4242' >/dev/null && echo running; pwd"
LEFT_BEHIND = "leftover\n[behind]\nrunning\n/tmp\n"  # what LOOK shows to the user who left it
NOTHING_LEFT = "[]\n/workspace\n"


async def test_a_recycled_sandbox_keeps_nothing_of_its_last_user():
    # A pool whose refill task is not started takes a released sandbox back (it is below its
    # size) and must hand that same sandbox out again, with nothing of the first user in it.
    pool = AsyncSandboxPool(SPEC, size=1)
    try:
        first = await pool.acquire()  # none idle: created on demand
        await first.run(LEAVE)
        assert (await first.run(LOOK)).stdout == LEFT_BEHIND
        await pool.release(first)
        for _ in range(600):
            if pool.idle == 1:
                break
            await asyncio.sleep(0.05)
        second = await pool.acquire()
        assert second is first and second.id == first.id  # reused: one create for two acquires
        assert (await second.run(LOOK)).stdout == NOTHING_LEFT
    finally:
        await pool.close()


def test_a_running_pool_reuses_released_sandboxes():
    with SandboxPool(SPEC, size=1) as pool:
        handed_out = []
        for _ in range(4):
            sb = pool.acquire()
            handed_out.append(sb.id)
            sb.run(LEAVE)
            pool.release(sb)
            assert _wait(lambda: pool.idle == 1 and pool.busy == 0)
        # one user at a time: every acquire handed out the same sandbox (one create, four acquires)
        assert len(set(handed_out)) == 1


def test_pool_close_leaves_nothing():
    pool = SandboxPool(SPEC, size=3)
    held = pool.acquire()
    ids = {held.id} | {s.id for s in pool.aio._idle}
    pool.close()
    assert not (set(current_run().live()) & ids)
    assert not held.alive


def test_pool_size_validation():
    with pytest.raises(SpecError):
        AsyncSandboxPool(SPEC, size=-1)


async def test_async_pool_acquire_many():
    async with AsyncSandboxPool(SPEC, size=3) as pool:
        boxes = [await pool.acquire() for _ in range(5)]
        assert len({b.id for b in boxes}) == 5
        for b in boxes:
            await pool.release(b)


def test_a_snapshot_pool_hands_out_and_returns_to_that_state():
    from rockroll.sandbox import open_sandbox

    with open_sandbox(SPEC) as sb:
        sb.run("mkdir -p /workspace/repo && cd /workspace/repo && echo base > state.txt && export STAGE=saved")
        snap = sb.snapshot()
    with SandboxPool(SPEC, size=2, snapshot=snap) as pool:
        assert pool.idle == 2
        a = pool.acquire()
        assert a.run("pwd; cat state.txt; echo $STAGE").stdout == "/workspace/repo\nbase\nsaved\n"
        a.run("echo dirty > state.txt; touch junk; cd /tmp")
        pool.release(a)
        assert _wait(lambda: pool.idle == 2 and pool.busy == 0)
        for sb in [pool.acquire() for _ in range(3)]:  # recycled ones and one created on demand
            assert sb.run("pwd; ls; cat state.txt").stdout == "/workspace/repo\nstate.txt\nbase\n"
            pool.release(sb)


def test_a_ray_pool_refuses_a_snapshot_clearly():
    with pytest.raises(SpecError, match="snapshot"):
        AsyncSandboxPool(SandboxSpec(backend="ray"), 2, snapshot="sha256:" + "0" * 64)
