"""What a run of sandboxes may leave on the host, read from the host's own view.

A sandbox's mounts live in its private mount namespace, so the test process's mount table
shows them only if something went wrong on the host side; what a dead run can really leak
is its processes (in its cgroups), its cgroups, its files under ROCKROLL_HOME, any
mount made in the host's namespaces under its directory and the loop devices of its
sandboxes' disks (``disk_mb``).
"""

from __future__ import annotations

from pathlib import Path

from rockroll.sandbox.deployment.cgroups import Cgroup, cgroup_mode
from rockroll.sandbox.deployment.disk import loop_devices
from rockroll.sandbox.home import state_home


def _host_mount_tables() -> list[str]:
    """This process's mount table and the host init's (pid 1's), where readable."""
    tables = []
    for pid in ("self", "1"):
        try:
            tables.append(Path(f"/proc/{pid}/mountinfo").read_text())
        except OSError:
            pass
    return tables


def _processes_in_cgroups_of(run_id: str) -> list[str]:
    """Host processes charged to a cgroup named after the run (its sandboxes' groups are
    ``<run_id>-<owner pid>-<owner start>.<sandbox id>``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            groups = (proc / "cgroup").read_text()
        except OSError:
            continue  # it exited meanwhile
        if f"/{run_id}-" in groups:
            found.append(f"process {proc.name}")
    return found


def leftovers(run_id: str, run_dir: Path) -> list[str]:
    """Everything of run ``run_id`` (directory ``run_dir``) still on the host; [] if clean."""
    left = [f"path {p}" for p in state_home().rglob(f"*{run_id}*")]
    if run_dir.exists():
        left.append(f"dir {run_dir}")
    if cgroup_mode() != "none":
        left += [f"cgroup {name}" for name in Cgroup.leftovers() if name.startswith(run_id + "-")]
    left += _processes_in_cgroups_of(run_id)
    left += [f"mount {line}" for table in _host_mount_tables() for line in table.splitlines()
             if str(run_dir) in line]
    left += [f"loop {dev}" for dev in loop_devices(run_dir)]
    return left
