"""backend="ray" on a real two-node Ray cluster (head + second node, both on 127.0.0.1).

Each node is started with Ray's own `ray start` (through `python -m
rockroll.sandbox.deployment.ray`, which keeps the loopback address Ray would otherwise swap
for the machine's outward IP) in its own session, so the second node can be killed on
its own by process group. No mocks: real actors, real sandboxes, a real node loss.
"""

import dataclasses
import time

import pytest

import ray  # the ray extra is a declared test dependency (make test installs it)

from rockroll.sandbox import (SandboxError, SandboxLost, SandboxSpec, SandboxFileError, SpecError,  # noqa: E402
                              open_sandbox)
from rockroll.sandbox.errors import TerminalError  # noqa: E402
from rockroll.sandbox.deployment import ray as raycluster  # noqa: E402
from rockroll.sandbox.pool import SandboxPool  # noqa: E402
from rockroll.sandbox.deployment.reaper import list_runs, reap_dead_runs  # noqa: E402

from _raycluster import LoopbackCluster, guests_of, wait_for as _wait  # noqa: E402

SPEC = SandboxSpec(backend="ray", memory_mb=128, timeout_s=30)
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    loop = LoopbackCluster(tmp_path_factory.mktemp("ray"))
    try:
        loop.start_head()
        loop.add_node()
        raycluster.connect(loop.address)
        _wait(lambda: loop.alive() == 2, 120, "two alive nodes")
        yield loop.nodes
    finally:
        ray.shutdown()
        loop.close()


def _node_of(sb) -> str:
    return sb.aio.node_id


def test_sandboxes_are_placed_on_both_nodes(cluster):
    boxes = [open_sandbox(SPEC) for _ in range(4)]
    try:
        nodes = {_node_of(sb) for sb in boxes}
        assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        for sb in boxes:
            assert sb.run("echo $((6*7))").stdout == "42\n"
    finally:
        for sb in boxes:
            sb.close()


def test_expose_is_answered_on_the_sandboxes_node_only(cluster):
    """``expose`` through Ray gives an address on the sandbox's node's 127.0.0.1: from a
    driver on another node it is refused, typed, before the host is asked; on this node the
    host actor answers (here the sandbox's own refusal: it has no network). The counters
    come through Ray too (none without a network). The network itself is tested in a lab:
    test_network_ray.py."""
    here = ray.get_runtime_context().get_node_id()
    boxes = [open_sandbox(SPEC) for _ in range(4)]
    try:
        by_node = {_node_of(sb): sb for sb in boxes}
        assert set(by_node) == {n["NodeID"] for n in ray.nodes() if n["Alive"]} and here in by_node
        elsewhere = next(sb for node, sb in by_node.items() if node != here)
        with pytest.raises(SandboxError, match="sandbox's node") as err:
            elsewhere.expose(8000)
        assert err.value.sandbox_id == elsewhere.id
        with pytest.raises(SpecError, match="network=True"):
            by_node[here].expose(8000)
        assert by_node[here].network_stats() is None and elsewhere.network_stats() is None
    finally:
        for sb in boxes:
            sb.close()


def test_sync_api_through_ray(cluster, tmp_path):
    with open_sandbox(SPEC) as sb:
        assert sb.alive and sb.spec.backend == "ray"
        r = sb.run("cd /tmp; export X=1; echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        assert sb.run("pwd; echo $X").stdout == "/tmp\n1\n"  # the session persists
        items = list(sb.run_stream("echo a; echo b >&2"))
        assert items[-1].stdout == "a\n" and ("stderr", "b\n") in items[:-1]

        sb.write_file("notes.txt", "v1")
        assert sb.read_file("/workspace/notes.txt") == b"v1" and sb.exists("notes.txt")
        with pytest.raises(SandboxFileError) as err:
            sb.read_file("nope")
        assert err.value.sandbox_id == sb.id  # the actor's typed error, rebuilt here

        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "a.txt").write_text("A")
        sb.upload(tmp_path / "up", "updir")
        sb.download("updir", tmp_path / "down")
        assert (tmp_path / "down" / "a.txt").read_text() == "A"
        sb.download("notes.txt", tmp_path / "n.txt")
        assert (tmp_path / "n.txt").read_text() == "v1"

        snap = sb.snapshot()
        assert snap.path is not None and snap.path.is_file()
        sb.write_file("notes.txt", "v2")
        sb.restore(snap)
        assert sb.read_file("notes.txt") == b"v1"
        assert sb.run("pwd").stdout == "/tmp\n"  # the session came back too

        kids = sb.fork(2)
        try:
            assert {_node_of(k) for k in kids} == {_node_of(sb)}  # COW: same node
            kids[0].write_file("notes.txt", "kid")
            assert kids[1].read_file("notes.txt") == b"v1"
        finally:
            for k in kids:
                k.close()

        with open_sandbox(SPEC, snapshot=snap) as again:  # anywhere in the cluster
            assert again.read_file("notes.txt") == b"v1"
        sb.reset()
        assert not sb.exists("notes.txt")
    assert not sb.alive


def test_terminal_through_ray(cluster):
    """The node's host actor holds the terminal; keys, output, resize, signal, exit."""
    with open_sandbox(SPEC) as sb:
        with sb.open_terminal(rows=25, cols=90) as t:
            t.write("PS1='RAY''$ '; stty size\n")
            t.expect("25 90")
            t.resize(30, 100)
            t.write("stty size; sleep 1000\n")
            t.expect("30 100")
            _wait(lambda: "sleep" in sb.run("ps -eo comm=").stdout, 30, "the sleep")
            t.signal(2)
            t.write("echo rc=$?\n")
            t.expect("rc=130")  # a Ray worker blocks SIGINT: the terminal's programs must not inherit that
            t.write("exit 4\n")
            assert t.wait(timeout=60) == 4
        with pytest.raises(TerminalError):
            t.write("x")


def test_pool_spreads_then_refills_after_node_loss(cluster):
    head, worker = cluster
    worker_node = worker.node_id()
    with SandboxPool(SPEC, size=4, health_interval_s=0.5) as pool:
        _wait(lambda: pool.idle == 4, 120, "a full pool")
        held = [pool.acquire() for _ in range(4)]
        assert {_node_of(sb) for sb in held} == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        doomed = [sb for sb in held if _node_of(sb) == worker_node]
        survivors = [sb for sb in held if sb not in doomed]
        assert doomed and survivors
        worker_run = next(s["run_id"] for h, s in _stats() if h.node_id == worker_node)

        worker.kill()
        for sb in doomed:
            with pytest.raises(SandboxLost) as err:
                _wait_lost(sb)
            assert err.value.sandbox_id == sb.id
            assert not sb.alive
            sb.close()  # still fine: nothing left to close
        for sb in survivors:
            assert sb.run("echo alive").stdout == "alive\n"
            pool.release(sb)
        _wait(lambda: pool.replaced >= 2 and pool.idle == 4, 120, "the pool refilled on the surviving node")
        fresh = pool.acquire()
        assert _node_of(fresh) != worker_node
        pool.release(fresh)

    # The killed node's host took its sandboxes with it: its run is dead, nothing of it
    # is still running, and the collector removes what is left on disk.
    run = _wait(lambda: next((r for r in list_runs() if r.run_id == worker_run and not r.alive), None),
                60, "the killed host's run to be dead")
    assert run.sandboxes
    _wait(lambda: not guests_of(worker_run), 60, "the killed node's agents to exit")
    assert worker_run in reap_dead_runs()
    assert worker_run not in {r.run_id for r in list_runs()}


def _stats():
    from rockroll.sandbox.sync import run_sync

    return run_sync(raycluster.cluster().stats())


def _wait_lost(sb, timeout: float = 60.0):
    """Call the sandbox until the loss shows (a dead node takes Ray a moment to confirm)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sb.run("true", timeout=5)
        time.sleep(0.2)
    raise AssertionError("the sandbox was never reported lost")


def test_model_endpoint_on_a_ray_node(cluster, monkeypatch):
    """A sandbox on a Ray node answers in-sandbox model calls through a real model service.
    The host actors started before the driver had a token (their environment has none):
    the driver's token travels with each create, and with a pool's resize."""
    from rockroll.sandbox.modelservice import ModelService
    from rockroll.sandbox.protocol.tokens import TOKEN_ENV

    from _model import WhoAmI, assert_served, host_call

    with ModelService(WhoAmI()) as svc:
        monkeypatch.setenv(TOKEN_ENV, svc.token)
        spec = dataclasses.replace(SPEC, model_endpoint=svc.url)
        with open_sandbox(spec) as sb:
            key = assert_served(sb, svc)
        assert host_call(svc, key) == 401  # revoked when the host closed it
        with SandboxPool(spec, size=1) as pool:
            monkeypatch.delenv(TOKEN_ENV)  # the pool keeps the token it was opened with
            pooled = pool.acquire()
            key = assert_served(pooled, svc)
            pooled.close()
        assert host_call(svc, key) == 401


async def test_rock_and_swerex_clients_drive_a_service_on_the_ray_backend(cluster, monkeypatch, tmp_path):
    """Issue #15's "on every backend": ROCK's unmodified SDK starts a sandbox of a service
    whose sandboxes live on the Ray cluster, and SWE-ReX's runtime drives that same sandbox."""
    from rock.sdk.sandbox.client import Sandbox
    from rock.sdk.sandbox.config import SandboxConfig

    from _server import Server, rock_and_swerex_share_a_sandbox

    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    srv = Server("--backend", "ray", "--max-sandboxes", "4")
    try:
        sb = Sandbox(SandboxConfig(base_url=srv.url, extra_headers={"Authorization": f"Bearer {srv.token}"},
                                   image="host", memory="256m", cpus=1, disk="512m"))
        await sb.start()
        try:
            spec = srv.http.get(f"/v1/sandboxes/{sb.sandbox_id}").json()["spec"]
            assert spec["backend"] == "ray" and spec["network"] is False
            assert (await sb.arun("echo $((6 * 7))")).output == "42\n"
            await rock_and_swerex_share_a_sandbox(srv, sb, tmp_path)
        finally:
            await sb.stop()
    finally:
        srv.stop()


async def test_a_fresh_service_on_the_ray_backend_takes_a_burst(cluster, monkeypatch):
    """A service on the Ray backend whose first creates come all at once (and again once its
    view of the nodes is stale): every one is served. Before, each of the concurrent
    placements refreshed the view and started a host for the same node; the handle
    overwritten took its host actor down (Ray: out of scope), and the burst found no host."""
    import asyncio

    from rockroll.sandbox import AsyncSandbox
    from rockroll.sandbox.deployment.ray import REFRESH_S
    from rockroll.sandbox.runtime import remote

    from _server import Server

    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    srv = Server("--backend", "ray", "--max-sandboxes", "32")
    try:
        remote.configure(srv.url, srv.token)
        spec = SandboxSpec(backend="remote", memory_mb=64, timeout_s=30)
        for burst in range(2):
            made = await asyncio.gather(*(AsyncSandbox.create(spec) for _ in range(8)), return_exceptions=True)
            failed = [repr(m) for m in made if isinstance(m, BaseException)]
            boxes = [m for m in made if not isinstance(m, BaseException)]
            try:
                assert not failed, failed
                assert [(await b.run("echo ok")).stdout for b in boxes] == ["ok\n"] * 8
            finally:
                await asyncio.gather(*(b.close() for b in boxes))
            await asyncio.sleep(REFRESH_S + 0.5)  # the next burst refreshes the view again
    finally:
        remote.configure(None, None)
        srv.stop()
