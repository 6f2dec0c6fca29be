"""``/metrics`` by the book (issue #21): the standard exposition, read back with
``prometheus_client``'s own parser; every fleet series moves when its event happens; and the
Grafana dashboard in docs/ plots only expressions that parse (``promql-parser``) and name
series the service exports."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rockroll.sandbox.home import state_home
from rockroll.sandbox.storage import temps

from _server import Server

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def scrape(srv: Server) -> tuple[dict[str, str], dict[tuple, float]]:
    """({family: type}, {(sample name, sorted labels): value}) of one scrape."""
    r = srv.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    types, values = {}, {}
    for fam in text_string_to_metric_families(r.text):  # raises on anything but the standard format
        types[fam.name] = fam.type
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, values


def exported_names(types: dict[str, str]) -> set[str]:
    """The sample names the families of a scrape export (those with no sample yet included)."""
    return {name + suffix for name, kind in types.items() for suffix in SUFFIXES.get(kind, ("",))}


@pytest.fixture(scope="module")
def restarted():
    """A service killed with -9 while holding a sandbox, a dead writer's temp file in the
    store, then a new service: the one the tests scrape."""
    old = Server()
    old.create()
    old.stop(signal.SIGKILL)
    dead = temps.temp_name("pack", ".tar.zst").replace(temps.lifecycle.tag(), "999999999-1")
    store = state_home() / "snapshots" / "sha256"
    store.mkdir(parents=True, exist_ok=True)
    (store / dead).write_bytes(b"half a tarball")
    srv = Server()
    yield srv
    srv.stop()


def test_fleet_series_move_with_their_events(restarted):
    srv = restarted
    types, before = scrape(srv)
    # the start reaped the killed service's run and the dead writer's temp file, and said so
    assert before[("rockroll_reaped_total", (("kind", "runs"),))] >= 1
    assert before[("rockroll_reaped_total", (("kind", "temps"),))] >= 1
    # standard types and process metrics
    assert types["rockroll_sandbox_create_duration_seconds"] == "histogram"
    assert types["rockroll_sandboxes_created"] == "counter" and types["rockroll_oom_kills"] == "counter"
    assert before[("process_resident_memory_bytes", ())] > 0 and before[("process_open_fds", ())] > 0

    sid = srv.create(memory_mb=64)
    srv.create()
    hog = srv.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "python3 -c 'b = bytearray(400 << 20)'"})
    assert hog.status_code == 200 and hog.json()["oom_killed"], hog.text
    snap = srv.http.post(f"/v1/sandboxes/{sid}/snapshots")
    assert snap.status_code == 201, snap.text
    digest = snap.json()["digest"]
    tarball = srv.http.get(f"/v1/snapshots/{digest}")
    assert tarball.status_code == 200
    assert srv.http.post("/v1/snapshots", content=tarball.content).status_code == 201
    assert srv.http.get("/v1/sandboxes/sb-nope").status_code == 404

    _, after = scrape(srv)

    def moved(name, labels=()):
        key = (name, tuple(sorted(labels)))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("rockroll_sandbox_create_duration_seconds_count") == 2
    assert moved("rockroll_sandbox_create_duration_seconds_bucket", [("le", "+Inf")]) == 2
    assert moved("rockroll_sandbox_create_duration_seconds_sum") > 0
    assert moved("rockroll_sandboxes_created_total") == 2
    assert after[("rockroll_sandboxes", (("state", "alive"),))] == 2
    assert moved("rockroll_oom_kills_total") == 1
    assert moved("rockroll_command_duration_seconds_count") == 1
    assert moved("rockroll_snapshot_bytes_total", [("direction", "out")]) == len(tarball.content)
    assert moved("rockroll_snapshot_bytes_total", [("direction", "in")]) == len(tarball.content)
    assert moved("rockroll_failures_total", [("kind", "SandboxNotFound")]) == 1


def selectors(node) -> list[str]:
    """The metric names a parsed PromQL expression selects."""
    if type(node).__name__ == "VectorSelector":
        return [node.name]
    out = []
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector", "args"):
        child = getattr(node, attr, None)
        for c in child if isinstance(child, list) else [child]:
            if type(c).__module__ == "promql_parser":
                out += selectors(c)
    return out


def test_the_grafana_dashboard_plots_exported_series(restarted):
    types, _ = scrape(restarted)
    exported = exported_names(types)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) >= 10
    for panel in panels:
        for target in panel["targets"]:
            names = selectors(promql_parser.parse(target["expr"]))  # ValueError if it does not parse
            assert names, target["expr"]
            missing = [n for n in names if n not in exported]
            assert not missing, f"panel {panel['title']!r} plots {missing}, which /metrics does not export"


def test_a_metrics_port_serves_the_same_series_without_the_token():
    """``--metrics-port``: the scraper's port answers without a token (and nothing but the
    metrics); the service's own /metrics still wants one."""
    import httpx

    from _server import free_port

    port = free_port()
    srv = Server("--metrics-port", str(port))
    try:
        srv.create()
        plain = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert plain.status_code == 200
        values = {(x.name, tuple(sorted(x.labels.items()))): x.value
                  for f in text_string_to_metric_families(plain.text) for x in f.samples}
        assert values[("rockroll_sandboxes_created_total", ())] == 1
        assert values[("rockroll_sandboxes", (("state", "alive"),))] == 1
        assert httpx.get(f"{srv.url}/metrics", timeout=10).status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/v1/sandboxes", timeout=10).text.count("sb-") == 0
    finally:
        srv.stop()
    with pytest.raises(httpx.ConnectError):  # stopped with the service
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
