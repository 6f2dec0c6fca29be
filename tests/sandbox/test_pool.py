"""Warm pools: acquire/release with reset, refill, health checks, replacement."""

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


def test_acquire_release_resets_and_refills():
    with SandboxPool(SPEC, size=2) as pool:
        assert pool.idle == 2
        a = pool.acquire()
        assert _wait(lambda: pool.idle == 2)  # background refill replaced what we took
        a.run("echo dirty > /workspace/x; cd /tmp")
        pool.release(a)
        # release resets in the background; the pool is full, so the extra one is closed
        assert _wait(lambda: pool.idle == 2 and pool.busy == 0)
        seen = [pool.acquire() for _ in range(3)]  # more than the pool holds: created on demand
        for sb in seen:
            assert sb.run("ls -A /workspace; pwd").stdout == "/workspace\n"
            pool.release(sb)


def test_released_sandbox_is_reset_before_reuse():
    with SandboxPool(SPEC, size=1) as pool:
        sb = pool.acquire()
        first_id = sb.id
        assert _wait(lambda: pool.idle == 1)
        sb.run("echo secret > /workspace/leftover")
        pool.release(sb)  # pool is full: closed, not recycled
        other = pool.acquire()
        assert other.run("ls -A /workspace").stdout == ""
        pool.release(other)
    assert first_id


def test_dead_idle_sandbox_is_replaced():
    with SandboxPool(SPEC, size=2, health_interval_s=0.2) as pool:
        victim = pool.aio._idle[0]
        pid = json.loads((current_run().dir / victim.id / "agent.json").read_text())["init_pid"]
        os.kill(pid, signal.SIGKILL)
        assert _wait(lambda: pool.replaced >= 1 and pool.idle == 2)
        for _ in range(2):
            sb = pool.acquire()
            assert sb.run("echo ok").stdout == "ok\n"


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
