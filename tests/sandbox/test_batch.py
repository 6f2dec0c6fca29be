"""Creates issued together: the SDK sends them as one ``POST /v1/sandboxes/batch`` to a
real ``rockroll serve``; each caller still gets its own sandbox or its own typed error,
and a client that leaves mid-batch leaves no sandbox behind."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
import time

import httpx
import pytest

from rockroll.sandbox import AsyncSandbox, CapacityError, SandboxSpec, SpecError
from rockroll.sandbox.modelservice import ModelService
from rockroll.sandbox.protocol.tokens import TOKEN_ENV
from rockroll.sandbox.sync import run_sync

from _model import CALL, WhoAmI, host_call
from _server import Server, sdk_service

SPEC = SandboxSpec(backend="remote", memory_mb=128, pids=64, timeout_s=30)


@pytest.fixture(scope="module")
def server():
    with sdk_service("--max-sandboxes", "16") as srv:
        yield srv


def metric(srv: Server, name: str, labels: str = "") -> float:
    text = srv.http.get("/metrics").text
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def live(srv: Server) -> set[str]:
    return {s["id"] for s in srv.http.get("/v1/sandboxes").json()}


def settle(srv: Server, want: set[str], timeout: float = 30) -> set[str]:
    """The service's sandboxes once they are ``want`` (or at the deadline)."""
    deadline = time.monotonic() + timeout
    while (now := live(srv)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_creates_issued_together_go_out_as_one_batch(server):
    batches, batched = metric(server, "rockroll_create_batches_total"), metric(server, "rockroll_create_batched_total")

    async def burst():
        boxes = await asyncio.gather(*(AsyncSandbox.create(SPEC) for _ in range(12)))
        try:
            outs = await asyncio.gather(*(b.run(f"echo {i} > /workspace/mine; cat /workspace/mine")
                                          for i, b in enumerate(boxes)))
            return [b.id for b in boxes], [o.stdout for o in outs]
        finally:
            await asyncio.gather(*(b.close() for b in boxes))

    ids, outs = run_sync(burst())
    assert len(set(ids)) == 12 and outs == [f"{i}\n" for i in range(12)]  # each its own, working sandbox
    assert metric(server, "rockroll_create_batches_total") == batches + 1
    assert metric(server, "rockroll_create_batched_total") == batched + 12
    # one at a time is a plain create, as before
    run_sync(_create_and_close())
    assert metric(server, "rockroll_create_batches_total") == batches + 1


async def close_all(boxes) -> None:
    await asyncio.gather(*(b.close() for b in boxes))


async def _create_and_close():
    sb = await AsyncSandbox.create(SPEC)
    await sb.close()


def test_each_caller_gets_its_own_error(server):
    """A spec the service refuses fails alone, and 20 creates against a service that holds
    16 give 16 sandboxes and 4 CapacityErrors: a batch is not all-or-nothing."""
    before = live(server)
    bad = SandboxSpec(backend="remote", image="no-such-image")

    async def burst(n: int, *extra: SandboxSpec):
        return await asyncio.gather(*(AsyncSandbox.create(s) for s in [SPEC] * n + list(extra)),
                                    return_exceptions=True)

    results = run_sync(burst(3, bad))
    try:
        assert all(isinstance(r, AsyncSandbox) for r in results[:3])
        assert isinstance(results[3], SpecError) and results[3].field == "image"
    finally:
        run_sync(close_all([r for r in results if isinstance(r, AsyncSandbox)]))
    room = 16 - len(before)
    results = run_sync(burst(room + 4))
    boxes = [r for r in results if isinstance(r, AsyncSandbox)]
    try:
        full = [r for r in results if not isinstance(r, AsyncSandbox)]
        assert len(boxes) == room and len(full) == 4
        assert all(isinstance(e, CapacityError) and e.retry_after > 0 for e in full), full
    finally:
        run_sync(close_all(boxes))
    assert settle(server, before) == before


def test_a_bad_item_refuses_the_batch_and_makes_nothing(server):
    before = live(server)
    r = server.http.post("/v1/sandboxes/batch", json={"sandboxes": [{"memory_mb": 128}, {"memory_mb": -1}]})
    assert r.status_code == 422 and r.json()["field"] == "sandboxes.1.memory_mb", r.text
    r = server.http.post("/v1/sandboxes/batch", json={"sandboxes": []})
    assert r.status_code == 422 and r.json()["field"] == "sandboxes", r.text
    assert live(server) == before


def test_the_answer_is_one_line_per_sandbox(server):
    with server.http.stream("POST", "/v1/sandboxes/batch", json={"sandboxes": [{"memory_mb": 128}] * 3}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        import json

        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert sorted(item["index"] for item in lines) == [0, 1, 2]
    assert all(item["status"] == 201 and item["sandbox"]["state"] == "alive" for item in lines)
    for item in lines:
        assert server.http.delete(f"/v1/sandboxes/{item['sandbox']['id']}").status_code == 204


def test_a_client_that_leaves_mid_batch_leaves_no_sandbox(server):
    """The client sends a batch and hangs up once the service has started it: the service
    closes every sandbox whose line it could not send; what it keeps, the client read (up
    to the end of the connection). The hang-up sweeps across the batch's creates, since
    a line the service writes in the same moment it reads the hang-up is the one at risk."""
    for round in range(12):
        left, heard = hang_up_mid_batch(server, delay=round * 0.004)
        try:
            assert left <= heard, f"round {round}: sandboxes the client never heard of were left: {left - heard}"
        finally:
            for sid in left:
                server.http.delete(f"/v1/sandboxes/{sid}")


def hang_up_mid_batch(srv: Server, delay: float, n: int = 6) -> tuple[set[str], set[str]]:
    """Sends a batch of ``n``, hangs up ``delay`` s after its creates started, reads the
    connection to its end; the sandboxes left of it once every create is over, and those
    the client was sent."""
    before = live(srv)
    batches = metric(srv, "rockroll_create_batches_total")
    created = metric(srv, "rockroll_sandboxes_created_total")
    request = httpx.Request("POST", srv.url + "/v1/sandboxes/batch", json={"sandboxes": [{"memory_mb": 128}] * n},
                            headers={"Authorization": f"Bearer {srv.token}"})
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    received = b""
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(f"POST /v1/sandboxes/batch HTTP/1.1\r\n{head}\r\n".encode() + request.read())
        deadline = time.monotonic() + 30
        while metric(srv, "rockroll_create_batches_total") < batches + 1:  # its creates have started
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(delay)
        s.shutdown(socket.SHUT_WR)  # hang up: the service sees the connection end
        s.settimeout(30)
        while chunk := s.recv(65536):
            received += chunk
    heard = {h.decode() for h in re.findall(rb'"sandbox":\{"id":"(sb-[0-9a-f]+)"', received)}
    deadline = time.monotonic() + 60
    while metric(srv, "rockroll_sandboxes_created_total") < created + n:  # every create ran to its end
        assert time.monotonic() < deadline, "the batch's creates did not finish"
        time.sleep(0.05)
    # Kept: only sandboxes the client was sent (one whose line went out as the hang-up was
    # seen may be closed too: its client is gone either way).
    deadline = time.monotonic() + 15
    while not (left := live(srv) - before) <= heard and time.monotonic() < deadline:
        time.sleep(0.1)
    return left, heard


def test_a_caller_cancelled_mid_batch_leaves_no_sandbox(server):
    """Creates cancelled while their batch is in flight (a timeout around a gather): the
    SDK closes each sandbox as its answer arrives, since no caller holds it."""
    before = live(server)
    batches = metric(server, "rockroll_create_batches_total")
    created = metric(server, "rockroll_sandboxes_created_total")

    async def scenario():
        calls = [asyncio.ensure_future(AsyncSandbox.create(SPEC)) for _ in range(4)]
        while metric(server, "rockroll_create_batches_total") < batches + 1:  # in flight now
            await asyncio.sleep(0.002)
        for call in calls:
            call.cancel()
        return await asyncio.gather(*calls, return_exceptions=True)

    results = run_sync(scenario())
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    deadline = time.monotonic() + 60
    while metric(server, "rockroll_sandboxes_created_total") < created + 4:
        assert time.monotonic() < deadline, "the batch's creates did not finish"
        time.sleep(0.05)
    assert settle(server, before, timeout=15) == before


def test_a_batch_carries_the_drivers_model_token(server, monkeypatch):
    """Creates with a ``model_endpoint`` go out as one batch with the driver's admin token
    in its header: the service issues each sandbox its own key with it (each call is
    answered as its own sandbox's), and revokes them on close."""
    batches = metric(server, "rockroll_create_batches_total")
    with ModelService(WhoAmI()) as svc:
        monkeypatch.setenv(TOKEN_ENV, svc.token)
        spec = dataclasses.replace(SPEC, model_endpoint=svc.url)

        async def burst():
            boxes = await asyncio.gather(*(AsyncSandbox.create(spec) for _ in range(3)))
            try:
                calls = await asyncio.gather(*(b.run(CALL) for b in boxes))
                keys = await asyncio.gather(*(b.run("printf %s $OPENAI_API_KEY") for b in boxes))
                return [b.id for b in boxes], [c.stdout for c in calls], [k.stdout for k in keys]
            finally:
                await close_all(boxes)

        ids, answers, keys = run_sync(burst())
        assert answers == [f"{sid}#0\n" for sid in ids] and len(set(keys)) == 3
        assert all(host_call(svc, key) == 401 for key in keys)  # closed: revoked
    assert metric(server, "rockroll_create_batches_total") == batches + 1
