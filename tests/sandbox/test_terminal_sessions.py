"""Terminals (issue #35): a process on a pseudo-terminal inside a sandbox, driven by keys."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rockroll.sandbox import SandboxSpec, open_async_sandbox, open_sandbox
from rockroll.sandbox.errors import ExpectTimeout, SpecError, TerminalError
from rockroll.sandbox.protocol.frames import MAX_TERMINALS, PTY_WINDOW

PROMPT = r"READY\$ "


@pytest.fixture(scope="module", params=["local", "docker"])
def box(request):
    """Both backends that run our guest (docker's in the container: enter mode)."""
    kw = {"image": request.getfixturevalue("image"), "backend": "docker"} if request.param == "docker" else {}
    with open_sandbox(SandboxSpec(memory_mb=256, pids=128, timeout_s=30, **kw)) as b:
        yield b


def _shell(sb, **kw):
    t = sb.open_terminal(**kw)
    t.write("PS1='READ''Y$ '\n")  # bash's prompt, split so that its echo does not match it
    t.expect(PROMPT)
    return t


def test_terminal_runs_bash_on_a_tty_with_size_term_and_echo(box):
    with _shell(box, rows=30, cols=100) as t:
        t.write("tty; stty size; echo $TERM; echo $((6*7))\n")
        m = t.expect(PROMPT)
        assert "/dev/pts/" in m.before and "30 100" in m.before and "xterm-256color" in m.before, m.before
        assert "echo $((6*7))" in m.before and "\r\n42\r\n" in m.before  # echoed keys, then the answer
        t.resize(40, 132)  # readline redraws its prompt on the SIGWINCH
        t.write("stty size\n")
        t.expect("40 132")
        t.write("exit 3\n")
        assert t.wait(timeout=30) == 3 and t.exited


def test_ctrl_c_key_and_signal_interrupt_the_foreground_program_not_the_shell(box):
    sb = box
    with _shell(sb) as t:
        t.write("sleep 1000\n")
        _wait_running(sb, "sleep")
        t.write("\x03")  # the line discipline turns it into SIGINT for the foreground group
        t.expect(PROMPT, timeout=30)
        t.write("sleep 1001\n")
        _wait_running(sb, "sleep")
        t.signal(signal.SIGINT)
        t.expect(PROMPT, timeout=30)
        t.write("echo rc=$?\n")  # the shell lives on, and saw its job die of SIGINT
        assert "rc=130" in t.expect(PROMPT).before


def test_no_output_is_lost_between_the_open_and_the_first_read(spec):
    """Programs that print at once and exit, opened together: their first bytes and exit
    reach the host in the same reads as the opens' replies."""
    async def one(box, i):
        t = await box.open_terminal(["echo", f"first-{i}"])
        await t.expect(f"first-{i}", timeout=10)
        return await t.wait(timeout=10)

    async def hold_the_loop():  # runs once every open was sent: the guest answers meanwhile
        time.sleep(1.0)

    async def main():
        async with open_async_sandbox(spec) as box:
            results = await asyncio.gather(*(one(box, i) for i in range(4)), hold_the_loop())
            assert results == [0, 0, 0, 0, None]
    asyncio.run(main())


def test_expect_times_out_with_what_it_saw_and_fails_when_the_process_ends(sb):
    with sb.open_terminal("echo partial; sleep 1000") as t:
        with pytest.raises(ExpectTimeout) as e:
            t.expect("never", timeout=0.5)
        assert "partial" in e.value.before
    t = sb.open_terminal(["sh", "-c", "echo bye; exit 7"])
    with pytest.raises(TerminalError, match="exit code 7"):
        t.expect("never", timeout=30)
    assert t.exit_code == 7
    with pytest.raises(TerminalError):
        t.write("x")
    t.close()
    with pytest.raises(TerminalError, match="closed"):
        t.read()


def test_a_terminal_keeps_the_sandboxs_isolation(box):
    """Same namespaces, cgroup, seccomp filter and capabilities as a session's command."""
    sb = box
    probe = ("for f in mnt pid net uts ipc; do readlink /proc/self/ns/$f; done; cat /proc/self/cgroup; "
             "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status; cat /proc/self/oom_score_adj")
    expected = sb.run(probe).stdout.split()
    with sb.open_terminal(["sh", "-c", probe + "; echo END"]) as t:
        seen = t.expect("END").before.split()
    assert seen == expected and "Seccomp:" in seen and seen[-1] == "0", (seen, expected)


def test_tmux_runs_inside_a_sandbox(sb):
    """devpts, TERM and a locale are there: tmux starts, takes keys, and shows its pane."""
    with _shell(sb) as t:
        t.write("tmux -S /tmp/tm new-session -d -s work -x 80 -y 24 && tmux -S /tmp/tm send-keys -t work "
                "'echo from-tmux-$((40+2))' Enter && sleep 1 && tmux -S /tmp/tm capture-pane -p -t work\n")
        m = t.expect(PROMPT, timeout=60)
        assert "from-tmux-42" in m.before.replace("from-tmux-$((40+2))", ""), m.before
    r = sb.run("tmux -S /tmp/tm capture-pane -p -t work; tmux -S /tmp/tm kill-server")
    assert "from-tmux-42" in r.stdout, r


def _wait_running(sb, comm: str) -> None:
    deadline = time.monotonic() + 30
    while not _running(sb, comm):
        assert time.monotonic() < deadline, f"{comm} never ran"
        time.sleep(0.05)


def _running(sb, comm: str) -> int:
    """Processes named ``comm`` in the sandbox, zombies (killed, not yet reaped) aside."""
    # through /proc: the docker image has no ps
    return int(sb.run(f"for d in /proc/[0-9]*; do [ \"$(cat $d/comm 2>/dev/null)\" = {comm} ] && "
                      f"! grep -qE '^State:\\s+Z' $d/status 2>/dev/null && echo; done | wc -l").stdout)


def test_bad_arguments_and_the_terminal_limit(sb):
    with pytest.raises(SpecError, match="rows"):
        sb.open_terminal(rows=0)
    with pytest.raises(SpecError, match="env"):
        sb.open_terminal(env={"A B": "x"})
    terms = [sb.open_terminal(["sleep", "1000"]) for _ in range(MAX_TERMINALS)]
    with pytest.raises(TerminalError, match="terminals open"):
        sb.open_terminal()
    terms.pop().close()  # one closed frees its place
    terms.append(sb.open_terminal(["sleep", "1000"]))
    for t in terms:
        t.close()
    assert _running(sb, "sleep") == 0  # closing ended them


def test_idle_terminal_is_closed(sb):
    t = sb.open_terminal(["sleep", "1000"], idle_timeout=0.5)
    assert t.wait(timeout=30) is None and t.exited
    assert _running(sb, "sleep") == 0


def test_terminal_dies_with_its_sandbox_and_reset():
    with open_sandbox(SandboxSpec(timeout_s=30)) as box:
        t = box.open_terminal(["sleep", "1000"])
        box.reset()
        assert t.wait(timeout=30) is None and t.exited
        t2 = box.open_terminal(["sh", "-c", "echo $$; sleep 1000"])
        t2.expect(r"\d+")
    assert t2.wait(timeout=30) is None  # the sandbox closed: its terminal ended with it


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_yes_flood_is_bounded_by_the_window_not_host_memory(sb):
    """Nobody reads: the guest stops at the window, `yes` blocks; the host's memory (this
    process) does not grow with the time it runs."""
    t = sb.open_terminal(["yes"])
    try:
        time.sleep(1.0)
        before = _rss_kb(os.getpid())
        time.sleep(3.0)
        after = _rss_kb(os.getpid())
        # bytes held host-side for it: at most the window (and what the kernel's pty buffer had)
        queued = sum(len(c) for c in list(t.aio.queue._queue) if c)
        assert queued <= PTY_WINDOW + (1 << 16), queued
        assert after - before < 16 << 10, (before, after)  # KiB: 3 s of an unbounded flood is GBs
        # the flood still flows once read: expect consumes it (and the search buffer stays bounded)
        with pytest.raises(ExpectTimeout):
            t.expect("never", timeout=2.0)
        assert len(t.aio._pending) <= (1 << 20)
    finally:
        t.close()


def test_async_api(spec):
    async def main():
        async with open_async_sandbox(spec) as box:
            async with await box.open_terminal("read -p 'name? ' n; echo hello $n") as t:
                await t.expect(r"name\? ")
                await t.write("rock\n")
                await t.expect("hello rock")
                assert await t.wait(timeout=30) == 0
    asyncio.run(main())


def _host_pids_of(marker: str) -> list[int]:
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def test_a_client_killed_9_leaves_no_terminal_process(tmp_path):
    """The host process holding the sandbox dies without any clean-up: the terminal's
    process is gone from the host's view (pid 1 of the sandbox dies with its host)."""
    marker = "98765" + str(os.getpid())
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from rockroll.sandbox import SandboxSpec, open_sandbox
        sb = open_sandbox(SandboxSpec(timeout_s=30))
        t = sb.open_terminal(["sleep", "{marker}"])
        t.write("x")
        print("open", flush=True)
        time.sleep(1000)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        deadline = time.monotonic() + 30
        while not _host_pids_of("sleep\0" + marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _host_pids_of("sleep\0" + marker), "the terminal's process never appeared"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while _host_pids_of("sleep\0" + marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _host_pids_of("sleep\0" + marker)
