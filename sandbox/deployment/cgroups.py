"""Resource limits for a sandbox's process tree: cgroup v2, cgroup v1, or rlimits.

A ``Cgroup`` is one sandbox's group, ``<parent>/<name>`` at the root of every
hierarchy it uses (the parent is ``rockroll`` unless ``ROCKROLL_CGROUP_PARENT`` says
otherwise). Groups sit at the hierarchy root, not inside the engine's own cgroup,
because they must outlive the engine process: a garbage collector of a later run
finds and removes them with ``Cgroup.leftovers()``.

When no cgroup can be created (``cgroup_mode() == "none"``: not root, read-only
cgroupfs, no controllers delegated), ``rlimit_fallback`` gives per-process limits
for the child to set on itself instead. Stdlib only.
"""

from __future__ import annotations

import errno
import functools
import os
import resource
import signal
import time
import uuid
from dataclasses import dataclass

from ..errors import IsolationUnavailable, SandboxError, SandboxNotFound, SandboxStartError, SpecError

CGROUP_ROOT = "/sys/fs/cgroup"
PARENT_ENV = "ROCKROLL_CGROUP_PARENT"
DEFAULT_PARENT = "rockroll"
CPU_PERIOD_US = 100_000
_MIB = 1024 * 1024
_V2_CONTROLLERS = ("memory", "pids", "cpu")
# v1 hierarchies a group lives in; "cpuacct" is optional (cpu_seconds() then reads 0).
_V1_REQUIRED = ("memory", "pids", "cpu", "freezer")


@dataclass(frozen=True)
class Limits:
    """Limits of one sandbox; ``None`` means "no limit" for that resource.

    ``cpus`` is a CPU-time quota in CPUs (0.5 = half a core, 2 = two cores),
    ``memory_mb`` caps RAM (and swap: swap cannot be used to bypass it), ``pids``
    caps the number of processes and threads. Invalid values raise ``SpecError``
    naming the field, so a ``Limits`` that exists is always valid.
    """

    cpus: float | None = None
    memory_mb: int | None = None
    pids: int | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and (isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float))
                                      or not self.cpus > 0):
            raise SpecError("cpus", f"must be a number > 0 or None, got {self.cpus!r}")
        # Below 16 MiB even a shell cannot start; below 8 pids a session cannot run a pipeline.
        for field, minimum in (("memory_mb", 16), ("pids", 8)):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise SpecError(field, f"must be an int >= {minimum} or None, got {value!r}")


def parent_name() -> str:
    """The parent group's relative path: ``$ROCKROLL_CGROUP_PARENT`` or ``rockroll``."""
    parent = os.environ.get(PARENT_ENV) or DEFAULT_PARENT
    parts = parent.split("/")
    if parent.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SpecError(PARENT_ENV, f"must be a relative path without '.' or '..', got {parent!r}")
    return parent


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise SpecError("name", f"must be a single path component, got {name!r}")


_ROOTS: dict[str, dict[str, str]] = {}


_FILES: dict[tuple[str, ...], bool] = {}  # (root, mode, controller, control file) -> offered (Cgroup._has)


def _mkdir(path: str) -> bool:
    """Make the group directory ``path`` (and its parents); True if it existed. One
    ``mkdir`` in the usual case, not ``makedirs``' stat of every parent first."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return True
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return _mkdir(path)
    return False


def _v1_roots() -> dict[str, str]:
    """v1 controller -> hierarchy root. A joint ``cpu,cpuacct`` mount (or ``cpu`` and
    ``cpuacct`` symlinked to it) maps both keys to the same directory. Looked up once per
    process (~15 stat and readlink calls on cgroupfs, which every create paid)."""
    if not _ROOTS.get(CGROUP_ROOT):  # (none found is not kept: hierarchies may be mounted later)
        _ROOTS[CGROUP_ROOT] = _find_v1_roots()
    return _ROOTS[CGROUP_ROOT]


def _find_v1_roots() -> dict[str, str]:
    roots = {}
    for key in ("memory", "pids", "cpu", "cpuacct", "freezer"):
        for entry in (key, "cpu,cpuacct", "cpuacct,cpu") if key in ("cpu", "cpuacct") else (key,):
            path = os.path.realpath(os.path.join(CGROUP_ROOT, entry))
            if os.path.isfile(os.path.join(path, "cgroup.procs")):
                roots[key] = path
                break
    return roots


def _is_v2() -> bool:
    """True if CGROUP_ROOT itself is a cgroup2 mount (not a hybrid host's ``unified``)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.partition(" - ") for line in f]
    except OSError:
        return False
    # The last mount on a path is the visible one.
    types = [right.split()[0] for left, _, right in mounts if left.split()[4] == CGROUP_ROOT]
    return bool(types) and types[-1] == "cgroup2"


def _enable_v2(path: str) -> None:
    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
        f.write(" ".join("+" + c for c in _V2_CONTROLLERS))


@functools.lru_cache(maxsize=None)
def cgroup_mode() -> str:
    """``"v2"``, ``"v1"`` or ``"none"`` (no group can be created here); cached.

    Decided by trying, not by guessing from the uid: a probe group is created and
    removed at each hierarchy root (in v2, the controllers are enabled at the root
    too, which is what ``Cgroup.create`` needs first).
    """
    if _is_v2():
        with open(os.path.join(CGROUP_ROOT, "cgroup.controllers")) as f:
            if not set(_V2_CONTROLLERS) <= set(f.read().split()):
                return "none"
        roots, mode = [CGROUP_ROOT], "v2"
    else:
        found = _v1_roots()
        if not set(_V1_REQUIRED) <= set(found):
            return "none"
        roots, mode = sorted(set(found.values())), "v1"
    try:
        if mode == "v2":
            _enable_v2(CGROUP_ROOT)
        for root in roots:
            probe = os.path.join(root, f".rockroll-probe-{uuid.uuid4().hex[:12]}")
            os.mkdir(probe)
            os.rmdir(probe)
    except OSError:
        return "none"
    return mode


def _keyed(text: str | None) -> dict[str, int]:
    """Parse a ``key value`` per line file (memory.events, cpu.stat, memory.oom_control)."""
    out = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class Cgroup:
    """One sandbox's cgroup(s). Get one with ``create`` (writes limits) or ``attach``.

    ``dirs`` maps a controller ("memory", "pids", "cpu", "cpuacct", "freezer") to its
    directory; in v2 every controller maps to the same one leaf directory.
    """

    def __init__(self, name: str, mode: str, dirs: dict[str, str]):
        self.name, self.mode, self.dirs = name, mode, dirs

    def __repr__(self) -> str:
        return f"Cgroup({self.name!r}, mode={self.mode!r})"

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


    @staticmethod
    def _layout(name: str) -> tuple[str, dict[str, str]]:
        _check_name(name)
        mode, parent = cgroup_mode(), parent_name()
        if mode == "none":
            raise IsolationUnavailable("cgroups cannot be created here; use rlimit_fallback()", sandbox_id=name)
        if mode == "v2":
            leaf = os.path.join(CGROUP_ROOT, parent, name)
            return mode, {key: leaf for key in ("memory", "pids", "cpu", "cpuacct", "freezer")}
        return mode, {key: os.path.join(root, parent, name) for key, root in _v1_roots().items()}

    def _unique_dirs(self) -> list[str]:
        return list(dict.fromkeys(self.dirs.values()))

    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroup:
        """Create group ``name`` and write ``limits``; reuse it (after killing whatever
        runs in it) if a dead run left it behind. Raises ``SpecError`` for a bad name,
        ``IsolationUnavailable`` in mode "none", ``SandboxStartError`` if the kernel
        refuses a directory or a limit (the half-made group is removed)."""
        mode, dirs = cls._layout(name)
        group = cls(name, mode, dirs)
        try:
            if mode == "v2":
                # v2 forbids processes in inner nodes that have controllers enabled, so
                # the parent path is made of pure parents; processes only go in leaves.
                path = CGROUP_ROOT
                for part in parent_name().split("/"):
                    _enable_v2(path)
                    path = os.path.join(path, part)
                    os.makedirs(path, exist_ok=True)
                _enable_v2(path)
            existed = False
            for d in group._unique_dirs():
                existed |= _mkdir(d)
            if existed:  # a dead run's group: empty it, and thaw it in case it died mid-snapshot
                group.kill_all()
                group.thaw()
            group._write_limits(limits, fresh=not existed)
        except (OSError, SandboxError) as e:
            try:
                group.remove()
            except SandboxError:
                pass  # report the first failure, not the cleanup's
            raise SandboxStartError(f"cannot set up cgroup: {e}", sandbox_id=name) from e
        return group

    def _write_limits(self, limits: Limits, fresh: bool = False) -> None:
        """Write ``limits``. A ``fresh`` group still has the kernel's defaults (no limit,
        a 100 ms CPU period), so only real limits are written: every write to cgroupfs
        takes the kernel's cgroup locks, which a burst of creates contends for."""
        mem = limits.memory_mb * _MIB if limits.memory_mb is not None else None
        quota = max(1000, round(limits.cpus * CPU_PERIOD_US)) if limits.cpus is not None else None
        if self.mode == "v2":
            if mem is not None or not fresh:
                self._write("memory", "memory.max", mem if mem is not None else "max")
                if self._has("memory", "memory.swap.max"):
                    self._write("memory", "memory.swap.max", 0 if mem is not None else "max")
            if limits.pids is not None or not fresh:
                self._write("pids", "pids.max", limits.pids if limits.pids is not None else "max")
            if quota is not None or not fresh:
                self._write("cpu", "cpu.max", f"{quota if quota is not None else 'max'} {CPU_PERIOD_US}")
            return
        # memsw (RAM + swap) must stay >= the RAM limit at every step, so lift it first;
        # then setting it equal to the RAM limit means swap cannot bypass the cap.
        memsw = self._has("memory", "memory.memsw.limit_in_bytes")
        if memsw and not fresh:
            self._write("memory", "memory.memsw.limit_in_bytes", -1)
        if mem is not None or not fresh:
            self._write("memory", "memory.limit_in_bytes", mem if mem is not None else -1)
        if memsw and mem is not None:
            self._write("memory", "memory.memsw.limit_in_bytes", mem)
        if limits.pids is not None or not fresh:
            self._write("pids", "pids.max", limits.pids if limits.pids is not None else "max")
        if not fresh:
            self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
        if quota is not None or not fresh:
            self._write("cpu", "cpu.cfs_quota_us", quota if quota is not None else -1)

    def renamed(self, name: str, limits: Limits, fresh: bool = False) -> Cgroup:
        """This group under ``name`` (its processes stay in it), with ``limits`` written:
        a group made ahead of time becomes a sandbox's (``fresh``: no limit was ever
        written to it). ``OSError`` if the kernel refuses."""
        mode, dirs = self._layout(name)
        new = {old: dirs[key] for key, old in self.dirs.items()}
        for old in self._unique_dirs():
            os.rename(old, new[old])
        group = Cgroup(name, mode, dirs)
        group._write_limits(limits, fresh=fresh)
        return group

    @classmethod
    def attach(cls, name: str) -> Cgroup:
        """A handle on existing group ``name`` without touching its limits;
        ``SandboxNotFound`` if it exists in no hierarchy."""
        mode, dirs = cls._layout(name)
        if not any(os.path.isdir(d) for d in dirs.values()):
            raise SandboxNotFound(f"no cgroup {parent_name()}/{name}", sandbox_id=name)
        return cls(name, mode, dirs)

    @staticmethod
    def leftovers() -> list[str]:
        """Names of all existing groups under the parent (in any hierarchy), sorted;
        ``[]`` in mode "none". Groups of live runs are listed too: the caller decides."""
        mode = cgroup_mode()
        if mode == "none":
            return []
        roots = [CGROUP_ROOT] if mode == "v2" else set(_v1_roots().values())
        names: set[str] = set()
        for root in roots:
            parent = os.path.join(root, parent_name())
            try:
                names.update(e.name for e in os.scandir(parent) if e.is_dir(follow_symlinks=False))
            except FileNotFoundError:
                pass
        return sorted(names)

    def remove(self) -> None:
        """Kill every process, then remove every directory. Idempotent: a group that
        is already (partly) gone is fine. Raises ``SandboxError`` only if processes or
        directories refuse to go away."""
        self.kill_all()
        for d in self._unique_dirs():
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:  # EBUSY: a killed task is not fully released yet
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxError(f"cannot remove {d}: {e}", sandbox_id=self.name) from e
                    time.sleep(0.01)


    def procs_paths(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid (or ``0``, meaning
        itself) into to join the group: one per v1 hierarchy, one in v2. A child does
        this itself before exec-ing the sandbox, so nothing runs outside the limits."""
        return [os.path.join(d, "cgroup.procs") for d in self._unique_dirs()]

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group; ``OSError`` if it is gone."""
        for path in self.procs_paths():
            with open(path, "w") as f:
                f.write(str(pid))

    def pids(self) -> list[int]:
        """Every pid in the group (union over hierarchies), sorted; ``[]`` if gone."""
        found: set[int] = set()
        for path in self.procs_paths():
            try:
                with open(path) as f:
                    found.update(int(line) for line in f.read().split())
            except OSError as e:  # ENODEV: another process is removing the group right now
                if e.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
        return sorted(found)

    def freeze(self, timeout: float = 5.0) -> None:
        """Stop every process in the group and return once all are stopped (for a
        consistent snapshot); ``SandboxError`` if that takes longer than ``timeout``."""
        if self.mode == "v2":
            self._write("freezer", "cgroup.freeze", 1)
            done = lambda: _keyed(self._read("freezer", "cgroup.events")).get("frozen") == 1  # noqa: E731
        else:
            self._write("freezer", "freezer.state", "FROZEN")
            done = lambda: (self._read("freezer", "freezer.state") or "").strip() == "FROZEN"  # noqa: E731
        deadline, delay = time.monotonic() + timeout, 0.001
        while not done():
            if time.monotonic() > deadline:
                raise SandboxError(f"cgroup did not freeze within {timeout}s", sandbox_id=self.name)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def thaw(self) -> None:
        """Let the processes of a frozen group run again."""
        if self.mode == "v2":
            self._write("freezer", "cgroup.freeze", 0)
        else:
            self._write("freezer", "freezer.state", "THAWED")

    def kill_all(self, timeout: float = 30.0) -> None:
        """SIGKILL every process in the group until it is empty; ``SandboxError`` if
        it is not empty after ``timeout`` s (long: a task in uninterruptible disk sleep dies
        only when its I/O completes, which takes seconds on a busy disk). A group that is
        gone counts as empty."""
        if not self.pids():  # empty, or gone
            return
        if self.mode == "v2" and self._has("freezer", "cgroup.kill"):
            self._write("freezer", "cgroup.kill", 1)  # atomic and race-free (Linux 5.14+)
        deadline = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > deadline:
                raise SandboxError(f"cgroup still holds pids {self.pids()} after {timeout}s", sandbox_id=self.name)
            # Frozen, nothing can fork or exit between reading a pid and killing it:
            # a fork bomb cannot outrun the loop, and a pid cannot be reused meanwhile.
            try:
                self.freeze(timeout=0.5)
            except (OSError, SandboxError):
                pass  # e.g. a task in uninterruptible sleep; kill what we can anyway
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.thaw()  # killed tasks only die once they run again
            except OSError:
                pass
            time.sleep(0.005)


    def oom_kills(self) -> int:
        """Processes the OOM killer has killed in this group so far; 0 if unknown."""
        if self.mode == "v2":
            return _keyed(self._read("memory", "memory.events")).get("oom_kill", 0)
        return _keyed(self._read("memory", "memory.oom_control")).get("oom_kill", 0)

    def memory_bytes(self) -> int:
        """Memory charged to the group now (RAM incl. page cache), in bytes; 0 if gone."""
        return int(self._read("memory", "memory.current" if self.mode == "v2" else "memory.usage_in_bytes") or 0)

    def memory_peak_bytes(self) -> int:
        """Highest memory charge seen; in v2 without memory.peak (Linux < 5.19), the
        current charge (a lower bound)."""
        peak = self._read("memory", "memory.peak" if self.mode == "v2" else "memory.max_usage_in_bytes")
        return int(peak) if peak else self.memory_bytes()

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used by the group's processes, in seconds."""
        if self.mode == "v2":
            return _keyed(self._read("cpu", "cpu.stat")).get("usage_usec", 0) / 1e6
        if "cpuacct" not in self.dirs:
            return 0.0
        return int(self._read("cpuacct", "cpuacct.usage") or 0) / 1e9


    def usage(self) -> dict[str, float] | None:
        """CPU seconds and current memory, or None if the group cannot be read (gone)."""
        try:
            return {"cpu_seconds": self.cpu_seconds(), "memory_bytes": self.memory_bytes()}
        except (OSError, ValueError, SandboxError):
            return None

    def _has(self, key: str, filename: str) -> bool:
        """Whether the kernel offers control file ``filename`` (swap accounting,
        ``cgroup.kill``): the same in every group of a hierarchy, so asked once."""
        known = (CGROUP_ROOT, self.mode, key, filename)
        if known not in _FILES:
            _FILES[known] = os.path.exists(os.path.join(self.dirs[key], filename))
        return _FILES[known]

    def _read(self, key: str, filename: str) -> str | None:
        try:
            with open(os.path.join(self.dirs[key], filename)) as f:
                return f.read()
        except (FileNotFoundError, KeyError):
            return None

    def _write(self, key: str, filename: str, value: object) -> None:
        with open(os.path.join(self.dirs[key], filename), "w") as f:
            f.write(str(value))


def rlimit_fallback(limits: Limits) -> list[tuple[int, tuple[int, int]]]:
    """``(resource.RLIMIT_*, (soft, hard))`` pairs for a child to pass to
    ``resource.setrlimit`` before exec when ``cgroup_mode() == "none"``.

    Weaker than cgroups, and per process, not per tree:
    - ``RLIMIT_AS`` from ``memory_mb`` caps each process's *virtual* address space
      (allocations fail with ENOMEM instead of an OOM kill; runtimes that reserve
      large virtual areas, like Go or the JVM, may need more headroom).
    - ``RLIMIT_NPROC`` from ``pids`` counts every process of the *real uid*, not of
      the sandbox, and does not apply to root (CAP_SYS_RESOURCE / CAP_SYS_ADMIN).
    - ``RLIMIT_CORE`` 0 always: no core dumps filling the disk.
    - ``cpus`` has no rlimit equivalent (``RLIMIT_CPU`` kills after a total, it does
      not throttle), so nothing is returned for it; the caller may lower the child's
      priority (e.g. ``os.nice(10)``) instead.
    """
    out = [(resource.RLIMIT_CORE, (0, 0))]
    if limits.memory_mb is not None:
        size = limits.memory_mb * _MIB
        out.append((resource.RLIMIT_AS, (size, size)))
    if limits.pids is not None:
        out.append((resource.RLIMIT_NPROC, (limits.pids, limits.pids)))
    return out
