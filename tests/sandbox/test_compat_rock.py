"""ROCK's unmodified SDK (``rl-rock``: ``rock.sdk.sandbox.client.Sandbox``) driving a real
``rockroll serve`` on 127.0.0.1 through ``/apis/envs/sandbox/v1``: start (its spec fields
mapped, what cannot be honoured refused), ``arun`` in normal and nohup modes, sessions,
timeouts, huge output, files, stop, auth, and 32 concurrent clients."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import pytest
from rock.actions import (Command, CreateBashSessionRequest, ReadFileRequest, UploadRequest,
                          WriteFileRequest)
from rock.sdk.common.exceptions import BadRequestRockError, InternalServerRockError
from rock.sdk.sandbox.client import Sandbox
from rock.sdk.sandbox.config import SandboxConfig

from _server import Server, rock_and_swerex_share_a_sandbox

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK warns about itself


@pytest.fixture(scope="module")
def server():
    srv = Server("--max-sandboxes", "64")
    yield srv
    srv.stop()


def config(server, **fields) -> SandboxConfig:
    fields = {"image": "host", "memory": "256m", "cpus": 1, "disk": "512m", **fields}
    return SandboxConfig(base_url=server.url, extra_headers={"Authorization": f"Bearer {server.token}"}, **fields)


@pytest.fixture
async def sandbox(server):
    sb = Sandbox(config(server))
    await sb.start()
    yield sb
    await sb.stop()


def spec_of(server, sandbox_id: str) -> dict:
    return server.http.get(f"/v1/sandboxes/{sandbox_id}").json()["spec"]


async def test_start_maps_rock_fields_and_keeps_isolation_on(server):
    sb = Sandbox(config(server, memory="300m", cpus=0.5, limit_cpus=0.75, disk="1g", auto_clear_seconds=600))
    await sb.start()
    try:
        spec = spec_of(server, sb.sandbox_id)
        assert (spec["memory_mb"], spec["cpus"], spec["disk_mb"], spec["ttl_s"]) == (300, 0.75, 1024, 600.0)
        assert spec["network"] is False
        status = await sb.get_status()
        assert status.is_alive and status.memory == "300m" and status.image == "host"
        other = Sandbox(config(server))
        await other.attach(sb.sandbox_id)  # a second client takes the sandbox over by id
        assert (other.config.memory, other.config.cpus) == ("300m", 0.75)
        assert (await other.arun("echo shared")).output == "shared\n"
        # the limits hold inside: 600 MB cannot be had, and there is no route out to the service itself
        obs = await sb.arun("python3 -c 'b = bytearray(600 << 20); b[::4096] = b\"x\" * len(b[::4096]); "
                            "print(\"got it\")' 2>/dev/null; echo rc=$?; "
                            f"(echo > /dev/tcp/127.0.0.1/{server.port}) 2>/dev/null && echo reached || echo cut")
        assert "got it\n" not in obs.output and obs.output.endswith("\nrc=137\ncut\n")
    finally:
        await sb.stop()
    assert not (await sb.is_alive()).is_alive
    await sb.stop()  # twice is fine


@pytest.mark.parametrize("fields, words", [
    ({"use_kata_runtime": True}, "use_kata_runtime"),
    ({"num_gpus": 1.0}, "GPU"),
    ({"image_os": "windows"}, "image_os"),
    ({"registry_username": "u", "registry_password": "p"}, "registry"),
    ({"sandbox_id": "mine"}, "sandbox_id"),
    ({"auto_archive_seconds": 60}, "auto_archive_seconds"),
    ({"memory": "lots"}, "memory"),
    ({"disk": "1q"}, "disk"),
    ({"memory": "1m"}, "memory_mb"),          # SandboxSpec's own bound
])
async def test_start_refuses_what_it_cannot_honour_by_name(server, fields, words):
    before = server.http.get("/v1/sandboxes").json()
    with pytest.raises(BadRequestRockError, match=words):
        await Sandbox(config(server, **fields)).start()
    assert server.http.get("/v1/sandboxes").json() == before  # nothing was made


async def test_start_of_an_image_the_backend_lacks_fails_typed(server):
    with pytest.raises((BadRequestRockError, InternalServerRockError)):
        await Sandbox(config(server, image="no-such-image:1")).start()


async def test_unknown_fields_are_refused_not_dropped(server):
    r = server.http.post("/apis/envs/sandbox/v1/start_async", json={"image": "host", "privileged": True})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "Failed" and body["result"]["code"] == 4000
    assert body["error"].startswith("privileged:")


async def test_token_is_required(server):
    sb = Sandbox(SandboxConfig(base_url=server.url, image="host", memory="256m"))
    with pytest.raises(Exception, match="401"):
        await sb.start()
    for headers in ({"XRL-Authorization": f"Bearer {server.token}"}, {"X-API-Key": server.token}):
        r = httpx.get(f"{server.url}/apis/envs/sandbox/v1/is_alive?sandbox_id=sb-nope", headers=headers)
        assert r.json() == {"status": "Success", "message": None, "error": None,
                            "result": {"is_alive": False, "message": "sandbox sb-nope is not alive"}}


async def test_arun_normal_sessions_and_check(server, sandbox):
    obs = await sandbox.arun("echo out; echo err >&2")
    assert (obs.output, obs.exit_code) == ("out\nerr\n", 0)
    with pytest.raises(Exception, match="exit code 7"):  # ROCK's check="raise": a Failed answer
        await sandbox.arun("exit 7")
    await sandbox.create_session(CreateBashSessionRequest(session="s", env={"GREETING": "hi there"}))
    await sandbox.arun("cd /tmp; export N=5", session="s")
    assert (await sandbox.arun("pwd; echo $GREETING $N", session="s")).output == "/tmp\nhi there 5\n"
    with pytest.raises(Exception, match="already exists"):
        await sandbox.create_session(CreateBashSessionRequest(session="s"))
    with pytest.raises(Exception, match="does not exist"):
        await sandbox.arun("true", session="never-made")
    stranger = Sandbox(config(server))
    await stranger.attach(sandbox.sandbox_id)
    stranger._sandbox_id = "sb-nope"  # a sandbox that went away: the client's error, code 4000
    with pytest.raises(Exception, match="no such sandbox.*'code': 4000"):
        await stranger.execute(Command(command="true"))
    with pytest.raises(Exception, match="syntax error"):
        await sandbox.arun("if then fi")
    with pytest.raises(Exception, match="remote_user"):
        await sandbox.create_session(CreateBashSessionRequest(session="u", remote_user="admin"))


async def test_nohup_mode_waits_for_the_process_and_returns_its_output(server, sandbox):
    obs = await sandbox.arun("bash -c 'echo started; sleep 1; echo finished; exit 3'", mode="nohup",
                             wait_timeout=60)
    # ROCK's SDK decides a nohup exit code itself: 0 once the process ended (docs/compat.md)
    assert (obs.output, obs.exit_code) == ("started\nfinished\n", 0)
    # the service held the SDK's first liveness check until the job ended: no second one 5 s later
    recent = server.http.get(f"/v1/sandboxes/{sandbox.sandbox_id}", params={"detail": True}).json()["recent"]
    assert sum("kill -0" in c["cmd"] for c in recent) == 1, [c["cmd"] for c in recent]
    obs = await sandbox.arun("bash -c 'echo kept'", mode="nohup", ignore_output=True,
                             output_file="/workspace/out/job.log")
    assert "Output file: /workspace/out/job.log" in obs.output
    assert (await sandbox.read_file(ReadFileRequest(path="/workspace/out/job.log"))).content == "kept\n"


async def test_a_timeout_kills_the_command_not_the_sandbox(server, sandbox):
    with pytest.raises(Exception, match="Timeout"):
        await sandbox.execute(Command(command="sleep 30", timeout=0.5))
    assert (await sandbox.arun("echo alive")).output == "alive\n"


async def test_huge_output_is_capped_and_says_so(server, sandbox):
    obs = await sandbox.arun("head -c 3000000 /dev/zero | tr '\\0' b")
    assert len(obs.output) == 1 << 20 and "truncated" in obs.failure_reason
    r = await sandbox.execute(Command(command=["sh", "-c", "seq 1 100000"]))
    assert r.stdout.splitlines()[-1] == "100000" and r.exit_code == 0


async def test_files_write_read_upload(server, sandbox, tmp_path):
    text = "ünïcode\n" * 5000
    assert (await sandbox.write_file(WriteFileRequest(path="/workspace/d/e/f.txt", content=text))).success
    assert (await sandbox.read_file(ReadFileRequest(path="/workspace/d/e/f.txt"))).content == text
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 3000)  # < 1 MiB: the SDK's direct upload, no object storage
    up = await sandbox.upload(UploadRequest(source_path=str(blob), target_path="/workspace/up/blob.bin"))
    assert up.success, up.message
    r = await sandbox.execute(Command(command=["sha256sum", "/workspace/up/blob.bin"]))
    assert r.stdout.split()[0] == hashlib.sha256(blob.read_bytes()).hexdigest()
    # bad input: a directory as a file; the SDK reports it, the service stays up
    bad = await sandbox.write_file(WriteFileRequest(path="/workspace/d", content="x"))
    assert not bad.success and "Failed" in bad.message
    missing = await sandbox.upload(UploadRequest(source_path=str(tmp_path / "nope"), target_path="/x"))
    assert not missing.success


async def test_32_concurrent_clients(server):
    async def client(i: int) -> str:
        sb = Sandbox(config(server, memory="128m"))
        await sb.start()
        try:
            await sb.arun(f"echo {i} > /workspace/mine")
            return (await sb.arun("cat /workspace/mine; ls /workspace")).output
        finally:
            await sb.stop()

    outputs = await asyncio.gather(*(client(i) for i in range(32)))
    assert outputs == [f"{i}\nmine\n" for i in range(32)]
    assert server.http.get("/v1/sandboxes").json() == []


# --------------------------------------------------------------------------- GEM envs (rock.make)
@pytest.fixture
def rock_env_url(server, monkeypatch):
    # ROCK's env client sends no auth header: the token rides in the URL's userinfo
    monkeypatch.setenv("ROCK_BASE_URL", f"http://rock:{server.token}@127.0.0.1:{server.port}")


def test_gem_make_reset_step_close_through_rock_make(server, rock_env_url):
    from rock.sdk.envs import make

    env = make("rock/FrozenLake-v0")
    observation, info = env.reset(seed=0)
    assert "FrozenLake" in observation and info["turn"] == 0
    observation, reward, terminated, truncated, info = env.step("<answer>Right || Right || Right</answer>")
    assert (reward, terminated, info["moves"]) == (0.0, False, ["Right", "Right", "Right"])
    observation, reward, terminated, truncated, info = env.step("<answer>Down || Down || Down</answer>")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    made = env._sandbox_id
    env.close()
    r = httpx.post(f"{server.url}/apis/v1/envs/gem/step", json={"sandbox_id": made, "action": "Up"},
                   auth=("rock", server.token))
    assert r.status_code == 404 and "closed" in r.json()["detail"]


def test_gem_errors_name_what_is_wrong(server, rock_env_url):
    from rock.sdk.envs import make

    with pytest.raises(Exception, match="404.*no env 'rock/Nope-v0'.*rock/FrozenLake-v0"):
        make("rock/Nope-v0")
    with pytest.raises(Exception, match="404"):
        make("CartPole-v1")  # registered in gymnasium, but not one of rockroll's
    env = make("rock/Math-v0")
    with pytest.raises(Exception, match="400.*step"):
        env.step("\\boxed{1}")  # before reset
    env.close()
    r = httpx.post(f"{server.url}/apis/v1/envs/gem/list", json={}, auth=("rock", server.token))
    assert "rock/SWE-v0" in r.json()["env_id"] and all(i.startswith("rock/") for i in r.json()["env_id"])
    for auth in (None, ("rock", "wrong")):
        r = httpx.post(f"{server.url}/apis/v1/envs/gem/make", json={"env_id": "rock/Math-v0"}, auth=auth)
        assert r.status_code == 401


async def test_commit_is_a_snapshot_that_start_can_use(server, sandbox):
    await sandbox.arun("mkdir -p /workspace/proj && echo v1 > /workspace/proj/state && export GONE=1")
    status = await sandbox.commit("my/project:v1", "user", "secret")
    assert status.phase.value == "SUCCEEDED" and status.image_tag == "my/project:v1"
    assert (await sandbox.get_commit_status()).phase.value == "SUCCEEDED"
    await sandbox.arun("echo v2 > /workspace/proj/state")
    child = Sandbox(config(server, image="my/project:v1"))
    await child.start()
    try:
        assert (await child.arun("cat /workspace/proj/state")).output == "v1\n"
        assert spec_of(server, child.sandbox_id)["image"] == "host"
    finally:
        await child.stop()
    assert (await sandbox.arun("cat /workspace/proj/state")).output == "v2\n"  # the original went on
    with pytest.raises(Exception, match="no commit"):
        other = Sandbox(config(server))
        other._sandbox_id = "sb-never"
        await other.get_commit_status()


def test_gem_envs_idle_past_the_service_ttl_are_closed(monkeypatch):
    srv = Server("--idle-ttl", "1")
    try:
        monkeypatch.setenv("ROCK_BASE_URL", f"http://rock:{srv.token}@127.0.0.1:{srv.port}")
        from rock.sdk.envs import make

        env = make("rock/FrozenLake-v0")
        env.reset(seed=0)
        deadline = time.monotonic() + 60
        while True:  # each try that finds it touches it: then it idles 3 s, past its 1 s
            time.sleep(3)
            try:
                env.step("<answer>Left</answer>")
            except Exception as e:  # noqa: BLE001 - the SDK raises a bare Exception
                assert "404" in str(e) and "idle too long" in str(e)
                break
            assert time.monotonic() < deadline, "the idle env was never closed"
    finally:
        srv.stop()


@pytest.mark.timeout(600)
async def test_both_clients_on_the_docker_backend(image, tmp_path):
    """The same routes over the docker backend: ROCK's SDK starts a container sandbox of a
    Docker image, SWE-ReX's runtime drives that same sandbox."""
    srv = Server("--backend", "docker", "--max-sandboxes", "4")
    try:
        sb = Sandbox(config(srv, image=image))
        await sb.start()
        try:
            assert spec_of(srv, sb.sandbox_id)["backend"] == "docker"
            assert (await sb.arun("cat /etc/debian_version >/dev/null && echo debian")).output == "debian\n"
            await rock_and_swerex_share_a_sandbox(srv, sb, tmp_path)
            assert (await sb.arun("ls /sys/class/net")).output == "lo\n"  # no network but loopback
        finally:
            await sb.stop()
    finally:
        srv.stop()
