"""Tests of rockroll.sandbox.storage.layers: real files, real tarballs, a real overlayfs mount."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from rockroll.sandbox.errors import SnapshotError, UnsafeArchiveError
from rockroll.sandbox.storage.layers import LayerInfo, digest_file, pack_layer, read_meta, unpack_layer, unpack_plain_tar

IS_ROOT = os.geteuid() == 0
OPAQUE = "trusted.overlay.opaque"


# ----------------------------------------------------------------------------- helpers


def listing(root: Path) -> dict[str, tuple]:
    """Everything that matters about a tree, by relative path (hardlinks by shared group)."""
    out: dict[str, tuple] = {}
    first_path: dict[tuple[int, int], str] = {}
    paths = [root] + sorted(
        Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files
    )
    for path in paths:
        rel = str(path.relative_to(root))
        st = os.lstat(path)
        mode = st.st_mode
        if stat.S_ISCHR(mode):  # whiteouts: only the device number is meaningful
            out[rel] = ("whiteout" if st.st_rdev == 0 else "chr", st.st_rdev)
            continue
        common = (stat.S_IMODE(mode), st.st_uid, st.st_gid, st.st_mtime_ns)
        if stat.S_ISDIR(mode):
            try:
                opaque = os.getxattr(path, OPAQUE, follow_symlinks=False)
            except OSError:
                opaque = None
            out[rel] = ("dir", *common, opaque)
        elif stat.S_ISLNK(mode):
            out[rel] = ("link", st.st_uid, st.st_gid, st.st_mtime_ns, os.readlink(path))
        elif stat.S_ISFIFO(mode):
            out[rel] = ("fifo", *common)
        elif stat.S_ISREG(mode):
            group = first_path.setdefault((st.st_dev, st.st_ino), rel) if st.st_nlink > 1 else None
            out[rel] = ("file", *common, hashlib.sha256(path.read_bytes()).hexdigest(), group)
        else:
            out[rel] = ("other", mode)
    return out


def make_tree(root: Path) -> None:
    """A tree with one of everything a sandbox upper dir can hold."""
    (root / "workspace/src/pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "workspace/a.txt").write_text("hello\n")
    (root / "workspace/src/pkg/mod.py").write_text("print('hi')\n")
    (root / "workspace/big.bin").write_bytes(os.urandom(3 << 20))  # several zstd blocks
    (root / "workspace/zeros.bin").write_bytes(bytes(5 << 20))
    run = root / "workspace/run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    suid = root / "workspace/suid"
    suid.write_bytes(b"x")
    if IS_ROOT:
        os.chown(suid, 1234, 5678)
    suid.chmod(0o4750)
    long_dir = root / ("d" * 120) / "ünïcödé"
    long_dir.mkdir(parents=True)
    (long_dir / ("f" * 150)).write_text("long names need pax headers")
    os.symlink("../a.txt", root / "workspace/src/rel-link")
    os.symlink("/etc/hostname", root / "workspace/abs-link")
    os.symlink("missing", root / "workspace/dangling")
    os.link(root / "workspace/a.txt", root / "workspace/hard1")
    os.link(root / "workspace/a.txt", root / "workspace/src/hard2")
    os.mkfifo(root / "workspace/fifo")
    os.mknod(root / "workspace/deleted.txt", stat.S_IFCHR, 0)  # whiteouts
    os.mknod(root / "gone", stat.S_IFCHR, 0)
    (root / "opaque/sub").mkdir(parents=True)
    (root / "opaque/sub/new.txt").write_text("new")
    os.setxattr(root / "opaque", OPAQUE, b"y")
    os.utime(root / "workspace/a.txt", ns=(1, 1_700_000_000_123_456_789))  # nanoseconds kept
    os.utime(root / "workspace/abs-link", ns=(1, 1_600_000_000_000_000_001), follow_symlinks=False)


def members(archive: Path) -> list[tarfile.TarInfo]:
    with zstandard.ZstdDecompressor().stream_reader(archive.open("rb")) as r:
        return tarfile.open(fileobj=io.BytesIO(r.read()), mode="r:").getmembers()


def craft(path: Path, entries: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
    """Write a zstd-compressed PAX tar of hand-made members, as an attacker would."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", dev: tuple[int, int] = (0, 0), data=b""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, (info.devmajor, info.devminor) = kind, link, dev
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return (info, data) if data else info


def F(name, data=b"pwned"):
    return member(name, data=data)


def D(name):
    return member(name, tarfile.DIRTYPE)


def S(name, target):
    return member(name, tarfile.SYMTYPE, target)


def H(name, target):
    return member(name, tarfile.LNKTYPE, target)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".unpack-" in p.name or p.name.startswith(".tmp-"))


# ----------------------------------------------------------------------------- round trips


@pytest.mark.skipif(not IS_ROOT, reason="whiteout devices, trusted.* xattrs and chown need root")
def test_round_trip_gives_an_equivalent_tree(tmp_path):
    src = tmp_path / "upper"
    src.mkdir()
    make_tree(src)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "workspace/agent.sock"))  # sockets are skipped
    sock.close()
    before = listing(src)
    del before["workspace/agent.sock"]

    info = pack_layer(src, tmp_path / "layers", meta={"session": {"cwd": "/workspace"}, "parents": []})

    assert isinstance(info, LayerInfo)
    assert info.path == tmp_path / "layers/sha256" / f"{info.digest.removeprefix('sha256:')}.tar.zst"
    assert info.size == info.path.stat().st_size
    assert digest_file(info.path) == info.digest
    names = [m.name for m in members(info.path)]
    assert names[0] == "rockroll.json" and names[1] == "rootfs"
    assert info.files == len(names) - 2
    assert "rootfs/workspace/.wh.deleted.txt" in names and "rootfs/.wh.gone" in names
    assert "rootfs/opaque/.wh..wh..opq" in names
    assert "rootfs/workspace/agent.sock" not in names
    assert {m.name: m.linkname for m in members(info.path) if m.islnk()} == {
        "rootfs/workspace/hard1": "rootfs/workspace/a.txt",
        "rootfs/workspace/src/hard2": "rootfs/workspace/a.txt",
    }
    assert read_meta(info.path) == {"session": {"cwd": "/workspace"}, "parents": []}

    meta = unpack_layer(info.path, tmp_path / "restored")
    assert meta == {"session": {"cwd": "/workspace"}, "parents": []}
    suid = before["workspace/suid"]  # the layer keeps the bit; the host never gets it
    assert suid[1] == 0o4750
    before["workspace/suid"] = (suid[0], 0o750, *suid[2:])
    assert listing(tmp_path / "restored") == before
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(not IS_ROOT, reason="whiteout devices and trusted.* xattrs need root")
def test_keep_mode_leaves_whiteouts_as_files(tmp_path):
    src = tmp_path / "upper"
    src.mkdir()
    make_tree(src)
    info = pack_layer(src, tmp_path / "layers")
    assert read_meta(info.path) == {}

    assert unpack_layer(info.path, tmp_path / "out", whiteouts="keep") == {}

    out = tmp_path / "out"
    for marker in ("workspace/.wh.deleted.txt", ".wh.gone", "opaque/.wh..wh..opq"):
        st = os.lstat(out / marker)
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0
    assert not os.path.lexists(out / "workspace/deleted.txt")
    with pytest.raises(OSError):
        os.getxattr(out / "opaque", OPAQUE)


def test_reproducible_layers_are_byte_identical(tmp_path):
    def tree(root: Path, mtime_ns: int, owner: int) -> Path:
        (root / "w/sub").mkdir(parents=True)
        (root / "w/sub/f.txt").write_text("same content")
        (root / "w/x.sh").write_text("#!/bin/sh\n")
        (root / "w/x.sh").chmod(0o755)
        os.symlink("sub/f.txt", root / "w/link")
        os.link(root / "w/x.sh", root / "w/x2.sh")
        for path in [root, *root.rglob("*")]:
            if IS_ROOT:
                os.chown(path, owner, owner, follow_symlinks=False)
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        return root

    a = tree(tmp_path / "a", 1_000_000_000_000_000_000, 1000)
    b = tree(tmp_path / "b", 1_700_000_000_555_000_000, 2000)

    la = pack_layer(a, tmp_path / "la", meta={"k": [1, 2]}, reproducible=True)
    lb = pack_layer(b, tmp_path / "lb", meta={"k": [1, 2]}, reproducible=True)
    assert la.digest == lb.digest
    assert la.path.read_bytes() == lb.path.read_bytes()
    # Without reproducible=True the mtimes make a difference.
    assert pack_layer(a, tmp_path / "la").digest != pack_layer(b, tmp_path / "lb").digest

    unpack_layer(la.path, tmp_path / "out")
    st = os.lstat(tmp_path / "out/w/sub/f.txt")
    assert (st.st_mtime_ns, st.st_uid, st.st_gid) == (0, 0, 0) if IS_ROOT else st.st_mtime_ns == 0


def test_same_tree_is_stored_once(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d/f").write_text("x")
    first = pack_layer(src, tmp_path / "layers", reproducible=True)
    second = pack_layer(src, tmp_path / "layers", reproducible=True)
    assert second == first
    assert os.listdir(tmp_path / "layers/sha256") == [first.path.name]


def test_digest_file_streams_sha256(tmp_path):
    data = os.urandom(3 << 20)
    (tmp_path / "blob").write_bytes(data)
    assert digest_file(tmp_path / "blob") == "sha256:" + hashlib.sha256(data).hexdigest()


def test_pack_never_follows_symlinks(tmp_path):
    secret = tmp_path / "host/secret"
    secret.parent.mkdir()
    secret.write_text("host secret")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(secret.parent, src / "hostdir")
    os.symlink(secret, src / "hostfile")

    info = pack_layer(src, tmp_path / "layers")

    found = {m.name: (m.type, m.linkname) for m in members(info.path)}
    assert found == {
        "rootfs": (tarfile.DIRTYPE, ""),
        "rootfs/hostdir": (tarfile.SYMTYPE, str(secret.parent)),
        "rootfs/hostfile": (tarfile.SYMTYPE, str(secret)),
    }
    with pytest.raises(SnapshotError):
        pack_layer(src / "hostdir", tmp_path / "layers")  # src itself is a symlink


@pytest.mark.skipif(not IS_ROOT, reason="mknod of a real device needs root")
def test_pack_refuses_real_devices(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(UnsafeArchiveError) as err:
        pack_layer(src, tmp_path / "layers")
    assert err.value.member == "rootfs/null"
    assert os.listdir(tmp_path / "layers/sha256") == []  # temp file removed


def test_pack_refuses_files_named_like_whiteouts(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / ".wh.passwd").write_text("would read as a deletion")
    with pytest.raises(UnsafeArchiveError):
        pack_layer(src, tmp_path / "layers")
    assert os.listdir(tmp_path / "layers/sha256") == []


def test_unpack_refuses_existing_dest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    info = pack_layer(src, tmp_path / "layers")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest/keep").write_text("mine")
    with pytest.raises(SnapshotError):
        unpack_layer(info.path, tmp_path / "dest")
    assert os.listdir(tmp_path / "dest") == ["keep"]
    with pytest.raises(ValueError):
        unpack_layer(info.path, tmp_path / "other", whiteouts="docker")


# ----------------------------------------------------------------------------- attacks

# Each attack gets the host folder (holding `victim`) that it tries to reach.
ATTACKS = {
    "absolute name": lambda host: [D("rootfs"), F(f"{host}/victim")],
    "dotdot name": lambda host: [D("rootfs"), F("rootfs/../../host/victim")],
    "dotdot deep": lambda host: [D("rootfs"), D("rootfs/a"), F("rootfs/a/../../../host/victim")],
    "outside rootfs": lambda host: [D("rootfs"), F("etc/passwd")],
    "metadata not first": lambda host: [D("rootfs"), F("rockroll.json", b"{}")],
    "non-canonical name": lambda host: [D("rootfs"), F("rootfs/./x")],
    "char device": lambda host: [D("rootfs"), member("rootfs/mem", tarfile.CHRTYPE, dev=(1, 1))],
    "whiteout as device": lambda host: [D("rootfs"), member("rootfs/x", tarfile.CHRTYPE, dev=(0, 0))],
    "block device": lambda host: [D("rootfs"), member("rootfs/sda", tarfile.BLKTYPE, dev=(8, 0))],
    "hardlink to host path": lambda host: [D("rootfs"), H("rootfs/h", f"{host}/victim")],
    "hardlink with dotdot": lambda host: [D("rootfs"), H("rootfs/h", "rootfs/../../host/victim")],
    "hardlink to later member": lambda host: [D("rootfs"), H("rootfs/h", "rootfs/z"), F("rootfs/z")],
    "hardlink to directory": lambda host: [D("rootfs"), D("rootfs/d"), H("rootfs/h", "rootfs/d")],
    "symlink climbing out": lambda host: [D("rootfs"), D("rootfs/a"), S("rootfs/a/b", "../../../etc/shadow")],
    "symlink climbing to host": lambda host: [D("rootfs"), D("rootfs/a"), S("rootfs/a/v", "../../host/victim")],
    "symlink dir then write": lambda host: [D("rootfs"), S("rootfs/x", str(host)), F("rootfs/x/victim")],
    "symlink up then write": lambda host: [D("rootfs"), D("rootfs/d"), S("rootfs/d/x", "../.."), F("rootfs/d/x/host/victim")],
    "inner symlink then write": lambda host: [D("rootfs"), D("rootfs/d"), S("rootfs/d/x", ".."), F("rootfs/d/x/f")],
    "symlink then hardlink under it": lambda host: [D("rootfs"), S("rootfs/x", str(host)), H("rootfs/x/victim2", "rootfs/x")],
    "rootfs is a symlink": lambda host: [S("rootfs", str(host)), F("rootfs/victim")],
    "missing parent": lambda host: [D("rootfs"), F("rootfs/nodir/f")],
    "file over directory": lambda host: [D("rootfs"), D("rootfs/d"), F("rootfs/d")],
    "duplicate file": lambda host: [D("rootfs"), F("rootfs/f"), F("rootfs/f")],
    "whiteout with slash": lambda host: [D("rootfs"), F("rootfs/.wh.a/b", b"")],
    "whiteout dir with child": lambda host: [D("rootfs"), D("rootfs/.wh.a"), F("rootfs/.wh.a/b", b"")],
    "whiteout of dotdot": lambda host: [D("rootfs"), F("rootfs/.wh..", b"")],
    "whiteout of nothing": lambda host: [D("rootfs"), F("rootfs/.wh.", b"")],
    "unknown meta whiteout": lambda host: [D("rootfs"), F("rootfs/.wh..wh.plnk", b"")],
    "whiteout with content": lambda host: [D("rootfs"), F("rootfs/.wh.x", b"data")],
    "whiteout and file": lambda host: [D("rootfs"), F("rootfs/.wh.x", b""), F("rootfs/x")],
}


@pytest.mark.parametrize("mode", ["overlay", "keep"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_unpack_refuses_attack(tmp_path, attack, mode):
    host = tmp_path / "host"
    host.mkdir()
    victim = host / "victim"
    victim.write_text("original")
    archive = craft(tmp_path / "evil.tar.zst", ATTACKS[attack](host))
    dest = tmp_path / "dest"

    with pytest.raises(UnsafeArchiveError) as err:
        unpack_layer(archive, dest, whiteouts=mode)

    assert err.value.member and err.value.reason
    assert not os.path.lexists(dest)
    assert leftovers(tmp_path) == []
    assert os.listdir(host) == ["victim"]
    assert victim.read_text() == "original" and victim.stat().st_nlink == 1


def test_hardlink_to_archive_symlink_links_the_symlink_not_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("original")
    archive = craft(tmp_path / "l.tar.zst", [D("rootfs"), S("rootfs/s", str(victim)), H("rootfs/h", "rootfs/s")])

    unpack_layer(archive, tmp_path / "dest")

    assert os.readlink(tmp_path / "dest/h") == str(victim)
    assert victim.stat().st_nlink == 1


def test_absolute_symlinks_are_kept_verbatim(tmp_path):
    archive = craft(tmp_path / "l.tar.zst", [D("rootfs"), D("rootfs/a"), S("rootfs/a/p", "/etc/passwd"), S("rootfs/a/up", "../x")])
    unpack_layer(archive, tmp_path / "dest")
    assert os.readlink(tmp_path / "dest/a/p") == "/etc/passwd"
    assert os.readlink(tmp_path / "dest/a/up") == "../x"


# ----------------------------------------------------------------------------- corrupt archives


def _good_layer(tmp_path: Path) -> LayerInfo:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d/big").write_bytes(os.urandom(1 << 20))
    (src / "d/small").write_text("x")
    return pack_layer(src, tmp_path / "layers", meta={"a": 1})


CORRUPTIONS = {
    "truncated by one byte": lambda data: data[:-1],
    "truncated in half": lambda data: data[: len(data) // 2],
    "truncated to header": lambda data: data[:8],
    "empty": lambda data: b"",
    "bit flip": lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1 :],
    "trailing garbage": lambda data: data + b"garbage",
    "not zstd": lambda data: b"PK\x03\x04 this is a zip" * 100,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_archive_is_a_clear_error(tmp_path, corruption):
    good = _good_layer(tmp_path)
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(CORRUPTIONS[corruption](good.path.read_bytes()))

    with pytest.raises(SnapshotError, match="layer"):
        unpack_layer(bad, tmp_path / "dest")

    assert not os.path.lexists(tmp_path / "dest")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("header", [{"mtime": "1e999999"}, {"mtime": "nan"}, {"uid": "99999999999999999999"}])
def test_absurd_header_numbers_are_a_clear_error(tmp_path, header):
    info = F("rootfs/f", b"x")[0]
    info.pax_headers = header
    archive = craft(tmp_path / "odd.tar.zst", [D("rootfs"), (info, b"x")])
    with pytest.raises(SnapshotError):
        unpack_layer(archive, tmp_path / "dest")
    assert not os.path.lexists(tmp_path / "dest")
    assert leftovers(tmp_path) == []


def test_tar_cut_at_a_member_boundary_is_detected(tmp_path):
    """A zstd frame cut short yields a tar prefix that tarfile alone would take as complete."""
    good = _good_layer(tmp_path)
    with zstandard.ZstdDecompressor().stream_reader(good.path.open("rb")) as r:
        tar = r.read()
    cut = tarfile.open(fileobj=io.BytesIO(tar)).getmembers()[3].offset  # a header starts here
    (tmp_path / "cut.tar.zst").write_bytes(zstandard.ZstdCompressor().compress(tar[:cut]))

    with pytest.raises(SnapshotError, match="truncated"):
        unpack_layer(tmp_path / "cut.tar.zst", tmp_path / "dest")
    assert not os.path.lexists(tmp_path / "dest")


def test_layer_named_by_digest_is_verified(tmp_path):
    good = _good_layer(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "f").write_text("different")
    impostor = pack_layer(other, tmp_path / "elsewhere").path
    forged = tmp_path / good.path.name  # a valid layer, but not the one this digest names
    forged.write_bytes(impostor.read_bytes())

    with pytest.raises(SnapshotError, match="digest"):
        unpack_layer(forged, tmp_path / "dest")
    assert not os.path.lexists(tmp_path / "dest")


def test_read_meta_of_missing_or_corrupt_file(tmp_path):
    with pytest.raises(SnapshotError):
        read_meta(tmp_path / "nope.tar.zst")
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(SnapshotError):
        read_meta(tmp_path / "junk")


# ----------------------------------------------------------------------------- plain tars (downloads)


def test_plain_tar_of_a_sandbox_folder(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub/x.txt").write_text("x")
    (src / ".wh.not-a-whiteout").write_text("just a file")
    (src / "tool").write_text("#!/bin/sh\n")
    (src / "tool").chmod(0o4755)  # setuid from a sandbox must not land on the host
    os.symlink("sub/x.txt", src / "link")
    os.link(src / "sub/x.txt", src / "hard")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src, arcname=".")

    unpack_plain_tar(buf.getvalue(), tmp_path / "out")

    out = tmp_path / "out"
    assert (out / "sub/x.txt").read_text() == "x"
    assert (out / ".wh.not-a-whiteout").read_text() == "just a file"
    assert stat.S_IMODE((out / "tool").stat().st_mode) == 0o755
    assert os.readlink(out / "link") == "sub/x.txt"
    assert os.path.samefile(out / "hard", out / "sub/x.txt")


@pytest.mark.parametrize("entries", [
    [D("."), F("./../escape")],
    [D("."), F("rootfs/x")],
    [D("."), S("./l", ".."), F("./l/x")],
    [D("."), member("./null", tarfile.CHRTYPE, dev=(1, 3))],
])
def test_plain_tar_attacks_are_refused(tmp_path, entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafeArchiveError):
        unpack_plain_tar(buf.getvalue(), tmp_path / "out")
    assert not os.path.lexists(tmp_path / "out")
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- real overlayfs


def _names(root: Path) -> set[str]:
    return {str(Path(d, n).relative_to(root)) for d, dirs, files in os.walk(root) for n in dirs + files}


@pytest.mark.skipif(not IS_ROOT, reason="mounting overlayfs needs root")
def test_overlay_upper_restores_as_a_lower_layer(tmp_path):
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower / "dir", upper, work, merged):
        d.mkdir(parents=True)
    (lower / "keep.txt").write_text("keep")
    (lower / "gone.txt").write_text("gone")
    (lower / "dir/old.txt").write_text("old")

    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        (merged / "gone.txt").unlink()
        subprocess.run(["rm", "-rf", str(merged / "dir")], check=True)
        (merged / "dir").mkdir()
        (merged / "dir/new.txt").write_text("new")
        (merged / "added.txt").write_text("added")
        expected = _names(merged)
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    assert expected == {"keep.txt", "added.txt", "dir", "dir/new.txt"}
    assert os.getxattr(upper / "dir", OPAQUE) == b"y"  # the kernel made it opaque

    info = pack_layer(upper, tmp_path / "layers")
    layer = tmp_path / "layer"
    unpack_layer(info.path, layer)

    merged2 = tmp_path / "merged2"
    merged2.mkdir()
    # Two lower layers and no upper: a read-only view of the restored snapshot.
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={layer}:{lower}", str(merged2)], check=True)
    try:
        assert _names(merged2) == expected
        assert (merged2 / "dir/new.txt").read_text() == "new"
        assert (merged2 / "keep.txt").read_text() == "keep"
    finally:
        subprocess.run(["umount", str(merged2)], check=True)
