"""Cluster benchmark (issue #54): a burst of sandboxes created at once through
`rockroll serve --backend ray` on a two-node Ray cluster on this machine, beside ROCK's
published table, and a model of a 100-node cluster calibrated from what this run measured.

    .venv/bin/python bench/cluster.py [--quick] [--n 4000]

The service is one Ray driver; each create is one call to the host actor of the node it
picks (the least loaded), which starts an ordinary local sandbox there. Measured: p50 / p99 /
max of the creates (launch to ready), failures by kind, the CPU of a create on each side
(the service's process tree; the nodes: raylets, agents, host actors and the sandboxes'
agents), the host memory a held sandbox costs, how the sandboxes spread over the nodes, and
what an idle node costs Ray (memory and CPU), the model's per-node overhead.

The model (``model``, a pure function) scales those to N nodes of C cores: where creates
are bounded by the nodes (their CPU a create), by the one service process (its CPU a create,
one core: asyncio on one thread), by Ray's control plane (health checks and resource
reports per node, not per create: a create is an actor call, not an actor or a task), and
what a hub pull of an env image costs when every node pulls at once.
Prints two tables and writes bench/results/cluster.json. The cluster and the service are
started and stopped here; nothing of either is left.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _burst import bench_concurrent  # noqa: E402
from _common import (_proc_cpu_s, children_map, descendants, log, print_table, pss_kb,  # noqa: E402
                     sigterm_as_exit, tree_cpu_s, write_json)
from _services import RayCluster, Service  # noqa: E402

from rockroll.sandbox import SandboxSpec  # noqa: E402
from rockroll.sandbox.runtime import remote  # noqa: E402

SPEC = dict(backend="remote", memory_mb=64, pids=32)  # bench/sandbox.py's burst: its default disk
NO_DISK = dict(SPEC, disk_mb=None)
MB_EACH = 4.0  # host memory a held sandbox was seen to cost (2.9 MiB, bench/sandbox.py density), with margin
# ROCK's published concurrent-create figures (100 % success), on a cluster: (n, p50 s, p99 s)
ROCK = ((1000, 4.9, 8.7), (4000, 7.1, 13.3), (8000, 17.9, 32.0), (16000, 40.0, 60.0))
BURST_COLUMNS = ("creates at once", "p50 (s)", "p99 (s)", "max (s)", "failures", "all created (s)",
                 "create CPU, nodes (ms each)", "create CPU, service (ms each)", "host MiB a sandbox", "where")
MODEL_COLUMNS = ("nodes", "burst", "nodes' CPU (s)", "service process (s)", "Ray control plane (calls/s)",
                 "held at the limit", "hub pull, all nodes (s)", "breaks first")
# What bench/results/cluster.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {
    "": ("burst", "idle_node", "model"),
    "burst_rows": ("rockroll", "rockroll", "rockroll", "ROCK 1000", "ROCK 4000", "ROCK 8000", "ROCK 16000"),
    "model_rows": ("2", "10", "100", "100"),
}
# Assumptions of the model that this machine cannot measure (said in every row's JSON):
ASSUME = {
    "node_cores": 32,             # a CPU node of a cluster
    "node_mem_gib": 128,
    "image_mb": 300,              # an env image's layers, compressed (a SWE task's base + repo)
    "node_gbit": 10,              # each node's link
    "s3_gbit": 100,               # what the object store serves in all (S3 scales by prefix; a MinIO cluster less)
    "health_checks_per_node_s": 1.0,  # Ray's GCS health check, per node per period (default period 3 s: 1/s is worst)
    "reports_per_node_s": 10.0,   # resource/load reports a raylet sends (at most every 100 ms)
    "gcs_calls_per_s": 20000,     # what one GCS process serves (Ray's scale tests: thousands of nodes)
}


def node_processes(cluster: RayCluster) -> dict[int, list[int]]:
    """Every live process of each node: its process group (raylet, agents) and what they
    started (actor workers run in process groups of their own; the sandboxes' agents below them)."""
    kids = children_map()
    out = {}
    for pgid in cluster.pgids:
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
        out[pgid] = sorted({q for p in members for q in descendants(p, kids)})
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def cluster_cpu_s(cluster: RayCluster) -> float:
    return sum(_proc_cpu_s(p) for procs in node_processes(cluster).values() for p in procs)


def sandboxes_per_node(cluster: RayCluster) -> list[int]:
    """Sandboxes held on each node: those of the runs (one per host actor) whose process is
    one of the node's."""
    from rockroll.sandbox.deployment.reaper import list_runs

    runs = list_runs()
    return [sum(len(r.sandboxes) for r in runs if r.pid in set(procs)) for procs in node_processes(cluster).values()]


def idle_node(cluster: RayCluster, seconds: float) -> dict:
    """What a node costs Ray with nothing to do: PSS of its processes, CPU per second."""
    cpu0 = [sum(_proc_cpu_s(p) for p in procs) for procs in node_processes(cluster).values()]
    time.sleep(seconds)
    procs = node_processes(cluster)
    cpu1 = [sum(_proc_cpu_s(p) for p in ps) for ps in procs.values()]
    pss = [sum(pss_kb(p) for p in ps) / 1024 for ps in procs.values()]
    return {"pss_mib": pss, "cpu_cores": [(b - a) / seconds for a, b in zip(cpu0, cpu1)],
            "processes": [len(ps) for ps in procs.values()]}


def model(nodes: int, *, node_create_ms: float, service_create_ms: float, mb_each: float, node_pss_mib: float,
          node_idle_cores: float, burst: int = 16000, limit_mb: int = SPEC["memory_mb"], assume: dict = ASSUME) -> dict:
    """A burst of ``burst`` creates on ``nodes`` CPU nodes (``assume``'s size), calibrated by
    this run: how long the nodes' CPU needs for it and how long the one service process does
    (its CPU a create, one core: asyncio on one thread), the control plane's load, whether the
    nodes hold the sandboxes at their memory limit, and every node pulling one env image at
    once. Pure: numbers in, numbers out."""
    cores, mem_mib = assume["node_cores"], assume["node_mem_gib"] * 1024
    node_s = burst * node_create_ms / 1000 / (nodes * (cores - node_idle_cores))
    service_s = burst * service_create_ms / 1000
    # a create is one actor call from the service to a host actor, no GCS round trip: the
    # control plane's load is per node (health checks, resource reports), whatever the burst
    gcs = nodes * (assume["health_checks_per_node_s"] + assume["reports_per_node_s"])
    holds = nodes * int((mem_mib - node_pss_mib) // limit_mb)  # at the spec's memory limit (idle: mb_each)
    pull_node = assume["image_mb"] * 8 / (assume["node_gbit"] * 1000)
    pull_store = nodes * assume["image_mb"] * 8 / (assume["s3_gbit"] * 1000)
    bounds = {"the service process": service_s, "the nodes' CPU": node_s}
    first = max(bounds, key=bounds.get)
    if gcs > assume["gcs_calls_per_s"]:
        first = "Ray's control plane"
    if holds < burst:
        first = f"memory: {nodes} nodes hold {holds} at {limit_mb} MiB"
    return {"nodes": nodes, "burst": burst, "node_s": node_s, "service_s": service_s, "gcs_calls_per_s": gcs,
            "holds": holds, "idle_holds": nodes * int((mem_mib - node_pss_mib) // mb_each),
            "pull_s": max(pull_node, pull_store),
            "pull_bound": "each node's link" if pull_node >= pull_store else "the object store",
            "burst_s": max(bounds.values()), "breaks_first": first, "assume": assume}


def model_row(m: dict) -> dict:
    return {"nodes": str(m["nodes"]), "burst": m["burst"], "nodes' CPU (s)": m["node_s"],
            "service process (s)": m["service_s"], "Ray control plane (calls/s)": m["gcs_calls_per_s"],
            "held at the limit": m["holds"], "hub pull, all nodes (s)": f"{m['pull_s']:.1f} ({m['pull_bound']})",
            "breaks first": m["breaks_first"]}


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bursts of 50 and 200")
    parser.add_argument("--n", type=lambda v: [int(x) for x in v.split(",")], default=None,
                        help="the bursts, one after the other (default 1000,4000; --quick 50,200)")
    args = parser.parse_args()
    sigterm_as_exit()
    sizes = args.n or ([50, 200] if args.quick else [1000, 4000])

    log("starting a two-node Ray cluster on 127.0.0.1")
    cluster = RayCluster(2)
    svc, bursts = None, []
    try:
        idle = idle_node(cluster, 3 if args.quick else 10)
        svc = Service("--backend", "ray", "--max-sandboxes", str(max(sizes) + 100),
                      env={**cluster.env, "RAY_ADDRESS": cluster.address})
        remote.configure(svc.url, svc.token)
        warm = bench_concurrent(4, lambda: 0.0, SPEC)  # the host actors of both nodes, their first layers
        log(f"warm-up: {warm['failures']} failures")
        # each size with the default disk, then the largest again without one: a sized disk is a
        # loop device, a kernel resource of the host that a burst may exhaust before anything else
        for n, spec in [(n, SPEC) for n in sizes] + [(max(sizes), NO_DISK)]:
            bursts.append(_burst(n, spec, svc, cluster))
            time.sleep(5)  # the last burst's teardown is over
        stop = svc.stop()
    finally:
        if svc is not None:
            svc.stop()
        stopped = cluster.stop()
    log(f"service stopped ({stop}), cluster stopped ({', '.join(stopped)})")

    rows = [_burst_row(b) for b in bursts]
    rows += [{"creates at once": f"ROCK {k}", "p50 (s)": p50, "p99 (s)": p99, "max (s)": None, "failures": 0,
              "all created (s)": None, "create CPU, nodes (ms each)": None, "create CPU, service (ms each)": None,
              "host MiB a sandbox": None, "where": "ROCK's table (a cluster)"} for k, p50, p99 in ROCK]
    print_table(f"sandboxes created at once through `rockroll serve --backend ray` ({os.cpu_count()} cores, "
                "two Ray nodes on 127.0.0.1; memory_mb=64 pids=32, the default disk)", rows, BURST_COLUMNS)

    # calibrated by the largest burst that held (no failures), else the largest
    held = [b for b in bursts if not b["failures"] and b["disk"]] or bursts
    ref = max(held, key=lambda b: b["n"])
    calib = dict(node_create_ms=ref["nodes_create_cpu_ms"], service_create_ms=ref["service_create_cpu_ms"],
                 mb_each=max(ref["mb_per_sandbox_observed"], 1.0),
                 node_pss_mib=max(idle["pss_mib"]), node_idle_cores=max(idle["cpu_cores"]))
    models = [model(k, **calib, burst=b) for k, b in ((2, ref["n"]), (10, 16000), (100, 16000), (100, 100000))]
    mrows = [model_row(m) for m in models]
    print_table(f"a model of N nodes of {ASSUME['node_cores']} cores / {ASSUME['node_mem_gib']} GiB, calibrated "
                f"by the burst of {ref['n']} (node CPU {calib['node_create_ms']:.1f} ms and service CPU "
                f"{calib['service_create_ms']:.1f} ms a create, {calib['mb_each']:.1f} MiB a sandbox, an idle "
                f"node {calib['node_pss_mib']:.0f} MiB)", mrows, MODEL_COLUMNS)
    path = write_json("cluster", {"sizes": sizes, "spec": SPEC, "burst": bursts[-1], "bursts": bursts, "idle_node": idle,
                                  "calibration": calib, "model": models, "burst_rows": rows, "model_rows": mrows})
    log(f"wrote {path}")
    return 0


def _burst(n: int, spec: dict, svc: Service, cluster: RayCluster) -> dict:
    parts: dict[str, list[float]] = {}

    def cpu() -> float:  # both sides, kept apart for the table
        parts.setdefault("service", []).append(tree_cpu_s(svc.proc.pid))
        parts.setdefault("nodes", []).append(cluster_cpu_s(cluster))
        return parts["service"][-1] + parts["nodes"][-1]

    burst = bench_concurrent(n, cpu, spec, MB_EACH, held=lambda: {"per_node": sandboxes_per_node(cluster)})
    burst["disk"] = SandboxSpec(**spec).disk_mb is not None
    if burst["failures"]:
        log(f"{burst['failures']} creates failed {burst['failure_kinds']}; the first: {burst['first_failure']}")
    done = max(1, burst["created"])
    burst["service_create_cpu_ms"] = (parts["service"][1] - parts["service"][0]) * 1e3 / done
    burst["nodes_create_cpu_ms"] = (parts["nodes"][1] - parts["nodes"][0]) * 1e3 / done
    return burst


def _burst_row(b: dict) -> dict:
    where = "/".join(str(k) for k in b["while_held"].get("per_node", []))
    size = f"rockroll {b['n']}" + (f" (of {b['wanted']}: memory)" if b["n"] < b["wanted"] else "")
    return {"creates at once": size + ("" if b["disk"] else ", disk_mb=None"),
            "p50 (s)": _s(b["p50"]), "p99 (s)": _s(b["p99"]), "max (s)": _s(b["max"]),
            "failures": b["failures"], "all created (s)": b["created_s"],
            "create CPU, nodes (ms each)": b["nodes_create_cpu_ms"],
            "create CPU, service (ms each)": b["service_create_cpu_ms"],
            "host MiB a sandbox": b["mb_per_sandbox_observed"], "where": f"2 nodes, 1 core each: {where}"}


if __name__ == "__main__":
    sys.exit(main())
