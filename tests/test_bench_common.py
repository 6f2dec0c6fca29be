"""The benchmarks' own measuring helpers (``bench/_common.py``): a wrong meter makes every
table that uses it wrong."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _common  # noqa: E402


def _burn_then_wait(ms: float, gate: tuple[int, int], done: int | None = None) -> int:
    """A forked child that uses ``ms`` of CPU, says so on ``done``, then blocks until
    ``gate``'s write end is closed everywhere (each child drops its copy at once)."""
    pid = os.fork()
    if pid == 0:
        os.close(gate[1])
        end = time.thread_time() + ms / 1e3
        while time.thread_time() < end:
            pass
        if done is not None:
            os.write(done, b".")
        os.read(gate[0], 1)
        os._exit(0)
    return pid


def test_tree_cpu_counts_many_short_lived_workers_exactly():
    """A thousand sandbox agents that each ran a few ms: ``/proc/PID/stat`` rounds each one
    down to a whole clock tick (10 ms), so it read 0 for every one and a burst's create CPU
    came out at half its real value. 20 children of 4 ms each must count as >= 80 ms."""
    gate, done = os.pipe(), os.pipe()
    kids = [_burn_then_wait(4, gate, done[1]) for _ in range(20)]
    try:
        burnt = b""
        while len(burnt) < len(kids):  # every child has used its share
            burnt += os.read(done[0], 64)
        counted = sum(_common.tree_cpu_s(pid) for pid in kids)
    finally:
        os.close(gate[1])
        for pid in kids:
            os.waitpid(pid, 0)
        for fd in (gate[0], *done):
            os.close(fd)
    assert counted >= 20 * 0.004, counted
    assert counted < 20 * 0.004 + 0.5, counted  # and not wildly more: each child's own time


def test_tree_cpu_keeps_reaped_children():
    """Children already reaped count through the parent's cutime/cstime."""
    before = _common.tree_cpu_s(os.getpid())
    gate = os.pipe()
    pid = _burn_then_wait(150, gate)
    os.close(gate[1])
    os.waitpid(pid, 0)
    os.close(gate[0])
    assert _common.tree_cpu_s(os.getpid()) - before >= 0.14


def test_the_cluster_model_scales_the_nodes_side_and_not_the_service():
    """bench/cluster.py's model of N nodes: the nodes' share of a burst falls as nodes are
    added, the one service process's does not, so past some N the service is what breaks
    first; a burst the nodes cannot hold at the spec's memory limit says so."""
    import cluster

    import pytest

    calib = dict(node_create_ms=20.0, service_create_ms=0.2, mb_each=3.0, node_pss_mib=400.0, node_idle_cores=0.1)
    small, large = cluster.model(2, **calib, burst=4000), cluster.model(100, **calib, burst=4000)
    assert small["node_s"] == pytest.approx(4000 * 0.020 / (2 * (32 - 0.1)))  # 4,000 creates of 20 ms, 63.8 cores
    assert large["node_s"] * 50 == pytest.approx(small["node_s"])
    assert large["service_s"] == small["service_s"] == pytest.approx(0.8)
    assert small["breaks_first"] == "the nodes' CPU" and large["breaks_first"] == "the service process"
    assert large["gcs_calls_per_s"] == 100 * small["gcs_calls_per_s"] / 2  # per node, not per create
    full = cluster.model(2, **calib, burst=10_000)
    assert full["holds"] == 2 * ((128 * 1024 - 400) // 64) < 10_000 and full["breaks_first"].startswith("memory")
