"""The service's Prometheus metrics, on ``prometheus_client``: the standard exposition
(counters with ``_total``, histograms with ``_bucket``/``_sum``/``_count``), the process
collector (CPU seconds, resident memory, open fds, start time) and what an operator of a
sandbox fleet watches. Each service has its own registry, so two services in one process
(tests) never share a series.

Event counts are kept where they happen (``SandboxFleet``, the routes); state that already
lives elsewhere (sandboxes by state, pools, storage) is read at scrape time by one
collector, never copied. ``docs/grafana-dashboard.json`` plots these names, and a test
checks that every panel's expression names a series this module exports.
"""

from __future__ import annotations

import collections
import os
from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics,
                               start_http_server)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..deployment.network import one_reading

disable_created_metrics()  # no *_created series: they double every counter for nothing we plot

# run() wall time: from a shell builtin (~1 ms) to a test suite (minutes)
COMMAND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# create wall time: a warm-pool hit (~1 ms) to a cold create of a big image under load (tens of s)
CREATE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Counters and histograms of one service, and its registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # no auto_describe: a live collector is read at scrape time only
        r = self.registry
        ProcessCollector(registry=r)
        self.created = Counter("rockroll_sandboxes_created", "Sandboxes created.", registry=r)
        self.closed = Counter("rockroll_sandboxes_closed", "Sandboxes closed, by reason.", ["reason"], registry=r)
        self.create_seconds = Histogram("rockroll_sandbox_create_duration_seconds",
                                        "Wall time of a create, warm-pool hits included.",
                                        buckets=CREATE_BUCKETS, registry=r)
        self.command_seconds = Histogram("rockroll_command_duration_seconds", "Wall time of run() calls, server side.",
                                         buckets=COMMAND_BUCKETS, registry=r)
        self.batches = Counter("rockroll_create_batches", "POST /v1/sandboxes/batch requests (the SDK sends "
                               "creates issued together as one).", registry=r)
        self.batched = Counter("rockroll_create_batched", "Sandboxes asked for in batches.", registry=r)
        self.failures = Counter("rockroll_failures", "Failed requests, by error kind.", ["kind"], registry=r)
        self.unpooled = Counter("rockroll_pool_unpooled", "Creates whose spec no warm pool serves.", registry=r)
        self.oom_kills = Counter("rockroll_oom_kills", "Commands the sandbox's memory limit killed.", registry=r)
        self.reaped = Counter("rockroll_reaped", "Leftovers of dead owners removed at start: runs (their "
                              "processes, cgroups, dirs) and temp files.", ["kind"], registry=r)
        self.snapshot_bytes = Counter("rockroll_snapshot_bytes", "Snapshot tarball bytes through the service: "
                                      "in (uploaded), out (downloaded).", ["direction"], registry=r)

    def watch(self, read: Callable[[], "collections.abc.Iterable"]) -> None:
        """Add a collector whose families are read at every scrape (state kept elsewhere)."""
        self.registry.register(_Live(read))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def serve(self, host: str, port: int):
        """This registry on ``http://host:port/metrics`` without auth (prometheus_client's own
        exporter, on a thread), as exporters usually are: counts only, no sandbox content.
        Returns the server; ``shutdown()`` stops it."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server


class _Live:
    def __init__(self, read):
        self.read = read

    def collect(self):
        return list(self.read())


def family(kind: str, name: str, help_: str, labels: tuple[str, ...] = (), samples=()):
    """A gauge or counter family from ``[(label values, value), ...]``."""
    f = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, help_, labels=list(labels))
    for values, value in samples:
        f.add_metric(list(values), value)
    return f


def service_families(fleet) -> list:
    """Sandboxes by state and the warm pools, read from the service's ``SandboxFleet``."""
    states = collections.Counter(e.state for e in fleet.entries.values())
    pools = [w.describe() for w in fleet.pools.values()]
    return [
        family("gauge", "rockroll_sandboxes", "Sandboxes held by the service, by state.", ("state",),
               [((s,), states.get(s, 0)) for s in ("alive", "dead")] + [(("creating",), fleet.creating)]),
        family("gauge", "rockroll_sandboxes_capacity", "Most sandboxes the service holds at once.",
               samples=[((), fleet.max_sandboxes)]),
        family("counter", "rockroll_pool_hits", "Creates served by a warm sandbox of a pool.", ("pool",),
               [((p.id,), p.hits) for p in pools]),
        family("counter", "rockroll_pool_misses", "Creates of a pooled spec that found no warm sandbox "
               "(made on demand).", ("pool",), [((p.id,), p.misses) for p in pools]),
        family("gauge", "rockroll_pool_sandboxes", "Sandboxes a warm pool owns, by state.", ("pool", "state"),
               [((p.id, k), getattr(p, k)) for p in pools for k in ("idle", "busy")]),
        family("gauge", "rockroll_pool_size", "Sandboxes a warm pool keeps (idle + handed out).", ("pool",),
               [((p.id,), p.size) for p in pools]),
        *network_families(fleet),
    ]


def network_families(fleet) -> list:
    """Per sandbox with a network: bytes through its gateway, connections it opened, and
    attempts the policy or the packet filter refused, by reason (``AsyncSandbox.network_stats``)."""
    with one_reading():  # the packet filter's counts of every sandbox here in one read
        stats = [(sid, s) for sid, e in fleet.entries.items() if (s := e.sb.network_stats()) is not None]
    return [
        family("counter", "rockroll_sandbox_network_bytes", "Bytes through a sandbox's gateway: in (to the "
               "sandbox), out (from it).", ("sandbox", "direction"),
               [((sid, d), s[f"bytes_{d}"]) for sid, s in stats for d in ("in", "out")]),
        family("counter", "rockroll_sandbox_network_connections", "TCP connections a sandbox opened that its "
               "egress policy allowed.", ("sandbox",), [((sid,), s["connections"]) for sid, s in stats]),
        family("counter", "rockroll_sandbox_network_denied", "Connections, queries and packets of a sandbox its "
               "egress policy or packet filter refused, by reason.", ("sandbox", "reason"),
               [((sid, r), n) for sid, s in stats for r, n in sorted(s["denied"].items())]),
    ]


def storage_families(quota, store) -> list:
    """The storage plane: bytes each token holds against its quota, the unpack limits, and
    the free space of the store's disk."""
    limits = store.limits
    home = store.tar_root.parent
    st = os.statvfs(home if home.is_dir() else "/")
    return [
        family("gauge", "rockroll_storage_used_bytes",
               "Bytes of snapshots uploaded or taken (tarball + unpacked layer) a token holds, by token key.", ("token",),
               [((k,), v) for k, v in quota.usage().items()]),
        family("gauge", "rockroll_storage_quota_bytes", "Bytes of snapshots one token may hold.",
               samples=[((), quota.quota)]),
        family("gauge", "rockroll_storage_limit_bytes", "Storage limits, by name.", ("limit",),
               [((n,), getattr(limits, n)) for n in ("max_layer_bytes", "max_chain_bytes", "min_free_bytes")]),
        family("gauge", "rockroll_storage_free_bytes", "Free bytes on the disk of the snapshot store.",
               samples=[((), st.f_bavail * st.f_frsize)]),
    ]
