"""Sandbox network benchmark: connect latency (connect, one HTTP request, its answer) and
download throughput from the host's own network and from sandboxes behind their gateway
(``network=True``, and an allow-list naming the server), in one run.

It runs in the network tests' lab (``tests/sandbox/_netlab.py``): "the host" and "the
internet" are network namespaces it makes (as root), so nothing touches the machine's own
network. Ratios are what to read; absolute numbers are of veths on this machine.

    sudo .venv/bin/python bench/network.py [--quick] [--connects 200] [--mib 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sandbox"))
from _common import print_table, write_json  # noqa: E402
from _netlab import NetLab, lab_available  # noqa: E402

PROMISED = {"results": ("host", "sandbox_open", "sandbox_allow_list")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 connects, 20 MiB")
    ap.add_argument("--connects", type=int, default=None)
    ap.add_argument("--mib", type=int, default=None)
    args = ap.parse_args()
    args.connects = args.connects or (20 if args.quick else 200)
    args.mib = args.mib or (20 if args.quick else 200)
    why = lab_available()
    if why:
        sys.exit(why)
    with tempfile.TemporaryDirectory(prefix="rockroll-bench-net-") as tmp, NetLab(Path(tmp)) as lab:
        r = lab.run_host("bench", str(args.connects), str(args.mib), timeout=1200)
    base = r["host"]
    rows = [{"path": name, "connect p50 ms": f"{m['connect_p50_ms']:.3f}", "connect p90 ms": f"{m['connect_p90_ms']:.3f}",
             "throughput MiB/s": f"{m['throughput_mib_s']:.0f}",
             "latency x host": f"{m['connect_p50_ms'] / base['connect_p50_ms']:.2f}",
             "throughput x host": f"{m['throughput_mib_s'] / base['throughput_mib_s']:.2f}"}
            for name, m in r.items()]
    print_table("Sandbox network vs the host's own (same run, lab namespaces)", rows, list(rows[0]))
    print(write_json("network", {"connects": args.connects, "mib": args.mib, "results": r}))


if __name__ == "__main__":
    main()
