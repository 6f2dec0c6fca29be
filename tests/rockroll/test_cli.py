"""The `rockroll` command line, run as a user would: a real subprocess."""

import json
import os
import subprocess
import sys

CLI = [sys.executable, "-m", "rockroll.cli"]


def rr(*args, input=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, input=input, env=os.environ, timeout=120)


def test_help_explains_every_command():
    out = rr("--help")
    assert out.returncode == 0 and "sandbox" in out.stdout
    for sub in ("run", "shell", "ls", "gc"):
        h = rr("sandbox", sub, "--help")
        assert h.returncode == 0 and len(h.stdout.splitlines()) > 3, sub


def test_sandbox_run_prints_streams_and_exits_with_the_code():
    out = rr("sandbox", "run", "--", "echo to-out; echo to-err >&2; exit 3")
    assert (out.returncode, out.stdout, out.stderr) == (3, "to-out\n", "to-err\n")


def test_sandbox_run_timeout_and_bad_option():
    out = rr("sandbox", "run", "--timeout", "0.5", "--", "sleep 30")
    assert out.returncode != 0 and "timed out" in out.stderr
    bad = rr("sandbox", "run", "--memory-mb", "1", "--", "true")
    assert bad.returncode == 2 and "memory" in bad.stderr


def test_sandbox_shell_keeps_state_between_lines():
    out = rr("sandbox", "shell", input="cd /tmp\nexport X=42\npwd\necho $X\nexit\n")
    assert out.returncode == 0
    assert "/tmp\n" in out.stdout and "42\n" in out.stdout


def test_sandbox_shell_on_a_terminal_attaches_the_sandboxs_own_terminal():
    """Run from a terminal (a pty of ours, 33x97), the shell is the sandbox's terminal:
    its size, Ctrl-C to a running program, a resize (SIGWINCH), the exit code."""
    import fcntl
    import select
    import struct
    import termios
    import time

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 97, 0, 0))
    proc = subprocess.Popen([*CLI, "sandbox", "shell"], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, env=os.environ,
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    seen = b""

    def wait_for(text: bytes, timeout: float = 60.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text not in seen:
            assert select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0], seen[-2000:]
            try:
                seen += os.read(master, 65536)
            except OSError:  # EIO: the CLI exited
                break
        assert text in seen, seen[-2000:]
        seen = seen[seen.index(text) + len(text):]

    try:
        wait_for(b"'exit' to leave")
        wait_for(b"/workspace# ")  # bash's readline is up: keys typed before it may be flushed
        os.write(master, b"stty size; echo $((6*7))-$TERM\r")
        wait_for(b"33 97")
        wait_for(b"42-xterm-256color")
        os.write(master, b"sleep 1000\r")
        time.sleep(1.0)
        os.write(master, b"\x03")  # raw here: the byte goes through, the sandbox's terminal makes it SIGINT
        os.write(master, b"echo rc=$?\r")
        wait_for(b"rc=130")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # SIGWINCH to the CLI
        time.sleep(0.5)
        os.write(master, b"stty size\r")
        wait_for(b"40 120")
        os.write(master, b"exit 4\r")
        assert proc.wait(timeout=60) == 4
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


OWNER = """
import os, sys
from rockroll.sandbox import open_sandbox
from rockroll.sandbox.deployment.reaper import current_run
sb = open_sandbox()
print(current_run().run_id, sb.id, os.getpid(), flush=True)
if sys.argv[1] == "die":
    os._exit(0)  # no cleanup: a dead run is left behind
for line in sys.stdin:
    try:
        print(sb.run(line).stdout.strip(), flush=True)
    except Exception as e:
        print(type(e).__name__, flush=True)
"""


def test_sandbox_ls_and_gc(tmp_path):
    env = dict(os.environ, ROCKROLL_HOME=str(tmp_path / "home"))  # exactly the runs made here
    cli = lambda *args: subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)  # noqa: E731
    live = subprocess.Popen([sys.executable, "-c", OWNER, "live"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        live_run, live_sb, live_pid = live.stdout.readline().split()
        dead = subprocess.run([sys.executable, "-c", OWNER, "die"], capture_output=True, text=True, env=env, timeout=120)
        dead_run, dead_sb, dead_pid = dead.stdout.split()
        listed = json.loads(cli("sandbox", "ls", "--json").stdout)
        assert sorted((r["run_id"], r["pid"], r["alive"], r["sandboxes"]) for r in listed) == sorted(
            [(live_run, int(live_pid), True, [live_sb]), (dead_run, int(dead_pid), False, [dead_sb])])
        table = cli("sandbox", "ls").stdout.splitlines()
        assert any(line.split()[:3] == [live_run, live_pid, "alive"] and live_sb in line for line in table)
        assert any(line.split()[:3] == [dead_run, dead_pid, "dead"] and dead_sb in line for line in table)
        # gc collects the dead run, and only it: the live owner's sandbox still answers
        gc = cli("sandbox", "gc")
        assert (gc.returncode, gc.stdout) == (0, f"reaped 1 run(s): {dead_run}; removed 0 temp file(s), 0 B\n")
        assert [r["run_id"] for r in json.loads(cli("sandbox", "ls", "--json").stdout)] == [live_run]
        live.stdin.write("echo still-here\n")
        live.stdin.flush()
        assert live.stdout.readline() == "still-here\n"
        # gc --all collects the live run too: its sandbox is gone from under its owner
        gc = cli("sandbox", "gc", "--all")
        assert (gc.returncode, gc.stdout) == (0, f"reaped 1 run(s): {live_run}; removed 0 temp file(s), 0 B\n")
        assert json.loads(cli("sandbox", "ls", "--json").stdout) == []
        assert cli("sandbox", "ls").stdout == "no sandboxes\n"
        live.stdin.write("echo gone\n")
        live.stdin.flush()
        assert live.stdout.readline() != "gone\n"
    finally:
        live.kill()
        live.wait()


def test_bench_group_lists_and_refuses_unknown_names():
    out = rr("bench", "list")
    assert out.returncode == 0
    listed = {line.split()[0] for line in out.stdout.splitlines()}
    assert listed == {"cluster", "envs", "generation", "gpu", "hub", "lora", "modelservice", "network", "rollout", "sandbox",
                      "runtimes", "terminal", "trl_grpo"}
    bad = rr("bench", "run", "nope")
    assert bad.returncode == 2 and "no benchmark 'nope'" in bad.stderr and "rollout" in bad.stderr
    private = rr("bench", "run", "_common")
    assert private.returncode == 2


def _train_config(tmp_path, **over) -> str:
    import yaml

    data = {"steps": 1, "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
            "tokenizer": {"build_dir": str(tmp_path / "tok")}, "envs": [{"id": "rock/FrozenLake-v0"}],
            "logging": {"dir": str(tmp_path / "run"), "progress": False}, **over}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_train_names_an_unknown_env_id_the_hubs_searched_and_the_namespace(tmp_path):
    """Issue #36: an id that is nowhere fails when the config loads, in one line that names
    the id, every hub searched, how to add one, and the rock/ namespace it lacks."""
    hub = tmp_path / "team-hub"
    out = rr("train", _train_config(tmp_path, envs=[{"id": "FrozenLake-v0"}], hubs=[str(hub)]))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("error: ") and "envs[0].id: env id 'FrozenLake-v0' is not registered" in line
    assert f"file://{hub}" in line and "$ROCKROLL_HUB" in line and "hubs: [URL]" in line
    assert "Did you mean 'rock/FrozenLake-v0'?" in line
    assert not (tmp_path / "tok").exists()  # nothing was built


def test_an_error_deep_in_a_command_is_one_line_unless_debug(tmp_path):
    """Issue #36: an error raised while a run is set up (here the tokenizer refusing an allowed
    token) comes as one `error:` line with what to do, not a traceback; --debug shows it."""
    config = _train_config(tmp_path, generation={"max_new_tokens": 1, "allowed_tokens": ["Up Down"]})
    out = rr("train", config)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines() == [
        "error: generation.allowed_tokens: 'Up Down' is not one token of the tokenizer"
        + out.stderr.split("tokenizer", 1)[1].splitlines()[0],
        "(rockroll --debug ... or ROCKROLL_DEBUG=1 shows the traceback)"]
    assert "tokenizer.add_tokens" in out.stderr
    debug = rr("--debug", "train", config)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert "ConfigError: generation.allowed_tokens" in debug.stderr
