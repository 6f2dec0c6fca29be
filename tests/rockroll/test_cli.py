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


def test_sandbox_ls_and_gc():
    out = rr("sandbox", "ls", "--json")
    assert out.returncode == 0 and isinstance(json.loads(out.stdout), list)
    gc = rr("sandbox", "gc")
    assert gc.returncode == 0 and gc.stdout.startswith("reaped")


def test_bench_group_lists_and_refuses_unknown_names():
    out = rr("bench", "list")
    assert out.returncode == 0
    assert {line.split()[0] for line in out.stdout.splitlines()} == {"envs", "hub", "rollout", "sandbox"}
    bad = rr("bench", "run", "nope")
    assert bad.returncode == 2 and "no benchmark 'nope'" in bad.stderr and "rollout" in bad.stderr
    private = rr("bench", "run", "_common")
    assert private.returncode == 2
