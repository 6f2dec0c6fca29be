"""Properties of tar extraction, where an archive an agent crafted meets the host.

Archives are generated member by member from adversarial pieces: ``..``, absolute and
non-canonical names, names outside the root prefix, symlinks to outside (absolute and
climbing) followed by members written through them, hardlinks to outside files and to
later or missing members, device nodes, fifos, duplicates, whiteouts. For each one:

- ``unpack_plain_tar`` (downloads) and ``unpack_layer`` (layers, snapshots): nothing
  outside ``dest`` changes, no file in ``dest`` is a hardlink to a file outside it; the
  result is either the whole archive (every member there, with its type) or
  ``UnsafeArchiveError`` with ``dest`` absent and no temp dir left; an archive holding an
  absolute or ``..`` name, a device node or a hardlink out of the root is always refused.
- The agent's upload extraction: nothing outside ``dest`` changes or is hardlinked, and a
  refusal is tarfile's ``FilterError`` (an ``OSError`` for a member that cannot be made).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rockroll.sandbox.guest.files import extract_tar  # noqa: I001 (the agent may move)
from rockroll.sandbox.errors import UnsafeArchiveError
from rockroll.sandbox.storage.layers import unpack_layer, unpack_plain_tar

PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

OUT = "@OUT@"  # replaced by the absolute path of the outside folder of each example
TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "link": tarfile.LNKTYPE,
         "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}
parts = st.sampled_from(["a", "b", "l", "h", "..", ".", "", ".wh.a", ".wh..wh..opq"])
targets = st.sampled_from(["a", "b", "a/b", "l", "l/x", "h", "..", "../..", "../../../outside/victim",
                           f"{OUT}/victim", f"{OUT}", "/etc/passwd", "", "./a", "{P}/a", "{P}/l",
                           "{P}/l/victim", "{P}/../outside/victim", "/{P}/a"])
prefixes = st.sampled_from(["{P}/", "{P}/", "{P}/", "/", "", "{P}/../", "/{P}/", "{P}/./", "x/"])
members = st.tuples(prefixes, st.lists(parts, min_size=1, max_size=3).map("/".join),
                    st.sampled_from(list(TYPES)), targets, st.binary(max_size=8))
# Mostly-sane trees, so that archives often get far or succeed: dirs first, then entries.
sane = st.tuples(st.just("{P}/"), st.sampled_from(["a", "b", "a/b", "a/c", "l", "h", "a/l", "f"]),
                 st.sampled_from(["dir", "dir", "file", "file", "sym", "link", "fifo"]),
                 st.sampled_from(["a", "b", "f", "../f", "{P}/f", "{P}/a/c", f"{OUT}/victim", "../../.."]),
                 st.binary(max_size=8))
archives = st.lists(sane | members, max_size=8)
# The attacks named above, always run (hypothesis may or may not reach them by itself).
ATTACKS = [
    [("{P}/", "l", "sym", OUT, b""), ("{P}/", "l/victim", "file", "", b"pwned")],  # write through a symlink
    [("{P}/", "h", "link", "{P}/../outside/victim", b""), ("{P}/", "h", "file", "", b"pwned")],  # ... a hardlink
    [("{P}/", "h", "link", "../outside/victim", b""), ("{P}/", "h", "file", "", b"pwned")],
    [("{P}/", "l", "sym", "../../outside", b""), ("{P}/", "l/victim", "file", "", b"pwned")],
    [("/", "victim", "file", "", b"pwned")], [("{P}/../outside/", "victim", "file", "", b"pwned")],
    [("{P}/", "a", "file", "", b"1"), ("{P}/", "a", "file", "", b"2")],  # duplicates
    [("{P}/", "null", "chr", "", b"")],
    [("{P}/", "a", "dir", "", b""), ("{P}/", "a/l", "sym", "../../outside/victim", b"")],  # climbs out
    [("{P}/", "l", "sym", OUT, b""), ("{P}/", "h", "link", "{P}/l/victim", b"")],  # hardlink via a symlink
]


def attacks(test):
    for spec in ATTACKS:
        test = example(spec)(test)
    return test


def build(spec, prefix: str, outside: Path) -> tuple[bytes, list[tarfile.TarInfo]]:
    buf, infos = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for pre, name, kind, target, data in spec:
            info = tarfile.TarInfo((pre + name).replace("{P}", prefix))
            info.type = TYPES[kind]
            info.mode = 0o6755 if kind == "file" else 0o755
            if kind in ("sym", "link"):
                info.linkname = target.replace("{P}", prefix).replace(OUT, str(outside))
            if kind == "file":
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
            infos.append(info)
    return buf.getvalue(), infos


def state(root: Path, skip: Path) -> dict:
    """Everything under ``root`` except ``skip``: type, content, link target, mode, inode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = here / name
            if p == skip:
                continue
            st_ = os.lstat(p)
            body = (p.read_bytes() if stat.S_ISREG(st_.st_mode) else
                    os.readlink(p) if stat.S_ISLNK(st_.st_mode) else None)
            out[str(p.relative_to(root))] = (stat.S_IFMT(st_.st_mode), st_.st_mode & 0o7777, body, st_.st_ino)
    return out


def inodes_under(root: Path) -> set[int]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st_ = os.lstat(Path(dirpath) / name)
            if not stat.S_ISDIR(st_.st_mode):
                found.add(st_.st_ino)
    return found


class World:
    """A scratch folder: ``outside/`` with a victim file, and ``box/`` where ``dest`` goes."""

    def __init__(self, base: Path):
        self.base, self.outside, self.dest = base, base / "outside", base / "box" / "dest"
        self.outside.mkdir()
        (self.outside / "victim").write_bytes(b"secret")
        (self.outside / "victim").chmod(0o644)
        (self.base / "box").mkdir()

    def snapshot(self) -> dict:
        return state(self.base, self.dest)

    def check_contained(self, before: dict) -> None:
        after = self.snapshot()
        assert after == before, "something outside dest changed"
        if self.dest.exists():
            outside = {v[3] for v in after.values() if v[0] != stat.S_IFDIR}
            assert not (inodes_under(self.dest) & outside), "a file in dest is a hardlink to a file outside"


def obviously_unsafe(infos: list[tarfile.TarInfo], prefix: str) -> bool:
    """Members that must be refused whatever else the archive holds."""
    for m in infos:
        parts_ = m.name.split("/")
        if m.name.startswith("/") or ".." in parts_ or m.ischr() or m.isblk():
            return True
        if m.islnk() and (m.linkname.startswith("/") or ".." in m.linkname.split("/")
                          or m.linkname.split("/")[0] != prefix):
            return True
    return False


def check_unpacked(world: World, infos: list[tarfile.TarInfo], prefix: str, plain: bool) -> None:
    """Success: every member is in dest with its type; plain tars keep no setuid bits."""
    for m in infos:
        rel = m.name.split("/", 1)[1] if "/" in m.name else ""
        path = world.dest / rel
        mode = os.lstat(path).st_mode
        if m.isdir():
            assert stat.S_ISDIR(mode)
        elif m.issym():
            assert stat.S_ISLNK(mode) and os.readlink(path) == m.linkname
            if not m.linkname.startswith("/"):  # relative: never lexically above the root
                assert not os.path.normpath(os.path.join(os.path.dirname(rel), m.linkname)).startswith("..")
        elif m.islnk():
            target = world.dest / m.linkname.split("/", 1)[1]
            assert os.lstat(target).st_ino == os.lstat(path).st_ino
        elif m.isfifo():
            assert stat.S_ISFIFO(mode)
        elif m.isreg():  # whiteouts too: "keep" leaves them as files
            assert stat.S_ISREG(mode)
        if plain and not stat.S_ISLNK(mode):
            assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)


def no_leftovers(world: World) -> None:
    assert [p.name for p in (world.base / "box").iterdir() if p.name != "dest"] == [], "a temp dir was left"


def unpack_checked(spec, prefix: str, unpack) -> None:
    """``unpack(tar bytes, dest)`` of the archive ``spec``: contained, and either
    complete or refused with ``UnsafeArchiveError`` leaving nothing behind."""
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        data, infos = build(spec, prefix, world.outside)
        before = world.snapshot()
        try:
            unpack(data, world.dest)
        except UnsafeArchiveError:
            assert not world.dest.exists()
        else:
            assert not obviously_unsafe(infos, prefix), "an unsafe archive was accepted"
            check_unpacked(world, infos, prefix, plain=prefix == ".")
        world.check_contained(before)
        no_leftovers(world)


@PROPS
@given(archives)
@attacks
def test_plain_tar_never_lands_outside_dest(spec):
    unpack_checked(spec, ".", unpack_plain_tar)


def _unpack_as_layer(data: bytes, dest: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:  # not in the world whose state is compared
        archive = Path(scratch) / "layer.tar.zst"
        archive.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(data))
        unpack_layer(archive, dest, whiteouts="keep")


@PROPS
@given(archives)
@attacks
def test_layer_never_lands_outside_dest(spec):
    unpack_checked(spec, "rootfs", _unpack_as_layer)


@PROPS
@given(archives)
@attacks
def test_agent_upload_never_lands_outside_dest(spec):
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        data, _ = build(spec, ".", world.outside)
        before = world.snapshot()
        try:
            extract_tar(data, str(world.dest))
        except (tarfile.FilterError, OSError):
            pass
        except (KeyError, RecursionError):
            # CPython's tarfile: a link that cannot be made (its name is taken, its target
            # is missing) falls back to extracting the target member: KeyError when there
            # is none, RecursionError when a symlink names itself. The agent answers any
            # exception with an error reply; containment is the property here.
            pass
        world.check_contained(before)
