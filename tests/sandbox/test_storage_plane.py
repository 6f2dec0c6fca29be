"""The storage plane is no way onto the host (issue #23): crafted layers unpacked directly,
uploaded to a real ``rockroll serve``, and read back by another local user.

After each attack the test reads what held: the bytes the unpacking thread wrote
(``/proc/thread-self/io``), the free space of a real small disk (a tmpfs), the modes on
disk, what a made-up local uid can reach, and that nothing was left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rockroll.sandbox import SandboxSpec, SpecError, StorageFullError, StorageLimitError, open_sandbox
from rockroll.sandbox.home import private_home
from rockroll.sandbox.storage.layers import digest_file, unpack_layer, unpack_plain_tar
from rockroll.sandbox.storage.limits import MEMBER_BYTES, Bound, StorageLimits, free_bytes
from rockroll.sandbox.storage.snapshots import SnapshotStore

from _server import Server
from _storage import crafted_layer, leftovers, other_user_reaches, thread_wchar

MiB = 1 << 20
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT and os.environ.get("CI") != "true",
                                reason="mounts a tmpfs and switches to another uid")


@pytest.fixture
def world_tmp():
    """A temp dir every local user may traverse (pytest's tmp_path sits under a 0700
    folder, which would hide everything from the other user whatever rockroll does)."""
    path = Path(tempfile.mkdtemp(prefix="rockroll-storage-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ unpacking, in process


def test_setuid_and_setgid_never_land_but_sticky_does(tmp_path):
    archive = crafted_layer(tmp_path / "l.tar.zst", {"su": (0o4755, b"#!/bin/sh\nid\n"), "sg": (0o2711, b"x")},
                            dirs={"shared": 0o2775, "tmp": 0o1777})
    unpack_layer(archive, tmp_path / "out")
    modes = {n: stat.S_IMODE(os.lstat(tmp_path / "out" / n).st_mode) for n in ("su", "sg", "shared", "tmp")}
    assert modes == {"su": 0o755, "sg": 0o711, "shared": 0o775, "tmp": 0o1777}


@pytest.mark.parametrize("shape", ["one file", "many files", "empty entries"])
def test_a_bomb_stops_at_the_layer_limit_and_leaves_nothing(tmp_path, shape):
    limit = 2 * MiB
    files = {"one file": {"zeros": (0o644, 10 * limit)},
             "many files": {f"z{i}": (0o644, 256 << 10) for i in range(80)},  # 10x in 256 KiB pieces
             "empty entries": {f"e{i}": (0o644, b"") for i in range(10 * limit // MEMBER_BYTES)}}[shape]
    archive = crafted_layer(tmp_path / "bomb.tar.zst", files)
    assert archive.stat().st_size < limit // 4  # it is the unpacking that would be big
    box = tmp_path / "box"
    box.mkdir()
    meter = StorageLimits(max_layer_bytes=limit, min_free_bytes=0).meter(box)
    before = thread_wchar()
    with pytest.raises(StorageLimitError) as info:
        unpack_layer(archive, box / "dest", meter=meter)
    written = thread_wchar() - before
    assert info.value.limit == "max_layer_bytes" and info.value.value == limit
    assert "max_layer_bytes" in str(info.value)
    assert written <= limit  # stopped at the limit, not after the bomb went off
    assert meter.used <= limit
    assert list(box.iterdir()) == []  # no dest, no half-unpacked temp dir


def test_a_plain_tar_download_is_bounded_too(tmp_path):
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("./big")
        info.size = 4 * MiB
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    meter = StorageLimits(max_layer_bytes=MiB, min_free_bytes=0).meter(tmp_path)
    with pytest.raises(StorageLimitError, match="max_layer_bytes"):
        unpack_plain_tar(buf.getvalue(), tmp_path / "out", meter=meter)
    assert list(tmp_path.iterdir()) == []


@needs_root
def test_the_free_space_reserve_holds_on_a_small_disk(tmp_path):
    """A real 64 MiB disk keeping 32 MiB free: a layer of 320 MiB stops before the reserve."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        archive = crafted_layer(tmp_path / "bomb.tar.zst", {f"z{i}": (0o644, 4 * MiB) for i in range(80)})
        free_before = free_bytes(disk)
        reserve = 32 * MiB
        limits = StorageLimits(max_layer_bytes=1 << 40, min_free_bytes=reserve)
        before = thread_wchar()
        with pytest.raises(StorageFullError) as info:
            unpack_layer(archive, disk / "dest", meter=limits.meter(disk))
        assert thread_wchar() - before <= free_before - reserve  # the reserve was never touched
        assert info.value.limit == "min_free_bytes" and "min_free_bytes" in str(info.value)
        assert list(disk.iterdir()) == []
        assert free_bytes(disk) == free_before  # all of it given back
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_chain_is_bounded_as_a_whole(tmp_path):
    limits = StorageLimits(max_layer_bytes=2 * MiB, max_chain_bytes=3 * MiB, min_free_bytes=0)
    store = SnapshotStore(tmp_path / "home", limits)
    base = store.import_tarball(crafted_layer(tmp_path / "a", {"a": (0o644, int(1.5 * MiB))}))
    top = store.import_tarball(crafted_layer(tmp_path / "b", {"b": (0o644, int(1.8 * MiB))},
                                             meta={"parents": [base]}))
    assert store.load(base).layers == (base,)  # each alone fits
    with pytest.raises(StorageLimitError) as info:
        store.load(top)
    assert info.value.limit == "max_chain_bytes"
    assert not (store.layer_root / top[7:]).exists() and leftovers(tmp_path / "home") == []


def test_sandboxes_of_a_new_image_starting_together_unpack_its_layer_once_without_error(tmp_path):
    """Eight threads ask for the same layer of a fresh store at once (a warm pool's sandboxes of
    an image not unpacked yet): each gets the complete layer; the losers of the race to rename it
    into place drop their copies (no temp dir left) instead of failing with "appeared while
    unpacking" (what every rollout episode of a new agent image but one hit)."""
    import threading

    store = SnapshotStore(tmp_path / "home", StorageLimits(min_free_bytes=0))
    digest = store.import_tarball(crafted_layer(tmp_path / "l", {f"f{i}": (0o644, 256 * 1024) for i in range(64)}))
    start, results = threading.Barrier(8), []

    def ask() -> None:
        start.wait()
        try:
            results.append(store.layer_dir(digest))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dest = store.layer_root / digest[7:]
    assert results == [dest] * 8, [r for r in results if not isinstance(r, Path)]
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"f{i}" for i in range(64))
    assert all((dest / f"f{i}").stat().st_size == 256 * 1024 for i in range(64))
    assert leftovers(tmp_path / "home") == []
    assert store.layer_bytes(digest) >= 64 * 256 * 1024


def test_a_compressed_file_past_the_layer_limit_is_not_imported(tmp_path):
    store = SnapshotStore(tmp_path / "home", StorageLimits(max_layer_bytes=MiB, min_free_bytes=0))
    big = tmp_path / "big.tar.zst"
    big.write_bytes(os.urandom(2 * MiB))
    with pytest.raises(StorageLimitError, match="max_layer_bytes"):
        store.import_tarball(big)
    assert not (store.tar_root / "sha256").exists() or list((store.tar_root / "sha256").iterdir()) == []


# ------------------------------------------------------------------ the state home


@needs_root
def test_an_open_home_from_an_older_install_is_repaired(world_tmp):
    """An older install left the home 0755 with a setuid-root file in an unpacked layer:
    another local user could run it. After the repair nothing under the home is reachable."""
    home = world_tmp / "home"
    suid = home / "layers" / "sha256" / ("ab" * 32) / "su"
    suid.parent.mkdir(parents=True)
    shutil.copy("/bin/true", suid)
    os.chmod(suid, 0o4755)
    for d in (home, home / "layers", home / "layers" / "sha256", suid.parent):
        os.chmod(d, 0o755)
    assert other_user_reaches(suid) == {"stat": True, "read": True, "run": True}  # the attack works

    private_home(home)

    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "layers").stat().st_mode) == 0o700
    assert not suid.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert other_user_reaches(suid) == {"stat": False, "read": False, "run": False}
    assert other_user_reaches(home) == {"stat": True, "read": False, "run": False}


def test_a_new_home_is_private(tmp_path):
    store = SnapshotStore(tmp_path / "fresh" / "home")
    assert stat.S_IMODE((tmp_path / "fresh" / "home").stat().st_mode) == 0o700
    assert store.limits == StorageLimits.from_env()


@needs_root
def test_a_running_sandbox_s_setuid_file_is_out_of_other_users_reach(world_tmp, monkeypatch):
    """Root in a local sandbox is root on the host's files: its setuid-root copy of a shell
    sits in the upper dir while it runs, and in the snapshot it takes. With a disk limit (the
    default) the upper dir is a filesystem mounted in the sandbox's mount namespace only, so
    the host's tree does not show it at all; without one (``disk_mb=None``) it is under the
    home, which another user cannot enter."""
    monkeypatch.setenv("ROCKROLL_HOME", str(world_tmp / "home"))
    upper = "*/*/upper*/workspace/rootsh"
    with open_sandbox(SandboxSpec()) as sb:
        assert sb.run("cp /bin/sh /workspace/rootsh && chmod 4755 /workspace/rootsh").exit_code == 0
        assert not list((world_tmp / "home" / "runs").glob(upper))
    with open_sandbox(SandboxSpec(disk_mb=None)) as sb:
        assert sb.run("cp /bin/sh /workspace/rootsh && chmod 4755 /workspace/rootsh").exit_code == 0
        planted = list((world_tmp / "home" / "runs").glob(upper))
        assert planted and planted[0].stat().st_mode & stat.S_ISUID  # the attack is in place...
        assert other_user_reaches(planted[0]) == {"stat": False, "read": False, "run": False}  # ...out of reach
        snap = sb.snapshot()
        layer = world_tmp / "home" / "layers" / "sha256" / snap.digest[7:] / "workspace" / "rootsh"
        assert stat.S_IMODE(layer.stat().st_mode) == 0o755  # the snapshot's copy lost the bit
        assert other_user_reaches(layer) == {"stat": False, "read": False, "run": False}


# ------------------------------------------------------------------ the upload path


@pytest.fixture
def service(world_tmp, monkeypatch):
    """A service with small limits whose state home another user could traverse to, were
    it not private."""
    monkeypatch.setenv("ROCKROLL_HOME", str(world_tmp / "home"))
    server = Server("--max-layer-bytes", "2M", "--max-chain-bytes", "3M", "--min-free-bytes", "0",
                    "--token-storage-quota", "5M")
    yield server
    server.stop()


def upload(server: Server, path: Path):
    return server.http.post("/v1/snapshots", content=path.read_bytes())


@needs_root
def test_upload_attacks_are_refused_or_defused(service, world_tmp, tmp_path):
    home = world_tmp / "home"
    # 1. a setuid-root file: accepted, without the bit, nowhere another user can reach
    r = upload(service, crafted_layer(tmp_path / "suid.tar.zst", {"su": (0o4755, Path("/bin/true").read_bytes())}))
    assert r.status_code == 201, r.text
    su = home / "layers" / "sha256" / r.json()["digest"][7:] / "su"
    assert stat.S_IMODE(su.stat().st_mode) == 0o755 and su.stat().st_uid == 0
    for path in (su, su.parent, home / "snapshots", home / "layers"):
        assert other_user_reaches(path) == {"stat": False, "read": False, "run": False}, path
    assert stat.S_IMODE(home.stat().st_mode) == 0o700

    # 2. a bomb: 20 MiB of zeros in a few KiB, 10x the 2 MiB limit
    bomb = crafted_layer(tmp_path / "bomb.tar.zst", {"zeros": (0o644, 20 * MiB)})
    io_file = f"/proc/{service.proc.pid}/io"
    before = thread_wchar(io_file)
    r = upload(service, bomb)
    # the unpacking, the upload's temp file and its copy, the answer: never the bomb's 20 MiB
    assert thread_wchar(io_file) - before <= 2 * MiB + 2 * bomb.stat().st_size + (64 << 10)
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "StorageLimitError" and r.json()["limit"] == "max_layer_bytes"
    assert "max_layer_bytes" in r.json()["message"]
    digest = digest_file(bomb)
    assert not (home / "snapshots" / "sha256" / f"{digest[7:]}.tar.zst").exists()
    assert not (home / "layers" / "sha256" / digest[7:]).exists()
    assert leftovers(home) == []

    # 3. an upload larger than a layer may be, refused on its Content-Length
    r = service.http.post("/v1/snapshots", content=os.urandom(3 * MiB))
    assert r.status_code == 413 and r.json()["limit"] == "max_layer_bytes"
    assert leftovers(home) == []

    # 4. the token's quota (5 MiB): 1.5 MiB layers until it is full, then 507
    codes = [upload(service, crafted_layer(tmp_path / f"q{i}.tar.zst", {f"f{i}": (0o644, int(1.5 * MiB))})).status_code
             for i in range(4)]
    assert codes == [201, 201, 201, 507]  # 3 x 1.5 MiB (+ the setuid layer) fit, a fourth does not
    r = upload(service, crafted_layer(tmp_path / "q9.tar.zst", {"f9": (0o644, MiB)}))
    assert r.status_code == 507 and r.json()["limit"] == "token_storage_quota", r.text
    assert leftovers(home) == []
    metrics = service.http.get("/metrics").text
    used = [line for line in metrics.splitlines() if line.startswith("rockroll_storage_used_bytes{token=")]
    assert len(used) == 1 and "test-token" not in used[0]
    assert 4.5 * MiB < float(used[0].split()[-1]) <= 5 * MiB
    values = {(x.name, tuple(x.labels.items())): x.value for f in text_string_to_metric_families(metrics)
              for x in f.samples}
    assert values[("rockroll_storage_quota_bytes", ())] == 5 * MiB
    assert values[("rockroll_storage_limit_bytes", (("limit", "max_layer_bytes"),))] == 2 * MiB


def test_an_upload_below_the_free_space_reserve_gets_507(world_tmp, monkeypatch, tmp_path):
    monkeypatch.setenv("ROCKROLL_HOME", str(world_tmp / "home"))
    server = Server("--min-free-bytes", "1024T")  # more than any disk here has
    try:
        r = upload(server, crafted_layer(tmp_path / "small.tar.zst", {"a": (0o644, b"a")}))
        assert r.status_code == 507, r.text
        assert r.json()["error"] == "StorageFullError" and r.json()["limit"] == "min_free_bytes"
        assert leftovers(world_tmp / "home") == []
    finally:
        server.stop()


def token_used(server: Server) -> int:
    """What ``/metrics`` says the server's token holds."""
    used = [line for line in server.http.get("/metrics").text.splitlines()
            if line.startswith("rockroll_storage_used_bytes{token=")]
    assert len(used) <= 1
    return int(float(used[0].split()[-1])) if used else 0


def quota_record(home: Path) -> dict[str, int]:
    """The quota's charges as stored on disk: ``{digest: bytes}`` of the one token."""
    files = list((home / "service-quota").glob("*.json"))
    assert len(files) <= 1
    return json.loads(files[0].read_text()) if files else {}


def stored(home: Path) -> dict[str, tuple[bool, bool]]:
    """Every layer in the store on disk: digest -> (its tarball is there, its unpacked dir is)."""
    tars = {f"sha256:{p.name[:64]}" for p in (home / "snapshots" / "sha256").glob("*.tar.zst")}
    dirs = {f"sha256:{p.name}" for p in (home / "layers" / "sha256").glob("*") if p.is_dir()}
    return {d: (d in tars, d in dirs) for d in tars | dirs}


def measured(home: Path, digest: str) -> int:
    """What a layer takes, measured on disk as the quota counts it: its tarball, and per
    entry of its unpacked dir a member's cost plus a regular file's bytes."""
    total = (home / "snapshots" / "sha256" / f"{digest[7:]}.tar.zst").stat().st_size
    for root, dirnames, filenames in os.walk(home / "layers" / "sha256" / digest[7:]):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(root, name))
            total += MEMBER_BYTES + (st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return total


def assert_charged_exactly(server: Server, home: Path) -> None:
    """The token is charged for each layer it holds what that layer takes on disk (the
    unpacked root entry aside), and every layer it holds is in the store whole."""
    record = quota_record(home)
    on_disk = stored(home)
    for digest, nbytes in record.items():
        assert on_disk[digest] == (True, True), digest
        assert 0 <= nbytes - measured(home, digest) <= MEMBER_BYTES, digest
    assert token_used(server) == sum(record.values())


def test_a_snapshot_through_the_service_is_charged_to_the_quota(service, world_tmp):
    """Snapshots taken through the service cost the token what they store; one that does
    not fit is refused with 507 and removed; a quota already used up refuses before the
    sandbox is copied at all."""
    home = world_tmp / "home"
    sid = service.create()
    r = service.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "head -c 1048576 /dev/urandom > /workspace/a"})
    assert r.json()["exit_code"] == 0, r.text
    r = service.http.post(f"/v1/sandboxes/{sid}/snapshots")
    assert r.status_code == 201, r.text
    first = r.json()["digest"]
    assert list(quota_record(home)) == [first]
    assert quota_record(home)[first] > 2 * MiB  # the random MiB, packed and unpacked
    assert_charged_exactly(service, home)
    used = token_used(service)

    # the same state again: the same layer, which the token holds already, costs nothing
    r = service.http.post(f"/v1/sandboxes/{sid}/snapshots")
    assert r.status_code == 201 and r.json()["digest"] == first, r.text
    assert token_used(service) == used

    # filled past the quota: 3 MiB of random bytes pack and unpack to ~6 MiB, ~3 MiB are left
    r = service.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "head -c 2097152 /dev/urandom > /workspace/b"})
    assert r.json()["exit_code"] == 0, r.text
    before = stored(home)
    r = service.http.post(f"/v1/sandboxes/{sid}/snapshots")
    assert r.status_code == 507, r.text
    body = r.json()
    assert (body["error"], body["limit"], body["value"], body["sandbox_id"]) == (
        "StorageFullError", "token_storage_quota", 5 * MiB, sid)
    assert "token_storage_quota" in body["message"]
    assert stored(home) == before and leftovers(home) == []  # the refused layer is gone, tarball and dir
    assert token_used(service) == used and list(quota_record(home)) == [first]
    assert_charged_exactly(service, home)
    r = service.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "cat /workspace/a /workspace/b | wc -c"})
    assert r.json()["stdout"] == f"{3 * MiB}\n"  # the sandbox lost nothing

    # the operator lowers the quota below what the token holds: refused before any copy
    service.stop()
    lowered = Server("--max-layer-bytes", "2M", "--max-chain-bytes", "3M", "--min-free-bytes", "0",
                     "--token-storage-quota", "1M")
    try:
        sid = lowered.create()
        r = lowered.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "head -c 1048576 /dev/urandom > /workspace/a"})
        assert r.json()["exit_code"] == 0, r.text
        io_file = f"/proc/{lowered.proc.pid}/io"
        written = thread_wchar(io_file)
        r = lowered.http.post(f"/v1/sandboxes/{sid}/snapshots")
        assert thread_wchar(io_file) - written < 64 << 10  # nothing was packed: the MiB never moved
        assert r.status_code == 507 and r.json()["limit"] == "token_storage_quota", r.text
        assert r.json()["sandbox_id"] == sid and f"holds {used} bytes" in r.json()["message"]
        assert stored(home) == before and leftovers(home) == []
        assert_charged_exactly(lowered, home)
    finally:
        lowered.stop()


def test_an_upload_unpacks_no_further_than_the_quota_has_left(service, world_tmp, tmp_path):
    """A layer whose unpacked size passes what the token has left (but no size limit)
    stops there: the server wrote at most what was left, and nothing stays."""
    home = world_tmp / "home"
    r = upload(service, crafted_layer(tmp_path / "r.tar.zst", {"r": (0o644, os.urandom(int(1.75 * MiB)))}))
    assert r.status_code == 201, r.text
    assert_charged_exactly(service, home)
    left = 5 * MiB - token_used(service)
    assert MiB < left < int(1.6 * MiB)

    bomb = crafted_layer(tmp_path / "bomb.tar.zst", {"zeros": (0o644, int(1.9 * MiB))})  # < max_layer_bytes
    before, used = stored(home), token_used(service)
    io_file = f"/proc/{service.proc.pid}/io"
    written = thread_wchar(io_file)
    r = upload(service, bomb)
    # the upload's temp file and its copy, the part unpacked until the quota stopped it
    assert thread_wchar(io_file) - written <= left + 2 * bomb.stat().st_size + (64 << 10)
    assert r.status_code == 507, r.text
    assert (r.json()["error"], r.json()["limit"], r.json()["value"]) == ("StorageFullError", "token_storage_quota",
                                                                        5 * MiB)
    assert stored(home) == before and leftovers(home) == []
    assert token_used(service) == used
    assert_charged_exactly(service, home)

    # what fits is still taken, and charged exactly; the same layer again costs nothing
    small = crafted_layer(tmp_path / "s.tar.zst", {"s": (0o644, os.urandom(256 << 10))})
    for _ in range(2):
        assert upload(service, small).status_code == 201
        assert_charged_exactly(service, home)
    assert len(quota_record(home)) == 2


# ------------------------------------------------------------------ what a sandbox hands the host


def test_read_and_download_of_a_huge_sparse_file_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCKROLL_MAX_LAYER_BYTES", "4M")
    with open_sandbox(SandboxSpec()) as sb:
        assert sb.run("truncate -s 1T /workspace/big && mkdir /workspace/d && "
                      "truncate -s 40M /workspace/d/big").exit_code == 0
        with pytest.raises(StorageLimitError, match="max_layer_bytes"):
            sb.read_file("/workspace/big")
        with pytest.raises(StorageLimitError, match="max_layer_bytes"):
            sb.download("/workspace/big", tmp_path / "big")
        with pytest.raises(StorageLimitError, match="max_layer_bytes"):
            sb.download("/workspace/d", tmp_path / "d")
        assert list(tmp_path.iterdir()) == []
        sb.write_file("/workspace/small", "ok")
        assert sb.read_file("/workspace/small") == b"ok"


def test_no_snapshot_is_taken_below_the_free_space_reserve(monkeypatch):
    monkeypatch.setenv("ROCKROLL_MIN_FREE_BYTES", "1024T")  # more than any disk here has
    with open_sandbox(SandboxSpec()) as sb:
        with pytest.raises(StorageFullError, match="min_free_bytes") as info:
            sb.snapshot()
        assert info.value.sandbox_id == sb.id
        assert sb.run("echo still-alive").stdout == "still-alive\n"


def test_remote_reads_and_downloads_are_bounded_on_the_client(world_tmp, monkeypatch, tmp_path):
    from rockroll.sandbox.runtime import remote

    monkeypatch.setenv("ROCKROLL_HOME", str(world_tmp / "home"))
    server = Server()
    remote.configure(server.url, server.token)
    monkeypatch.setenv("ROCKROLL_MAX_LAYER_BYTES", "4M")  # the client's own setting
    try:
        with open_sandbox(SandboxSpec(backend="remote")) as sb:
            assert sb.run("truncate -s 64M /workspace/big").exit_code == 0  # 16x the limit
            with pytest.raises(StorageLimitError, match="max_layer_bytes"):
                sb.read_file("/workspace/big")
            with pytest.raises(StorageLimitError, match="max_layer_bytes"):
                sb.download("/workspace/big", tmp_path / "big")
            assert list(tmp_path.iterdir()) == []
            sb.write_file("/workspace/small", "ok")
            assert sb.read_file("/workspace/small") == b"ok"
    finally:
        remote.configure(None)
        server.stop()


# ------------------------------------------------------------------ settings and the wire


def test_a_meter_stops_at_its_smallest_bound_with_that_bound_s_error(tmp_path):
    limits = StorageLimits(max_layer_bytes=4 * MiB, max_chain_bytes=16 * MiB, min_free_bytes=0)
    quota = Bound(MiB, "token_storage_quota", 5 * MiB, StorageFullError)
    cases = [(None, None, 4 * MiB, "max_layer_bytes", StorageLimitError),
             (2 * MiB, None, 2 * MiB, "max_chain_bytes", StorageLimitError),
             (4 * MiB, None, 4 * MiB, "max_layer_bytes", StorageLimitError),  # a tie: the layer limit
             (2 * MiB, quota, MiB, "token_storage_quota", StorageFullError),
             (-5, quota, 0, "max_chain_bytes", StorageLimitError)]  # a chain already past its limit
    for room, bound, fits, name, error in cases:
        meter = limits.meter(tmp_path, room=room, bound=bound)
        meter.charge(fits)  # exactly the bound fits
        with pytest.raises(StorageLimitError) as info:
            meter.charge(1)
        assert type(info.value) is error and info.value.limit == name, (room, bound)
        assert meter.used == fits


def test_limits_read_sizes_and_name_a_bad_one():
    limits = StorageLimits.from_env({"ROCKROLL_MAX_LAYER_BYTES": "512M", "ROCKROLL_MIN_FREE_BYTES": "0"})
    assert (limits.max_layer_bytes, limits.max_chain_bytes, limits.min_free_bytes) == (512 * MiB, 16 << 30, 0)
    assert StorageLimits(max_layer_bytes="1GiB").max_layer_bytes == 1 << 30
    for bad, field in (({"max_chain_bytes": "lots"}, "max_chain_bytes"), ({"max_layer_bytes": 0}, "max_layer_bytes"),
                       ({"min_free_bytes": -1}, "min_free_bytes")):
        with pytest.raises(SpecError) as info:
            StorageLimits(**bad)
        assert info.value.field == field


def test_a_limit_error_crosses_the_wire_with_its_limit():
    from rockroll.sandbox.protocol.wire import error_body, error_from_body, status_of

    for exc, status in ((StorageLimitError("max_layer_bytes", MiB, "layer x is too big"), 413),
                        (StorageFullError("token_storage_quota", 5 * MiB, "quota used up"), 507)):
        body = error_body(exc)
        assert status_of(exc) == status and body["limit"] == exc.limit and body["value"] == exc.value
        back = error_from_body(status, body)
        assert type(back) is type(exc) and (back.limit, back.value, str(back)) == (exc.limit, exc.value, str(exc))
