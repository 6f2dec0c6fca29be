"""Debian base images built without any registry: debootstrap + ``docker import``.

The mirror comes from the host's own apt sources (read at run time, never hard-coded),
so an image builds wherever ``apt-get`` works. Rootfs trees are cached under the
rockroll state home, one per (suite, package set); the docker image is imported only
when ``docker image inspect`` does not already know its tag.

    from rockroll.sandbox.deployment.images import ensure_docker_image
    tag = ensure_docker_image("bookworm", ["python3"])   # rockroll/debian:bookworm-1a2b3c4d
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..errors import SandboxError

APT_SOURCE_FILES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list",
                    "/etc/apt/sources.list.d/*.sources")
IMAGE_REPO = "rockroll/debian"
IMAGE_LABEL = "rockroll.image=1"
LOG_TAIL_LINES = 30


class ImageBuildError(SandboxError):
    """A base image could not be built or imported (the message says which step)."""


# ----------------------------------------------------------------- apt sources
def _one_line_entries(text: str) -> Iterable[tuple[str, list[str]]]:
    """``deb [opts] URI suite comp...`` lines as (uri, [suite])."""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # drop "[arch=amd64 signed-by=...]"
        fields = line.split()
        if len(fields) >= 3:
            yield fields[1], [fields[2]]


def _deb822_entries(text: str) -> Iterable[tuple[str, list[str]]]:
    """deb822 stanzas (blank-line separated ``Key: value``) as (uri, suites) per URI."""
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and key:  # continuation line
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        for uri in fields.get("uris", "").split():
            yield uri, suites


def _is_debian_archive(uri: str) -> bool:
    """A main Debian archive, not debian-security, ports or a third-party repo."""
    path = uri.rstrip("/").rsplit("/", 1)[-1]
    return path == "debian"


def apt_source_entries(texts: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Every ``deb`` (uri, suites) in apt source texts, either format, mixed freely. Pure function."""
    entries = []
    for text in texts:
        parse = _deb822_entries if re.search(r"(?im)^\s*(types|uris)\s*:", text) else _one_line_entries
        entries.extend(parse(text))
    return entries


def read_apt_sources(patterns: Sequence[str] = APT_SOURCE_FILES) -> tuple[list[str], list[str]]:
    """The texts of this machine's apt source files, and their paths (unreadable ones skipped)."""
    paths = [p for pattern in patterns for p in sorted(glob.glob(pattern))]
    texts = []
    for path in paths:
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            continue
    return texts, paths


def parse_apt_sources(texts: Sequence[str], suite: str = "bookworm") -> str | None:
    """The Debian mirror URI found in apt source texts (either format, mixed freely).

    Prefers a Debian archive listing the plain ``suite`` (not ``-updates``/``-security``);
    else the first Debian archive at all; ``None`` when there is none. Pure function.
    """
    debian = [(uri.rstrip("/"), suites) for uri, suites in apt_source_entries(texts) if _is_debian_archive(uri)]
    for uri, suites in debian:
        if suite in suites:
            return uri
    return debian[0][0] if debian else None


def apt_mirror(suite: str = "bookworm", patterns: Sequence[str] = APT_SOURCE_FILES) -> str:
    """The host's Debian mirror, read from its apt sources at run time."""
    texts, paths = read_apt_sources(patterns)
    mirror = parse_apt_sources(texts, suite)
    if mirror is None:
        raise ImageBuildError(
            f"no Debian mirror in the apt sources ({', '.join(paths) or 'none found'}); "
            "add a 'deb http://<mirror>/debian <suite> main' line or a deb822 .sources file")
    return mirror


# ----------------------------------------------------------------- rootfs
def build_debian_rootfs(dest: Path, suite: str = "bookworm", packages: Sequence[str] = (),
                        variant: str = "minbase", *, mirror: str | None = None) -> Path:
    """Debootstrap ``suite`` into ``dest``, atomically: it is built in a sibling temp
    folder and renamed into place when complete, so a failed build leaves nothing.

    debootstrap's output goes to ``<dest>.log``; its tail is in the error on failure.
    """
    dest = Path(dest)
    if dest.exists():
        raise ImageBuildError(f"{dest} already exists")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = mirror or apt_mirror(suite)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    log = dest.parent / f"{dest.name}.log"
    cmd = ["debootstrap", f"--variant={variant}"]
    if packages:
        cmd.append("--include=" + ",".join(sorted(set(packages))))
    cmd += [suite, str(tmp), mirror]
    try:
        with open(log, "wb") as out:
            _run_with_progress(cmd, out, f"debootstrap {suite} from {mirror}")
        _slim(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp made it 0700; this folder becomes the image's /
        os.rename(tmp, dest)
    except BaseException as e:
        _remove_tree(tmp)
        if isinstance(e, subprocess.CalledProcessError):
            raise ImageBuildError(f"debootstrap failed (exit {e.returncode}); log {log}:\n"
                                  f"{_tail(log)}") from None
        raise
    return dest


def _slim(rootfs: Path) -> None:
    """Drop what debootstrap leaves behind but an image never needs: the downloaded
    .debs (~40 MB) and apt's package lists (stale the day after the build)."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"):
        for path in rootfs.glob(pattern):
            path.unlink(missing_ok=True)


def _run_with_progress(cmd: list[str], out, what: str) -> None:
    """Run a long command with its output in ``out`` and a spinner-style tqdm on stderr
    that shows elapsed time (debootstrap gives no total to make a real bar from)."""
    from tqdm import tqdm  # lazy: only builds need it

    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    done = threading.Event()
    with tqdm(desc=what, total=None, unit="s", bar_format="{desc}: {elapsed}", leave=False) as bar:
        def tick() -> None:
            while not done.wait(1.0):
                bar.update(1)
        threading.Thread(target=tick, daemon=True).start()
        try:
            code = proc.wait()
        except BaseException:
            # SIGTERM first: debootstrap's exit trap unmounts the /proc and /sys it
            # mounted in the target; SIGKILL would leave them for us to clean up.
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            done.set()
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (deepest first), from /proc/self/mountinfo."""
    prefix = os.path.realpath(root)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # \040 = space
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _remove_tree(root: Path) -> None:
    """Delete a half-built rootfs, never through a mount: rmtree would otherwise walk
    into /proc, /sys or a bind of /dev that debootstrap left mounted in the target."""
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left = _mounts_under(root)
    if left:
        raise ImageBuildError(f"cannot remove {root}: still mounted: {', '.join(left)}")
    shutil.rmtree(root, ignore_errors=True)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ----------------------------------------------------------------- docker
def docker_image_tag(suite: str = "bookworm", packages: Iterable[str] = ()) -> str:
    """``rockroll/debian:<suite>-<8 hex>``: the hash of the sorted package set, so each
    set of packages is its own cached image."""
    digest = hashlib.sha256(",".join(sorted(set(packages))).encode()).hexdigest()[:8]
    return f"{IMAGE_REPO}:{suite}-{digest}"


def rootfs_cache_dir(tag: str) -> Path:
    """Where the rootfs of an image tag is cached: ``<state home>/images/<repo_tag>``."""
    from ..home import state_home

    return state_home() / "images" / re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def ensure_docker_image(suite: str = "bookworm", packages: Sequence[str] = (), *, client=None) -> str:
    """The tag of a Debian image with ``packages``, built and imported if docker lacks it.

    ``client`` is an optional ``docker.DockerClient`` (the ``docker`` extra); without it
    the docker CLI is used, so no extra is needed.
    """
    tag = docker_image_tag(suite, packages)
    engine = _SdkEngine(client) if client is not None else _CliEngine()
    if engine.has_image(tag):
        return tag
    rootfs = rootfs_cache_dir(tag)
    with _exclusive(rootfs.with_name(rootfs.name + ".lock")):
        if engine.has_image(tag):  # another process built it while we waited
            return tag
        if not rootfs.is_dir():
            build_debian_rootfs(rootfs, suite, packages)
        engine.import_rootfs(rootfs, tag)
    return tag


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An inter-process lock, so concurrent callers build and import an image once."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


class _CliEngine:
    """The docker CLI: ``docker image inspect`` / ``docker import - TAG``."""

    def __init__(self) -> None:
        if shutil.which("docker") is None:
            raise ImageBuildError("the docker CLI is not installed (apt-get install docker.io)")

    def has_image(self, tag: str) -> bool:
        return subprocess.run(["docker", "image", "inspect", tag], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        # tar streams straight into docker import: no temporary tarball on disk.
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            imp = subprocess.run(["docker", "import", "--change", f"LABEL {IMAGE_LABEL}",
                                  "--change", 'CMD ["/bin/bash"]', "-", tag],
                                 stdin=tar.stdout, capture_output=True)
        finally:
            tar.stdout.close()
            tar_err = tar.stderr.read().decode(errors="replace")
            tar.stderr.close()
            tar_code = tar.wait()
        if tar_code or imp.returncode:
            raise ImageBuildError(f"docker import of {rootfs} as {tag} failed: "
                                  f"{(imp.stderr.decode(errors='replace') + tar_err).strip()}")


class _SdkEngine:
    """The ``docker`` Python SDK, for callers that already hold a client."""

    def __init__(self, client) -> None:
        self.client = client

    def has_image(self, tag: str) -> bool:
        try:
            import docker.errors  # lazy: the optional ``docker`` extra
        except ImportError as e:
            raise ImageBuildError("the docker SDK is not installed: pip install 'rockroll[docker]'") from e
        try:
            self.client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        # The SDK has no streaming ``import``; go through the low-level API with a tar pipe.
        repo, _, version = tag.rpartition(":")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        try:
            self.client.api.import_image_from_stream(
                tar.stdout, repository=repo, tag=version,
                changes=[f"LABEL {IMAGE_LABEL}", 'CMD ["/bin/bash"]'])
        finally:
            tar.stdout.close()
            if tar.wait():
                raise ImageBuildError(f"tar of {rootfs} failed (exit {tar.returncode})")
