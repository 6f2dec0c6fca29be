"""Faults: a killed guest, a killed owner process. Nothing may leak."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rockroll.sandbox import GuestDied, SandboxSpec, open_sandbox
from rockroll.sandbox.deployment.cgroups import cgroup_mode
from rockroll.sandbox.deployment.reaper import current_run, list_runs, reap_dead_runs

from _leaks import leftovers


def _agent_pids(sb):
    info = json.loads((current_run().dir / sb.id / "guest.json").read_text())
    return info["init_pid"], info["outer_pid"]


def test_killed_agent_is_a_typed_error_and_reset_recovers(sb):
    init_pid, _ = _agent_pids(sb)
    sb.run("echo x > /workspace/f")

    def kill_soon():
        time.sleep(0.3)
        os.kill(init_pid, signal.SIGKILL)

    import threading
    threading.Thread(target=kill_soon).start()
    with pytest.raises(GuestDied) as err:
        sb.run("sleep 30")  # killed mid-command
    assert err.value.sandbox_id == sb.id
    with pytest.raises(GuestDied):
        sb.run("true")
    assert not sb.ping()
    sb.reset()
    assert sb.run("echo back; ls /workspace").stdout == "back\n"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def _parent(pid):
    data = Path(f"/proc/{pid}/stat").read_text()
    return int(data[data.rindex(")") + 2:].split()[1])


def _children(pid):
    """Live processes whose parent is ``pid``."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if _parent(int(p.name)) == pid and _alive(int(p.name)):
                    found.append(int(p.name))
            except (OSError, ValueError):
                continue
    return found


# Set to 1 to watch the leak checks below fail: the reap that the next start runs is skipped.
BREAK_REAP = os.environ.get("ROCKROLL_TEST_SKIP_REAP") == "1"


def test_kill_9_of_owner_leaves_nothing_after_next_start(tmp_path):
    script = textwrap.dedent("""
        import json, sys, time
        from rockroll.sandbox import open_sandbox, SandboxSpec
        from rockroll.sandbox.deployment.process import zygote_pid
        from rockroll.sandbox.deployment.reaper import current_run
        boxes = [open_sandbox(SandboxSpec(memory_mb=128)) for _ in range(3)]
        for b in boxes:
            b.run("sleep 1000 &")
        info = [json.loads((current_run().dir / b.id / "guest.json").read_text()) for b in boxes]
        print(json.dumps({"run": current_run().run_id, "dir": str(current_run().dir), "guests": info,
                          "zygote": zygote_pid()}), flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ)
    line = proc.stdout.readline()
    data = json.loads(line)
    run_id, run_dir = data["run"], Path(data["dir"])
    live = leftovers(run_id, run_dir)  # the checks see a live run's traces, of every kind
    assert {item.split()[0] for item in live} >= {"path", "dir", "process", "loop"} | ({"cgroup"} if cgroup_mode() != "none" else set())
    zygote = data["zygote"]  # the guests' parent, a process of the owner's
    assert zygote and all(_parent(a["outer_pid"]) == zygote for a in data["guests"])
    forked = _children(zygote)  # the guests' outer processes, and spares waiting for a config
    assert len(forked) > len(data["guests"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the guests die with their owner: their control pipe closed, pid 1 exits, the pid namespace
    # goes; so does the zygote that forked them (PR_SET_PDEATHSIG, and EOF on its socket)
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for a in data["guests"] for p in (a["init_pid"], zygote)):
        time.sleep(0.1)
    assert not any(_alive(a["init_pid"]) or _alive(a["outer_pid"]) for a in data["guests"])
    assert not _alive(zygote) and not [p for p in forked if _alive(p)]
    dead = [r for r in list_runs() if r.run_id == run_id]
    assert dead and not dead[0].alive  # its directory is still there until the next start ...
    if not BREAK_REAP:
        reaped = reap_dead_runs(keep=current_run().run_id)  # ... which is what the next start runs
        assert run_id in reaped
    # in the host's view nothing of it is left: processes, cgroups, mounts, files
    assert leftovers(run_id, run_dir) == []
    assert not any(r.run_id == run_id for r in list_runs())


def test_next_start_reaps_and_gc_cli(tmp_path):
    env = dict(os.environ)
    script = "import os\nfrom rockroll.sandbox import open_sandbox\nsb = open_sandbox()\nprint(sb.id, flush=True)\nos._exit(0)\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.startswith("sb-")
    assert any(not r.alive for r in list_runs())  # os._exit skipped cleanup: a dead run is left
    r = subprocess.run([sys.executable, "-m", "rockroll.cli", "sandbox", "gc"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "reaped" in r.stdout
    assert all(r.alive for r in list_runs())


def test_sigterm_and_ctrl_c_clean_up():
    for sig in (signal.SIGTERM, signal.SIGINT):
        script = ("import time\nfrom rockroll.sandbox import open_sandbox\nfrom rockroll.sandbox.deployment.reaper import current_run\n"
                  "sb = open_sandbox()\nprint(current_run().run_id, flush=True)\ntime.sleep(100)\n")
        # SIGINT default, as a terminal's Ctrl-C finds it (a suite started in the background hands
        # its children SIGINT ignored, and Python keeps it so)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=os.environ, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        run_id = proc.stdout.readline().strip()
        proc.send_signal(sig)
        # a bound on a hang, not a timing: full-suite runs on a busy 2-core host took over 30 s
        proc.wait(timeout=120)
        assert not any(r.run_id == run_id for r in list_runs()), f"run left behind after {sig!r}"


def test_gc_never_touches_a_live_run_of_another_home(tmp_path):
    """Two users (or test sessions) with different ROCKROLL_HOMEs share the cgroup tree:
    one's gc must not reap the other's live sandboxes."""
    env = dict(os.environ, ROCKROLL_HOME=str(tmp_path / "other-home"))
    script = ("import sys, time\nfrom rockroll.sandbox import open_sandbox\nsb = open_sandbox()\n"
              "print('ready', flush=True)\nsys.stdin.readline()\nprint(sb.run('echo still-here').stdout, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        reap_dead_runs(keep=current_run().run_id)  # our gc, in our home
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "still-here"
    finally:
        proc.kill()
        proc.wait()


def test_a_run_being_registered_is_never_taken_for_a_dead_one(tmp_path, monkeypatch):
    """Two processes that start sandbox engines at once on one home (two env workers on a
    node): the second's reaper runs while the first registers its run. Held open here at its
    widest -- the reaper runs while the first is about to write its run.json -- the first's
    directory must come through (before: it was seen without a run.json, taken for a dead
    run's and removed, and later its spare disks vanished under it)."""
    import threading

    from rockroll.sandbox.deployment.reaper import RunRegistry

    window, reaped = threading.Event(), threading.Event()
    write_text = Path.write_text

    def held(self, data, *args, **kwargs):
        if self.name == "run.json":
            window.set()
            reaped.wait(30)
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", held)
    registry = RunRegistry(tmp_path)
    registering = threading.Thread(target=registry.ensure)
    registering.start()
    assert window.wait(30)
    assert reap_dead_runs(tmp_path) == []  # the other process's reaper, in the window
    reaped.set()
    registering.join(30)
    monkeypatch.undo()
    assert json.loads((registry.dir / "run.json").read_text())["pid"] == os.getpid()
    assert [r.run_id for r in list_runs(tmp_path)] == [registry.run_id]

    # a directory whose maker died between mkdir and rename goes once it is older than the grace
    from rockroll.sandbox.deployment.reaper import STARTING, STARTING_GRACE_S

    fresh, stale = tmp_path / "runs" / f"{STARTING}aaaa", tmp_path / "runs" / f"{STARTING}bbbb"
    fresh.mkdir()
    stale.mkdir()
    old = time.time() - STARTING_GRACE_S - 5
    os.utime(stale, (old, old))
    reap_dead_runs(tmp_path)
    assert fresh.is_dir() and not stale.exists() and registry.dir.is_dir()
    registry.close_all()


async def test_cancelled_create_leaves_no_sandbox():
    # A create cancelled at any point of its build (threads that cannot be interrupted) must
    # not leave a sandbox running that nobody holds: pools cancel refills when they close.
    from rockroll.sandbox import AsyncSandbox

    spec = SandboxSpec(memory_mb=128, timeout_s=30)
    before = set(current_run().live())
    for delay in [ms / 1000 for ms in range(0, 60, 2)]:  # spread over a build's phases
        task = asyncio.ensure_future(AsyncSandbox.create(spec))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            sb = await task
            await sb.close()  # it finished before the cancel landed: an ordinary close
    # A cut-off build registers its sandbox only when its thread finishes, after the cancel:
    # wait until the registry has been back to `before` for a few quiet seconds.
    deadline, quiet_since = time.monotonic() + 60, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 3:
        if set(current_run().live()) - before:
            quiet_since = time.monotonic()
        await asyncio.sleep(0.05)
    assert set(current_run().live()) - before == set()


async def test_handshake_takes_ready_before_spawned():
    # The outer guest reports the pid it forked ("spawned") while init reports "ready" on the
    # same pipe: on a loaded host "ready" can come first, and the pid must still be recorded
    # (a crash reaper needs it). A process speaking the guest's framing in that order:
    from rockroll.sandbox.runtime.guest import GuestConnection

    script = textwrap.dedent("""
        import os, sys, time
        from rockroll.sandbox.protocol.frames import encode_frame
        os.write(1, encode_frame({"op": "ready", "ok": True, "pid": 1}))
        time.sleep(0.2)
        os.write(1, encode_frame({"op": "spawned", "init_pid": 4242}))
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        conn = GuestConnection(proc, "sb-test")
        assert await conn.handshake(timeout=30) == 4242
        conn.close()
    finally:
        proc.kill()
        proc.wait()


async def test_handshake_of_a_one_process_agent_is_its_own_pid():
    # As root the guest is init itself (pid 1 of a pid namespace the zygote made): its
    # "ready" says so, no "spawned" comes, and the pid to record is the process's own.
    from rockroll.sandbox.runtime.guest import GuestConnection

    script = textwrap.dedent("""
        import os, sys
        from rockroll.sandbox.protocol.frames import encode_frame
        os.write(1, encode_frame({"op": "ready", "ok": True, "pid": 1, "one_process": True}))
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        conn = GuestConnection(proc, "sb-test")
        assert await conn.handshake(timeout=30) == proc.pid
        conn.close()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("frame", [
    "struct.pack('>II', 1 << 31, 0)",                     # an oversized frame, from its size alone
    "struct.pack('>II', 4, 0) + b'null'",                 # a header that is not a JSON object
])
async def test_a_bad_frame_fails_requests_instead_of_hanging(frame):
    # A corrupted control stream cannot be resynchronised: requests in flight must fail with
    # GuestDied at once, not wait for a reply that can never be parsed.
    from rockroll.sandbox.runtime.guest import GuestConnection

    script = textwrap.dedent(f"""
        import os, struct, sys, time
        from rockroll.sandbox.protocol.frames import encode_frame
        os.write(1, encode_frame({{"op": "ready", "ok": True, "pid": 1}}))
        os.write(1, encode_frame({{"op": "spawned", "init_pid": 4242}}))
        sys.stdin.buffer.read1(1 << 16)  # the request
        os.write(1, {frame})
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        conn = GuestConnection(proc, "sb-test")
        assert await conn.handshake(timeout=30) == 4242
        with pytest.raises(GuestDied, match="bad frame"):
            await asyncio.wait_for(conn.request({"op": "ping"}), 30)
        conn.close()
    finally:
        proc.kill()
        proc.wait()
