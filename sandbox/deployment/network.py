"""A sandbox's own network (local backend, as root): a veth pair from the namespace the
sandbox was created in ("the host") to the sandbox's network namespace, and the host's
packet filter rules that leave the sandbox nothing but its gateway (``gateway.py``).

Per sandbox, from ``SUBNET`` (``$ROCKROLL_SANDBOX_SUBNET``, default 10.231.0.0/16) a /30:
the host end ``rrh<N>`` holds ``.1`` (the gateway), the sandbox's ``eth0`` ``.2``; IPv6 gets a
ULA /64 on both ends only so that an IPv6 attempt leaves the sandbox and is counted.
No packet of the sandbox is ever forwarded or NATed: every TCP connection is redirected
to the gateway's proxy, which connects out from the host itself when the policy allows
(the host's own address is the source, as with NAT); UDP to the gateway's port 53 goes
to its resolver. Everything else is dropped where it enters (the ``raw`` table, before
routing), and counted by reason. The host reaches a sandbox's listener only through
``expose`` (its forwarder's packets carry ``EXPOSE_MARK``); replies of connections the
sandbox opened pass.

The index ``N`` is taken by creating ``rrh<N>`` (the kernel refuses a name in use), so
processes on one host never share one; rules a crashed owner left under an index are
replaced when the index is next taken, or removed by ``sweep`` (the reaper's, when it
finds a dead run, and ``rockroll sandbox gc``).
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxStartError

SUBNET = ipaddress.ip_network(os.environ.get("ROCKROLL_SANDBOX_SUBNET", "10.231.0.0/16"))
ULA = ipaddress.ip_network("fd72:7272:7272::/48")
PROXY_PORT, DNS_PORT = 15001, 15053
EXPOSE_MARK = 0x7272
# Reasons the filter drops a packet for, as the rules' comments name them
KERNEL_REASONS = ("spoofed", "icmp", "udp", "other", "ipv6", "to_host")


@dataclass(frozen=True)
class Link:
    """One sandbox's wiring: the host end, the addresses, the rule chains' prefix."""

    index: int
    host_if: str
    gateway: str
    address: str
    gateway6: str
    address6: str

    @property
    def chain(self) -> str:
        return f"RR{self.index}"


def _link_for(index: int) -> Link:
    base = int(SUBNET.network_address) + 4 * index
    net6 = int(ULA.network_address) + (index << 64)
    return Link(index, f"rrh{index}", str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2)),
                str(ipaddress.ip_address(net6 + 1)), str(ipaddress.ip_address(net6 + 2)))


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxStartError(f"sandbox network: {argv[0]} failed: {e}; the local backend's network "
                                "needs iproute2 and iptables (scripts/services.sh installs them)") from e
    if check and proc.returncode != 0:
        raise SandboxStartError(f"sandbox network: {' '.join(argv[:4])} ...: {proc.stderr.strip()}")
    return proc


def check_guard(what: str) -> None:
    """The test suite's guard (tests/conftest.py): tests give sandboxes a network only from
    namespaces they made, never from the one ``$ROCKROLL_SANDBOX_NETWORK_GUARD`` names."""
    guard = os.environ.get("ROCKROLL_SANDBOX_NETWORK_GUARD")
    if guard and guard == _netns_id():
        raise SandboxStartError(f"sandbox network: refusing to {what} this network namespace "
                                "($ROCKROLL_SANDBOX_NETWORK_GUARD names it); run this in a namespace of its own")


def allocate() -> Link:
    """Take a free index: its veth pair, both ends here until ``plumb`` moves one."""
    check_guard("add a veth and rules to")
    slots = SUBNET.num_addresses // 4
    start = random.randrange(1, slots)
    for attempt in range(64):
        link = _link_for(1 + (start + attempt) % (slots - 1))
        made = _run(["ip", "link", "add", link.host_if, "type", "veth", "peer", "name", f"rrs{link.index}"],
                    check=False)
        if made.returncode == 0:
            return link
        if "exists" not in made.stderr:
            raise SandboxStartError(f"sandbox network: cannot create a veth pair: {made.stderr.strip()}")
    raise SandboxStartError("sandbox network: no free index in $ROCKROLL_SANDBOX_SUBNET")


def _netns_id() -> str:
    """This process's network namespace, as ``ROCKROLL_SANDBOX_NETWORK_GUARD`` names one."""
    return os.readlink("/proc/self/ns/net")


def plumb(link: Link, init_pid: int, bandwidth_mbit: float | None = None) -> None:
    """Move the sandbox's end into the network namespace of ``init_pid`` (the sandbox's
    pid 1) as ``eth0``, address both ends, and put the rules in place."""
    try:
        _rules(link, add=True)
        _run(["ip", "-batch", "-"], stdin="\n".join((
            f"link set rrs{link.index} netns {init_pid}",
            f"addr add {link.gateway}/30 dev {link.host_if}",
            f"addr add {link.gateway6}/64 dev {link.host_if} nodad",
            f"link set {link.host_if} up")) + "\n")
        inside = "\n".join((
            "ip link set lo up",
            f"ip link set rrs{link.index} name eth0",
            f"ip addr add {link.address}/30 dev eth0",
            "ip link set eth0 up",
            f"ip route add default via {link.gateway}",
            # IPv6 where the kernel has it (docker turns it off in its containers: on again for eth0)
            "if [ -e /proc/sys/net/ipv6/conf/eth0/disable_ipv6 ]; then",
            "  echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6",
            f"  ip addr add {link.address6}/64 dev eth0 nodad",
            f"  ip -6 route add default via {link.gateway6}",
            "fi",
            # ICMP echo through datagram sockets (no CAP_NET_RAW needed): a ping is sent, and counted
            "echo '0 2147483647' > /proc/sys/net/ipv4/ping_group_range",
        ))
        if bandwidth_mbit:
            rate = f"{bandwidth_mbit}mbit"
            inside += f"\ntc qdisc add dev eth0 root tbf rate {rate} burst 64kb latency 200ms"
            _run(["tc", "qdisc", "add", "dev", link.host_if, "root", "tbf", "rate", rate, "burst", "64kb",
                  "latency", "200ms"])
        _run(["nsenter", f"--net=/proc/{init_pid}/ns/net", "sh", "-ec", inside])
    except BaseException:
        unplumb(link)
        raise


def unplumb(link: Link) -> dict[str, int]:
    """Remove the link's rules and its veth pair; returns the drops counted until then."""
    counts = kernel_drops(link)
    _rules(link, add=False)
    _run(["ip", "link", "del", link.host_if], check=False)  # gone already if the namespace died
    return counts


def _rules(link: Link, add: bool) -> None:
    c, i, gw, sb = link.chain, link.host_if, link.gateway, link.address
    hooks4 = [("raw", "PREROUTING", f"-i {i} -j {c}-RAW"), ("nat", "PREROUTING", f"-i {i} -j {c}-NAT"),
              ("filter", "INPUT", f"-i {i} -j {c}-IN"), ("filter", "FORWARD", f"-i {i} -j DROP"),
              ("filter", "FORWARD", f"-o {i} -j DROP"), ("filter", "OUTPUT", f"-o {i} -j {c}-OUT")]
    hooks6 = [("raw", "PREROUTING", f"-i {i} -j {c}-RAW6"), ("filter", "OUTPUT", f"-o {i} -j {c}-OUT6"),
              ("filter", "FORWARD", f"-o {i} -j DROP")]
    # a hook left by a crashed owner under this index (or this one's): take each away first
    for tool, hooks in (("iptables", hooks4), ("ip6tables", hooks6)):
        for table, chain, rule in hooks:
            for _ in range(8):
                if _run([tool, "-w", "-t", table, "-D", chain, *rule.split()], check=False).returncode:
                    break
    for tool, chains in (("iptables", (("raw", "RAW"), ("nat", "NAT"), ("filter", "IN"), ("filter", "OUT"))),
                         ("ip6tables", (("raw", "RAW6"), ("filter", "OUT6")))):
        for table, suffix in chains:
            _run([tool, "-w", "-t", table, "-F", f"{c}-{suffix}"], check=False)
            _run([tool, "-w", "-t", table, "-X", f"{c}-{suffix}"], check=False)
    if not add:
        return
    v4 = f"""*raw
:{c}-RAW - [0:0]
-A {c}-RAW ! -s {sb} -m comment --comment spoofed -j DROP
-A {c}-RAW -p tcp -j RETURN
-A {c}-RAW -p udp -d {gw} --dport 53 -j RETURN
-A {c}-RAW -p icmp -m comment --comment icmp -j DROP
-A {c}-RAW -p udp -m comment --comment udp -j DROP
-A {c}-RAW -m comment --comment other -j DROP
COMMIT
*nat
:{c}-NAT - [0:0]
-A {c}-NAT -p tcp -j REDIRECT --to-ports {PROXY_PORT}
-A {c}-NAT -p udp -j REDIRECT --to-ports {DNS_PORT}
COMMIT
*filter
:{c}-IN - [0:0]
:{c}-OUT - [0:0]
-A {c}-IN -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A {c}-IN -p tcp -d {gw} --dport {PROXY_PORT} -j ACCEPT
-A {c}-IN -p udp -d {gw} --dport {DNS_PORT} -j ACCEPT
-A {c}-IN -m comment --comment to_host -j DROP
-A {c}-OUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A {c}-OUT -m mark --mark {EXPOSE_MARK} -j ACCEPT
-A {c}-OUT -j DROP
COMMIT
"""
    v6 = f"""*raw
:{c}-RAW6 - [0:0]
-A {c}-RAW6 -p icmpv6 --icmpv6-type neighbour-solicitation -j RETURN
-A {c}-RAW6 -p icmpv6 --icmpv6-type neighbour-advertisement -j RETURN
-A {c}-RAW6 -d ff00::/8 -j DROP
-A {c}-RAW6 -m comment --comment ipv6 -j DROP
COMMIT
*filter
:{c}-OUT6 - [0:0]
-A {c}-OUT6 -p icmpv6 --icmpv6-type neighbour-advertisement -j ACCEPT
-A {c}-OUT6 -p icmpv6 --icmpv6-type neighbour-solicitation -j ACCEPT
-A {c}-OUT6 -j DROP
COMMIT
"""
    _run(["iptables-restore", "-w", "--noflush"], stdin=v4)
    _run(["ip6tables-restore", "-w", "--noflush"], stdin=v6)
    for tool, hooks in (("iptables", hooks4), ("ip6tables", hooks6)):
        for table, chain, rule in hooks:
            _run([tool, "-w", "-t", table, "-I", chain, "1", *rule.split()])


# A drop rule of a sandbox's chain as ``*-save -c`` prints it: its packets, index, chain, reason
_SAVED_DROP = re.compile(r"^\[(\d+):\d+\] -A RR(\d+)-(\w+) .*--comment \"?(\w+)\"? -j DROP\b")
# Where the drops are counted: (save tool, table, the chains' suffix)
_DROP_TABLES = (("iptables-save", "raw", "RAW"), ("iptables-save", "filter", "IN"), ("ip6tables-save", "raw", "RAW6"))
_reading: contextvars.ContextVar[dict | None] = contextvars.ContextVar("rockroll_kernel_drops", default=None)


def _drops_by_index() -> dict[int, dict[str, int]]:
    """Every sandbox's drops in this namespace, by index: one ``*-save -c`` a table."""
    found: dict[int, dict[str, int]] = {}
    for tool, table, suffix in _DROP_TABLES:
        out = _run([tool, "-c", "-t", table], check=False)
        for line in out.stdout.splitlines():
            m = _SAVED_DROP.match(line)
            if m and m.group(3) == suffix and m.group(4) in KERNEL_REASONS:
                counts = found.setdefault(int(m.group(2)), dict.fromkeys(KERNEL_REASONS, 0))
                counts[m.group(4)] += int(m.group(1))
    return found


@contextlib.contextmanager
def one_reading():
    """Within it, ``kernel_drops`` of any number of sandboxes shares one read of the filter:
    a ``/metrics`` scrape runs three ``*-save`` commands, not three per sandbox."""
    token = _reading.set({})
    try:
        yield
    finally:
        _reading.reset(token)


def kernel_drops(link: Link) -> dict[str, int]:
    """Packets the filter dropped so far, by reason (``KERNEL_REASONS``)."""
    shared = _reading.get()
    if shared is None:
        by_index = _drops_by_index()
    else:
        if "all" not in shared:
            shared["all"] = _drops_by_index()
        by_index = shared["all"]
    return dict(by_index.get(link.index) or dict.fromkeys(KERNEL_REASONS, 0))


_COUNTED = re.compile(r"^\s*(\d+)\s+\d+\s+DROP\b.*/\* (\w+) \*/")


def count_drops(listing: str) -> dict[str, int]:
    """The packets of each ``KERNEL_REASONS`` comment in ``listing`` (``iptables -L -v -x -n``'s)."""
    counts = dict.fromkeys(KERNEL_REASONS, 0)
    for line in listing.splitlines():
        m = _COUNTED.match(line)
        if m and m.group(2) in counts:
            counts[m.group(2)] += int(m.group(1))
    return counts


_CHAIN = re.compile(r"^:RR(\d+)-")


def sweep() -> list[int]:
    """Remove the rules of indexes whose veth is gone (an owner killed with -9 never ran
    ``unplumb``; its sandbox's namespace, and with it the veth, died with it). Returns the
    indexes swept. Rules are added only after their veth exists and removed before it is,
    so a live sandbox's are never taken."""
    found: set[int] = set()
    for tool, tables in (("iptables-save", ("raw", "nat", "filter")), ("ip6tables-save", ("raw", "filter"))):
        for table in tables:
            out = _run([tool, "-t", table], check=False)
            found |= {int(m.group(1)) for line in out.stdout.splitlines() if (m := _CHAIN.match(line))}
    stale = [i for i in sorted(found) if not Path(f"/sys/class/net/rrh{i}").exists()]
    for index in stale:
        _rules(_link_for(index), add=False)
    return stale
