"""Warm pools in ``rockroll serve`` (a real server on 127.0.0.1): a create of a pooled spec
is served by a sandbox the pool made before the request; other specs are not; a sandbox
given back is reset and handed out again with nothing of its last user; pools are set by
``--pool``, ``--pools FILE`` and ``/v1/pools``, counted on /metrics and the dashboard, and
closed with the service."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _leaks import leftovers
from _server import Server
from test_pool import LEAVE, LEFT_BEHIND, LOOK, NOTHING_LEFT
from test_service import _alive, _headless, _parse_metrics, _wait

POOLED = {"memory_mb": 128, "timeout_s": 30}  # the spec of the --pool below, as a client writes it


def _pool(srv: Server) -> dict:
    (pool,) = srv.http.get("/v1/pools").json()
    return pool


def _warm(srv: Server, idle: int) -> dict:
    _wait(lambda: _pool(srv)["idle"] == idle, what=f"the pool to hold {idle} warm sandboxes")
    return _pool(srv)


def _metrics(srv: Server) -> dict[str, float]:
    return _parse_metrics(srv.http.get("/metrics").text)[1]


def _sandbox_dirs(srv: Server) -> set[str]:
    return {p.name for p in srv.run_dir.iterdir() if p.is_dir()}


@pytest.fixture
def pooled():
    srv = Server("--pool", "size=2,memory_mb=128,timeout_s=30", "--max-sandboxes", "8")
    _warm(srv, 2)
    yield srv
    srv.stop()


def test_a_pooled_create_is_served_warm_and_other_specs_are_not(pooled):
    pool = _pool(pooled)
    warm = _sandbox_dirs(pooled)  # made by the pool before any request
    assert len(warm) == 2
    before = _metrics(pooled)
    r = pooled.http.post("/v1/sandboxes", json=POOLED)
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["pool"] == pool["id"] and out["spec"]["memory_mb"] == 128
    inner, lease = out["id"].rsplit(".", 1)
    assert inner in warm and lease == "1"  # one of the sandboxes that existed before the request
    assert pooled.http.post(f"/v1/sandboxes/{out['id']}/run", json={"cmd": "echo hi"}).json()["stdout"] == "hi\n"
    after = _metrics(pooled)
    key = f'{{pool="{pool["id"]}"}}'
    assert after["rockroll_pool_hits_total" + key] == before["rockroll_pool_hits_total" + key] + 1
    assert after["rockroll_pool_misses_total" + key] == before["rockroll_pool_misses_total" + key]
    # any other spec, however close, is an ordinary create: not from the pool, counted apart
    for other in ({"memory_mb": 256, "timeout_s": 30}, {**POOLED, "env": {"A": "1"}}, {"memory_mb": 128}):
        r = pooled.http.post("/v1/sandboxes", json=other)
        assert r.status_code == 201 and r.json()["pool"] is None, r.text
        assert r.json()["id"] not in warm
    after2 = _metrics(pooled)
    assert after2["rockroll_pool_unpooled_total"] == after["rockroll_pool_unpooled_total"] + 3
    assert after2["rockroll_pool_hits_total" + key] == after["rockroll_pool_hits_total" + key]
    # the pool's second warm sandbox is a hit too; a third user finds none idle: a miss, made on demand
    second = pooled.http.post("/v1/sandboxes", json=POOLED).json()
    assert second["pool"] == pool["id"] and second["id"].rsplit(".", 1)[0] in warm - {inner}
    third = pooled.http.post("/v1/sandboxes", json=POOLED).json()
    assert third["pool"] == pool["id"] and third["id"].rsplit(".", 1)[0] not in warm
    final = _metrics(pooled)
    assert final["rockroll_pool_hits_total" + key] == before["rockroll_pool_hits_total" + key] + 2
    assert final["rockroll_pool_misses_total" + key] == before["rockroll_pool_misses_total" + key] + 1
    assert final[f'rockroll_pool_sandboxes{{pool="{pool["id"]}",state="busy"}}'] == 3
    # the dashboard shows the pool with its counts
    dom = _headless(f"{pooled.url}/#token={pooled.token}", "--dump-dom").stdout
    assert f'data-pool="{pool["id"]}"' in dom and 'data-hits="2"' in dom and 'data-misses="1"' in dom, dom[-3000:]


def test_a_given_back_sandbox_is_reset_then_handed_out_again_with_nothing_left(pooled):
    first = pooled.http.post("/v1/sandboxes", json=POOLED).json()
    run = lambda sid, cmd: pooled.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": cmd}).json()  # noqa: E731
    run(first["id"], LEAVE)
    assert run(first["id"], LOOK)["stdout"] == LEFT_BEHIND
    assert pooled.http.delete(f"/v1/sandboxes/{first['id']}").status_code == 204
    # the lease is over: its id is closed for good, even once the sandbox serves someone else
    r = pooled.http.post(f"/v1/sandboxes/{first['id']}/run", json={"cmd": "true"})
    assert r.status_code == 409 and r.json()["error"] == "SandboxClosed" and r.json()["sandbox_id"] == first["id"]
    _warm(pooled, 2)  # reset in the background, back in the pool
    inner = first["id"].rsplit(".", 1)[0]
    leases = [pooled.http.post("/v1/sandboxes", json=POOLED).json() for _ in range(2)]
    again = next(s for s in leases if s["id"].startswith(inner + "."))
    assert again["id"] == f"{inner}.2"  # the same sandbox, a new lease (no create)
    assert run(again["id"], LOOK)["stdout"] == NOTHING_LEFT
    assert pooled.http.post(f"/v1/sandboxes/{first['id']}/run", json={"cmd": "true"}).status_code == 409


def test_pools_api_adds_resizes_and_removes(pooled):
    spec = {"memory_mb": 96, "timeout_s": 20}
    r = pooled.http.post("/v1/pools", json={**spec, "size": 1})
    assert r.status_code == 201, r.text
    pool = r.json()
    assert pool["idle"] == 1 and pool["size"] == 1  # the call returns once the pool is warm
    assert pooled.http.post("/v1/pools", json={**spec, "size": 2}).status_code == 200  # same spec: resized
    _wait(lambda: pooled.http.get(f"/v1/pools/{pool['id']}").json()["idle"] == 2, what="the resize")
    leased = pooled.http.post("/v1/sandboxes", json=spec).json()
    assert leased["pool"] == pool["id"]
    # bad pools are refused naming the field; pools may not own more than the service holds
    for body, field in (({"size": 0}, "size"), ({"size": 1, "memory_mb": 1}, "memory_mb"),
                        ({"size": 1, "nope": 1}, "nope")):
        r = pooled.http.post("/v1/pools", json=body)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert pooled.http.post("/v1/pools", json={"size": 7, "memory_mb": 64}).status_code == 429
    assert pooled.http.get("/v1/pools/pool-nope").status_code == 404
    # removing a pool closes what it owns, the sandbox handed out included
    assert pooled.http.delete(f"/v1/pools/{pool['id']}").status_code == 204
    r = pooled.http.post(f"/v1/sandboxes/{leased['id']}/run", json={"cmd": "true"})
    assert r.status_code == 409 and "pool was removed" in r.json()["message"]
    assert [p["id"] for p in pooled.http.get("/v1/pools").json()] == [_pool_id_of(pooled)]


def _pool_id_of(srv: Server) -> str:
    return next(p["id"] for p in srv.http.get("/v1/pools").json() if p["spec"]["memory_mb"] == 128)


def test_pools_from_a_file_are_closed_at_shutdown_with_nothing_left(tmp_path):
    conf = tmp_path / "pools.toml"
    conf.write_text('[[pool]]\nsize = 2\nmemory_mb = 128\n\n[[pool]]\nsize = 1\nmemory_mb = 64\n[pool.env]\nK = "v"\n')
    srv = Server("--pools", str(conf))
    try:
        _wait(lambda: sorted(p["idle"] for p in srv.http.get("/v1/pools").json()) == [1, 2], what="both pools")
        leased = srv.http.post("/v1/sandboxes", json={"memory_mb": 64, "env": {"K": "v"}}).json()
        assert leased["pool"] is not None
        assert srv.http.post(f"/v1/sandboxes/{leased['id']}/run", json={"cmd": "echo $K"}).json()["stdout"] == "v\n"
        agents = [srv.guests(d) for d in _sandbox_dirs(srv)]
        assert len(agents) == 3
    finally:
        assert srv.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert not any(_alive(a["init_pid"], a["init_start"]) or _alive(a["outer_pid"], a["outer_start"]) for a in agents)
    assert leftovers(srv.run_id, srv.run_dir) == []


@pytest.mark.parametrize("args, says", [
    (("--pool", "size=2,memory_mb=1"), "pool[0].memory_mb"),
    (("--pool", "memory_mb=128"), "pool[0].size"),
    (("--pool", "size=2,bogus"), "KEY=VALUE"),
])
def test_a_bad_pool_option_is_refused_naming_the_field(args, says):
    r = subprocess.run([sys.executable, "-m", "rockroll.cli", "serve", "--port", "1", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_a_pool_of_a_hub_env_hands_out_that_env(tmp_path, monkeypatch):
    from rockroll.envhub import HubStore, build, publish

    pkg = Path(__file__).parents[1] / "envhub" / "pkgs" / "counter"
    shutil.copytree(pkg, tmp_path / "counter")
    hub = f"file://{tmp_path / 'hub'}"
    publish(build(tmp_path / "counter").manifest, HubStore(hub))
    monkeypatch.setenv("ROCKROLL_HUB", hub)  # the service's default hub, where hub: images resolve
    srv = Server("--pool", "size=1,memory_mb=128,image=hub:counter@1.0.0")
    try:
        pool = _warm(srv, 1)
        out = srv.http.post("/v1/sandboxes", json={"memory_mb": 128, "image": "hub:counter@1.0.0"}).json()
        assert out["pool"] == pool["id"]
        r = srv.http.post(f"/v1/sandboxes/{out['id']}/run", json={"cmd": "cat /opt/counter/setup.txt"}).json()
        assert r["stdout"] == "built-by-setup\n"  # the env's layer, built by its setup step
        # the same env by a range is another image string: an ordinary create
        other = srv.http.post("/v1/sandboxes", json={"memory_mb": 128, "image": "hub:counter@1"})
        assert other.status_code == 201 and other.json()["pool"] is None, other.text
    finally:
        srv.stop()
