"""snapshot / restore / fork / reset, and the tarball safety of restore()."""

import io
import tarfile

import pytest
import zstandard

from rockroll.sandbox import SandboxSpec, SnapshotError, UnsafeArchiveError, open_sandbox
from rockroll.sandbox.storage.layers import read_meta


def test_snapshot_restore_in_place(sb):
    sb.run("mkdir -p /workspace/p && echo one > /workspace/p/f && rm /etc/hosts && cd /workspace/p && export S=1")
    snap = sb.snapshot()
    assert snap.digest.startswith("sha256:") and snap.size > 0 and snap.id == snap.digest[7:19]
    assert snap.path.exists() and snap.layers == (snap.digest,)
    meta = read_meta(snap.path)
    assert "cd -- /workspace/p" in meta["sessions"]["default"]
    sb.run("echo two > /workspace/p/f; echo new > /workspace/new; cd /; export S=2")
    sb.restore(snap)
    r = sb.run("cat /workspace/p/f; ls /workspace; test -e /etc/hosts || echo nohosts; pwd; echo $S")
    assert r.stdout == "one\np\nnohosts\n/workspace/p\n1\n"


def test_snapshot_is_content_addressed(sb):
    sb.run("echo same > /workspace/f")
    a = sb.snapshot()
    b = sb.snapshot()
    assert a.digest == b.digest  # nothing changed: the same bytes, the same digest
    sb.run("echo other > /workspace/f")
    assert sb.snapshot().digest != a.digest


def test_chained_snapshots_and_restore_of_either(sb):
    sb.run("echo 1 > /workspace/a")
    first = sb.snapshot()
    sb.restore(first)
    sb.run("echo 2 > /workspace/b; rm /workspace/a")
    second = sb.snapshot()
    assert second.layers == (first.digest, second.digest)
    sb.restore(first)
    assert sb.run("ls /workspace").stdout == "a\n"
    sb.restore(second)
    assert sb.run("ls /workspace").stdout == "b\n"


def test_fork_makes_independent_copy_on_write_copies(sb):
    sb.run("echo base > /workspace/f; cd /tmp; export K=v")
    forks = sb.fork(3)
    try:
        assert len({f.id for f in forks} | {sb.id}) == 4
        for i, f in enumerate(forks):
            assert f.run("cat /workspace/f; pwd; echo $K").stdout == "base\n/tmp\nv\n"
            f.run(f"echo {i} > /workspace/f")
        assert [f.read_file("/workspace/f") for f in forks] == [b"0\n", b"1\n", b"2\n"]
        assert sb.read_file("/workspace/f") == b"base\n"
    finally:
        for f in forks:
            f.close()


def test_fork_is_copy_on_write_both_ways(sb):
    sb.write_file("/workspace/shared", b"base")
    sb.write_file("/workspace/doomed", b"keep")
    a, b = sb.fork(2)
    try:
        # a child's writes, new files and deletions: invisible to the parent and to its sibling
        a.write_file("/workspace/shared", b"from a")
        a.write_file("/workspace/only-a", b"a")
        a.run("rm /workspace/doomed")
        assert sb.read_file("/workspace/shared") == b.read_file("/workspace/shared") == b"base"
        assert sb.run("ls /workspace").stdout == b.run("ls /workspace").stdout == "doomed\nshared\n"
        # the parent's writes after the fork: invisible to the children
        sb.write_file("/workspace/shared", b"parent later")
        sb.write_file("/workspace/only-parent", b"p")
        assert a.read_file("/workspace/shared") == b"from a" and b.read_file("/workspace/shared") == b"base"
        assert a.run("ls /workspace").stdout == "only-a\nshared\n"
        assert b.run("ls /workspace").stdout == "doomed\nshared\n"
    finally:
        a.close()
        b.close()


def test_restore_removes_later_files_and_brings_back_deleted_ones_byte_for_byte(sb):
    blob = bytes(range(256)) * 4096 + b"\0tail\n"  # 1 MiB and change, every byte value, NULs
    sb.write_file("/workspace/blob.bin", blob)
    sb.write_file("/workspace/edited", b"before\n")
    sb.run("mkdir -p /workspace/dir && echo x > /workspace/dir/x && chmod 640 /workspace/edited")
    snap = sb.snapshot()
    sb.run("rm -r /workspace/blob.bin /workspace/dir /etc/hostname; echo after >> /workspace/edited; "
           "chmod 600 /workspace/edited; echo new > /workspace/new; mkdir /workspace/newdir")
    sb.restore(snap)
    assert sb.read_file("/workspace/blob.bin") == blob
    assert sb.read_file("/workspace/edited") == b"before\n" and sb.read_file("/workspace/dir/x") == b"x\n"
    assert sb.run("stat -c %a /workspace/edited; ls /workspace; test -e /etc/hostname && echo hostname").stdout \
        == "640\nblob.bin\ndir\nedited\nhostname\n"


def test_open_from_snapshot_and_reset_goes_to_image(spec, sb):
    sb.run("echo saved > /workspace/s")
    snap = sb.snapshot()
    with open_sandbox(spec, snapshot=snap) as other:
        assert other.read_file("s") == b"saved\n"
        other.reset()
        assert other.run("ls -A /workspace").stdout == ""
    with open_sandbox(spec, snapshot=snap.digest) as by_digest:
        assert by_digest.read_file("s") == b"saved\n"
    with open_sandbox(spec, snapshot=str(snap.path)) as by_path:
        assert by_path.read_file("s") == b"saved\n"


def _evil_tarball(path, members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name, kind, **kw):
    info = tarfile.TarInfo(name)
    info.type = kind
    for k, v in kw.items():
        setattr(info, k, v)
    return info, None


@pytest.mark.parametrize("members", [
    [_file("/etc/evil")],
    [_file("rootfs/../../evil")],
    [_special("rootfs/dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0)],
    [_special("rootfs/dev/mem", tarfile.CHRTYPE, devmajor=1, devminor=1)],
    [_special("rootfs/x", tarfile.SYMTYPE, linkname="../../../../etc"), _file("rootfs/x/passwd")],
    [_special("rootfs/l", tarfile.SYMTYPE, linkname="../../../../../etc/shadow")],
    [_special("rootfs/h", tarfile.LNKTYPE, linkname="/etc/shadow")],
], ids=["absolute", "dotdot", "blockdev", "chardev", "through-symlink", "escaping-symlink", "hardlink-out"])
def test_restore_refuses_unsafe_tarballs(sb, tmp_path, members):
    evil = _evil_tarball(tmp_path / "evil.tar.zst", members)
    sb.run("echo keep > /workspace/k")
    with pytest.raises(UnsafeArchiveError):
        sb.restore(evil)
    # refused before anything changed: the sandbox still runs with its files
    assert sb.read_file("k") == b"keep\n"


def test_restore_refuses_other_image_and_garbage(sb, tmp_path):
    bad = tmp_path / "garbage.tar.zst"
    bad.write_bytes(b"not a tarball at all")
    with pytest.raises(SnapshotError):
        sb.restore(bad)
    with pytest.raises(SnapshotError):
        sb.restore("sha256:" + "0" * 64)
    assert sb.run("echo ok").stdout == "ok\n"
