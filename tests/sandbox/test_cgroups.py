"""Tests of rockroll.sandbox.deployment.cgroups on the host's real cgroups (v1 or v2), no mocks.

Every test runs under its own parent group (``ROCKROLL_CGROUP_PARENT``) so it cannot
touch groups of a real engine or of another test, and removes what it made.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid

import pytest

from rockroll.sandbox.deployment.cgroups import PARENT_ENV, Cgroup, Limits, cgroup_mode, rlimit_fallback
from rockroll.sandbox.errors import SandboxNotFound, SpecError

MIB = 1024 * 1024
needs_cgroups = pytest.mark.skipif(
    cgroup_mode() == "none", reason="cannot create cgroups here (not root, or cgroupfs read-only)"
)


@pytest.fixture
def parent(monkeypatch):
    """A fresh parent group name for this test; its directories are removed at the end."""
    name = f"rockroll-test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv(PARENT_ENV, name)
    yield name
    if cgroup_mode() == "none":
        return
    for leftover in Cgroup.leftovers():
        Cgroup.attach(leftover).remove()
    # The parent's directory in every hierarchy is the dirname of any group's directory.
    for d in {os.path.dirname(d) for d in Cgroup._layout("unused")[1].values()}:
        if os.path.isdir(d):
            os.rmdir(d)


@pytest.fixture
def make_group(parent):
    """Factory of groups with unique names, all removed when the test ends."""
    made: list[Cgroup] = []

    def make(limits: Limits = Limits()) -> Cgroup:
        group = Cgroup.create(f"g-{uuid.uuid4().hex[:8]}", limits)
        made.append(group)
        return group

    yield make
    for group in made:
        group.remove()


def joiner(group: Cgroup):
    """A preexec_fn that puts the child into ``group`` before it execs."""
    paths = group.procs_paths()

    def join() -> None:
        for path in paths:
            with open(path, "w") as f:
                f.write("0")  # "0" = the writing process itself

    return join


def run_python(group: Cgroup, code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=joiner(group), **kwargs)


def read(group: Cgroup, controller: str, filename: str) -> str:
    with open(os.path.join(group.dirs[controller], filename)) as f:
        return f.read().strip()


# --- validation (no cgroups needed) ------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [({"cpus": 0}, "cpus"), ({"cpus": -1.5}, "cpus"), ({"cpus": "2"}, "cpus"),
     ({"memory_mb": 15}, "memory_mb"), ({"memory_mb": 64.0}, "memory_mb"), ({"memory_mb": True}, "memory_mb"),
     ({"pids": 7}, "pids"), ({"pids": -1}, "pids")],
)
def test_invalid_limits_name_the_field(kwargs, field):
    with pytest.raises(SpecError) as info:
        Limits(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_valid_limits():
    assert Limits(cpus=0.5, memory_mb=16, pids=8) == Limits(0.5, 16, 8)
    assert Limits() == Limits(None, None, None)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_invalid_group_name(name):
    with pytest.raises(SpecError) as info:
        Cgroup.create(name, Limits())
    assert info.value.field == "name"


def test_invalid_parent_env(monkeypatch):
    monkeypatch.setenv(PARENT_ENV, "../escape")
    with pytest.raises(SpecError) as info:
        Cgroup.create("ok", Limits())
    assert info.value.field == PARENT_ENV


def test_cgroup_mode_is_cached():
    assert cgroup_mode() in ("v1", "v2", "none")
    assert cgroup_mode() is cgroup_mode()
    assert cgroup_mode.cache_info().hits >= 1


def test_rlimit_fallback_pairs():
    pairs = dict(rlimit_fallback(Limits(cpus=2, memory_mb=64, pids=20)))
    assert pairs == {
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_AS: (64 * MIB, 64 * MIB),
        resource.RLIMIT_NPROC: (20, 20),
    }  # no entry for cpus: there is no rlimit that throttles
    assert dict(rlimit_fallback(Limits())) == {resource.RLIMIT_CORE: (0, 0)}


def test_rlimit_fallback_caps_a_real_child():
    def apply() -> None:
        for res, pair in rlimit_fallback(Limits(memory_mb=64)):
            resource.setrlimit(res, pair)

    code = "try:\n b = b'x' * (300 << 20)\nexcept MemoryError:\n print('MemoryError')"
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=apply, capture_output=True, text=True, timeout=30)
    assert "MemoryError" in out.stdout


# --- real cgroups ---------------------------------------------------------------------------


@needs_cgroups
def test_limits_are_written(make_group):
    group = make_group(Limits(cpus=0.5, memory_mb=64, pids=20))
    if group.mode == "v2":
        assert read(group, "memory", "memory.max") == str(64 * MIB)
        if os.path.exists(os.path.join(group.dirs["memory"], "memory.swap.max")):
            assert read(group, "memory", "memory.swap.max") == "0"
        assert read(group, "pids", "pids.max") == "20"
        assert read(group, "cpu", "cpu.max") == "50000 100000"
    else:
        assert read(group, "memory", "memory.limit_in_bytes") == str(64 * MIB)
        if os.path.exists(os.path.join(group.dirs["memory"], "memory.memsw.limit_in_bytes")):
            assert read(group, "memory", "memory.memsw.limit_in_bytes") == str(64 * MIB)
        assert read(group, "pids", "pids.max") == "20"
        assert read(group, "cpu", "cpu.cfs_period_us") == "100000"
        assert read(group, "cpu", "cpu.cfs_quota_us") == "50000"


@needs_cgroups
def test_none_means_unlimited(make_group):
    group = make_group(Limits())
    assert read(group, "pids", "pids.max") == "max"
    if group.mode == "v2":
        assert read(group, "memory", "memory.max") == "max"
        assert read(group, "cpu", "cpu.max") == "max 100000"
    else:
        assert int(read(group, "memory", "memory.limit_in_bytes")) > 2**60
        assert read(group, "cpu", "cpu.cfs_quota_us") == "-1"


@needs_cgroups
def test_memory_hog_is_oom_killed(make_group):
    group = make_group(Limits(memory_mb=64))
    before = group.oom_kills()
    proc = run_python(group, "b = b'x' * (300 << 20)", stderr=subprocess.DEVNULL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert group.oom_kills() > before
    assert group.memory_peak_bytes() > 32 * MIB  # it got close to the limit before dying


@needs_cgroups
def test_fork_bomb_hits_pids_limit(make_group, tmp_path):
    group = make_group(Limits(pids=20))
    result = tmp_path / "result"
    code = f"""
import os, time
forked, error = 0, "none"
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        error = type(e).__name__
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
with open({str(result)!r}, "w") as f:
    f.write(f"{{forked}} {{error}}")
"""
    proc = run_python(group, code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(timeout=30) == 0
    forked, error = result.read_text().split()
    assert error == "BlockingIOError"  # EAGAIN from fork
    assert int(forked) < 20
    assert len(group.pids()) <= 20
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    group.kill_all()
    assert group.pids() == []


@needs_cgroups
def test_kill_all_empties_the_group(make_group):
    group = make_group(Limits(pids=50))
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(5)]
    for proc in procs:
        group.add(proc.pid)
    assert group.pids() == sorted(p.pid for p in procs)
    group.kill_all()
    assert group.pids() == []
    assert [p.wait(timeout=5) for p in procs] == [-signal.SIGKILL] * 5


@needs_cgroups
def test_remove_leaves_nothing(make_group):
    group = make_group(Limits(memory_mb=64))
    proc = subprocess.Popen(["sleep", "60"])
    group.add(proc.pid)
    assert group.name in Cgroup.leftovers()
    group.remove()
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert not any(os.path.exists(d) for d in group.dirs.values())
    assert group.name not in Cgroup.leftovers()
    group.remove()  # idempotent
    with pytest.raises(SandboxNotFound):
        Cgroup.attach(group.name)


@needs_cgroups
def test_create_reuses_a_leftover_group(make_group):
    old = make_group(Limits(memory_mb=64, pids=20))
    proc = subprocess.Popen(["sleep", "60"])
    old.add(proc.pid)
    assert Cgroup.attach(old.name).pids() == [proc.pid]
    old.freeze()  # the engine crashed mid-snapshot
    new = Cgroup.create(old.name, Limits(pids=30))
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert new.pids() == []
    assert read(new, "pids", "pids.max") == "30"
    # the old group's memory limit is lifted: a reused group is not fresh, its limits are all written
    if new.mode == "v2":
        assert read(new, "memory", "memory.max") == "max"
    else:
        assert int(read(new, "memory", "memory.limit_in_bytes")) > 2**60
    child = run_python(new, "pass")  # the reused group is not left frozen
    assert child.wait(timeout=10) == 0


@needs_cgroups
def test_freeze_stops_and_thaw_resumes(make_group, tmp_path):
    group = make_group()
    counter = tmp_path / "counter"
    code = f"""
import os
i = 0
while True:
    i += 1
    if i % 1000 == 0:
        with open({str(counter)!r} + ".tmp", "w") as f:
            f.write(str(i))
        os.replace({str(counter)!r} + ".tmp", {str(counter)!r})
"""
    proc = run_python(group, code)
    try:
        assert _wait_for(lambda: counter.exists())
        group.freeze()
        frozen_at = counter.read_text()
        time.sleep(0.3)
        assert counter.read_text() == frozen_at  # did not advance while frozen
        group.thaw()
        assert _wait_for(lambda: counter.read_text() != frozen_at)  # advances again
    finally:
        group.kill_all()
        proc.wait(timeout=5)


@needs_cgroups
def test_cpu_seconds_grow_for_a_busy_child(make_group):
    group = make_group(Limits(cpus=1))
    before = group.cpu_seconds()
    proc = run_python(group, "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass")
    assert proc.wait(timeout=30) == 0
    assert group.cpu_seconds() > before
    assert group.memory_bytes() >= 0


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False
