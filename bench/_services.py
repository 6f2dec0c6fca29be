"""What a benchmark starts beside itself: a ``rockroll serve``, a loopback Ray cluster and
moto's S3 server.

All listen on 127.0.0.1 only and run in their own process groups, so ``stop()`` ends
exactly what was started here (SIGTERM first, then SIGKILL), also after a Ctrl-C.
Benchmarks never import the tests: the test suite has its own copy of this logic.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(pgid: int, grace: float) -> bool:
    """SIGTERM a process group, wait ``grace`` seconds, then SIGKILL what is left.
    Returns True if it ended on SIGTERM alone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return False


def _raise_nofile() -> None:
    """In the child: open files up to the hard limit (1,000 sandboxes = 2,000 pipes + sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Service:
    """``rockroll serve --host 127.0.0.1 --port <free>`` with a random token.

    ``env`` is the environment it runs in (default: ours); its stdout/stderr go to a log
    file, shown when it fails to start."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, start_timeout: float = 60.0):
        import secrets

        self.port = free_ports(1)[0]
        self.token = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="rockroll-bench-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rockroll.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            env={**(env if env is not None else os.environ), "ROCKROLL_TOKEN": self.token},
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_raise_nofile)
        self.run_id: str | None = None
        try:
            self.run_id = self._wait_healthy(start_timeout)["run_id"]
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    return json.loads(r.read())
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rockroll serve did not start:\n{self.logs()[-3000:]}") from None
                time.sleep(0.1)

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, grace: float = 60.0) -> str:
        """SIGTERM (the service closes every sandbox it holds), then SIGKILL after
        ``grace`` seconds; returns how it ended. Idempotent."""
        how = "not running"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
                how = "SIGTERM"
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                how = "SIGKILL"
        stop_group(self.proc.pid, 5.0)  # anything it left in its group
        if not self.log.closed:
            self.log.close()
            if how == "SIGTERM":
                Path(self.log.name).unlink(missing_ok=True)
        return how


class RayCluster:
    """A Ray cluster of ``nodes`` nodes on 127.0.0.1, one process group per node.

    Started with ``python -m rockroll.sandbox.deployment.ray start`` (Ray's ``ray start``,
    keeping the loopback address). Ray's dashboard asks cloud metadata servers where it
    runs unless it finds a cluster config in ``$HOME``: the nodes get a private HOME that
    holds one, so no traffic leaves 127.0.0.1."""

    def __init__(self, nodes: int = 1, *, env: dict[str, str] | None = None, cpus_per_node: int = 1):
        self.root = Path(tempfile.mkdtemp(prefix="rrb-"))  # short: Ray's unix sockets live under it
        home = self.root / "home"
        home.mkdir()
        (home / "ray_bootstrap_config.yaml").write_text("provider: {type: local}\n")
        self.env = {**(env if env is not None else os.environ), "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
        self.cpus = cpus_per_node
        self.pgids: list[int] = []
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        try:
            self._start(["--head", f"--port={self.port}", "--include-dashboard=false",
                         "--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_ports(1)[0]}"], "h")
            for i in range(nodes - 1):
                self._start([f"--address={self.address}"], f"w{i}")
        except BaseException:
            self.stop()
            raise

    def _start(self, args: list[str], name: str) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir()
        agent, grpc, metrics, rt_env = free_ports(4)
        cmd = [sys.executable, "-m", "rockroll.sandbox.deployment.ray", "start", *args,
               "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}", "--object-store-memory=100000000",
               f"--temp-dir={temp_dir}", "--disable-usage-stats",
               f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
               f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={rt_env}"]
        proc = subprocess.Popen(cmd, env=self.env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        self.pgids.append(proc.pid)  # its daemons stay in this new process group
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ray start ({name}) did not finish in 180 s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed:\n{out.decode(errors='replace')[-3000:]}")

    def stop(self, grace: float = 15.0) -> list[str]:
        """Stop every node (SIGTERM, then SIGKILL after ``grace`` s), workers first;
        returns how each ended. Idempotent."""
        how = []
        for pgid in reversed(self.pgids):
            how.append("SIGTERM" if stop_group(pgid, grace) else "SIGKILL")
        self.pgids.clear()
        shutil.rmtree(self.root, ignore_errors=True)
        return how


class MotoServer:
    """moto's S3 server (``moto_server``, a test dependency) on 127.0.0.1 and a free port, in
    a process group of its own; ``endpoint`` is its URL. Its data lives in its memory."""

    def __init__(self, start_timeout: float = 30.0):
        self.port = free_ports(1)[0]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("moto_server")
        if not exe.is_file():
            raise RuntimeError(f"no {exe}: install the test extra (pip install -e '.[test]'), which brings moto[server]")
        self.proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> str:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns how it ended. Idempotent."""
        if self.proc.poll() is not None:
            return "not running"
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
            return "SIGTERM"
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return "SIGKILL"
