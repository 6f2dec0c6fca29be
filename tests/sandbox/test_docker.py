"""The docker backend: the local backend's contract, against a real Docker engine.

Skipped without an engine, except under CI=true, where a missing engine is a failure
(the ``client`` and ``image`` fixtures, in conftest.py).
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rockroll.sandbox import GuestDied, SandboxError, SandboxSpec, SpecError, open_sandbox
from rockroll.sandbox.deployment.rootfs import NO_NETWORK_ETC


@pytest.fixture(scope="module")
def sh_image(client, image):
    """The Debian image without bash, so sessions run under dash (cached by tag)."""
    import docker

    tag = image.replace("rockroll/debian:", "rockroll/debian-nobash:")
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        c = client.containers.run(image, ["rm", "-f", "/usr/bin/bash", "/bin/bash"], detach=True,
                                  network_mode="none")
        try:
            assert c.wait()["StatusCode"] == 0
            c.commit(*tag.split(":"))
        finally:
            c.remove(force=True)
    return tag


# `sleep 31`s left running (minbase has no ps; the pattern does not match its own argv)
COUNT_SLEEPS = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cx '3[1]'"


def dspec(image, **kw):
    kw = {"memory_mb": 256, "pids": 128, "timeout_s": 30, **kw}
    return SandboxSpec(image=image, backend="docker", **kw)


@pytest.fixture(scope="module")
def box(image):
    with open_sandbox(dspec(image, max_output_bytes=1 << 16)) as sb:
        yield sb


def container_of(sb):
    return sb.aio._deploy.container


# ----------------------------------------------------------------- commands and files


def test_run_separates_streams_and_exit_code(box):
    r = box.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_session_keeps_cwd_and_exports(box):
    box.run("mkdir -p /tmp/w && cd /tmp/w && export A=1 B=2")
    box.run("unset B")
    assert box.run('pwd; echo "$A-${B:-unset}"').stdout == "/tmp/w\n1-unset\n"
    assert box.run("pwd", session="other").stdout == "/workspace\n"


def test_timeout_kills_command_not_session(box):
    box.run("export KEEP=yes")
    r = box.run("sleep 31 & sleep 31; echo finished", timeout=1)
    assert r.timed_out and "finished" not in r.stdout  # cut off, not waited out
    assert box.run(f"echo $KEEP; {COUNT_SLEEPS}").stdout == "yes\n0\n"


def test_output_cap(box):
    r = box.run("head -c 200000 /dev/zero | tr '\\0' x")
    assert r.truncated and len(r.stdout) == 1 << 16 and r.exit_code == 0


def test_files_round_trip(box, tmp_path):
    box.write_file("dir/a.bin", bytes(range(256)) * 100, mode=0o600)
    assert box.read_file("/workspace/dir/a.bin") == bytes(range(256)) * 100
    assert box.run("stat -c %a /workspace/dir/a.bin").stdout == "600\n"
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "f.txt").write_text("uploaded")
    box.upload(tmp_path / "up", "up")
    assert box.run("cat /workspace/up/f.txt").stdout == "uploaded"
    box.download("up", tmp_path / "down")
    box.download("dir/a.bin", tmp_path / "a.bin")
    assert (tmp_path / "down" / "f.txt").read_text() == "uploaded"
    assert (tmp_path / "a.bin").read_bytes() == bytes(range(256)) * 100


# ----------------------------------------------------------------- snapshots


def test_snapshot_restore_fork_reset(image):
    with open_sandbox(dspec(image)) as sb:
        # a file, a deletion (whiteout) and a replaced directory (opaque) in the first layer
        sb.run("echo one > a.txt; rm /etc/debian_version; rm -rf /etc/apt; mkdir /etc/apt; "
               "touch /etc/apt/only; ln a.txt hard; cd /tmp; export PHASE=one")
        first = sb.snapshot()
        sb.run("echo two > /workspace/a.txt; echo new > /workspace/b.txt; cd /; export PHASE=two")
        second = sb.snapshot()  # a chain of two layers
        sb.run("rm -rf /workspace/*; export PHASE=three")

        sb.restore(first)
        r = sb.run("cat /workspace/a.txt; ls /workspace; ls /etc/apt; ls /etc/debian_version; pwd; echo $PHASE")
        assert r.stdout == "one\na.txt\nhard\nonly\n/tmp\none\n" and "No such file" in r.stderr
        assert sb.run("stat -c %h /workspace/hard").stdout == "2\n"

        sb.restore(second)
        assert sb.run("cat /workspace/a.txt /workspace/b.txt; pwd; echo $PHASE").stdout == "two\nnew\n/\ntwo\n"

        kids = sb.fork(2)
        try:
            kids[0].write_file("/workspace/a.txt", "kid0")
            assert kids[1].read_file("/workspace/a.txt") == b"two\n"
            assert sb.read_file("/workspace/a.txt") == b"two\n"
        finally:
            for kid in kids:
                kid.close()

        sb.reset()
        r = sb.run("ls /workspace; cat /etc/debian_version; ls /etc/apt | wc -l; echo ${PHASE:-none}")
        assert r.stdout.startswith("12") and r.stdout.endswith("none\n") and "only" not in r.stdout


def test_snapshot_moves_between_backends(image):
    """image="host" names each backend's default system, so its snapshots travel both ways."""
    local = SandboxSpec(memory_mb=256, pids=128, timeout_s=30)
    docker_host = dspec("host")
    with open_sandbox(local) as sb:
        sb.run("mkdir -p /workspace/proj && echo from-local > /workspace/proj/f && cd /workspace/proj")
        snap = sb.snapshot()
    with open_sandbox(docker_host, snapshot=snap) as sb:
        assert sb.run("cat f; pwd").stdout == "from-local\n/workspace/proj\n"
        sb.run("echo from-docker > g; rm f")
        snap = sb.snapshot()
    with open_sandbox(local, snapshot=snap) as sb:
        r = sb.run("cat g; ls")
        assert r.stdout == "from-docker\ng\n"


# ----------------------------------------------------------------- confinement


def test_confinement(box):
    r = box.run("grep -E 'CapBnd|NoNewPrivs' /proc/self/status; cat /proc/net/dev; "
                "mount -t tmpfs none /mnt", timeout=10)
    bnd = int(next(line for line in r.stdout.splitlines() if line.startswith("CapBnd")).split()[1], 16)
    assert not bnd & (1 << 21) and not bnd & (1 << 27)  # no CAP_SYS_ADMIN, no CAP_MKNOD
    assert "NoNewPrivs:\t1" in r.stdout and r.exit_code != 0
    interfaces = [line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line
                  and not line.startswith(("Cap", "NoNew", "Inter"))]
    assert interfaces == ["lo"]
    assert not container_of(box).attrs["HostConfig"]["Privileged"]


def test_cannot_reach_host_loopback(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        r = box.run(f"exec 3<>/dev/tcp/127.0.0.1/{server.getsockname()[1]} && echo CONNECTED", timeout=10)
        assert "CONNECTED" not in r.stdout and r.exit_code != 0 and not accepted
    finally:
        server.close()


def test_name_resolution_holds_nothing_of_the_host(box):
    """Docker gives even a network-``none`` container a copy of the host's name servers:
    the sandbox gets the host image's placeholder instead, read-only."""
    assert box.read_file("/etc/resolv.conf").decode() == NO_NETWORK_ETC["resolv.conf"]
    assert box.run("echo 'nameserver 192.0.2.1' > /etc/resolv.conf", timeout=10).exit_code != 0
    assert box.read_file("/etc/resolv.conf").decode() == NO_NETWORK_ETC["resolv.conf"]


def test_memory_hog_is_oom_killed(image):
    with open_sandbox(dspec(image, memory_mb=64)) as sb:
        r = sb.run("head -c 400m /dev/zero | tail > /dev/null; echo rc=$?")
        assert r.stdout == "rc=137\n"
        r = sb.run("head -c 400m /dev/zero | tail")
        assert r.exit_code == 137 and r.oom_killed
        assert sb.run("echo alive").stdout == "alive\n"


def test_fork_bomb_stops_at_pids_limit(image):
    with open_sandbox(dspec(image, pids=64)) as sb:
        sb.run("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=10)
        assert os.system("true") == 0  # the host still forks
        sb.reset()
        assert sb.run("echo back").stdout == "back\n"


# ----------------------------------------------------------------- lifecycle and cleanup


def test_guest_death_then_reset(image):
    with open_sandbox(dspec(image)) as sb:
        os.kill(sb.aio._deploy.guest.init_pid, signal.SIGKILL)
        with pytest.raises(GuestDied):
            sb.run("true")
        sb.reset()
        assert sb.run("echo ok").stdout == "ok\n"


def test_labels_and_removal_on_close(client, image):
    sb = open_sandbox(dspec(image))
    container = container_of(sb)
    labels = container.labels
    assert labels["rockroll.sandbox"] == sb.id and labels["rockroll.run"] == sb.aio.run_id
    assert labels["rockroll.owner"] == str(os.getuid())
    sb.close()
    sb.close()  # idempotent
    assert not client.containers.list(all=True, filters={"label": f"rockroll.sandbox={sb.id}"})


def test_a_close_while_a_container_is_created_leaves_none(client, image):
    """At exit, kill_now runs on the main thread while a pool may be resetting the sandbox on a
    deployment thread: between the new container's create and its start. That container must
    go too, not keep running after its owner until the next gc."""
    sb = open_sandbox(dspec(image))
    dep = sb.aio._deploy
    create = dep._create

    def create_then_exit(image_):
        container = create(image_)
        dep.kill_now()  # what the exit handler does, at the worst moment
        return container

    dep._create = create_then_exit
    label = {"label": f"rockroll.sandbox={sb.id}"}
    try:
        with pytest.raises(SandboxError, match="closed while its container was being created"):
            sb.reset()
        assert not client.containers.list(all=True, filters=label)
    finally:
        sb.close()
        for leftover in client.containers.list(all=True, filters=label):
            leftover.remove(force=True)


OWNER = textwrap.dedent("""
    import sys, time
    from rockroll.sandbox import SandboxSpec, open_sandbox
    sb = open_sandbox(SandboxSpec(image=sys.argv[1], backend="docker", memory_mb=128))
    print(sb.aio.run_id, flush=True)
    time.sleep(600)
""")


def test_owner_killed_then_gc_removes_container(client, image):
    from rockroll.sandbox.deployment.reaper import reap_dead_runs

    owner = subprocess.Popen([sys.executable, "-c", OWNER, image], stdout=subprocess.PIPE, text=True)
    try:
        run_id = owner.stdout.readline().strip()
        assert run_id, "the owner process failed to start its sandbox"
    finally:
        owner.kill()
        owner.wait()
    label = {"label": f"rockroll.run={run_id}"}
    assert client.containers.list(all=True, filters=label)  # it survives its owner's kill -9 ...
    reap_dead_runs()
    assert not client.containers.list(all=True, filters=label)  # ... until the next gc


def test_image_without_bash(sh_image):
    with open_sandbox(dspec(sh_image)) as sb:
        assert sb.run("test -e /bin/bash || echo sh-only").stdout == "sh-only\n"
        r = sb.run("echo out; echo err >&2; exit 4")
        assert (r.exit_code, r.stdout, r.stderr) == (4, "out\n", "err\n")
        r = sb.run("true\nnosuchcmd")
        assert r.exit_code == 127 and "nosuchcmd" in r.stderr and "/dev/.rr" not in r.stderr, r.stderr
        r = sb.run("echo never", cwd="/nonexistent")
        assert r.exit_code != 0 and "/nonexistent" in r.stderr and "/dev/.rr" not in r.stderr, r.stderr
        sb.run("mkdir -p '/tmp/it'\"'\"'s' && cd '/tmp/it'\"'\"'s' && export X='a b' Y=2")
        sb.run("unset Y")
        assert sb.run('pwd; echo "$X-${Y:-unset}"').stdout == "/tmp/it's\na b-unset\n"
        r = sb.run("sleep 31 & sleep 31; echo finished", timeout=1)
        assert r.timed_out and "finished" not in r.stdout  # cut off, not waited out
        assert sb.run(f"pwd; {COUNT_SLEEPS}").stdout == "/tmp/it's\n0\n"
        snap = sb.snapshot()
        sb.restore(snap)
        assert sb.run('pwd; echo "$X"').stdout == "/tmp/it's\na b\n"


def test_cli_image_build_prints_the_tag(image):
    from click.testing import CliRunner

    from rockroll.cli import main

    result = CliRunner().invoke(main, ["sandbox", "image", "build"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == image


# ----------------------------------------------------------------- model endpoint

HTTP_CALL = r"""body='{"model":"m","messages":[{"role":"user","content":"hi"}]}'
exec 3<>/dev/tcp/127.0.0.1/8080 || exit 7
printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: sb\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "$OPENAI_API_KEY" "${#body}" "$body" >&3
cat <&3
"""


def test_model_endpoint_in_a_container(image, monkeypatch):
    """The same agent channel as the local backend: an OpenAI endpoint on the container's
    loopback, the container's network still none (the image has no Python: raw HTTP)."""
    from rockroll.sandbox.modelservice import ModelService, ReplayMode
    from rockroll.sandbox.protocol.tokens import TOKEN_ENV

    recorded = {"kind": "chat", "messages": [{"role": "user", "content": "hi"}], "prompt": None, "tools": None,
                "choices": [{"content": "hello from the host", "finish_reason": "stop"}]}
    with ModelService(ReplayMode([recorded])) as svc:
        monkeypatch.setenv(TOKEN_ENV, svc.token)
        with open_sandbox(dspec(image, model_endpoint=svc.url)) as sb:
            r = sb.run(HTTP_CALL)
            assert r.stdout.startswith("HTTP/1.1 200"), r
            assert '"content":"hello from the host"' in r.stdout
            key = sb.run("printf %s $OPENAI_API_KEY").stdout
            assert svc.caller(key).sandbox_id == sb.id
            assert svc.recorder.records[0]["sandbox_id"] == sb.id
            port = svc.url.rsplit(":", 1)[1]
            r = sb.run(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED")  # the service's host port
            assert "CONNECTED" not in r.stdout and r.exit_code != 0
            assert container_of(sb).attrs["HostConfig"]["NetworkMode"] == "none"
            # the agent entered the container from the host: nothing of the host's environment came in
            environ = sb.run("cat /proc/[0-9]*/environ; env").stdout
            assert "OPENAI_API_KEY=" + key in environ
            assert svc.token not in environ and "PYTEST_CURRENT_TEST" not in environ
        assert svc.caller(key) is None
