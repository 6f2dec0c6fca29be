"""A lab for the network tests: "the host" and "the internet" as network namespaces this
module makes, wired only to each other by one veth pair. Nothing is added to the
machine's own network namespace: the pair is created inside the host namespace with its
peer straight in the internet one, and the sandbox's host side (``_netdriver.py``) runs
under ``ip netns exec`` in the host namespace, where it makes its veths and rules.

  host ns  198.51.100.1/24 --veth-- 198.51.100.2/24  internet ns (DNS; 203.0.113.0/24 and
  (default route to the internet ns)                   169.254.169.254 on its loopback)

Everything is removed on exit, failures included (the namespaces take their veths and
rules with them)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
INTERNET_ADDRS = ("203.0.113.10/32", "203.0.113.20/32", "203.0.113.30/32", "203.0.113.40/32", "203.0.113.50/32",
                  "169.254.169.254/32")


def _sh(*argv: str, input: str | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=60)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out.stdout


def make_certs(folder: Path) -> None:
    """A test CA, and certificates it signed: for tls.test (and other.test: the proxy, not
    the certificate, must stop a request naming the wrong host), and for the names of the
    shared address's HTTPS (allowed.test, evil.test and api.test on one certificate, as a
    CDN's edge may hold them). And a rogue CA, which nothing trusts, and its certificate for
    rogue.test (a forged upstream)."""
    o = ["openssl"]
    for ca in ("ca", "rogue-ca"):
        _sh(*o, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(folder / f"{ca}.key"),
            "-out", str(folder / f"{ca}.pem"), "-days", "2", "-subj", f"/CN=rockroll-test-{ca}")
    for name, ca, names in (("tls", "ca", "tls.test,DNS:other.test"),
                            ("shared", "ca", "allowed.test,DNS:evil.test,DNS:api.test"), ("rogue", "rogue-ca", "rogue.test")):
        _sh(*o, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(folder / f"{name}.key"), "-out",
            str(folder / f"{name}.csr"), "-subj", f"/CN={names.split(',')[0]}")
        (folder / f"{name}.ext").write_text(f"subjectAltName=DNS:{names}\n")
        _sh(*o, "x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / f"{ca}.pem"), "-CAkey",
            str(folder / f"{ca}.key"), "-CAcreateserial", "-out", str(folder / f"{name}.pem"), "-days", "2",
            "-extfile", str(folder / f"{name}.ext"))


def make_index(folder: Path) -> None:
    """A PEP 503 simple index holding one pure-Python wheel, ``rrnetpkg``."""
    files = folder / "index" / "files"
    files.mkdir(parents=True)
    wheel = files / "rrnetpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("rrnetpkg/__init__.py", "VALUE = 'from-the-test-index'\n")
        z.writestr("rrnetpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: rrnetpkg\nVersion: 1.0\n")
        z.writestr("rrnetpkg-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: rockroll-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("rrnetpkg-1.0.dist-info/RECORD", "rrnetpkg/__init__.py,,\nrrnetpkg-1.0.dist-info/METADATA,,\n"
                   "rrnetpkg-1.0.dist-info/WHEEL,,\nrrnetpkg-1.0.dist-info/RECORD,,\n")
    simple = folder / "index" / "simple" / "rrnetpkg"
    simple.mkdir(parents=True)
    (simple / "index.html").write_text(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')


class NetLab:
    def __init__(self, folder: Path):
        self.folder = folder
        tag = uuid.uuid4().hex[:6]
        self.host, self.net = f"rrt-host-{tag}", f"rrt-net-{tag}"
        self.etc = Path("/etc/netns") / self.host
        self.internet: subprocess.Popen | None = None

    def __enter__(self) -> "NetLab":
        try:
            self._up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _up(self) -> None:
        make_certs(self.folder)
        make_index(self.folder)
        _sh("ip", "netns", "add", self.host)
        _sh("ip", "netns", "add", self.net)
        h, n = ["ip", "-n", self.host], ["ip", "-n", self.net]
        _sh(*h, "link", "add", "wan", "type", "veth", "peer", "name", "wan", "netns", self.net)
        _sh(*h, "link", "set", "lo", "up")
        _sh(*h, "addr", "add", "198.51.100.1/24", "dev", "wan")
        _sh(*h, "link", "set", "wan", "up")
        _sh(*h, "route", "add", "default", "via", "198.51.100.2")
        _sh(*n, "link", "set", "lo", "up")
        _sh(*n, "addr", "add", "198.51.100.2/24", "dev", "wan")
        _sh(*n, "link", "set", "wan", "up")
        for addr in INTERNET_ADDRS:
            _sh(*n, "addr", "add", addr, "dev", "lo")
        # ip netns exec binds this over /etc/resolv.conf for the host's processes
        self.etc.mkdir(parents=True, exist_ok=True)
        (self.etc / "resolv.conf").write_text("nameserver 198.51.100.2\noptions timeout:2 attempts:2\n")
        self.internet = subprocess.Popen(["ip", "netns", "exec", self.net, sys.executable, str(HERE / "_internet.py"),
                                          str(self.folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.internet.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the test internet did not start: {line}{self.internet.stderr.read()}")

    def run_host(self, *args: str, timeout: float = 300, driver: str = "_netdriver.py") -> dict:
        """Run ``DRIVER ARGS`` (``_netdriver.py`` unless named) as the host (in the host
        namespace); its JSON output."""
        # The lab's host may be wired: builds there get the allow-list, not the suite's "host".
        env = {**{k: v for k, v in os.environ.items() if k != "ROCKROLL_BUILD_NETWORK"}, "PYTHONPATH": str(HERE)}
        return self._driver([sys.executable, str(HERE / driver), str(self.folder), *args], env, timeout)

    def run_host_unprivileged(self, folder: Path, *args: str, timeout: float = 300,
                              driver: str = "_netdriver.py") -> dict:
        """``run_host``, as uid 65534 with the system Python and a copy of the package made
        in ``folder`` (``_nobody.py``; the lab's folder must be readable by all)."""
        from _nobody import AS_NOBODY, SYSTEM_PY, nobody_env, nobody_package

        pkg = nobody_package(folder, *{HERE / "_netdriver.py", HERE / driver})
        subprocess.run(["chmod", "-R", "a+rX", str(self.folder)], check=True)
        env = nobody_env(folder, ROCKROLL_SANDBOX_NETWORK_GUARD=os.environ.get("ROCKROLL_SANDBOX_NETWORK_GUARD", ""))
        return self._driver([*AS_NOBODY, SYSTEM_PY, str(pkg / driver), str(self.folder), *args], env, timeout)

    def _driver(self, argv: list[str], env: dict[str, str], timeout: float) -> dict:
        out = subprocess.run(["ip", "netns", "exec", self.host, *argv], capture_output=True, text=True,
                             timeout=timeout, env=env)
        if out.returncode:
            raise RuntimeError(f"the driver failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def __exit__(self, *exc) -> None:
        if self.internet is not None:
            self.internet.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.internet.wait(timeout=10)
        for ns in (self.host, self.net):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)
        shutil.rmtree(self.etc, ignore_errors=True)


def lab_available() -> str | None:
    """Why this host cannot run the lab, or None."""
    if os.geteuid() != 0:
        return "the network tests need root (network namespaces)"
    for tool in ("ip", "iptables", "ip6tables", "nsenter", "openssl", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/services.sh installs it)"
    return None
