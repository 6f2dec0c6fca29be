"""The local deployment: a sandbox as Linux namespaces + overlayfs + cgroups, no daemon.

This module only starts, stops and locates sandboxes; what you can *do* in one lives in
``runtime/guest.py`` and is the same for every backend (SWE-ReX's runtime/deployment split).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import shutil
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IsolationUnavailable, SandboxError, SandboxStartError
from ..protocol.frames import PREPARE_NET, GuestConfig, ModelConfig, encode_frame
from ..spec import SandboxSpec
from .cgroups import Cgroup, Limits, cgroup_mode, rlimit_fallback
from .disk import SandboxDisk
from .gateway import NetworkedDeployment, SandboxNetwork
from .process import GuestHandle, GuestProcess, fork_guest
from .rootfs import RootfsPlan, host_network_plan, network_plan, plan_for_image
from .usernet import UserNetwork

if TYPE_CHECKING:
    from .reaper import RunRegistry


def check_isolation() -> None:
    """Fail clearly, naming the docker backend, where this host cannot isolate."""
    if not sys.platform.startswith("linux"):
        raise IsolationUnavailable(
            f"the local backend needs Linux namespaces and overlayfs; this is {sys.platform}. "
            "Use backend='docker' instead.")
    if not os.path.exists("/proc/self/ns/pid") or "overlay" not in Path("/proc/filesystems").read_text():
        raise IsolationUnavailable(
            "this kernel lacks namespaces or overlayfs; use backend='docker' instead.")
    if os.geteuid() != 0 and not _userns_allowed():
        raise IsolationUnavailable(
            "not root and unprivileged user namespaces are disabled; run as root, enable "
            "kernel.unprivileged_userns_clone, or use backend='docker'.")


def _userns_allowed() -> bool:
    try:
        return Path("/proc/sys/kernel/unprivileged_userns_clone").read_text().strip() != "0"
    except OSError:
        return True  # upstream kernels have no switch: allowed unless userns max is 0


class _JoinedGuests:
    """Guests forked ahead of time (``fork_guest``) and already in a cgroup of their own,
    ``<run tag>.spare-<hex>``, with no limits yet, and in a network namespace of their own
    (loopback up; ``guest/main.py``'s ``read_config``). Moving a process into a cgroup is most of a
    local create's wall time when done on the way: the kernel's migration lock waits for
    an RCU grace period (cgroup v1, and v2 without ``favordynmods``): 9 of 15 ms on the
    dev host; making a network namespace waits on the kernel's rtnl_lock. A create takes one, renames its group to the sandbox's and writes the
    limits (no wait); a background thread makes the next. Per run: a run that closes
    kills and removes its own, and a crashed run's are reaped with its cgroups (same tag)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._ready: dict[str, collections.deque[tuple[Cgroup, GuestHandle]]] = {}
        self._lock = threading.Lock()
        self._maker: concurrent.futures.ThreadPoolExecutor | None = None

    def take(self, run: RunRegistry, name: str, limits: Limits) -> tuple[Cgroup, GuestHandle] | None:
        tag = run.cgroup_tag
        with self._lock:
            if self._maker is None:
                self._maker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rockroll-joined")
            if tag not in self._ready:
                self._ready[tag] = collections.deque()
                run.at_close(lambda: self.drop(tag))
            ready = self._ready[tag]
            pair = ready.popleft() if ready else None
            self._maker.submit(self._refill, run)
        if pair is None:
            return None
        group, guest = pair
        if guest.poll() is None:
            try:
                return group.renamed(name, limits, fresh=True), guest  # made with no limits
            except (OSError, SandboxError):
                pass
        _discard(group, guest)
        return None

    def _refill(self, run: RunRegistry) -> None:
        tag = run.cgroup_tag
        while True:
            with self._lock:
                if run.closed or len(self._ready.get(tag, ())) >= self.keep:
                    return
            try:
                group = Cgroup.create(f"{tag}.spare-{uuid.uuid4().hex[:10]}", Limits())
            except SandboxError:
                return  # the next create makes its own group, and says why
            guest = None
            try:
                guest = fork_guest(pid_ns=True)  # root only: see LocalDeployment
                group.add(guest.pid)
                guest.stdin.write(encode_frame(PREPARE_NET))  # in its cgroup, charged there
                guest.stdin.flush()
            except (OSError, SandboxError):
                _discard(group, guest)
                return
            with self._lock:
                if not run.closed and tag in self._ready:
                    self._ready[tag].append((group, guest))
                    continue
            _discard(group, guest)
            return

    def drop(self, tag: str) -> None:
        with self._lock:
            pairs = list(self._ready.pop(tag, ()))
        for group, guest in pairs:
            _discard(group, guest)


def _discard(group: Cgroup, guest: GuestHandle | None) -> None:
    if guest is not None:
        guest.kill()
    with contextlib.suppress(SandboxError):
        group.remove()


_joined = _JoinedGuests()


class LocalDeployment(NetworkedDeployment):
    """Host side of one local sandbox: its directories, cgroup and guest process."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str, run: RunRegistry):
        check_isolation()
        self.spec, self.id, self.run = spec, sandbox_id, run
        self.plan = plan_for_image(spec.image, run.home)
        self.dir = run.add(sandbox_id, self.kill_now)
        if spec.disk_mb is None:  # else the root's mount point is on the sized layer
            (self.dir / "rootfs").mkdir(exist_ok=True)
        # network="host": the host's resolver files over the image, as Docker's --network host
        self.net = host_network_plan(self.dir / "net") if spec.network == "host" else RootfsPlan((), ())
        self.userns = os.geteuid() != 0
        # as root a veth to the gateway (network.py); in a user namespace, lo and sockets
        # made in the sandbox's namespace (usernet.py): the same gateway and policy
        self.network = (UserNetwork if self.userns else SandboxNetwork)(spec.egress) if spec.network is True else None
        self.gen = 0
        self.guest = GuestProcess(self.dir)
        self.disk = SandboxDisk(spec.disk_mb, run.dir, self.dir, userns=self.userns, home=run.home)
        self.limits = Limits(cpus=spec.cpus, memory_mb=spec.memory_mb, pids=spec.pids)
        self.cgroup = None
        self._joined: GuestHandle | None = None  # a guest already in self.cgroup
        if cgroup_mode() != "none":
            name = f"{run.cgroup_tag}.{sandbox_id}"
            # a spare has its own network namespace already: only for network=False
            taken = None if self.userns or spec.network else _joined.take(run, name, self.limits)
            try:
                if taken is not None:
                    self.cgroup, self._joined = taken
                else:
                    self.cgroup = Cgroup.create(name, self.limits)
            except SandboxStartError as e:
                run.discard(sandbox_id)
                raise SandboxStartError(str(e), sandbox_id=sandbox_id) from e
        self._lock = threading.Lock()

    @property
    def upper(self) -> Path:
        return self.disk.upper or self.dir / f"upper{self.gen}"

    def spawn(self, layers: list[Path], sessions: dict[str, str],
              model: ModelConfig | None = None) -> GuestHandle:
        """Start a fresh guest over ``layers`` (top first) + the image, with an empty upper:
        on a disk of its own, ``disk_mb`` big (``disk.py``), or a host directory (no limit)."""
        self.gen += 1
        upper, work = self.dir / f"upper{self.gen}", self.dir / f"work{self.gen}"
        if self.network is not None:
            # On top of everything (image and snapshot layers): its resolver, the gateway;
            # with TLS inspection the trust store holding the sandbox's CA (tlsinspect.py).
            nameserver = self.network.prepare()
            self.net = network_plan(self.dir / "net", nameserver, self.network.trust_bundle())
        disk = self.disk.prepare(self.gen)
        if disk is None:
            upper.mkdir()
            work.mkdir()
            os.chmod(upper, 0o755)
        cfg = GuestConfig(
            id=self.id, hostname=self.id, workdir=self.spec.workdir, env=self.guest_env(),
            sessions=sessions, disk=disk, model=model,
            cgroup_procs=self.cgroup.procs_paths() if self.cgroup and not self._joined else [],
            rootfs=f"{disk.dir}/root" if disk else str(self.dir / "rootfs"),
            lowers=[*self.net.lowers, *(str(p) for p in layers), *self.plan.lowers],
            upper=str(upper), work=str(work),
            binds=[tuple(b) for b in (*self.plan.binds, *self.net.binds)],
            rlimits=[] if self.cgroup else [(r, s, h) for r, (s, h) in rlimit_fallback(self.limits)],
            userns=self.userns, network=self.spec.network is True,
            host_network=self.spec.network == "host")
        proc, self._joined = self._joined, None
        return self.guest.start(cfg, proc)

    def record(self, init_pid: int) -> None:
        self.guest.record(init_pid)
        self.disk.mounted(self.guest.proc.pid)
        if self.network is not None:
            # in a user namespace, the outer process: init is not dumpable, and its memory
            # belongs to the host's user namespace, where the owner may not enter it
            self.network.attach(self.guest.proc.pid if self.userns else init_pid)

    def stop_guest(self) -> None:
        """Kill the current guest (and with it the whole pid namespace); delete the old
        generation's directories once it is reaped, in the background."""
        gen = self.gen
        self.disk.close()
        self.guest.stop(then=lambda: self._drop_generation(gen))
        if self.network is not None:
            self.network.detach()
        if self.cgroup:
            # The old namespace's processes die after its pid 1, not with it: a fork bomb's
            # may still hold the pids limit, and the next guest could not fork. Empty it first.
            self.cgroup.kill_all()

    def _drop_generation(self, gen: int) -> None:
        for name in (f"upper{gen}", f"work{gen}"):
            shutil.rmtree(self.dir / name, ignore_errors=True)
        self.disk.drop(gen)

    def oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup else 0

    def freeze(self) -> None:
        if self.cgroup:
            self.cgroup.freeze()

    def thaw(self) -> None:
        if self.cgroup:
            self.cgroup.thaw()

    def usage(self) -> dict[str, float] | None:
        return self.cgroup.usage() if self.cgroup else None

    def kill_now(self) -> None:
        """Synchronous, idempotent teardown (also called from atexit)."""
        with self._lock:
            self.disk.close()
            self.guest.kill()
            if self.network is not None:
                self.network.detach()
            if self.cgroup:
                self.cgroup.remove()
                self.cgroup = None
            shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        self.kill_now()
        self.run.discard(self.id)
