"""The sandbox API contract (DESIGN.md), on the local backend."""

import asyncio
import inspect
import os

import pytest

from rockroll.sandbox import (AsyncSandbox, Sandbox, SandboxClosed, SandboxFileError, SandboxFileNotFound, SandboxSpec,
                              SnapshotError, SpecError, open_async_sandbox, open_sandbox)


def test_stdout_stderr_exit_code_are_separate(sb):
    r = sb.run("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.timed_out and not r.truncated and r.duration_s > 0


def test_session_keeps_cwd_and_exports(sb):
    sb.run("mkdir -p /tmp/w && cd /tmp/w && export FOO=bar BAZ='a b'")
    r = sb.run('pwd; echo "$FOO|$BAZ"')
    assert r.stdout == "/tmp/w\nbar|a b\n"
    sb.run("unset FOO")
    assert sb.run('echo "[$FOO]"').stdout == "[]\n"


def test_exit_in_command_keeps_session_state(sb):
    r = sb.run("cd /tmp && export X=1 && exit 4")
    assert r.exit_code == 4
    assert sb.run("pwd; echo $X").stdout == "/tmp\n1\n"


def test_a_failing_command_reads_as_in_any_shell(sb):
    """Its message names no file of ours (the command once ran from /dev/.rr/s1/cmd), and
    its line numbers are the command's own, as `bash -c` would say them."""
    r = sb.run("echo a\nnosuchcmd --x\necho b")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "a\nb\n", "bash: line 2: nosuchcmd: command not found\n")
    r = sb.run("nosuchcmd")
    assert (r.exit_code, r.stderr) == (127, "bash: line 1: nosuchcmd: command not found\n")
    r = sb.run("echo never", cwd="/nonexistent")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == "bash: line 1: cd: /nonexistent: No such file or directory\n"
    # the command runs inside a function of the session: `declare -x` still persists
    sb.run("declare -x DECLARED=yes; cd /tmp")
    assert sb.run('echo "$DECLARED $0"; pwd').stdout == "yes bash\n/tmp\n"


def test_named_sessions_are_independent(sb):
    sb.run("cd /tmp", session="a")
    sb.run("cd /var", session="b")
    assert sb.run("pwd", session="a").stdout == "/tmp\n"
    assert sb.run("pwd", session="b").stdout == "/var\n"
    assert sb.run("pwd").stdout == "/workspace\n"
    assert set(sb.sessions()) >= {"a", "b", "default"}


def test_per_call_env_and_cwd_do_not_persist(sb):
    r = sb.run("pwd; echo $ONLY", env={"ONLY": "here"}, cwd="/tmp")
    assert r.stdout == "/tmp\nhere\n"
    assert sb.run("pwd; echo \"[$ONLY]\"").stdout == "/workspace\n[]\n"


def test_timeout_kills_process_group_not_session(sb):
    sb.run("export KEEP=yes")
    r = sb.run("sleep 100 & sleep 100; echo never", timeout=0.5)
    assert r.timed_out and r.exit_code != 0 and "never" not in r.stdout
    # the session lives on, with its state, and the killed group is gone
    r = sb.run("echo $KEEP; ps -eo args | grep -c '^sleep 100' || true")
    assert r.stdout.split() == ["yes", "0"]


async def test_closing_a_session_kills_the_command_running_in_it():
    async with await AsyncSandbox.create(SandboxSpec()) as sb:
        running = asyncio.ensure_future(sb.run("sleep 101; echo never", session="doomed", timeout=300))
        for _ in range(200):  # until the command runs
            if "sleep 101" in (await sb.run("ps -eo args")).stdout:
                break
            await asyncio.sleep(0.05)
        await sb.close_session("doomed")
        # the command leads its own process group: it dies with its session, not later
        assert "sleep 101" not in (await sb.run("ps -eo args")).stdout
        assert "doomed" not in await sb.sessions()
        outcome = (await asyncio.gather(running, return_exceptions=True))[0]
        assert not hasattr(outcome, "stdout") or "never" not in outcome.stdout


async def test_cancelling_a_run_kills_its_command_and_frees_its_session():
    async with await AsyncSandbox.create(SandboxSpec(memory_mb=128)) as sb:
        running = asyncio.ensure_future(sb.run("sleep 102 & echo $! > /tmp/bg; sleep 103", timeout=300))
        for _ in range(200):  # until both run
            if (await sb.run("ps -eo args", session="look")).stdout.count("sleep 10") == 2:
                break
            await asyncio.sleep(0.05)
        running.cancel()  # the caller stops waiting: the command's process group must die now
        for _ in range(200):
            if "sleep 10" not in (await sb.run("ps -eo args", session="look")).stdout:
                break
            await asyncio.sleep(0.05)
        assert "sleep 10" not in (await sb.run("ps -eo args", session="look")).stdout
        # its session takes the next command at once (it would wait 103 s behind a live one)
        r = await asyncio.wait_for(sb.run("echo free"), 30)
        assert r.stdout == "free\n"


def test_timeout_kills_a_pure_builtin_loop(sb):
    r = sb.run("while :; do :; done", timeout=0.5)
    assert r.timed_out
    assert sb.run("echo ok").stdout == "ok\n"


def test_output_is_capped(spec):
    with open_sandbox(SandboxSpec(max_output_bytes=10_000, timeout_s=30)) as sb:
        r = sb.run("yes | head -c 5000000; echo done >&2")
        assert r.truncated and len(r.stdout) == 10_000 and r.stderr == "done\n"
        r = sb.run("yes", timeout=1)  # endless output: bounded memory, killed at the timeout
        assert r.timed_out and r.truncated and len(r.stdout) == 10_000


def test_commands_read_no_stdin(sb):
    r = sb.run("cat; echo after", timeout=5)
    assert r.stdout == "after\n" and not r.timed_out


def test_files_round_trip(sb, tmp_path):
    sb.write_file("dir/a.txt", "hello")
    assert sb.read_file("dir/a.txt") == b"hello"
    assert sb.run("cat /workspace/dir/a.txt").stdout == "hello"
    blob = os.urandom(9 << 20)  # spans several transfer chunks
    sb.write_file("/tmp/blob", blob)
    assert sb.read_file("/tmp/blob") == blob
    sb.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.run("./run.sh").stdout == "ran\n"
    with pytest.raises(SandboxFileNotFound, match="/workspace/missing") as err:
        sb.read_file("missing")
    assert isinstance(err.value, FileNotFoundError) and err.value.sandbox_id == sb.id


def test_upload_download_files_and_dirs(sb, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("x")
    (src / "top.bin").write_bytes(os.urandom(5 << 20))
    sb.upload(src, "proj")
    assert sb.run("cat proj/sub/x.txt").stdout == "x"
    sb.upload(src / "top.bin", "single.bin")
    sb.download("single.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == (src / "top.bin").read_bytes()
    sb.download("proj", tmp_path / "proj-back")
    assert (tmp_path / "proj-back" / "sub" / "x.txt").read_text() == "x"
    with pytest.raises(SandboxFileError):
        sb.download("nope", tmp_path / "nope")


def test_close_is_idempotent_and_final(spec):
    sb = open_sandbox(spec)
    sb.close()
    sb.close()
    with pytest.raises(SandboxClosed):
        sb.run("true")


def test_reset_returns_to_image(sb):
    sb.run("echo data > /workspace/f; cd /tmp; export A=1; rm -f /etc/hosts")
    sb.reset()
    r = sb.run("ls /workspace; pwd; echo \"[$A]\"; test -f /etc/hosts && echo hosts")
    assert r.stdout == "/workspace\n[]\nhosts\n"


def _public(cls: type) -> dict[str, object]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_every_public_method_states_its_contract():
    """``help(sb.run)`` is not empty: each public method and property of both twins has a
    docstring, and the sync twin's is its async original's (written once)."""
    for cls in (AsyncSandbox, Sandbox):
        for name, attr in _public(cls).items():
            doc = (attr.__func__ if isinstance(attr, classmethod) else attr).__doc__
            assert doc and len(doc.split()) >= 5, f"{cls.__name__}.{name} has no contract"
    shared = set(_public(Sandbox)) & set(_public(AsyncSandbox))
    assert {"run", "fork", "read_file", "restore", "create", "alive"} <= shared
    for name in shared - {"id", "spec", "run_stream"}:
        assert inspect.getdoc(getattr(Sandbox, name)) == inspect.getdoc(getattr(AsyncSandbox, name)), name
    fork, read_file = (" ".join(getattr(Sandbox, n).__doc__.split()) for n in ("fork", "read_file"))
    assert "CURRENT state" in fork and "not from any snapshot taken earlier" in fork
    assert "always as ``bytes`` (also when ``write_file`` was given a ``str``" in read_file


def test_fork_copies_the_current_state_and_read_file_gives_bytes(sb):
    sb.write_file("state.txt", "at the snapshot")
    sb.snapshot()
    sb.write_file("state.txt", "now")  # a str in ...
    (child,) = sb.fork()
    with child:
        assert child.read_file("state.txt") == b"now"  # ... bytes out, of the state at fork()
        child.write_file("state.txt", "child")
        assert sb.read_file("state.txt") == b"now"  # independent after


def test_spec_validation_names_the_field():
    for kwargs, field in [({"memory_mb": 1}, "memory_mb"), ({"cpus": 0}, "cpus"), ({"pids": "x"}, "pids"),
                          ({"pids": (1 << 22) + 1}, "pids"), ({"cpus": 3.6e16}, "cpus"), ({"backend": "vm"}, "backend"),
                          ({"workdir": "rel"}, "workdir"), ({"env": {"1bad": "x"}}, "env"),
                          ({"timeout_s": -1}, "timeout_s")]:
        with pytest.raises(SpecError) as err:
            SandboxSpec(**kwargs)
        assert err.value.field == field
    with pytest.raises(SpecError) as err:
        SandboxSpec.from_dict({"image": "host", "colour": "red"})
    assert err.value.field == "colour"


def test_image_unknown_is_a_spec_error_that_lists_the_accepted_forms():
    with pytest.raises(SpecError) as err:
        open_sandbox(SandboxSpec(image="ubuntu:22.04"))
    assert err.value.field == "image"
    for form in ("host", "docker:<image>", "hub:<name>@<version>", "debian:<suite>", "image='docker:ubuntu:22.04'"):
        assert form in str(err.value), form


def test_restore_of_an_unknown_snapshot_is_a_snapshot_error_naming_it(sb):
    messages = []
    for ref, named in (("no-such-snapshot", "'no-such-snapshot'"), ("sha256:" + "ab" * 32, "sha256:" + "ab" * 32)):
        with pytest.raises(SnapshotError) as err:
            sb.restore(ref)
        assert named in str(err.value) and err.value.sandbox_id == sb.id
        messages.append(str(err.value))
    assert "sha256:<digest>" in messages[0] and "hub:<name>@<version>#<snapshot>" in messages[0]  # how to write one
    assert sb.run("echo alive").stdout == "alive\n"


async def test_async_twin_runs_many_sandboxes_on_one_loop():
    spec = SandboxSpec(memory_mb=128, timeout_s=30)
    boxes = await asyncio.gather(*(AsyncSandbox.create(spec) for _ in range(6)))
    try:
        results = await asyncio.gather(*(b.run(f"echo {i}; sleep 0.2") for i, b in enumerate(boxes)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
        # concurrent commands in different sessions of one sandbox
        a, b = await asyncio.gather(boxes[0].run("sleep 0.3; echo a", session="s1"),
                                    boxes[0].run("echo b", session="s2"))
        assert (a.stdout, b.stdout) == ("a\n", "b\n")
    finally:
        await asyncio.gather(*(b.close() for b in boxes))


async def test_async_context_manager_and_files():
    async with open_async_sandbox(SandboxSpec()) as sb:
        await sb.write_file("x", b"1")
        assert await sb.read_file("x") == b"1"
        assert await sb.exists("x") and not await sb.exists("y")
    with pytest.raises(SandboxClosed):
        await sb.run("true")


async def test_run_stream_yields_output_live_then_the_result():
    async with open_async_sandbox(SandboxSpec()) as sb:
        items = []
        async for item in sb.run_stream("echo one; sleep 0.5; echo two >&2; echo three"):
            items.append(item)
        chunks, result = items[:-1], items[-1]
        assert result.exit_code == 0 and result.stdout == "one\nthree\n" and result.stderr == "two\n"
        assert chunks[0] == ("stdout", "one\n")  # arrived before the command finished
        assert "".join(t for k, t in chunks if k == "stdout") == "one\nthree\n"
        assert ("stderr", "two\n") in chunks


async def test_close_fails_calls_in_flight():
    sb = await AsyncSandbox.create(SandboxSpec())
    pending = asyncio.ensure_future(sb.run("sleep 30"))
    await asyncio.sleep(0.3)
    await sb.close()
    with pytest.raises(SandboxClosed):
        await asyncio.wait_for(pending, 10)
