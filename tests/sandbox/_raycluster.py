"""A real multi-node Ray cluster on 127.0.0.1 for tests: each node started with Ray's own
`ray start` (through `python -m rockroll.sandbox.deployment.ray`, which keeps the loopback
address Ray would otherwise swap for the machine's outward IP) in a session of its own, so
one node can be killed by itself, as a machine that loses power would be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Node:
    temp_dir: Path
    pgid: int

    def kill(self) -> None:
        """SIGKILL every process of the node (raylet, agents, and the actor workers, which
        Ray puts in process groups of their own), as a machine that loses power -- but not
        the sandbox agents they started, nor what runs under those: those must go by themselves."""
        parent, group, cmdline = {}, {}, {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                pid = int(entry.name)
                parent[pid], group[pid] = int(fields[1]), int(fields[2])
                cmdline[pid] = (entry / "cmdline").read_bytes()
            except (OSError, ValueError):
                pass
        doomed = {pid for pid, g in group.items() if g == self.pgid}
        while True:  # and their descendants, down to a sandbox agent
            more = {pid for pid, pp in parent.items() if pp in doomed and pid not in doomed
                    and b"guest/__main__.py" not in cmdline.get(pid, b"")}
            if not more:
                break
            doomed |= more
        for pid in doomed:
            if b"guest/__main__.py" in cmdline.get(pid, b""):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_all(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def node_id(self) -> str:
        """The node's id, as ``ray.nodes()`` of a connected driver tells."""
        import ray

        return next(n["NodeID"] for n in ray.nodes()
                    if n["Alive"] and str(self.temp_dir) in n.get("ObjectStoreSocketName", ""))


def ray_start(args: list[str], temp_dir: Path, env: dict, resources: dict[str, float] | None = None) -> Node:
    temp_dir.mkdir(parents=True)
    agent, grpc, metrics, rt_env = free_ports(4)
    cmd = [sys.executable, "-m", "rockroll.sandbox.deployment.ray", "start", *args,
           "--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=100000000",
           f"--temp-dir={temp_dir}", "--disable-usage-stats",
           f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
           f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={rt_env}"]
    if resources:
        cmd.append(f"--resources={json.dumps(resources)}")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    node = Node(temp_dir, proc.pid)  # its daemons stay in this new process group
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        node.kill_all()
        raise
    if proc.returncode != 0:
        node.kill_all()
        raise RuntimeError(f"ray start failed:\n{out.decode(errors='replace')[-3000:]}")
    return node


@dataclass
class LoopbackCluster:
    """A head and worker nodes on 127.0.0.1, each in its own process group; ``env`` is the
    environment the nodes (and a driver started as a subprocess) run with."""

    root: Path
    env: dict = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    address: str = ""

    def __post_init__(self):
        # Ray's dashboard asks cloud metadata servers what it runs on unless it finds a
        # cluster config in $HOME: give it one, so no traffic leaves 127.0.0.1.
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "ray_bootstrap_config.yaml").write_text("provider: {type: local}\n")
        # RAY_AUTH_MODE: the nodes' own (an earlier ray.init in this process may have set
        # "token", and the token lives in the real HOME): loopback only, no auth
        self.env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                    # notice a dead node in seconds, not the default tens of seconds
                    "RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
                    "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}

    def _temp_dir(self, name: str) -> Path:
        # Ray puts unix sockets under its --temp-dir, which must stay short (108-byte limit):
        # hence tempfile.mkdtemp under /tmp, not pytest's deep tmp_path.
        return Path(tempfile.mkdtemp(prefix="rr-")) / name

    def start_head(self, resources: dict[str, float] | None = None) -> Node:
        port = free_ports(1)[0]
        node = ray_start(["--head", f"--port={port}", "--include-dashboard=false", "--dashboard-host=127.0.0.1",
                          f"--ray-client-server-port={free_ports(1)[0]}"], self._temp_dir("h"), self.env, resources)
        self.nodes.append(node)
        self.address = f"127.0.0.1:{port}"
        return node

    def add_node(self, resources: dict[str, float] | None = None) -> Node:
        node = ray_start([f"--address={self.address}"], self._temp_dir(f"w{len(self.nodes)}"), self.env, resources)
        self.nodes.append(node)
        return node

    def alive(self) -> int:
        import ray

        return sum(n["Alive"] for n in ray.nodes())

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.kill_all()
            shutil.rmtree(node.temp_dir.parent, ignore_errors=True)


def guests_of(run_id: str) -> list[int]:
    """The recorded guest pids of a run's sandboxes that are still running."""
    from rockroll.sandbox.home import state_home
    from rockroll.sandbox.lifecycle import proc_start_time

    alive = []
    for sb_dir in (state_home() / "runs" / run_id).glob("*/guest.json"):
        pids = json.loads(sb_dir.read_text())
        alive += [pids[k] for k in ("init_pid", "outer_pid")
                  if isinstance(pids.get(k), int) and proc_start_time(pids[k]) == pids.get(k.replace("pid", "start"))]
    return alive
