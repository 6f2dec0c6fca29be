"""Sandbox network benchmark: connect latency (connect, one HTTP request, its answer) and
download throughput from the host's own network and from sandboxes behind their gateway
(``network=True``, and an allow-list naming the server), on the root path (a veth and NAT)
and the unprivileged one (``usernet.py``: only ``lo``, the creator's proxy), in one run.

It runs in the network tests' lab (``tests/sandbox/_netlab.py``): "the host" and "the
internet" are network namespaces it makes (as root), so nothing touches the machine's own
network. The unprivileged rows run the sandboxes' owner as uid 65534 with the system Python
in the same lab (``tests/sandbox/_nobody.py``: needs ``setpriv`` and a system Python of this
one's version; ``--no-unprivileged`` leaves those rows out). Ratios are what to read;
absolute numbers are of veths on this machine.

    sudo .venv/bin/python bench/network.py [--quick] [--connects 200] [--mib 200] [--no-unprivileged]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sandbox"))
from _common import print_table, write_json  # noqa: E402
from _netlab import NetLab, lab_available  # noqa: E402

PROMISED = {"results": ("host", "root_open", "root_allow_list", "unprivileged_open", "unprivileged_allow_list")}


def unprivileged_available() -> str | None:
    """Why the unprivileged rows cannot run here, or None."""
    from _nobody import system_python_matches

    if not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed"
    if not system_python_matches():
        return "the system python differs from this one (the package runs as nobody with it)"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 connects, 20 MiB")
    ap.add_argument("--connects", type=int, default=None)
    ap.add_argument("--mib", type=int, default=None)
    ap.add_argument("--no-unprivileged", action="store_true", help="leave out the rows of the unprivileged path")
    args = ap.parse_args()
    args.connects = args.connects or (20 if args.quick else 200)
    args.mib = args.mib or (20 if args.quick else 200)
    why = lab_available()
    if why:
        sys.exit(why)
    if not args.no_unprivileged and (why := unprivileged_available()):
        sys.exit(f"{why} (--no-unprivileged: the root rows only)")
    size = (str(args.connects), str(args.mib))
    tmp = Path(tempfile.mkdtemp(prefix="rockroll-bench-net-", dir="/tmp"))
    try:
        os.chmod(tmp, 0o755)  # nobody reaches the lab's files and its own package copy
        (tmp / "lab").mkdir()
        with NetLab(tmp / "lab") as lab:
            print("root path ...", file=sys.stderr)
            r = lab.run_host("bench", *size, "root", timeout=1200)
            if not args.no_unprivileged:
                print("unprivileged path ...", file=sys.stderr)
                (tmp / "nobody").mkdir()
                r.update(lab.run_host_unprivileged(tmp / "nobody", "bench", *size, "unprivileged", timeout=1200))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = {name: m["error"] for name, m in r.items() if "error" in m}
    if failed:
        sys.exit(f"measurements failed: {failed}")
    base = r["host"]
    rows = [{"path": name, "connect p50 ms": f"{m['connect_p50_ms']:.3f}", "connect p90 ms": f"{m['connect_p90_ms']:.3f}",
             "throughput MiB/s": f"{m['throughput_mib_s']:.0f}",
             "latency x host": f"{m['connect_p50_ms'] / base['connect_p50_ms']:.2f}",
             "throughput x host": f"{m['throughput_mib_s'] / base['throughput_mib_s']:.2f}"}
            for name, m in r.items()]
    print_table("Sandbox network vs the host's own (same run, lab namespaces)", rows, list(rows[0]))
    print(write_json("network", {"connects": args.connects, "mib": args.mib,
                                        "unprivileged": not args.no_unprivileged, "results": r}))


if __name__ == "__main__":
    main()
