"""The docker deployment: a sandbox as a Docker container, driven by our own guest.

The container runs nothing but a keep-alive ``sh`` as its pid 1. The guest is the same
``guest/`` as the local backend's, started on the host in *enter mode*: it joins the
container's cgroups and namespaces with ``setns(2)`` and serves every session of the
sandbox over one pipe. So ``run("true")`` costs a protocol round trip, never a
``docker exec``, and the image needs only ``/bin/sh`` (bash when it has one), no Python.

- Image: ``spec.image`` is a docker image reference; ``"host"`` means the Debian image
  of ``images.ensure_docker_image()`` (built with debootstrap on first use, minutes,
  then cached). Snapshots record ``spec.image``, so a snapshot taken with ``"host"`` on
  one backend restores with ``"host"`` on the other: same files, a different base system.
- Confinement: capabilities dropped to the guest's ``KEEP_CAPS``, ``no-new-privileges``,
  network ``none`` (``network=True``: that namespace wired to a gateway here, as a local
  sandbox's, ``gateway.SandboxNetwork``), memory = memory+swap, ``nano_cpus``,
  ``pids_limit``; the guest's processes join the container's cgroups, so they count
  against the same limits. Syscalls: the container runs under our profile
  (``seccomp.docker_profile()``, never unconfined), and the guest, which enters from
  the host and so escapes the container's filter, installs the same table as a BPF
  program on itself, as on the local backend: every command runs under it. ``/etc/resolv.conf`` is
  the host image's no-network placeholder, bound read-only (Docker would otherwise give
  even a network-``none`` container a copy of the host's name servers).
- Disk limit (``disk_mb``): Docker's own ``storage_opt size`` needs xfs with project
  quotas, so instead the guest gives the sandbox a root of its own, an overlay of the
  container's root and a sized layer (``disk.py``) mounted at ``LAYER_DIR`` in a mount
  namespace of the guest's (``guest/layers.py``, ``layer_root``); the container's writable layer stays
  empty.
- Snapshots: ``upper`` is the sized layer's upper dir (with ``disk_mb=None``, the
  container's overlay2 upper dir), packed by ``pack_layer`` like a local upper. A
  container restored from a snapshot chain starts from an image
  of the base plus the chain, made once per chain (the layers are copied into a created
  container's upper dir, O(size), and ``docker commit``-ed) and cached under
  ``rockroll/chain:<hash>``; later restores and forks of that chain start in O(1), like
  local's stacked lower dirs. The new container's upper then holds only its own changes,
  whiteouts included, so its snapshots chain onto their parents exactly as local ones
  do. Remove the cache with ``docker image prune -a --filter label=rockroll.chain``.
- Cleanup: every container is labelled with its run, sandbox, owner uid and owner
  process; ``kill_now`` (also at exit) removes it, and ``reap_containers`` (called by
  ``reaper.reap_dead_runs``) removes those of dead owners after a kill -9.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IsolationUnavailable, SandboxStartError
from ..lifecycle import proc_start_time
from ..guest.syscalls import KEEP_CAPS
from ..protocol.frames import GuestConfig, ModelConfig
from ..spec import SandboxSpec
from ..storage.whiteouts import apply_layer
from .cgroups import Cgroup
from .disk import SandboxDisk
from .gateway import NetworkedDeployment, SandboxNetwork
from .tlsinspect import BUNDLE_PATH
from .process import GuestHandle, GuestProcess
from .rootfs import NO_NETWORK_ETC
from .seccomp import docker_security_opt

if TYPE_CHECKING:
    from .reaper import RunRegistry

LABEL_RUN, LABEL_SANDBOX, LABEL_OWNER = "rockroll.run", "rockroll.sandbox", "rockroll.owner"
LABEL_OWNER_PID, LABEL_OWNER_START = "rockroll.owner.pid", "rockroll.owner.start"
LABEL_CHAIN, CHAIN_REPO = "rockroll.chain", "rockroll/chain"
# Where the guest mounts the sandbox's sized layer (disk_mb), in its own mount namespace
# inside the container: on docker's /dev tmpfs, so the image's files are never touched.
LAYER_DIR = "/dev/.rr-disk"
# pid 1 of the container: needs only sh and sleep; exits on SIGTERM (pid 1 has no default handlers).
KEEPALIVE = 'trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done'
_CAP_NAMES = {0: "CHOWN", 1: "DAC_OVERRIDE", 3: "FOWNER", 4: "FSETID", 5: "KILL", 6: "SETGID",
              7: "SETUID", 8: "SETPCAP", 10: "NET_BIND_SERVICE", 18: "SYS_CHROOT",
              29: "AUDIT_WRITE", 31: "SETFCAP"}


def docker_client():
    """A ``docker.DockerClient`` on the local engine, or ``IsolationUnavailable``."""
    try:
        import docker  # noqa: PLC0415 - the optional ``docker`` extra
    except ImportError as e:
        raise IsolationUnavailable("the docker backend needs the docker SDK: "
                                   "pip install 'rockroll[docker]'") from e
    try:
        return docker.from_env(timeout=60)  # asks the engine its API version: fails fast if absent
    except docker.errors.DockerException as e:
        raise IsolationUnavailable(f"cannot reach the Docker engine ({e}); is dockerd running?") from e


def resolve_image(image: str) -> str:
    """The docker image reference for ``spec.image`` (``"host"``: the default Debian image)."""
    if image == "host":
        from .images import ensure_docker_image  # noqa: PLC0415

        return ensure_docker_image()
    return image


def container_cgroup(pid: int) -> Cgroup:
    """A handle on the cgroups of process ``pid`` (a container's), every v1 hierarchy
    and the v2 group, found through /proc; it is docker's: never ``remove()`` it."""
    mounts = []  # (fstype, super options, mount root, mount point)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                fields = left.split()
                mounts.append((fstype, set(options.split(",")), fields[3], fields[4]))
    dirs = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            keys = controllers.split(",") if controllers else []
            for fstype, options, root, point in mounts:
                if fstype == "cgroup2" if not keys else fstype == "cgroup" and set(keys) <= options:
                    rel = os.path.relpath(path, root)
                    for key in keys or ["unified"]:
                        dirs[key] = os.path.normpath(os.path.join(point, rel))
                    break
    if set(dirs) == {"unified"}:  # pure v2: one group serves every controller
        return Cgroup(str(pid), "v2", {k: dirs["unified"] for k in ("memory", "pids", "cpu", "cpuacct", "freezer")})
    return Cgroup(str(pid), "v1", dirs)


class DockerDeployment(NetworkedDeployment):
    """Host side of one docker sandbox: its container and the guest that entered it.

    The guest process is the local one's (an ``GuestProcess``: recorded, killed and
    reaped the same way); what differs is where it runs. Each ``spawn`` (start, reset,
    restore, after a crash) gets a fresh container; the old one is removed in the
    background.
    """

    def __init__(self, spec: SandboxSpec, sandbox_id: str, run: RunRegistry):
        self.client = docker_client()
        self.spec, self.id, self.run = spec, sandbox_id, run
        self.image = resolve_image(spec.image)
        self.dir = run.add(sandbox_id, self.kill_now)
        # A mount there stops Docker from mounting its copy of the host's resolv.conf.
        self.resolv = self.dir / "resolv.conf"
        self.resolv.write_text(NO_NETWORK_ETC["resolv.conf"])
        # network=True: the container keeps network 'none' (a namespace of its own, lo only)
        # and is wired like a local sandbox, to a gateway in this process's namespace
        self.network = SandboxNetwork(spec.egress) if spec.network else None
        self.gen = 0
        self.guest = GuestProcess(self.dir)
        self.container = None
        self.cgroup: Cgroup | None = None
        self._upper: Path | None = None
        self.disk = SandboxDisk(spec.disk_mb, run.dir, self.dir, userns=False, home=run.home)
        self._removals: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._killed = False  # kill_now ran: a container created after it is removed at once

    @property
    def upper(self) -> Path:
        return self.disk.upper or self._upper

    def _labels(self) -> dict[str, str]:
        pid = os.getpid()
        return {LABEL_RUN: self.run.run_id, LABEL_SANDBOX: self.id, LABEL_OWNER: str(os.getuid()),
                LABEL_OWNER_PID: str(pid), LABEL_OWNER_START: str(proc_start_time(pid))}

    def _chain_image(self, layers: list[Path]) -> str:
        """The image to start from: the base image, or the base plus snapshot ``layers``
        (unpacked dirs named by digest, top first), committed once and cached by tag."""
        if not layers:
            return self.image
        base = self.client.images.get(self.image).id
        key = hashlib.sha256("\n".join([base, *(p.name for p in layers)]).encode()).hexdigest()[:24]
        tag = f"{CHAIN_REPO}:{key}"
        if self.client.images.list(name=tag):
            return tag
        # Labelled like a sandbox's container, so gc removes it if we die mid-build.
        builder = self.client.containers.create(self.image, ["/bin/sh"], network_mode="none",
                                                labels=self._labels())
        try:
            upper = Path(builder.attrs["GraphDriver"]["Data"]["UpperDir"])
            for layer in reversed(layers):  # bottom first; the overlay is not mounted yet
                apply_layer(layer, upper)
            builder.commit(CHAIN_REPO, key, conf={"Labels": {LABEL_CHAIN: key}})
        finally:
            _remove(builder)
        return tag

    def _create(self, image: str):
        """Create (not start) this generation's container, confined and labelled."""
        import docker  # noqa: PLC0415

        spec = self.spec
        memory = f"{spec.memory_mb}m" if spec.memory_mb else None
        mounts = [docker.types.Mount("/etc/resolv.conf", str(self.resolv), type="bind", read_only=True)]
        bundle = self.network.trust_bundle() if self.network is not None else None
        if bundle is not None:  # TLS inspection: the sandbox's CA in the system bundle (tlsinspect.py)
            (self.dir / "ca-certificates.crt").write_bytes(bundle)
            mounts.append(docker.types.Mount(BUNDLE_PATH, str(self.dir / "ca-certificates.crt"), type="bind",
                                             read_only=True))
        try:
            return self.client.containers.create(
                image, ["/bin/sh", "-c", KEEPALIVE], name=f"rockroll-{self.id}-{self.gen}", mounts=mounts,
                hostname=self.id, labels=self._labels(), working_dir=spec.workdir, environment=dict(spec.env),
                network_mode="none", init=False, cap_drop=["ALL"],
                cap_add=[_CAP_NAMES[c] for c in KEEP_CAPS],
                security_opt=["no-new-privileges", docker_security_opt()],
                mem_limit=memory, memswap_limit=memory, pids_limit=spec.pids,
                nano_cpus=int(spec.cpus * 1e9) if spec.cpus else None,
                log_config={"type": "none"})
        except docker.errors.ImageNotFound as e:
            raise SandboxStartError(f"docker image {self.image!r} not found (build one with "
                                    "`rockroll sandbox image build`)", sandbox_id=self.id) from e
        except docker.errors.DockerException as e:
            raise SandboxStartError(f"cannot create the container: {e}", sandbox_id=self.id) from e

    def spawn(self, layers: list[Path], sessions: dict[str, str],
              model: ModelConfig | None = None) -> GuestHandle:
        """Start a fresh container over snapshot ``layers`` (top first), and a guest in it."""
        import docker  # noqa: PLC0415

        self.gen += 1
        if self.network is not None:  # the file is bound into the container: rewritten in place
            self.resolv.write_text(f"nameserver {self.network.prepare()}\noptions attempts:3 timeout:2\n")
        try:
            image = self._chain_image(layers)
        except (docker.errors.DockerException, OSError) as e:
            raise SandboxStartError(f"cannot build the image of a snapshot: {e}", sandbox_id=self.id) from e
        container = self._create(image)
        # kill_now runs on another thread (atexit, while a pool resets this sandbox on a deployment
        # thread): a container created after it would outlive the process until the next gc.
        with self._lock:
            if self._killed:
                _remove(container)
                raise SandboxStartError("the sandbox was closed while its container was being created",
                                        sandbox_id=self.id)
            self.container = container
        try:
            self._upper = Path(container.attrs["GraphDriver"]["Data"]["UpperDir"])
            container.start()
            container.reload()
            pid = container.attrs["State"]["Pid"]
            self.cgroup = container_cgroup(pid)
        except (docker.errors.DockerException, OSError, KeyError) as e:
            raise SandboxStartError(f"cannot start the container: {e}", sandbox_id=self.id) from e
        if self.network is not None:
            self.network.attach(pid)
        disk = self.disk.prepare(self.gen)
        if disk is not None:  # mounted in the container's namespace, at a path of the container
            disk.dir = LAYER_DIR
        cfg = GuestConfig(id=self.id, hostname=self.id, workdir=self.spec.workdir, env=self.guest_env(),
                          sessions=sessions, disk=disk, model=model, enter_pid=pid,
                          cgroup_procs=self.cgroup.procs_paths())
        return self.guest.start(cfg)

    def record(self, init_pid: int) -> None:
        self.guest.record(init_pid)
        self.disk.mounted(self.guest.proc.pid)

    def stop_guest(self) -> None:
        """Kill the guest and remove its container (and its disk image) in the background."""
        self.disk.close()
        gen = self.gen
        self.guest.stop(then=lambda: self.disk.drop(gen))
        container, self.container = self.container, None
        if self.network is not None:
            self.network.detach()
        if container is not None:
            thread = threading.Thread(target=_remove, args=(container,), daemon=True)
            thread.start()
            self._removals.append(thread)

    def oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup else 0

    def freeze(self) -> None:
        if self.container is not None:
            self.container.pause()

    def thaw(self) -> None:
        if self.container is not None:
            self.container.unpause()

    def usage(self) -> dict[str, float] | None:
        return self.cgroup.usage() if self.cgroup else None

    def kill_now(self) -> None:
        """Synchronous, idempotent teardown (also called from atexit): the guest, then
        the container removals that restarts and this started. The cgroup is docker's:
        it goes with the container, so it is not removed here."""
        with self._lock:
            self._killed = True
            self.guest.kill()
            self.stop_guest()
            for thread in self._removals:
                thread.join(timeout=60)
            self._removals = []
            self.cgroup = None
            shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        self.kill_now()
        self.run.discard(self.id)


def _remove(container) -> None:
    import docker  # noqa: PLC0415

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as e:  # "removal already in progress" and the like
        if e.status_code != 409:
            raise


# --------------------------------------------------------------------------- gc


def _owner_alive(labels: dict) -> bool:
    try:
        return proc_start_time(int(labels[LABEL_OWNER_PID])) == int(labels[LABEL_OWNER_START])
    except (KeyError, ValueError):
        return False


def reap_containers(runs=(), *, keep: str | None = None) -> list[str]:
    """Remove this user's sandbox containers whose owner process is dead, or whose run
    is in ``runs``; never those of run ``keep``. Returns the names removed. Does nothing
    (returns []) without the docker SDK or a reachable engine, so gc never needs docker."""
    if importlib.util.find_spec("docker") is None:
        return []
    import docker  # noqa: PLC0415
    try:
        client = docker_client()
    except IsolationUnavailable:
        return []
    removed = []
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={os.getuid()}"})
        for container in found:
            run = container.labels.get(LABEL_RUN)
            if run != keep and (run in runs or not _owner_alive(container.labels)):
                try:
                    _remove(container)
                    removed.append(container.name)
                except docker.errors.DockerException:
                    pass  # the next gc tries again
    finally:
        client.close()
    return removed
