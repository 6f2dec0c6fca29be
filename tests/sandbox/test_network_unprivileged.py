"""``network=True`` without root (``deployment/usernet.py``): the sandbox's namespace has
only ``lo``; the gateway's listeners are sockets made in it and held by the creator.

The lab tests run the sandboxes' owner as uid 65534 with the system Python
(``_nobody.py``) inside the lab's host namespace (``_netlab.py``), and attack from inside
as ``test_network.py`` does for the root path: each attack refused and counted, what the
policy allows working. The test without a lab runs in a network namespace of its own with
nothing in it (loopback down): it sends nothing anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from _netlab import NetLab, lab_available
from _nobody import AS_NOBODY, SYSTEM_PY, nobody_env, nobody_package, system_python_matches, world_tmp  # noqa: F401
from test_network import check_close_with_connections_open, check_every_request_judged, refused

why_not = lab_available()
if why_not is None and not shutil.which("setpriv"):
    why_not = "setpriv (util-linux) is not installed"
if why_not is None and not system_python_matches():
    why_not = "the system python differs from the test python (the package runs as nobody with it)"
needs_lab = pytest.mark.skipif(why_not is not None and os.environ.get("CI") != "true", reason=why_not or "")


@pytest.fixture
def lab(world_tmp):  # noqa: F811
    if why_not:
        pytest.fail(f"CI must run the network tests: {why_not}")
    folder = world_tmp / "lab"
    folder.mkdir()
    with NetLab(folder) as lab:
        yield lab


@needs_lab
def test_unprivileged_allow_list_holds_against_each_attack_and_counts_it(lab, world_tmp):  # noqa: F811
    r = lab.run_host_unprivileged(world_tmp, "restricted")
    assert r["resolv"].startswith("nameserver 10.0.2.100\n"), r["resolv"]
    assert r["allowed_http"] == "allowed-site"
    assert r["wildcard_http"] == "allowed-site"
    assert r["allowed_tls"] == "tls-site"
    assert r["pip"][:2] == [0, "from-the-test-index"], r["pip"]
    for name, a in r["attacks"].items():
        assert refused(a["result"]), (name, a)
        assert a["counted"] >= 1, (name, a)
    assert r["raw_socket"].startswith("error:PermissionError"), r["raw_socket"]
    assert r["own_loopback"].startswith("error:ConnectionRefused")  # its own lo, not the host's
    stats = r["stats"]
    assert stats["connections"] >= 4 and stats["bytes_in"] > 1000 and stats["bytes_out"] > 100


@needs_lab
def test_unprivileged_gateway_judges_every_http_request(lab, world_tmp):  # noqa: F811
    """The same gateway without root: each request on a connection judged, as on the root path
    (``test_network.test_every_http_request_on_a_connection_is_judged``)."""
    check_every_request_judged(lab.run_host_unprivileged(world_tmp, "requests"))


@needs_lab
def test_unprivileged_close_with_connections_open_prints_and_leaks_nothing(lab, world_tmp):  # noqa: F811
    check_close_with_connections_open(lab.run_host_unprivileged(world_tmp, "close_open"))


@needs_lab
def test_unprivileged_sandbox_reaches_neither_the_hosts_loopback_nor_its_address_and_leaves_nothing(lab, world_tmp):  # noqa: F811
    r = lab.run_host_unprivileged(world_tmp, "unprivileged")
    assert r["euid"] == 65534
    assert r["interfaces"] == ["lo"], r["interfaces"]
    assert r["resolv"].startswith("nameserver 10.0.2.100\n")
    # the host's 127.0.0.1:8111 answers the host; from the sandbox, 127.0.0.1 is its own lo
    assert r["host_loopback_from_host"] == "host-loopback"
    assert r["host_loopback"].startswith("error:ConnectionRefused") and r["host_loopback_hits"] == 0, r
    assert "other-site" in r["direct_public_ip"], r  # network=True: the public internet ...
    assert r["any_name"] == "other-site"
    assert refused(r["metadata"]) and refused(r["lab_host"])  # ... nothing private
    assert r["rebind"].startswith("error:")
    # no CAP_NET_ADMIN in its user namespace: the rules and routes stay as they are
    assert r["flush_rules"] != 0 and r["cap_net_admin"] == 0
    assert refused(r["metadata_after_flush"])
    assert r["listen"] == "listening"
    assert r["host_before_expose"].startswith("error:")
    assert r["exposed"] == ["127.0.0.1", "from-the-sandbox"]
    # egress.bandwidth_mbit: lo's two capped classes (one per direction) carry the proxied connection
    assert "other-site" in r["capped_by_cidr"]
    assert len(r["capped_classes"]) == 2 and all(sent > 0 for sent in r["capped_classes"]), r["capped_classes"]
    denied = r["stats"]["denied"]
    assert denied.get("metadata") == 2 and denied.get("host") == 1 and denied.get("rebinding") == 1, denied
    assert r["helpers_while_open"] >= 1
    assert r["helpers_after_close"] == 0 and r["sockets_left"] == 0, r
    assert r["helper_alive"] and not r["helper_after_kill"], r  # the helper dies with a killed owner


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not system_python_matches(),
                    reason="needs root to switch to nobody, setpriv and a matching system python")
def test_unprivileged_network_opens_with_only_loopback(world_tmp):  # noqa: F811
    """No lab: the owner runs as nobody in a network namespace of its own with nothing in
    it (``unshare --net``), so nothing is sent anywhere; the sandbox opens, and sees ``lo``,
    after a restore too."""
    nobody_package(world_tmp)
    script = textwrap.dedent("""
        import os
        from rockroll.sandbox import open_sandbox, SandboxSpec
        assert os.geteuid() == 65534
        with open_sandbox(SandboxSpec(network=True, timeout_s=60)) as sb:
            print(sb.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; ip -4 -o addr show | "
                         "awk '{print $2, $4}'").stdout, end='')
            print(sb.run('cat /etc/resolv.conf').stdout.split()[1])
            print(sorted(sb.network_stats()))
            sb.restore(sb.snapshot())  # a new guest, a new namespace: wired again
            print(sb.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; ip -4 -o addr show | "
                         "awk '{print $2, $4}'").stdout, end='')
    """)
    env = nobody_env(world_tmp, ROCKROLL_SANDBOX_NETWORK_GUARD=os.environ.get("ROCKROLL_SANDBOX_NETWORK_GUARD", ""))
    out = subprocess.run(["unshare", "--net", *AS_NOBODY, SYSTEM_PY, "-c", script], capture_output=True,
                         text=True, env=env, cwd=str(world_tmp), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "lo", "lo 127.0.0.1/8", "lo 10.0.2.100/32", "10.0.2.100",
        "['bytes_in', 'bytes_out', 'bytes_spliced', 'connections', 'denied', 'dns_queries', 'log']",
        "lo", "lo 127.0.0.1/8", "lo 10.0.2.100/32"], out.stdout
