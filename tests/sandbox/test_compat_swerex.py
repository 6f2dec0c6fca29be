"""SWE-ReX's unmodified ``RemoteRuntime`` (the ``swe-rex`` package) driving a real
``rockroll serve`` on 127.0.0.1 at ``/swerex/<sandbox id>``: sessions with SWE-ReX's
semantics and exception types, execute, files, upload of a file and of a directory,
errors for bad input, and 32 concurrent clients."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging

import httpx
import pytest
from swerex import exceptions as rex
from swerex.deployment.remote import RemoteDeployment
from swerex.runtime.abstract import (BashAction, BashInterruptAction, CloseBashSessionRequest, Command,
                                     CreateBashSessionRequest, ReadFileRequest, UploadRequest, WriteFileRequest)
from swerex.runtime.remote import RemoteRuntime

from _server import Server, server_fixtures

logging.getLogger("rex-runtime").setLevel(logging.CRITICAL)  # it logs every transferred error


server, sid = server_fixtures(64)


def runtime(server, sid, token=None) -> RemoteRuntime:
    return RemoteRuntime(host=f"{server.url}/swerex/{sid}", auth_token=token or server.token, timeout=30)


async def test_is_alive_needs_the_token_and_a_sandbox(server, sid):
    assert (await runtime(server, sid).is_alive()).is_alive
    wrong = await runtime(server, sid, token="wrong-token").is_alive()
    assert not wrong.is_alive and "Status code 401" in wrong.message
    missing = await runtime(server, "sb-nope").is_alive()
    assert not missing.is_alive and "Status code 404" in missing.message and "no such sandbox" in missing.message
    with pytest.raises(Exception, match="401"):  # every route, not only is_alive
        await runtime(server, sid, token="wrong-token").execute(Command(command="true"))


async def test_session_keeps_state_and_merges_output_in_order(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    obs = await rt.run_in_session(BashAction(command="echo a; echo b >&2; echo c\ncd /tmp\nexport RR_X=42"))
    assert (obs.output, obs.exit_code, obs.expect_string) == ("a\nb\nc\n", 0, "SHELLPS1PREFIX")
    obs = await rt.run_in_session(BashAction(command="pwd; echo $RR_X"))
    assert obs.output == "/tmp\n42\n"
    # a second session is a shell of its own
    await rt.create_session(CreateBashSessionRequest(session="other"))
    obs = await rt.run_in_session(BashAction(command="pwd; echo x${RR_X}x", session="other"))
    assert obs.output == "/workspace\nxx\n"


async def test_check_modes_and_the_exceptions_swerex_raises(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    with pytest.raises(rex.NonZeroExitCodeError, match="exit code 3"):
        await rt.run_in_session(BashAction(command="echo out; exit 3"))
    with pytest.raises(rex.NonZeroExitCodeError, match="^mine: "):
        await rt.run_in_session(BashAction(command="false", error_msg="mine"))
    assert (await rt.run_in_session(BashAction(command="exit 3", check="silent"))).exit_code == 3
    assert (await rt.run_in_session(BashAction(command="exit 3", check="ignore"))).exit_code is None
    # a syntax error is caught before anything runs: the first half never wrote its file
    with pytest.raises(rex.BashIncorrectSyntaxError, match="syntax error"):
        await rt.run_in_session(BashAction(command="touch /workspace/ran; if then fi"))
    assert (await rt.run_in_session(BashAction(command="test -e /workspace/ran", check="silent"))).exit_code == 1
    with pytest.raises(rex.SessionExistsError):
        await rt.create_session(CreateBashSessionRequest())
    with pytest.raises(rex.SessionDoesNotExistError):
        await rt.run_in_session(BashAction(command="true", session="never-made"))
    with pytest.raises(rex.SessionDoesNotExistError):  # interactive ones too (test_terminal_service.py)
        await rt.run_in_session(BashAction(command="python3", is_interactive_command=True, session="never-made"))
    await rt.close_session(CloseBashSessionRequest())
    with pytest.raises(rex.SessionDoesNotExistError):
        await rt.run_in_session(BashAction(command="true"))
    with pytest.raises(rex.SessionDoesNotExistError):
        await rt.close_session(CloseBashSessionRequest())


async def test_timeout_kills_the_command_not_the_session(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(BashAction(command="cd /tmp"))
    with pytest.raises(rex.CommandTimeoutError, match="timeout after 0.5 seconds"):
        await rt.run_in_session(BashAction(command="sh -c 'echo $$ > /tmp/pid; exec sleep 30'", timeout=0.5))
    # SWE-agent interrupts after a timeout; the session answers, the sleeper is gone, cwd kept
    assert (await rt.run_in_session(BashInterruptAction())).exit_code == 0
    obs = await rt.run_in_session(BashAction(command="pwd; kill -0 $(cat /tmp/pid) 2>/dev/null || echo gone"))
    assert obs.output == "/tmp\ngone\n"


async def test_huge_output_is_capped_and_says_so(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    obs = await rt.run_in_session(BashAction(command="head -c 5000000 /dev/zero | tr '\\0' a; echo end >&2"))
    cap = 1 << 20  # SandboxSpec.max_output_bytes
    assert len(obs.output) == cap and set(obs.output) == {"a"}
    assert "truncated" in obs.failure_reason and str(cap) in obs.failure_reason
    assert (await rt.run_in_session(BashAction(command="echo still"))).output == "still\n"


async def test_execute_runs_outside_sessions(server, sid):
    rt = runtime(server, sid)
    r = await rt.execute(Command(command=["printf", "%s|", "a b", "$HOME", "'q'"]))
    assert (r.stdout, r.exit_code) == ("a b|$HOME|'q'|", 0)
    r = await rt.execute(Command(command="cd /; pwd; echo err >&2; exit 4", shell=True))
    assert (r.stdout, r.stderr, r.exit_code) == ("/\n", "err\n", 4)
    r = await rt.execute(Command(command="pwd", shell=True))  # the cd above stayed in its subshell
    assert r.stdout == "/workspace\n"
    r = await rt.execute(Command(command="echo $A; pwd; echo e >&2", shell=True, env={"A": "1"}, cwd="/tmp",
                                 merge_output_streams=True))
    assert (r.stdout, r.stderr) == ("1\n/tmp\ne\n", "")
    with pytest.raises(rex.NonZeroExitCodeError, match="exit code 1"):
        await rt.execute(Command(command="false", shell=True, check=True))
    with pytest.raises(rex.CommandTimeoutError):
        await rt.execute(Command(command="sleep 30", shell=True, timeout=0.5))
    with pytest.raises(ValueError, match="env"):
        await rt.execute(Command(command="true", env={"not a name": "x"}))


async def test_files_read_write_and_upload(server, sid, tmp_path):
    rt = runtime(server, sid)
    text = "héllo\nwörld\n" * 1000
    await rt.write_file(WriteFileRequest(path="/workspace/deep/er/f.txt", content=text))
    assert (await rt.read_file(ReadFileRequest(path="deep/er/f.txt"))).content == text
    latin = await rt.read_file(ReadFileRequest(path="deep/er/f.txt", encoding="latin-1"))
    assert latin.content == text.encode().decode("latin-1")
    with pytest.raises(FileNotFoundError):
        await rt.read_file(ReadFileRequest(path="/workspace/missing"))
    with pytest.raises(IsADirectoryError):
        await rt.read_file(ReadFileRequest(path="/workspace/deep"))
    with pytest.raises(ValueError, match="encoding"):
        await rt.read_file(ReadFileRequest(path="deep/er/f.txt", encoding="no-such-codec"))

    one = tmp_path / "one.bin"
    one.write_bytes(bytes(range(256)) * 4000)
    await rt.upload(UploadRequest(source_path=str(one), target_path="/workspace/up/one.bin"))
    tree = tmp_path / "tree"
    (tree / "sub" / "empty").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("deep")
    (tree / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "run.sh").chmod(0o755)
    await rt.upload(UploadRequest(source_path=str(tree), target_path="/workspace/tree"))
    r = await rt.execute(Command(command="sha256sum < up/one.bin; cat tree/sub/f.txt; ./tree/run.sh; "
                                         "test -d tree/sub/empty && echo dir", shell=True))
    assert r.stdout.split("\n") == [f"{hashlib.sha256(one.read_bytes()).hexdigest()}  -", "deepran", "dir", ""]


async def test_bad_input_is_refused_in_swerex_shapes(server, sid):
    # what the client's own models cannot send: straight to the routes
    http = httpx.AsyncClient(base_url=f"{server.url}/swerex/{sid}", headers={"X-API-Key": server.token})
    async with http:
        r = await http.post("/run_in_session", json={"action_type": "bash"})
        assert r.status_code == 511
        exc = r.json()["swerexception"]
        assert exc["class_path"] == "builtins.ValueError" and "command: Field required" in exc["message"]
        r = await http.post("/run_in_session", json={"command": "true", "check": "sometimes", "action_type": "bash"})
        assert r.status_code == 511 and "check: Input should be" in r.json()["swerexception"]["message"]
        r = await http.post("/read_file", json={"path": ""})
        assert r.status_code == 511 and r.json()["swerexception"]["message"].startswith("path:")
        r = await http.post("/upload", files={"file": ("x.zip", b"not a zip")},
                            data={"target_path": "/workspace/z", "unzip": "true"})
        assert r.status_code == 511 and "not a zip" in r.json()["swerexception"]["message"]


async def test_remote_deployment_stop_closes_its_sessions_not_the_sandbox(server, sid):
    deployment = RemoteDeployment(host=f"{server.url}/swerex/{sid}", auth_token=server.token)
    await deployment.start()
    await deployment.runtime.create_session(CreateBashSessionRequest(session="s1"))
    await deployment.stop()
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest(session="s1"))  # closed, so makeable again
    assert server.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "alive"


async def test_32_concurrent_clients(server):
    sids = [server.create(pids=128) for _ in range(8)]
    try:
        async def client(i: int) -> tuple[str, str]:
            rt = runtime(server, sids[i % len(sids)])
            name = f"s{i}"
            await rt.create_session(CreateBashSessionRequest(session=name))
            await rt.run_in_session(BashAction(command=f"export MINE={i}; mkdir -p /tmp/{i}; cd /tmp/{i}",
                                               session=name))
            for _ in range(3):
                await rt.run_in_session(BashAction(command="sleep 0.0$RANDOM", session=name, check="silent"))
            obs = await rt.run_in_session(BashAction(command="echo $MINE $((MINE*MINE)); pwd", session=name))
            await rt.close_session(CloseBashSessionRequest(session=name))
            return obs.output, f"{i} {i * i}\n/tmp/{i}\n"

        results = await asyncio.gather(*(client(i) for i in range(32)))
        assert all(got == want for got, want in results), [r for r in results if r[0] != r[1]]
    finally:
        for s in sids:
            server.http.delete(f"/v1/sandboxes/{s}")


# --------------------------------------------------------------------------- a SWE-agent-style loop
@pytest.mark.timeout(900)
async def test_swe_task_repaired_through_swerex_is_graded_resolved(swe_hub, monkeypatch):
    """SWE-agent's way in: ``swerex.deployment`` at the service, holding a ``rock/SWE-v0``
    task's sandbox (the env on the remote backend); the gold patch goes in through SWE-ReX's
    runtime, and the task's own grader gives reward 1 (a null submission gets 0)."""
    from rockroll.gem.swe import SWEEnv, hub_swe_tasks
    from rockroll.sandbox.deployment.reaper import current_run
    from rockroll.sandbox.runtime import remote
    from rockroll.sandbox.storage.snapshots import SnapshotStore

    monkeypatch.setenv("ROCKROLL_HUB", swe_hub)  # the service finds the task's image there too
    task = hub_swe_tasks(swe_hub)[0]
    # the buggy state, resolved from the hub into the store this machine's service reads
    snap = await asyncio.to_thread(SnapshotStore(current_run().home).load, task.snapshot)
    srv = Server("--max-sandboxes", "8")
    try:
        monkeypatch.setattr(remote, "_configured", None)  # restored after the test
        remote.configure(srv.url, srv.token)
        env = SWEEnv(tasks=[dataclasses.replace(task, backend="remote", snapshot=snap.digest)], pool_size=1)
        try:
            for patch, want in (("", 0.0), (task.patch, 1.0)):
                obs, info = await asyncio.to_thread(env.reset, options={"task_id": task.id})
                assert "infra_error" not in info, info
                deployment = RemoteDeployment(host=f"{srv.url}/swerex/{env.sandbox.id}", auth_token=srv.token)
                await deployment.start()
                rt = deployment.runtime
                await rt.create_session(CreateBashSessionRequest())
                obs = await rt.run_in_session(BashAction(command=f"cd {task.workdir} && git status --short"))
                assert obs.output == ""  # the buggy commit, untouched
                if patch:
                    await rt.write_file(WriteFileRequest(path="/tmp/fix.diff", content=patch))
                    await rt.run_in_session(BashAction(command="git apply /tmp/fix.diff"))
                    assert (await rt.run_in_session(BashAction(command="git status --short"))).output.strip()
                await deployment.stop()
                _, reward, terminated, _, info = await asyncio.to_thread(env.step, "<submit/>")
                assert (reward, terminated) == (want, True), info
        finally:
            await asyncio.to_thread(env.close)
    finally:
        srv.stop()


async def test_a_zip_bomb_upload_stops_at_the_layer_limit(tmp_path):
    srv = Server("--max-layer-bytes", "1M")
    try:
        sid = srv.create()
        bomb = tmp_path / "bomb"
        bomb.mkdir()
        (bomb / "zeros").write_bytes(bytes(8 << 20))  # 8 MiB that deflate to a few KiB
        rt = RemoteRuntime(host=f"{srv.url}/swerex/{sid}", auth_token=srv.token, timeout=30)
        with pytest.raises(rex.SwerexException, match="StorageLimitError.*max_layer_bytes"):
            await rt.upload(UploadRequest(source_path=str(bomb), target_path="/workspace/bomb"))
        r = await rt.execute(Command(command="ls -A /workspace", shell=True))
        assert r.stdout == ""  # nothing of it landed
    finally:
        srv.stop()
