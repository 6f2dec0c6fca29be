"""Where sandboxes live on the host, and the ``host`` image.

``image="host"`` is a minimal read-only view of the host's system folders: a base
layer holding an empty skeleton (``/workspace``, ``/tmp``, ``/root``, ...) and a
*filtered copy* of ``/etc``, plus read-only binds of ``/usr`` and the top-level
``/bin``, ``/lib*`` and ``/sbin`` (symlinks on merged-/usr hosts, copied as symlinks).
Nothing else of the host is reachable: no ``/root``, ``/home``, project folders,
``/var/run/docker.sock`` or ``/proc`` of the host.

Name resolution: the host image's ``/etc/hosts`` and ``/etc/resolv.conf`` know localhost
only (``NO_NETWORK_ETC``). A sandbox with ``network=True`` (any image) has a network of its
own whose resolver is its gateway, so it gets a ``resolv.conf`` naming it (``network_plan``): files
in a top lower layer, each bound read-only over itself, so they are never in the upper
dir, a snapshot or a built layer, and a sandbox without network never sees them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..home import first_use_lock, state_home

SKELETON_DIRS = {
    "workspace": 0o755, "tmp": 0o1777, "root": 0o700, "home": 0o755, "etc": 0o755,
    "var": 0o755, "var/tmp": 0o1777, "var/lib": 0o755, "var/log": 0o755, "var/cache": 0o755,
    "run": 0o755, "mnt": 0o755, "opt": 0o755, "srv": 0o755, "media": 0o755,
    "usr": 0o755, "dev": 0o755, "proc": 0o755, "sys": 0o555,
}
# What the host image's name resolution files hold: localhost, and no name server.
NO_NETWORK_ETC = {"hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n",
                  "resolv.conf": "# no network in the sandbox\n"}
SANDBOX_ETC = {**NO_NETWORK_ETC, "hostname": "sandbox\n"}
TOP_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries never copied, even when world-readable: credentials, keys, daemons' config.
ETC_DENY = {"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh", "docker",
            "ssl/private", "machine-id", "hosts", "hostname", "resolv.conf", "mtab", "subuid",
            "subgid", "security/opasswd", "credstore", "credstore.encrypted", "wireguard"}


@dataclass(frozen=True)
class RootfsPlan:
    """What the guest mounts: overlay lower dirs (top first) and read-only binds."""

    lowers: tuple[str, ...]
    binds: tuple[tuple[str, str, bool], ...]


def host_binds() -> tuple[tuple[str, str, bool], ...]:
    binds = [("/usr", "/usr", True)]
    for name in TOP_SYSTEM:
        path = f"/{name}"
        if os.path.isdir(path) and not os.path.islink(path):
            binds.append((path, path, True))
    return tuple(binds)


def _etc_fingerprint() -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk("/etc"):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            h.update(f"{dirpath}/{name}:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for name in TOP_SYSTEM:
        h.update(f"{name}:{os.path.islink('/' + name) and os.readlink('/' + name)}".encode())
    return h.hexdigest()[:16]


def _copy_etc(dest: Path) -> None:
    """Copy the world-readable part of /etc, minus ETC_DENY, keeping symlinks as links."""
    for dirpath, dirnames, filenames in os.walk("/etc"):
        rel_dir = os.path.relpath(dirpath, "/etc")
        keep = []
        for d in dirnames:
            rel = os.path.normpath(os.path.join(rel_dir, d))
            st = os.lstat(os.path.join(dirpath, d))
            if rel in ETC_DENY or stat.S_ISLNK(st.st_mode):
                if stat.S_ISLNK(st.st_mode) and rel not in ETC_DENY:
                    os.symlink(os.readlink(os.path.join(dirpath, d)), dest / rel)
                continue
            if st.st_mode & 0o005 != 0o005:  # not listable by others: private
                continue
            (dest / rel).mkdir(mode=stat.S_IMODE(st.st_mode))
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, f))
            src = os.path.join(dirpath, f)
            if rel in ETC_DENY:
                continue
            st = os.lstat(src)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dest / rel)
            elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
                shutil.copy2(src, dest / rel, follow_symlinks=False)


def write_sandbox_etc(etc: Path) -> None:
    """Give the ``etc`` of a root the host image's ``SANDBOX_ETC``: hostname, and name
    resolution that knows localhost only (a rootfs base uses it too: debootstrap copies the
    host's resolv.conf and hostname into its tree). Each file is replaced by a new one, so
    a hardlinked copy of a cached tree is never written through."""
    for name, text in SANDBOX_ETC.items():
        (etc / name).unlink(missing_ok=True)
        (etc / name).write_text(text)


_host_layers: dict[Path, Path] = {}  # per process: /etc is fingerprinted once, not per sandbox


def host_base_layer(home: Path | None = None) -> Path:
    """The cached base layer of the ``host`` image, rebuilt when /etc has changed since it
    was made (checked once per process: walking /etc on every create would cost more
    than the create itself)."""
    home = home or state_home()
    cached = _host_layers.get(home)
    if cached is not None and cached.is_dir():
        return cached
    with first_use_lock(home / "layers" / "host"):  # one walk of /etc, not one per waiting create
        cached = _host_layers.get(home)
        if cached is not None and cached.is_dir():
            return cached
        layer = home / "layers" / f"host-{_etc_fingerprint()}"
        if not layer.is_dir():
            _build_host_layer(layer)
        _host_layers[home] = layer
    return layer


def _build_host_layer(layer: Path) -> None:
    layer.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".host-", dir=layer.parent))
    try:
        for rel, mode in SKELETON_DIRS.items():
            (tmp / rel).mkdir(parents=True, exist_ok=True)
            os.chmod(tmp / rel, mode)
        for name in TOP_SYSTEM:
            if os.path.islink("/" + name):
                os.symlink(os.readlink("/" + name), tmp / name)
            elif os.path.isdir("/" + name):
                (tmp / name).mkdir()
        _copy_etc(tmp / "etc")
        write_sandbox_etc(tmp / "etc")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, layer)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def network_plan(folder: Path, nameserver: str, trust_bundle: bytes | None = None) -> RootfsPlan:
    """What a sandbox with ``network=True`` mounts over its image: ``hosts`` (localhost) and
    a ``resolv.conf`` naming ``nameserver`` (its gateway's resolver, ``deployment/gateway.py``);
    with TLS inspection, ``trust_bundle`` as the system CA bundle (``tlsinspect.BUNDLE_PATH``).
    The bundle is a file of this layer, not of the upper dir, for the reason resolv.conf is:
    it is the sandbox's CA, and a snapshot restored into another sandbox must get that one's."""
    files: dict[str, str | bytes] = {**NO_NETWORK_ETC,
                                     "resolv.conf": f"nameserver {nameserver}\noptions attempts:3 timeout:2\n"}
    if trust_bundle is not None:
        files["ssl/certs/ca-certificates.crt"] = trust_bundle
    return _etc_plan(folder, files)


def host_network_plan(folder: Path) -> RootfsPlan:
    """What a sandbox with ``network="host"`` mounts over its image: the host's ``hosts`` and
    ``resolv.conf`` (symlinks followed: systemd-resolved's stub file is what the host resolves
    with), as Docker gives a host-network container; a file the host lacks gets
    ``NO_NETWORK_ETC``'s text."""
    files = {}
    for name, default in NO_NETWORK_ETC.items():
        try:
            files[name] = Path("/etc", name).read_text()
        except OSError:
            files[name] = default
    return _etc_plan(folder, files)


def _etc_plan(folder: Path, files: dict[str, str | bytes]) -> RootfsPlan:
    """``files`` written into ``folder/etc``: ``folder`` is the top lower layer, so each file
    is a regular file whatever the image has there (a symlink, nothing), and a read-only bind
    of it over itself keeps it out of the upper dir: a snapshot or a built layer never holds it."""
    etc = folder / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    os.chmod(etc, 0o755)
    binds = []
    for name, text in files.items():
        path = etc / name
        for parent in reversed(path.relative_to(folder).parents[:-1]):  # etc/ssl, etc/ssl/certs: world-readable
            (folder / parent).mkdir(exist_ok=True)
            os.chmod(folder / parent, 0o755)
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        os.chmod(path, 0o644)
        binds.append((str(path), f"/etc/{name}", True))
    return RootfsPlan(lowers=(str(folder),), binds=tuple(binds))


# Image schemes other packages plug in (``"hub"`` from rockroll.envhub): the sandbox must
# not import them (dependencies flow one way), so they register a resolver here instead.
# Keyed by scheme, so registering twice replaces rather than stacks.
_IMAGE_RESOLVERS: dict[str, Callable[[str, Path], RootfsPlan]] = {}
_IMAGE_FORMS: dict[str, str] = {"host": "host"}  # scheme -> how to write it, for error messages


def register_image_resolver(scheme: str, fn: Callable[[str, Path], RootfsPlan], *, form: str | None = None) -> None:
    """Make ``image="<scheme>:<ref>"`` resolvable: ``fn(ref, home)`` returns the
    ``RootfsPlan`` (lower dirs top first, binds). It may do I/O (pull layers); it should
    cache, since it runs on every sandbox start. Errors it raises reach the caller as is.
    ``form`` shows how to write such an image (``"hub:<name>@<version>"``) where an
    unknown image is refused."""
    if not scheme or ":" in scheme or scheme == "host":
        raise ValueError(f"bad image scheme {scheme!r}")
    _IMAGE_RESOLVERS[scheme] = fn
    _IMAGE_FORMS[scheme] = form or f"{scheme}:<ref>"


def image_schemes() -> tuple[str, ...]:
    return ("host", *sorted(_IMAGE_RESOLVERS))


def image_forms() -> tuple[str, ...]:
    """How each image the local backend accepts is written (``host``, ``docker:<image>``, ...)."""
    return tuple(_IMAGE_FORMS[s] for s in image_schemes())


def plan_for_image(image: str, home: Path | None = None) -> RootfsPlan:
    """Lower layers and binds for an image name: ``host``, or ``<scheme>:<ref>`` for a
    scheme registered with ``register_image_resolver`` (e.g. ``hub:name@1.2.0``)."""
    if image == "host":
        return RootfsPlan(lowers=(str(host_base_layer(home)),), binds=host_binds())
    from ..errors import SpecError

    scheme, sep, ref = image.partition(":")
    fn = _IMAGE_RESOLVERS.get(scheme) if sep else None
    if fn is None:
        # a plain Docker reference ("ubuntu:22.04") is the likeliest slip: say how to write it
        hint = (f"; a Docker image is image='docker:{image}' here, or backend='docker' with "
                f"image={image!r}" if "docker" in _IMAGE_RESOLVERS else "; backend='docker' takes Docker images")
        raise SpecError("image", f"unknown image {image!r} for the local backend: accepted forms are "
                                 f"{', '.join(image_forms())}{hint}")
    return fn(ref, home or state_home())
