"""Security properties of the local backend, each tested by attacking it."""

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rockroll.sandbox import SandboxFileError, SandboxSpec, open_sandbox
from rockroll.sandbox.deployment.rootfs import NO_NETWORK_ETC

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def planted_secrets():
    """Secrets in the host's /root and in the project folder."""
    paths = [Path("/root/.rockroll-test-secret"), PROJECT / ".rockroll-test-secret"]
    for p in paths:
        p.write_text("TOPSECRET-4242")
    yield paths
    for p in paths:
        p.unlink(missing_ok=True)


def test_cannot_read_host_secrets(sb, planted_secrets):
    r = sb.run("cat /root/.rockroll-test-secret; grep -rs TOPSECRET-4242 /workspace /tmp "
               "/etc /root /home /var /opt /srv /mnt /run | head -3; ls -a /root /home; ls " + str(PROJECT), timeout=60)
    assert "TOPSECRET" not in r.stdout + r.stderr
    assert "No such file" in r.stderr  # neither /root's secret nor the project folder exist inside
    # the host view holds no credential files either
    r = sb.run("ls /etc/shadow /etc/gshadow /etc/ssh 2>&1; cat /etc/sudoers 2>&1")
    assert "No such file" in r.stdout and "root:" not in r.stdout


def _cgroup_file(sb, controller: str, name: str) -> str:
    """A file of the sandbox's own cgroup, where the kernel records what the limit held."""
    group = sb.aio._deploy.cgroup
    assert group is not None, "this host cannot create cgroups: the limits cannot be read back"
    return Path(group.dirs[controller], name).read_text()


def test_cannot_see_docker_socket_or_host_processes(sb):
    r = sb.run("ls -la /var/run/docker.sock /run/docker.sock 2>&1")
    assert r.stdout.count("No such file") == 2
    marker = "4242.0417"  # a host process whose pid and command line we know
    host = subprocess.Popen(["sleep", marker])
    try:
        r = sb.run(f"for p in /proc/[0-9]*; do echo \"${{p#/proc/}} $(tr '\\0' ' ' < $p/cmdline)\"; done",
                   timeout=30)
        seen = dict(line.partition(" ")[::2] for line in r.stdout.splitlines())
        assert seen.get("1") and len(seen) >= 2  # it did list the sandbox's own processes
        assert marker not in r.stdout  # the host's process is not there under any pid ...
        assert marker not in seen.get(str(host.pid), "")  # ... nor under its host pid
        assert "pytest" not in r.stdout  # nor is this test process
    finally:
        host.kill()
        host.wait()


def test_cannot_connect_to_host_loopback(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        r = sb.run(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED", timeout=10)
        assert "CONNECTED" not in r.stdout and r.exit_code != 0
        r = sb.run("ip -o link 2>/dev/null || cat /proc/net/dev")
        assert "eth" not in r.stdout and "docker" not in r.stdout
        assert not accepted
    finally:
        server.close()


def _name_resolution(sb) -> dict[str, str]:
    return {name: sb.read_file(f"/etc/{name}").decode() for name in NO_NETWORK_ETC}


def test_host_name_resolution_only_with_network_read_only_and_in_no_snapshot():
    """``network=True`` shares the host's network, so it gets the host's resolv.conf and
    hosts (a setup step's ``pip install`` resolves the index's name): read-only, out of the
    snapshot. A sandbox without network, even one restored from that snapshot, knows
    localhost only: nothing of the host's resolver reaches it."""
    host = {name: Path("/etc", name).read_text() if Path("/etc", name).exists() else text
            for name, text in NO_NETWORK_ETC.items()}
    assert host != NO_NETWORK_ETC  # else this test could not tell the two apart
    with open_sandbox(SandboxSpec(network=True, timeout_s=30)) as sb:
        assert _name_resolution(sb) == host
        # overwrite, delete, unmount, remount read-write: each refused by the read-only bind
        # and the dropped CAP_SYS_ADMIN (read the files back after the attack)
        for cmd in ("echo 'nameserver 192.0.2.1' > /etc/resolv.conf", "rm -f /etc/hosts",
                    "umount /etc/resolv.conf", "mount -o remount,rw,bind /etc/hosts"):
            assert sb.run(cmd, timeout=10).exit_code != 0, cmd
        assert _name_resolution(sb) == host
        sb.run("echo kept > /etc/rockroll-net-test", timeout=10)
        snap = sb.snapshot()
    with open_sandbox(SandboxSpec(timeout_s=30)) as sb:
        assert _name_resolution(sb) == NO_NETWORK_ETC
    with open_sandbox(SandboxSpec(timeout_s=30), snapshot=snap) as sb:
        assert sb.read_file("/etc/rockroll-net-test") == b"kept\n"  # the snapshot holds /etc's changes ...
        assert _name_resolution(sb) == NO_NETWORK_ETC  # ... and not the host's files


def test_fork_bomb_stops_at_pids_limit(spec):
    with open_sandbox(SandboxSpec(pids=64, memory_mb=256, timeout_s=30)) as bomb, open_sandbox(spec) as other:
        bomb.run("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout=15)
        # the bomb keeps forking in the background: on a loaded machine it may take longer
        # than those 2 s to reach the limit, so wait (bounded) for the first refused fork
        deadline = time.monotonic() + 60
        while int(_cgroup_file(bomb, "pids", "pids.events").split()[1]) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        # the limit held: the kernel never let the sandbox hold more than 64 tasks, and it
        # refused the bomb's forks at that limit (pids.events counts each refusal)
        assert int(_cgroup_file(bomb, "pids", "pids.max")) == 64
        assert 32 < int(_cgroup_file(bomb, "pids", "pids.peak")) <= 64
        assert int(_cgroup_file(bomb, "pids", "pids.events").split()[1]) > 0
        # the host and the other sandbox still answer
        assert other.run("echo fine").stdout == "fine\n"
        assert os.system("true") == 0
        bomb.reset()  # and the bombed sandbox recovers
        assert bomb.run("echo back").stdout == "back\n"


def test_memory_hog_is_killed_and_reported():
    with open_sandbox(SandboxSpec(memory_mb=64, timeout_s=60)) as sb:
        r = sb.run("python3 -c \"b = bytearray(400 << 20); print('allocated')\"")
        assert r.exit_code == 137 and r.oom_killed and "allocated" not in r.stdout
        # the kill came from the sandbox's own limit: its group's OOM killer fired, and its
        # charge went up to the 64 MiB limit and never past it
        assert sb.aio._deploy.cgroup.oom_kills() >= 1
        assert 32 << 20 < sb.aio._deploy.cgroup.memory_peak_bytes() <= 64 << 20
        r = sb.run("echo alive")  # the session and agent survive the OOM kill
        assert r.stdout == "alive\n" and not r.oom_killed


def test_rm_rf_root_leaves_host_and_others_intact(spec):
    marker = Path("/usr/share/rockroll-marker")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("keep")
    try:
        with open_sandbox(spec) as victim, open_sandbox(spec) as other:
            other.write_file("keep.txt", "mine")
            victim.run("rm -rf --no-preserve-root / 2>/dev/null; true", timeout=60)
            assert marker.read_text() == "keep" and Path("/usr/bin/bash").exists()
            assert other.read_file("keep.txt") == b"mine"
            assert other.run("ls /usr/bin/bash").exit_code == 0
            victim.reset()
            assert victim.run("ls /etc/hosts && echo ok").stdout.endswith("ok\n")
    finally:
        marker.unlink()


def test_write_file_traversal_stays_inside(sb):
    target = Path("/etc/rockroll-escape-test")
    target.unlink(missing_ok=True)
    sb.write_file("../../etc/rockroll-escape-test", "x")
    sb.write_file("/workspace/../../../../etc/rockroll-escape-test2", "y")
    assert not target.exists() and not Path("/etc/rockroll-escape-test2").exists()
    assert sb.run("cat /etc/rockroll-escape-test /etc/rockroll-escape-test2").stdout == "xy"


def test_upload_traversal_stays_inside(sb, tmp_path):
    f = tmp_path / "f"
    f.write_text("up")
    sb.upload(f, "../../../etc/rockroll-upload-test")
    assert not Path("/etc/rockroll-upload-test").exists()
    assert sb.run("cat /etc/rockroll-upload-test").stdout == "up"


def test_planted_symlink_cannot_read_host_file(sb, planted_secrets, tmp_path):
    sb.run(f"ln -s /root/.rockroll-test-secret leak; ln -s {PROJECT}/.rockroll-test-secret leak2; "
           "ln -s ../../../../../../root/.rockroll-test-secret leak3; mkdir d; ln -s /root d/rootlink")
    for name in ("leak", "leak2", "leak3"):
        # links resolve inside the sandbox, where the host's file does not exist: the SDK's
        # typed file error, naming the sandbox, and not a byte of the secret
        with pytest.raises(SandboxFileError) as err:
            sb.read_file(name)
        assert err.value.sandbox_id == sb.id and "TOPSECRET" not in str(err.value)
        with pytest.raises(SandboxFileError) as err:
            sb.download(name, tmp_path / name)
        assert err.value.sandbox_id == sb.id
        assert not (tmp_path / name).exists()
    sb.download("d", tmp_path / "d")
    link = tmp_path / "d" / "rootlink"
    assert link.is_symlink() and os.readlink(link) == "/root"  # copied as a link, never followed


def test_capabilities_are_dropped(sb):
    r = sb.run("grep -E 'CapBnd|CapEff|NoNewPrivs' /proc/self/status", timeout=10)
    bnd = int(next(l for l in r.stdout.splitlines() if l.startswith("CapBnd")).split()[1], 16)
    assert not bnd & (1 << 21)  # CAP_SYS_ADMIN
    assert not bnd & (1 << 27)  # CAP_MKNOD
    assert "NoNewPrivs:\t1" in r.stdout
    # each privileged act, one by one: refused, and nothing happened
    r = sb.run("mount -t tmpfs none /mnt", timeout=10)
    assert r.exit_code != 0 and "permission denied" in r.stderr.lower()
    assert " /mnt " not in sb.run("cat /proc/self/mounts").stdout
    r = sb.run("mknod /tmp/sda b 8 0", timeout=10)
    assert r.exit_code != 0 and "not permitted" in r.stderr.lower()
    assert sb.run("test -e /tmp/sda").exit_code == 1
    # a sysctl write of the host's own value: harmless if it got through, refused if the limit holds
    swappiness = Path("/proc/sys/vm/swappiness").read_text().strip()
    for cmd in (f"echo {swappiness} > /proc/sys/vm/swappiness", f"sysctl -w vm.swappiness={swappiness}"):
        r = sb.run(cmd, timeout=10)
        assert r.exit_code != 0 and ("read-only" in r.stderr.lower() or "denied" in r.stderr.lower()), (cmd, r)
