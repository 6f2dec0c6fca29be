"""A sandbox's own network without root (local backend in a user namespace): the same
gateway (``gateway.py``: resolver, proxy, policy, counters) as ``network.py`` wires as
root, reached without a veth, a route or a rule in the creator's namespace.

The sandbox's network namespace (owned by its user namespace) has no interface but
``lo``. It holds ``ADDRESS`` on ``lo`` and a default route through ``lo``, so a packet to
anywhere is delivered back into the namespace, where its ``OUTPUT`` rules send each TCP
connection (but to 127.0.0.0/8) to ``ADDRESS:PROXY_PORT`` and UDP to its name server
(``ADDRESS:53``) to ``ADDRESS:DNS_PORT`` (DNAT: REDIRECT to 127.0.0.1 is refused there as a martian);
ICMP, other UDP, other protocols and IPv6 are dropped and counted by reason
(``network.KERNEL_REASONS``). The sockets listening there are the gateway's: made *in*
the sandbox's namespace by a helper (``nshelper.py``, a process of the creator's user
joined to the sandbox's user and network namespaces, where their owner has every
capability) and handed over (SCM_RIGHTS); a socket's namespace is fixed when it is
made, so the creator's gateway accepts on them and connects out from its own namespace,
as it does for the root path. The helper stays for the sandbox's guest: ``expose`` asks
it for a socket of the sandbox's namespace per connection, and ``stats`` for the rules'
counters. It dies with its owner (PR_SET_PDEATHSIG).

Why this holds: nothing leaves the sandbox's namespace but through sockets the creator
holds. Its processes run without CAP_NET_ADMIN (``guest/syscalls.py``'s KEEP_CAPS; a user
namespace of their own would own none of these objects), so they cannot change the rules,
routes or addresses; and were the rules gone, there is no interface to send on. Nothing
is added to the creator's namespace, so no root is needed, and nothing is left behind
when the owner is killed: the namespace dies with its last process and socket.

What it does not do that the root path does: the bandwidth cap shapes the gateway's
connections (``lo``'s TCP and DNS through the proxy and resolver) but not the traffic of
``expose``d ports; and the sandbox cannot reach its own listeners at ``ADDRESS``
(only on 127.0.0.1: every connection to ``ADDRESS`` goes to the proxy, which refuses it
as the host's).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from ..egress import EgressPolicy
from ..errors import SandboxStartError
from . import network
from .gateway import SandboxNetwork, gateway_loop
from .network import DNS_PORT, EXPOSE_MARK, PROXY_PORT

ADDRESS = "10.0.2.100"  # the sandbox's, on its lo; its name server's and gateway's too
ADDRESS6 = str(network.ULA.network_address + 0x100)  # only so an IPv6 attempt is sent, and counted
HELPER = str(Path(__file__).with_name("nshelper.py"))
COUNTERS = "iptables -w -L OUTPUT -v -x -n; ip6tables -w -L OUTPUT -v -x -n 2>/dev/null || true"


def setup_script(bandwidth_mbit: float | None) -> str:
    """What the helper runs in the sandbox's fresh network namespace."""
    mark = hex(EXPOSE_MARK)
    script = f"""
ip link set lo up
ip addr add {ADDRESS}/32 dev lo
ip route add default dev lo src {ADDRESS}
echo '0 0' > /proc/sys/net/ipv4/ping_group_range
iptables-restore -w <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A OUTPUT -d 127.0.0.0/8 -j RETURN
-A OUTPUT -m mark --mark {mark} -j RETURN
-A OUTPUT -p tcp -j DNAT --to-destination {ADDRESS}:{PROXY_PORT}
-A OUTPUT -p udp -d {ADDRESS} --dport 53 -j DNAT --to-destination {ADDRESS}:{DNS_PORT}
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -d 127.0.0.0/8 -j ACCEPT
-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A OUTPUT -m mark --mark {mark} -j ACCEPT
-A OUTPUT -p tcp -d {ADDRESS} --dport {PROXY_PORT} -j ACCEPT
-A OUTPUT -p udp -d {ADDRESS} --dport {DNS_PORT} -j ACCEPT
-A OUTPUT -p icmp -m comment --comment icmp -j DROP
-A OUTPUT -p udp -m comment --comment udp -j DROP
-A OUTPUT -m comment --comment other -j DROP
COMMIT
EOF
if [ -e /proc/sys/net/ipv6/conf/lo/disable_ipv6 ] && [ "$(cat /proc/sys/net/ipv6/conf/lo/disable_ipv6)" = 0 ]; then
  ip -6 addr add {ADDRESS6}/128 dev lo nodad
  ip -6 route add default dev lo
  ip6tables-restore -w <<'EOF'
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -d ::1 -j ACCEPT
-A OUTPUT -m comment --comment ipv6 -j DROP
COMMIT
EOF
fi
"""
    if bandwidth_mbit:
        # lo carries the sandbox's own loopback traffic too: only the gateway's connections
        # (those the nat table rewrote) are classed and shaped, each direction at the rate
        rate = f"{bandwidth_mbit}mbit"
        script += f"""
tc qdisc add dev lo root handle 1: htb default 0
tc class add dev lo parent 1: classid 1:1 htb rate {rate} burst 64kb
tc class add dev lo parent 1: classid 1:2 htb rate {rate} burst 64kb
iptables -w -t mangle -A POSTROUTING -m conntrack --ctstate DNAT --ctdir ORIGINAL -j CLASSIFY --set-class 1:1
iptables -w -t mangle -A POSTROUTING -m conntrack --ctstate DNAT --ctdir REPLY -j CLASSIFY --set-class 1:2
"""
    return script


class Helper:
    """The helper process of one guest (``nshelper.py``), and requests to it."""

    def __init__(self, pid: int):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-S", "-E", HELPER, str(pid), str(os.getpid()), str(theirs.fileno())]

        async def spawn():  # on the gateway's thread: PR_SET_PDEATHSIG fires when its starter thread ends
            return subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env={}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")

        try:
            self.proc = asyncio.run_coroutine_threadsafe(spawn(), gateway_loop()).result(timeout=30)
        except OSError as e:
            ours.close()
            raise SandboxStartError(f"sandbox network: cannot start its helper: {e}") from e
        finally:
            theirs.close()
        self.chan = ours
        self.chan.settimeout(60)
        self._lock = threading.Lock()
        first = self._reply()
        if not first.get("ok"):
            self.close()
            raise SandboxStartError(f"sandbox network: cannot join the sandbox's namespaces: {first.get('error')}")

    def _reply(self, fds: bool = False):
        try:
            msg, got, _, _ = socket.recv_fds(self.chan, 1 << 20, 1)
        except OSError as e:
            raise OSError(f"the sandbox's network helper did not answer: {e}") from e
        if not msg:
            raise OSError("the sandbox's network helper is gone")
        reply = json.loads(msg)
        return (reply, got) if fds else reply

    def run(self, script: str) -> str:
        """``sh -ec script`` in the sandbox's namespaces; its stdout (SandboxStartError if it fails)."""
        try:
            with self._lock:
                self.chan.send(json.dumps({"op": "run", "script": script}).encode())
                out = self._reply()
        except OSError as e:
            raise SandboxStartError(f"sandbox network: {e}") from e
        if not out["ok"]:
            raise SandboxStartError(f"sandbox network: setting up the sandbox's namespace failed: "
                                    f"{out['stderr'].strip()[-2000:]}; it needs iproute2 and iptables "
                                    "(scripts/services.sh installs them)")
        return out["stdout"]

    def socket(self, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
        """A new socket of the sandbox's network namespace (OSError if none can be had)."""
        with self._lock:
            self.chan.send(json.dumps({"op": "socket", "family": int(family), "type": int(type)}).encode())
            reply, fds = self._reply(fds=True)
        if not reply.get("ok") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the sandbox's network helper made no socket: {reply.get('error')}")
        return socket.socket(fileno=fds[0])

    def close(self) -> None:
        self.chan.close()  # EOF: the helper exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class UserNetwork(SandboxNetwork):
    """``SandboxNetwork`` for a sandbox in a user namespace (the module's docstring)."""

    def __init__(self, policy: EgressPolicy | None):
        super().__init__(policy)
        self.helper: Helper | None = None

    def prepare(self) -> str:
        self.detach()
        network.check_guard("give a sandbox a network, through a gateway in,")
        self._prepare_inspection()
        return ADDRESS

    def attach(self, pid: int) -> None:
        """Wire the namespaces of ``pid``: a process in the sandbox's user and network
        namespaces that its owner may enter (a dumpable one: the guest's outer process)."""
        self.helper = Helper(pid)
        listeners = []
        try:
            self.helper.run(setup_script(self.policy.bandwidth_mbit if self.policy else None))
            proxy = self.helper.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(proxy)
            proxy.bind((ADDRESS, PROXY_PORT))
            proxy.listen(128)
            resolver = self.helper.socket(socket.AF_INET, socket.SOCK_DGRAM)
            listeners.append(resolver)
            resolver.bind((ADDRESS, DNS_PORT))
            self.gateway = self._new_gateway(ADDRESS, ADDRESS, new_socket=self._inbound_socket)
            self.gateway.start((proxy, resolver))
        except BaseException:
            for s in listeners:
                s.close()
            self.detach()
            raise

    def _inbound_socket(self) -> socket.socket:
        helper = self.helper
        if helper is None:
            raise OSError("the sandbox's network is not up")
        sock = helper.socket(socket.AF_INET, socket.SOCK_STREAM)
        # The owner of the sandbox's user namespace may mark its sockets (CAP_NET_ADMIN there)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, EXPOSE_MARK)
        return sock

    def _wired(self) -> bool:
        return self.helper is not None

    def _kernel_now(self) -> dict[str, int]:
        try:
            return network.count_drops(self.helper.run(COUNTERS))
        except SandboxStartError:
            return {}

    def _unwire(self) -> dict[str, int]:
        counts = self._kernel_now()
        helper, self.helper = self.helper, None
        helper.close()
        return counts
