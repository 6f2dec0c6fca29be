"""The remote backend (SDK over a real ``rockroll serve`` on 127.0.0.1) behaves like a local sandbox."""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
from pathlib import Path

import pytest

from rockroll.sandbox import (GuestDied, AsyncSandbox, SandboxClosed, SandboxError, SandboxFileError,
                              SandboxFileNotFound, SandboxNotFound, SandboxSpec, SpecError, open_async_sandbox,
                              open_sandbox)
from rockroll.sandbox.runtime import remote
from rockroll.sandbox.runtime.remote import AuthError, RemoteSandbox

from _model import CALL, WhoAmI, assert_served, host_call
from _server import Server, sdk_service

SPEC = SandboxSpec(backend="remote", memory_mb=256, pids=128, timeout_s=30)


@pytest.fixture(scope="module")
def server():
    # test_model_endpoint_with_the_drivers_token checks that the driver's token is the one used
    with sdk_service() as srv:
        yield srv


@pytest.fixture
def rsb(server):
    with open_sandbox(SPEC) as box:
        yield box


def test_same_methods_and_signatures_as_local():
    public = [n for n, f in inspect.getmembers(AsyncSandbox) if not n.startswith("_") and callable(f)]
    for name in public:
        local, ours = inspect.signature(getattr(AsyncSandbox, name)), inspect.signature(getattr(RemoteSandbox, name))
        if name == "create":  # the SDK adds url/token keywords
            assert list(local.parameters) == list(ours.parameters)[:len(local.parameters)]
        else:  # return annotations name each class itself
            assert local.parameters == ours.parameters, name
    for prop in ("alive",):
        assert isinstance(getattr(RemoteSandbox, prop), property)


def test_dispatch_and_sync_wrapper(rsb, server):
    assert isinstance(rsb.aio, RemoteSandbox) and rsb.alive and rsb.id.startswith("sb-")
    assert rsb.spec.backend == "remote"
    listed = server.http.get(f"/v1/sandboxes/{rsb.id}").json()
    assert listed["spec"]["backend"] == "local"  # the service ran it on its own backend


def test_stdout_stderr_exit_code_are_separate(rsb):
    r = rsb.run("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.timed_out and not r.truncated and r.duration_s > 0


def test_sessions_persist_and_are_independent(rsb):
    rsb.run("mkdir -p /tmp/w && cd /tmp/w && export FOO='a b'")
    assert rsb.run('pwd; echo "$FOO"').stdout == "/tmp/w\na b\n"
    rsb.run("cd /var", session="other")
    assert rsb.run("pwd", session="other").stdout == "/var\n"
    assert set(rsb.sessions()) >= {"default", "other"}
    rsb.close_session("other")
    assert "other" not in rsb.sessions()
    r = rsb.run("pwd; echo $ONLY", env={"ONLY": "here"}, cwd="/tmp")
    assert r.stdout == "/tmp\nhere\n"


def test_timeout_kills_command_not_session(rsb):
    rsb.run("export KEEP=yes")
    r = rsb.run("sleep 100; echo never", timeout=0.5)
    assert r.timed_out and "never" not in r.stdout
    assert rsb.run("echo $KEEP").stdout == "yes\n"


def test_files_round_trip_including_10mb(rsb, tmp_path):
    rsb.write_file("dir/a.txt", "hello")
    assert rsb.read_file("dir/a.txt") == b"hello" and rsb.exists("dir/a.txt") and not rsb.exists("nope")
    assert rsb.run("cat /workspace/dir/a.txt").stdout == "hello"
    blob = os.urandom(10 << 20)  # several transfer chunks, streamed both ways
    rsb.write_file("/tmp/blob", blob)
    assert rsb.run("stat -c %s /tmp/blob").stdout.strip() == str(len(blob))
    assert rsb.read_file("/tmp/blob") == blob
    rsb.write_file("empty", b"")
    assert rsb.read_file("empty") == b""
    with pytest.raises(SandboxFileNotFound, match="no such file: does/not/exist"):  # the service's 404
        rsb.read_file("does/not/exist")


def test_upload_download_file_and_dir(rsb, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("x")
    big = os.urandom(10 << 20)
    (src / "big.bin").write_bytes(big)
    os.chmod(src / "big.bin", 0o750)
    rsb.upload(src / "big.bin", "/tmp/big.bin")
    assert rsb.run("stat -c %a /tmp/big.bin").stdout == "750\n"
    rsb.upload(src, "proj")
    assert rsb.run("cat proj/sub/x.txt").stdout == "x"
    rsb.download("/tmp/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big
    rsb.download("proj", tmp_path / "proj")
    assert (tmp_path / "proj" / "sub" / "x.txt").read_text() == "x"
    assert (tmp_path / "proj" / "big.bin").read_bytes() == big
    with pytest.raises(SandboxFileError):
        rsb.download("missing", tmp_path / "m")
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.*"))


def test_snapshot_restore_fork_reset(rsb):
    rsb.run("echo 1 > /workspace/f && cd /tmp && export S=saved")
    snap = rsb.snapshot()
    assert snap.digest.startswith("sha256:") and snap.size > 0
    rsb.run("echo 2 > /workspace/f; cd /; export S=changed")
    rsb.restore(snap)
    assert rsb.run("cat /workspace/f; pwd; echo $S").stdout == "1\n/tmp\nsaved\n"
    kids = rsb.fork(2)
    try:
        assert len({k.id for k in kids} | {rsb.id}) == 3
        kids[0].run("echo kid > /workspace/f")
        assert kids[1].read_file("/workspace/f") == b"1\n" and rsb.read_file("/workspace/f") == b"1\n"
    finally:
        for k in kids:
            k.close()
    with open_sandbox(SPEC, snapshot=snap) as again:  # create from a snapshot digest
        assert again.read_file("/workspace/f") == b"1\n"
    rsb.reset()
    assert not rsb.exists("/workspace/f") and rsb.run("pwd").stdout == "/workspace\n"


def test_run_stream_yields_chunks_then_result(rsb):
    items = list(rsb.run_stream("for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done; exit 2"))
    result = items[-1]
    chunks = items[:-1]
    assert result.exit_code == 2 and result.stdout == "o1\no2\no3\n" and result.stderr == "e1\ne2\ne3\n"
    assert "".join(t for k, t in chunks if k == "stdout") == "o1\no2\no3\n"
    assert sum(k == "stdout" for k, _ in chunks) >= 2  # arrived as it was produced, not at the end


async def test_async_api(server):
    async with open_async_sandbox(SPEC) as sb:
        assert isinstance(sb, RemoteSandbox)
        assert (await sb.run("echo hi")).stdout == "hi\n"
        items = [i async for i in sb.run_stream("echo a; echo b >&2")]
        assert items[-1].stdout == "a\n" and ("stderr", "b\n") in items
        assert await sb.ping()
    assert not sb.alive and not await sb.ping()


def test_errors_map_to_local_classes(server, tmp_path):
    ghost = RemoteSandbox(SPEC, "sb-0000000000", remote.endpoint())
    with pytest.raises(SandboxNotFound) as err:
        remote_call(ghost.run("true"))
    assert err.value.sandbox_id == "sb-0000000000"
    sb = open_sandbox(SPEC)
    sb.close()
    sb.close()  # idempotent
    with pytest.raises(SandboxClosed):
        sb.run("true")
    with pytest.raises(SpecError) as err:  # valid locally, refused by the service's backend
        open_sandbox(SandboxSpec(backend="remote", image="no-such-image"))
    assert err.value.field == "image"


def test_agent_death_is_agent_died_and_reset_recovers(rsb, server):
    pids = server.guests(rsb.id)
    os.kill(pids["init_pid"], signal.SIGKILL)
    with pytest.raises(GuestDied) as err:
        for _ in range(50):
            rsb.run("true")
    assert err.value.sandbox_id == rsb.id and not rsb.alive and not rsb.ping()
    rsb.reset()
    assert rsb.alive and rsb.run("echo back").stdout == "back\n"


def test_wrong_token_is_a_typed_auth_error(server):
    with pytest.raises(AuthError) as err:
        remote_call(RemoteSandbox.create(SPEC, url=server.url, token="wrong"))
    assert isinstance(err.value, SandboxError) and "token" in str(err.value)


def test_an_unreachable_service_says_how_to_point_the_sdk_at_one(monkeypatch):
    """Nothing listens where the SDK points: a ``ServiceUnreachable`` (still a ``SandboxLost``
    for code that handles lost hosts) that names the URL, where it came from and the fix."""
    from _server import free_port
    from rockroll.sandbox import SandboxLost, ServiceUnreachable

    nowhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.delenv("ROCKROLL_URL", raising=False)
    monkeypatch.setattr(remote, "DEFAULT_URL", nowhere)  # the default port may be taken on a shared host
    before = remote._configured
    remote.configure(None)
    try:
        cases = {"the default": lambda: open_sandbox(SandboxSpec(backend="remote"))}
        cases["$ROCKROLL_URL"] = lambda: (monkeypatch.setenv("ROCKROLL_URL", nowhere),
                                          open_sandbox(SandboxSpec(backend="remote")))
        cases["configure()"] = lambda: (remote.configure(nowhere, "x"), open_sandbox(SandboxSpec(backend="remote")))
        cases["url="] = lambda: remote_call(RemoteSandbox.create(SPEC, url=nowhere, token="x"))
        for source, call in cases.items():
            with pytest.raises(ServiceUnreachable) as err:
                call()
            message = str(err.value)
            assert isinstance(err.value, SandboxLost) and err.value.sandbox_id is None
            assert nowhere in message and f"({source}" in message, message
            assert "ROCKROLL_URL" in message and "configure(url, token)" in message and "rockroll serve" in message
            assert "lost" not in message.lower()
    finally:
        remote._configured = before


def remote_call(coro):
    from rockroll.sandbox.sync import run_sync

    return run_sync(coro)


def test_model_endpoint_with_the_drivers_token(server, monkeypatch):
    """``model_endpoint`` travels in the spec, the admin token in a header of the create call
    (the service's own environment has none): the service's host relays the sandbox's
    calls, issues and revokes its key, and its forks' keys, with the driver's token."""
    from rockroll.sandbox.modelservice import ModelService
    from rockroll.sandbox.protocol.tokens import TOKEN_ENV

    assert TOKEN_ENV.encode() not in Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    with ModelService(WhoAmI()) as svc:
        monkeypatch.setenv(TOKEN_ENV, svc.token)
        with open_sandbox(dataclasses.replace(SPEC, model_endpoint=svc.url)) as sb:
            key = assert_served(sb, svc)
            assert svc.token not in server.http.get(f"/v1/sandboxes/{sb.id}").text  # never in the spec
            monkeypatch.delenv(TOKEN_ENV)  # the fork's key comes from the token the parent was opened with
            kid = sb.fork(1)[0]
            assert kid.run(CALL).stdout == f"{kid.id}#0\n"
            kid_key = kid.run("printf %s $OPENAI_API_KEY").stdout
            assert host_call(svc, kid_key) == 200
            kid.close()
            assert host_call(svc, kid_key) == 401
            assert host_call(svc, key) == 200
        assert host_call(svc, key) == 401  # closed through the service: revoked


def test_model_endpoint_with_the_services_token(monkeypatch):
    """A driver without the token: the service's own ``$ROCKROLL_MODEL_TOKEN`` serves."""
    from rockroll.sandbox.modelservice import ModelService
    from rockroll.sandbox.protocol.tokens import TOKEN_ENV

    with ModelService(WhoAmI()) as svc:
        monkeypatch.setenv(TOKEN_ENV, svc.token)
        srv, before = Server(), remote._configured  # a service started with the token in its environment
        monkeypatch.delenv(TOKEN_ENV)
        remote.configure(srv.url, srv.token)
        try:
            with open_sandbox(dataclasses.replace(SPEC, model_endpoint=svc.url)) as sb:
                key = assert_served(sb, svc)
            assert host_call(svc, key) == 401
        finally:
            remote._configured = before
            srv.stop()
