"""``backend="ray"`` with a network: the egress policy, the counters and ``expose`` carried
through a real Ray cluster, attacked from inside the sandbox.

The cluster runs inside the lab's host namespace (``_netlab.py``; ``_netdriver.py ray``
starts it with node address 127.0.0.1, that namespace's own loopback), so Ray's ports and
the sandbox's veth and rules never touch the machine's network namespace. Ray is shut down
by the driver; no process may be left in the namespace after it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from _netlab import NetLab, lab_available

why_not = lab_available()
needs_lab = pytest.mark.skipif(why_not is not None and os.environ.get("CI") != "true", reason=why_not or "")
pytestmark = pytest.mark.timeout(600)


def host_pids(lab: NetLab) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", lab.host], capture_output=True, text=True, timeout=30)
    return [int(p) for p in out.stdout.split()]


@pytest.fixture
def lab(tmp_path):
    if why_not:
        pytest.fail(f"CI must run the network tests: {why_not}")
    with NetLab(tmp_path) as lab:
        try:
            yield lab
        finally:
            for pid in host_pids(lab):  # what a failed run left (the test fails on it below)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def refused(result) -> bool:
    return isinstance(result, str) and (result.startswith("error:") or result == "closed")


@needs_lab
def test_ray_sandbox_gets_the_policy_counters_and_expose(lab):
    r = lab.run_host("ray", timeout=480)
    assert r["client"] == "RaySandbox"
    assert r["resolv"].startswith("nameserver 10.231."), r["resolv"]  # its own gateway, on the node
    assert r["allowed_http"] == "allowed-site", r
    for name, a in r["attacks"].items():
        assert refused(a["result"]), (name, a)
        assert a["counted"] == 1, (name, a)  # read through Ray: SandboxHost.network_stats
    # pipelined: allowed.test answered, the request for evil.test refused by the node's gateway
    assert "allowed-site" in r["pipelined"] and "evil-site" not in r["pipelined"], r["pipelined"]
    assert "403 Forbidden" in r["pipelined"] and r["stats"]["denied"].get("http_host") == 1, r
    # TLS inspection on the node: the sandbox trusts its CA, each request inside is judged
    assert r["inspected"] == {"get": "allowed-site", "fronting": "403 http_host", "post": "403 http_method"}, r
    assert r["inspected_denied"] == {"http_host": 1, "http_method": 1}, r
    assert r["listen"] == "listening"
    assert r["exposed"] == ["127.0.0.1", "from-the-sandbox"], r  # expose through the host actor
    stats = r["stats"]
    assert stats["connections"] >= 1 and stats["bytes_in"] > 0 and stats["dns_queries"] >= 2, stats
    assert set(stats["denied"]) >= {"address", "dns", "metadata", "udp"}, stats
    assert r["stats_after_close"] is None
    # ray.shutdown() took the cluster down: nothing of it (or of the sandbox) is left
    deadline = time.monotonic() + 30
    while host_pids(lab) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert host_pids(lab) == []
