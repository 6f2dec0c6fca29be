"""The service's Prometheus series, rendered by hand in the text format."""

from __future__ import annotations

import bisect
import collections
import os

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

class Metrics:
    """The few series the service exports, rendered by hand in Prometheus text format
    (no client library: four metric families do not justify a dependency)."""

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.commands = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.created = 0
        self.unpooled = 0  # creates whose spec no warm pool serves
        self.closed: collections.Counter[str] = collections.Counter()

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds
        self.commands += 1

    def render(self, states: collections.Counter[str], capacity: int, pools: list = ()) -> str:
        """The exposition; ``pools`` are the warm pools' ``PoolOut``s."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            _family(out, name, kind, help_, samples)

        family("rockroll_sandboxes", "gauge", "Sandboxes held by the service, by state.",
               [(f'{{state="{s}"}}', states.get(s, 0)) for s in ("alive", "dead")])
        family("rockroll_sandboxes_capacity", "gauge", "Most sandboxes the service holds at once.",
               [("", capacity)])
        family("rockroll_sandboxes_created_total", "counter", "Sandboxes created.", [("", self.created)])
        family("rockroll_sandboxes_closed_total", "counter", "Sandboxes closed, by reason.",
               [(f'{{reason="{r}"}}', n) for r, n in sorted(self.closed.items())])
        cumulative, samples = 0, []
        for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), self.buckets):
            cumulative += n
            samples.append((f'{{le="{bound}"}}', cumulative))
        out.append("# HELP rockroll_command_duration_seconds Wall time of run() calls, server side.")
        out.append("# TYPE rockroll_command_duration_seconds histogram")
        out.extend(f"rockroll_command_duration_seconds_bucket{labels} {v}" for labels, v in samples)
        out.append(f"rockroll_command_duration_seconds_sum {self.latency_sum:.6f}")
        out.append(f"rockroll_command_duration_seconds_count {self.commands}")
        family("rockroll_failures_total", "counter", "Failed requests, by error kind.",
               [(f'{{kind="{k}"}}', n) for k, n in sorted(self.failures.items())])
        family("rockroll_pool_hits_total", "counter", "Creates served by a warm sandbox of a pool.",
               [(f'{{pool="{p.id}"}}', p.hits) for p in pools])
        family("rockroll_pool_misses_total", "counter",
               "Creates of a pooled spec that found no warm sandbox (made on demand).",
               [(f'{{pool="{p.id}"}}', p.misses) for p in pools])
        family("rockroll_pool_unpooled_total", "counter", "Creates whose spec no warm pool serves.",
               [("", self.unpooled)])
        family("rockroll_pool_sandboxes", "gauge", "Sandboxes a warm pool owns, by state.",
               [(f'{{pool="{p.id}",state="{k}"}}', getattr(p, k)) for p in pools for k in ("idle", "busy")])
        family("rockroll_pool_size", "gauge", "Sandboxes a warm pool keeps (idle + handed out).",
               [(f'{{pool="{p.id}"}}', p.size) for p in pools])
        return "\n".join(out) + "\n"


def _family(out: list[str], name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    out.extend(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
               for labels, value in samples)


def storage_series(quota, store) -> str:
    """The storage plane's series: bytes each token holds against its quota, the unpack
    limits, and the free space of the store's disk."""
    out: list[str] = []
    _family(out, "rockroll_storage_used_bytes", "gauge",
            "Bytes of snapshots uploaded or taken (tarball + unpacked layer) a token holds, by token key.",
            [(f'{{token="{k}"}}', v) for k, v in quota.usage().items()])
    _family(out, "rockroll_storage_quota_bytes", "gauge", "Bytes of snapshots one token may hold.",
            [("", quota.quota)])
    limits = store.limits
    _family(out, "rockroll_storage_limit_bytes", "gauge", "Storage limits, by name.",
            [(f'{{limit="{n}"}}', getattr(limits, n)) for n in ("max_layer_bytes", "max_chain_bytes",
                                                               "min_free_bytes")])
    home = store.tar_root.parent
    st = os.statvfs(home if home.is_dir() else "/")
    _family(out, "rockroll_storage_free_bytes", "gauge", "Free bytes on the disk of the snapshot store.",
            [("", st.f_bavail * st.f_frsize)])
    return "\n".join(out) + "\n"
