"""Disk limits (``disk_mb``): a sandbox's writable layer is a filesystem of its own.

Each attack fills the layer another way (bytes, one huge sparse file, inodes), then reads
the limit that held: ENOSPC inside, the layer's size in ``df``, and the host's share of it
(the allocated blocks of the sandbox's disk image). Local and docker alike; the
unprivileged (tmpfs) variant is in test_unprivileged.py.
"""

import json
import os
import subprocess
import time

import pytest

from rockroll.sandbox import SandboxSpec, SpecError, open_sandbox
from rockroll.sandbox.deployment import disk
from rockroll.sandbox.deployment.disk import inodes_for, loop_devices
from rockroll.sandbox.deployment.reaper import current_run, reap_dead_runs
from rockroll.sandbox.home import state_home
from rockroll.sandbox.spec import DEFAULT_DISK_MB, DISK_MB_MAX

from _leaks import leftovers
from test_docker import dspec  # the client and image fixtures are in conftest.py

LIMIT = 64  # MiB
FULL = "No space left on device"


@pytest.fixture(params=["local", "docker"])
def make(request):
    """``make(**kw)``: a spec of the backend under test."""
    if request.param == "local":
        return lambda **kw: SandboxSpec(memory_mb=256, pids=128, timeout_s=60, **kw)
    img = request.getfixturevalue("image")
    return lambda **kw: dspec(img, timeout_s=60, **kw)


def df(sb, path: str = "/") -> tuple[int, int, int, int]:
    """(size KiB, used KiB, inodes, free inodes) of the filesystem holding ``path``, as the
    sandbox sees it."""
    size, used = sb.run(f"df -kP {path} | tail -1").stdout.split()[1:3]
    inodes, _, ifree = sb.run(f"df -iP {path} | tail -1").stdout.split()[1:4]
    return int(size), int(used), int(inodes), int(ifree)


def host_bytes(sb) -> int:
    """What the sandbox's layer holds of the host's disk: its image's allocated blocks."""
    deploy = sb.aio._deploy
    return os.stat(deploy.dir / f"disk{deploy.gen}.img").st_blocks * 512


def docker_layer_bytes(sb) -> int:
    """Bytes in the container's own (unlimited) writable layer; 0 for local."""
    upper = getattr(sb.aio._deploy, "_upper", None)
    if upper is None:
        return 0
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(upper) for f in files)


def test_writes_past_the_limit_fail_with_enospc_and_rm_frees_them(make):
    with open_sandbox(make(disk_mb=LIMIT)) as sb, open_sandbox(make(disk_mb=LIMIT)) as other:
        r = sb.run("dd if=/dev/zero of=/workspace/fill bs=1M count=200")
        assert r.exit_code != 0 and FULL in r.stderr
        r = sb.run("head -c 1M /dev/zero > /tmp/more")  # every writable path shares the one layer
        assert r.exit_code != 0 and FULL in r.stderr
        size, used, _, _ = df(sb)
        assert LIMIT * 1024 * 0.9 < size <= LIMIT * 1024 and used > size * 0.95
        assert host_bytes(sb) <= LIMIT << 20  # the host gave it no more than the limit
        assert docker_layer_bytes(sb) < 1 << 20  # nothing went around it into docker's layer
        # another sandbox is untouched by the full one
        assert other.run("head -c 20M /dev/zero > /workspace/f && echo ok").stdout == "ok\n"
        # deleting frees the space, inside and (discard) on the host
        sb.run("rm /workspace/fill")
        assert sb.run("head -c 20M /dev/zero > /workspace/f && echo ok").stdout == "ok\n"
        assert host_bytes(sb) < 40 << 20


def test_a_huge_sparse_file_is_bounded_by_the_bytes_it_holds(make):
    with open_sandbox(make(disk_mb=LIMIT)) as sb:
        # seek to 1 TiB, then write 200 MiB of real data: the holes are free, the data is not
        r = sb.run("dd if=/dev/zero of=/workspace/huge bs=1M seek=1048576 count=200")
        assert r.exit_code != 0 and FULL in r.stderr
        assert int(sb.run("stat -c %s /workspace/huge").stdout) > 1 << 40
        assert host_bytes(sb) <= LIMIT << 20
        r = sb.run("truncate -s 2T /workspace/huge2 && head -c 1M /dev/zero >> /workspace/huge2")
        assert r.exit_code != 0 and FULL in r.stderr
        sb.run("rm /workspace/huge /workspace/huge2")
        assert sb.run("head -c 20M /dev/zero > /workspace/f && echo ok").stdout == "ok\n"


def test_inode_exhaustion_is_enospc_too(make):
    with open_sandbox(make(disk_mb=16)) as sb:
        _, _, inodes, _ = df(sb)
        assert inodes <= inodes_for(16)  # one inode per 16 KiB, on every backing
        r = sb.run("cd /workspace && for i in $(seq 1 5000); do : > f$i || exit 7; done")
        assert r.exit_code == 7 and FULL in r.stderr
        size, used, _, ifree = df(sb)
        assert ifree == 0 and used < size // 2  # the inodes ran out, not the bytes
        sb.run("rm /workspace/f1 /workspace/f2")
        assert sb.run(": > /workspace/again && echo ok").stdout == "ok\n"


def test_the_default_limit_applies_and_none_lifts_it(make):
    spec = make()
    assert spec.disk_mb == DEFAULT_DISK_MB
    with open_sandbox(spec) as sb:
        size = df(sb)[0]
        assert DEFAULT_DISK_MB * 1024 * 0.95 < size <= DEFAULT_DISK_MB * 1024
    with open_sandbox(make(disk_mb=None)) as sb:  # no limit: the host's filesystem
        assert df(sb)[0] > DEFAULT_DISK_MB * 1024 * 2
    for bad in (8, DISK_MB_MAX + 1, 2.5):  # too small for a filesystem, past 1 TiB, not MiB
        with pytest.raises(SpecError) as err:
            make(disk_mb=bad)
        assert err.value.field == "disk_mb"


def test_restored_and_forked_sandboxes_are_limited_too(make):
    with open_sandbox(make(disk_mb=LIMIT)) as sb:
        sb.run("head -c 40M /dev/urandom > /workspace/data; sha256sum /workspace/data > /workspace/sum")
        snap = sb.snapshot()
        sb.run("rm /workspace/data")
        sb.restore(snap)  # the snapshot is a lower layer now; the new upper is empty, and sized
        assert sb.run("sha256sum -c /workspace/sum").exit_code == 0
        r = sb.run("dd if=/dev/zero of=/workspace/fill bs=1M count=200")
        assert r.exit_code != 0 and FULL in r.stderr
        assert LIMIT * 1024 * 0.9 < df(sb)[0] <= LIMIT * 1024
        snap = sb.snapshot()  # a full sandbox still snapshots ...
        [child] = sb.fork()  # ... and forks
        with child:
            assert child.run("sha256sum -c /workspace/sum").exit_code == 0
            r = child.run("dd if=/dev/zero of=/workspace/fill2 bs=1M count=200")
            assert r.exit_code != 0 and FULL in r.stderr
            assert host_bytes(child) <= LIMIT << 20
        with open_sandbox(make(disk_mb=LIMIT), snapshot=snap) as again:
            r = again.run("rm /workspace/fill; dd if=/dev/zero of=/workspace/fill3 bs=1M count=200")
            assert r.exit_code != 0 and FULL in r.stderr


def test_close_and_reset_leave_no_loop_device_or_mount(make):
    run = current_run()
    with open_sandbox(make(disk_mb=LIMIT)) as sb:
        home = run.dir / sb.id  # (the run's own spare disks, made ahead, live beside it)
        assert len(loop_devices(home)) == 1
        sb.reset()  # a second generation: the first one's disk must go
        sb.run("echo x > /workspace/x")
        assert _eventually(lambda: not (home / "disk1.img").exists() and len(loop_devices(home)) == 1)
    assert _eventually(lambda: loop_devices(home) == [])  # the kernel detaches them asynchronously
    assert [x for x in leftovers(run.run_id, run.dir) if x.split()[0] == "mount"] == []


def _eventually(cond, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.05)
    return cond()


def test_without_loop_devices_the_layer_is_a_tmpfs_of_the_same_size(make, monkeypatch):
    # a root host without /dev/loop-control (a container) gets what a user namespace gets
    monkeypatch.setattr(disk, "loop_devices_usable", lambda: False)
    with open_sandbox(make(disk_mb=LIMIT)) as sb:
        size, _, inodes, _ = df(sb)
        assert size == LIMIT * 1024 and inodes == inodes_for(LIMIT)
        r = sb.run("dd if=/dev/zero of=/workspace/fill bs=1M count=200")
        assert r.exit_code != 0 and FULL in r.stderr
        assert not (sb.aio._deploy.dir / "disk1.img").exists()  # no image: memory-backed
        sb.run("rm /workspace/fill")
        assert sb.run("head -c 20M /dev/zero > /workspace/f && echo ok").stdout == "ok\n"


def test_gc_detaches_the_loop_devices_of_a_dead_run():
    # a loop device that outlived its run (attached without auto-clear, as a stuck one is)
    run_dir = state_home() / "runs" / "deaddisk00"
    (run_dir / "sb-0000000000").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"pid": 1 << 30, "start": 1}))  # no such process
    image = run_dir / "sb-0000000000" / "disk1.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        assert loop_devices(run_dir) == [dev]
        assert "deaddisk00" in reap_dead_runs(keep=current_run().run_id)
        assert _eventually(lambda: loop_devices(run_dir) == [])
        assert not run_dir.exists()
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)  # only if the test failed


def sparse_images(folder, n: int) -> list:
    """``n`` sparse 1 MiB files to back loop devices."""
    images = []
    for i in range(n):
        image = folder / f"{i}.img"
        with open(image, "wb") as f:
            f.truncate(1 << 20)
        images.append(image)
    return images


def test_a_busy_free_device_before_many_bound_ones_does_not_exhaust_the_retries(tmp_path):
    """The kernel's free loop device can be busy (held open exclusively, or mid-attach by
    another process) while the devices after it are bound by live sandboxes: the attach steps
    over the bound ones instead of spending its retries on them (CI ran out of retries so)."""
    images = sparse_images(tmp_path, 80)
    ctl = os.open("/dev/loop-control", os.O_RDWR)
    held = None
    attached = []
    try:
        free = disk.fcntl.ioctl(ctl, disk.LOOP_CTL_GET_FREE)
        held = os.open(f"/dev/loop{free}", os.O_RDONLY | os.O_EXCL)  # an exclusive holder: EBUSY
        for image in images:  # one after another: each bound device is in the next one's way
            attached.append(disk.attach_loop(image))
        devices = [dev for dev, _ in attached]
        assert len(set(devices)) == len(images) and f"/dev/loop{free}" not in devices
    finally:
        for _, fd in attached:
            os.close(fd)
        if held is not None:
            os.close(held)
        os.close(ctl)


def test_loop_devices_attach_in_parallel_each_to_its_own_image(tmp_path):
    """A burst of creates attaches loop devices from many threads at once (not one at a time:
    an attach can wait tens of ms on the kernel): every attach succeeds, on a device of its
    own, backed by its own image, and each is gone once its last fd is closed (autoclear)."""
    import concurrent.futures

    images = sparse_images(tmp_path, 48)
    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        attached = list(pool.map(disk.attach_loop, images))
    try:
        devices = [dev for dev, _ in attached]
        assert len(set(devices)) == len(images)
        for (dev, _), image in zip(attached, images):
            backing = open(f"/sys/block/{os.path.basename(dev)}/loop/backing_file").read().strip()
            assert backing == str(image)
    finally:
        for _, fd in attached:
            os.close(fd)
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/sys/block/{os.path.basename(d)}/loop/backing_file") for d in devices):
        assert time.monotonic() < deadline, "loop devices still attached after their fds closed"
        time.sleep(0.1)
