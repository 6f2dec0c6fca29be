"""``rockroll serve`` over real HTTP on 127.0.0.1: auth, errors, streaming, metrics,
the idle reaper, shutdown and crash recovery, a fuzzer, a load test, the dashboard."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from schemathesis.generation import GenerationMode
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from rockroll.sandbox.lifecycle import proc_start_time

from _leaks import leftovers
from _server import Server

TOKEN = "test-token-123"


@pytest.fixture(scope="module")
def server():
    srv = Server("--max-sandboxes", "64")
    yield srv
    srv.stop()


def _alive(pid: int, start: int | None) -> bool:
    """Alive and still the same process (a recycled pid is not ours); zombies count as dead."""
    if proc_start_time(pid) != start:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- auth and errors
def test_auth_is_required_except_health_and_dashboard_page(server):
    anon = httpx.Client(base_url=server.url, timeout=10)
    assert anon.get("/healthz").json()["ok"] is True
    assert anon.get("/").status_code == 200 and "rockroll" in anon.get("/").text
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        for method, path in (("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/metrics"),
                             ("DELETE", "/v1/sandboxes/sb-0000000000")):
            r = anon.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.json()["error"] == "AuthError" and r.headers["www-authenticate"] == "Bearer"
    assert server.http.get("/v1/sandboxes").status_code == 200


def test_unknown_sandbox_is_a_typed_404(server):
    for method, path in (("GET", ""), ("POST", "/run"), ("GET", "/files?path=x"), ("DELETE", "")):
        r = server.http.request(method, f"/v1/sandboxes/sb-nope{path}", json={"cmd": "true"})
        assert r.status_code == 404, r.text
        assert r.json() == {"error": "SandboxNotFound", "message": "no such sandbox", "sandbox_id": "sb-nope"}


def test_a_missing_file_is_a_typed_404_naming_it(server):
    sid = server.create()
    try:
        r = server.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace/nope.txt"})
        assert r.status_code == 404, r.text
        assert r.json() == {"error": "SandboxFileNotFound", "message": "no such file: /workspace/nope.txt",
                            "sandbox_id": sid}
        assert server.http.get(f"/v1/sandboxes/{sid}/ping").json() == {"ok": True}  # the sandbox is fine
    finally:
        server.http.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize("body, field", [
    ({"memory_mb": 1}, "memory_mb"),            # SandboxSpec's own check
    ({"image": "no-such-image"}, "image"),      # the backend's check
    ({"disk_mb": 10}, "disk_mb"),               # below the smallest disk
    ({"cpus": "lots"}, "cpus"),                 # a type error (FastAPI's validation)
    ({"bogus": 1}, "bogus"),                    # an unknown field
    ({"env": {"1X": "y"}}, "env"),
    ({"snapshot": "/etc/passwd"}, "snapshot"),  # a digest, never a path on the server
])
def test_bad_spec_is_422_naming_the_field(server, body, field):
    r = server.http.post("/v1/sandboxes", json=body)
    assert r.status_code == 422, r.text
    data = r.json()
    assert data["error"] == "SpecError" and data["field"] == field
    assert data["detail"][0]["loc"] == ["body", field] and data["detail"][0]["msg"]


def test_bad_run_arguments_are_422_and_closed_sandbox_is_409(server):
    sid = server.create()
    r = server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "true", "env": {"not valid": "x"}})
    assert r.status_code == 422 and r.json()["field"] == "env"
    assert server.http.post(f"/v1/sandboxes/{sid}/run", json={}).status_code == 422
    assert server.http.delete(f"/v1/sandboxes/{sid}").status_code == 204
    assert server.http.delete(f"/v1/sandboxes/{sid}").status_code == 204  # idempotent, as locally
    r = server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "true"})
    assert r.status_code == 409 and r.json()["error"] == "SandboxClosed" and r.json()["sandbox_id"] == sid


def test_over_capacity_is_429_with_retry_after():
    srv = Server("--max-sandboxes", "2")
    try:
        ids = [srv.create(), srv.create()]
        r = srv.http.post("/v1/sandboxes", json={"memory_mb": 64})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"] == "CapacityError"
        r = srv.http.post(f"/v1/sandboxes/{ids[0]}/fork", json={"n": 1})
        assert r.status_code == 429
        srv.http.delete(f"/v1/sandboxes/{ids[0]}")
        srv.create()  # room again
    finally:
        srv.stop()


# --------------------------------------------------------------------------- streaming and metrics
def _sse_events(resp: httpx.Response) -> list[tuple[str, str]]:
    events, event, data = [], None, []
    for line in resp.iter_lines():
        if not line:
            if event:
                events.append((event, "\n".join(data)))
            event, data = None, []
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    return events


def test_sse_streams_stdout_stderr_then_result(server):
    sid = server.create()
    cmd = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done; exit 3"
    with server.http.stream("POST", f"/v1/sandboxes/{sid}/run/stream", json={"cmd": cmd}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(resp)
    kinds = [e for e, _ in events]
    assert kinds[-1] == "result" and kinds.count("stdout") >= 3 and kinds.count("stderr") >= 3
    assert "".join(json.loads(d) for e, d in events if e == "stdout") == "out1\nout2\nout3\n"
    result = json.loads(events[-1][1])
    assert result["exit_code"] == 3 and result["stderr"] == "err1\nerr2\nerr3\n"
    # an unknown sandbox is a status, not an event
    assert server.http.post("/v1/sandboxes/sb-nope/run/stream", json={"cmd": "true"}).status_code == 404


ALIVE = "for f in /tmp/fg.pid /tmp/bg.pid; do kill -0 $(cat $f) 2>/dev/null && echo alive; done; echo checked"


def test_sse_client_disconnect_kills_the_command(server):
    sid = server.create()
    # a foreground loop that streams forever, and a background child in its process group
    cmd = ("sleep 1000 & echo $! > /tmp/bg.pid; "
           "bash -c 'echo $$ > /tmp/fg.pid; while :; do echo tick; sleep 0.05; done'")
    client = httpx.Client(base_url=server.url, headers=server.http.headers, timeout=60)
    with client.stream("POST", f"/v1/sandboxes/{sid}/run/stream", json={"cmd": cmd, "timeout": 600}) as resp:
        ticks = 0
        for line in resp.iter_lines():
            ticks += line == 'data: "tick\\n"'
            if ticks >= 3:
                break
    client.close()  # mid-stream: the server sees the connection go
    look = {"cmd": ALIVE, "session": "probe"}  # another session: the streamed one may still be busy
    assert server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "cat /tmp/fg.pid /tmp/bg.pid",
                                                             "session": "probe"}).json()["exit_code"] == 0
    _wait(lambda: server.http.post(f"/v1/sandboxes/{sid}/run", json=look).json()["stdout"] == "checked\n",
          what="the command and its background child to be killed")
    # the session it ran in is free again, and keeps its state
    r = server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "echo still here; pwd", "timeout": 30})
    assert r.json()["stdout"] == "still here\n/workspace\n" and r.json()["exit_code"] == 0
    server.http.delete(f"/v1/sandboxes/{sid}")


def _parse_metrics(text: str) -> tuple[dict[str, str], dict[str, float]]:
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)', line)
            assert m, f"bad sample line {line!r}"
            samples[m.group(1)] = float(m.group(2))
    return types, samples


def test_metrics_exposition(server):
    sid = server.create()
    _, before = _parse_metrics(server.http.get("/metrics").text)
    for _ in range(3):
        server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "echo x"})
    server.http.get("/v1/sandboxes/sb-nope")
    r = server.http.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    types, after = _parse_metrics(r.text)
    assert types["rockroll_sandboxes"] == "gauge"
    assert types["rockroll_command_duration_seconds"] == "histogram"
    assert types["rockroll_failures_total"] == "counter"
    assert after['rockroll_sandboxes{state="alive"}'] >= 1
    assert after["rockroll_command_duration_seconds_count"] == before["rockroll_command_duration_seconds_count"] + 3
    assert after['rockroll_command_duration_seconds_bucket{le="+Inf"}'] == after["rockroll_command_duration_seconds_count"]
    assert after['rockroll_failures_total{kind="SandboxNotFound"}'] >= 1
    buckets = [v for k, v in after.items() if k.startswith("rockroll_command_duration_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative


# --------------------------------------------------------------------------- reliability
def test_idle_ttl_reaper_closes_idle_sandboxes(server):
    sid = server.create(ttl_s=0.5)
    keep = server.create()  # the server default (an hour) applies
    agent = server.guests(sid)
    _wait(lambda: server.http.get(f"/v1/sandboxes/{sid}").status_code == 409, what="the reaper")
    r = server.http.get(f"/v1/sandboxes/{sid}")
    assert r.json()["error"] == "SandboxClosed" and "idle" in r.json()["message"]
    _wait(lambda: not _alive(agent["init_pid"], agent["init_start"]), what="the agent to exit")
    _wait(lambda: not (server.run_dir / sid).exists(), what="its directory to go")
    assert server.http.get(f"/v1/sandboxes/{keep}").json()["state"] == "alive"


def test_graceful_shutdown_closes_every_sandbox():
    srv = Server()
    ids = [srv.create() for _ in range(3)]
    agents = [srv.guests(i) for i in ids]
    srv.http.post(f"/v1/sandboxes/{ids[0]}/run", json={"cmd": "sleep 1000 &"})
    assert srv.stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once done
    assert not any(_alive(a["init_pid"], a["init_start"]) or _alive(a["outer_pid"], a["outer_start"])
                   for a in agents)
    assert leftovers(srv.run_id, srv.run_dir) == []


def test_kill_9_then_restart_reaps_the_old_run():
    srv = Server()
    ids = [srv.create() for _ in range(3)]
    agents = [srv.guests(i) for i in ids]
    for sid in ids:
        srv.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "sleep 1000 &"})
    srv.stop(signal.SIGKILL)
    assert srv.run_dir.exists()  # nobody cleaned up ...
    again = Server()  # ... until the next server starts
    try:
        assert leftovers(srv.run_id, srv.run_dir) == []
        _wait(lambda: not any(_alive(a["init_pid"], a["init_start"]) for a in agents), what="old agents to die")
    finally:
        again.stop()


# --------------------------------------------------------------------------- fuzzing
@pytest.fixture(scope="module")
def fuzz_server():
    # Small capacity and a short idle TTL: the fuzzer creates sandboxes with random specs.
    srv = Server("--max-sandboxes", "6", "--idle-ttl", "5")
    yield srv
    srv.stop()


def _live_sandbox(srv: Server) -> str | None:
    """A sane sandbox to aim half the cases at (random ids only find 404s; the fuzzer's own
    sandboxes may have 8 pids and 16 MB, where the agent legitimately dies)."""
    if getattr(srv, "fuzz_target", None):
        r = srv.http.get(f"/v1/sandboxes/{srv.fuzz_target}")
        if r.status_code == 200 and r.json()["state"] == "alive":
            return srv.fuzz_target
    r = srv.http.post("/v1/sandboxes", json={"memory_mb": 128})
    srv.fuzz_target = r.json()["id"] if r.status_code == 201 else None
    return srv.fuzz_target


_turn = itertools.count()


def _fuzz(case, srv: Server) -> None:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                                   status_code_conformance)

    if isinstance(case.body, dict) and isinstance(case.body.get("timeout"), (int, float)):
        case.body["timeout"] = min(case.body["timeout"], 5)  # a fuzzed command must stay short
    if "sandbox_id" in (case.path_parameters or {}) and next(_turn) % 2:
        case.path_parameters["sandbox_id"] = _live_sandbox(srv) or case.path_parameters["sandbox_id"]
    case.call_and_validate(headers={"Authorization": f"Bearer {srv.token}"}, timeout=60,
                           checks=[not_a_server_error, response_schema_conformance, status_code_conformance,
                                   content_type_conformance])


@pytest.mark.timeout(600)
def test_openapi_fuzz_no_server_errors_and_schema_conformance(fuzz_server):
    """Bounded schemathesis run over every operation of /openapi.json: no 5xx, and every
    response as the document says (status, content type, body schema). Driven through
    hypothesis directly: schemathesis' lazy pytest loader does not support this pytest."""
    api = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    failures = {}
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 20
    for op, mode in itertools.product(operations, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)):
        @given(case=op.as_strategy(mode))
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True, phases=[Phase.explicit, Phase.generate])
        def check(case):
            _fuzz(case, fuzz_server)

        try:
            check()
        except Unsatisfiable:
            pass  # no negative input exists for an operation without parameters (GET /healthz)
        except Exception as e:  # noqa: BLE001 - collect every operation's failure, report all
            failures[f"{op.label} ({mode.value})"] = str(e)[:3000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


# --------------------------------------------------------------------------- load
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_load_200_sandboxes_20000_commands_no_errors_no_leaks():
    from rockroll.sandbox import SandboxSpec
    from rockroll.sandbox.runtime.remote import RemoteSandbox

    n_boxes, per_box = 200, 100
    srv = Server("--max-sandboxes", str(n_boxes))

    async def create(gate: asyncio.Semaphore) -> RemoteSandbox:
        async with gate:  # creation is the expensive part: a bounded number at once
            return await RemoteSandbox.create(SandboxSpec(backend="remote", memory_mb=64, pids=64),
                                              url=srv.url, token=srv.token)

    async def work(i: int, sb: RemoteSandbox) -> int:
        ok = 0
        for k in range(per_box):
            r = await sb.run(f"echo {i}-{k}")
            ok += r.exit_code == 0 and r.stdout == f"{i}-{k}\n" and r.stderr == ""
        return ok

    async def main() -> list[int]:
        gate = asyncio.Semaphore(16)
        boxes = await asyncio.wait_for(asyncio.gather(*(create(gate) for _ in range(n_boxes))), 900)
        try:
            # all 200 are alive at once before a single command runs
            alive = await asyncio.to_thread(lambda: srv.http.get("/v1/sandboxes").json())
            assert len(alive) == n_boxes
            return await asyncio.wait_for(asyncio.gather(*(work(i, sb) for i, sb in enumerate(boxes))), 900)
        finally:
            await asyncio.gather(*(sb.close() for sb in boxes), return_exceptions=True)

    try:
        started = time.monotonic()
        results = asyncio.run(main())
        took = time.monotonic() - started
        assert sum(results) == n_boxes * per_box
        assert srv.http.get("/v1/sandboxes").json() == []
        _, m = _parse_metrics(srv.http.get("/metrics").text)
        assert m["rockroll_command_duration_seconds_count"] == n_boxes * per_box
        assert not any(k.startswith("rockroll_failures_total") and v for k, v in m.items())
        _wait(lambda: [p for p in srv.run_dir.iterdir() if p.is_dir()] == [], what="sandbox dirs to go")
        print(f"\n{n_boxes} sandboxes x {per_box} commands: {took:.1f}s, "
              f"{n_boxes * per_box / took:.0f} commands/s through the service")
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)
    assert leftovers(srv.run_id, srv.run_dir) == []


# --------------------------------------------------------------------------- dashboard
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("chromium is not installed (apt-get install chromium)")


def _headless(url: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="rockroll-chromium-") as profile:
        return subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=4000", *args, url],
            capture_output=True, text=True, timeout=120)


def _status_text(dom: str) -> str:
    m = re.search(r'<span id="status"[^>]*>([^<]*)<', dom)
    return m.group(1) if m else ""


def test_dashboard_shows_live_sandboxes_in_headless_chromium(server):
    ids = [server.create() for _ in range(3)]
    for i, sid in enumerate(ids):
        server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "echo hello; python3 -c 'x = bytearray(16 << 20)'"})
        server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": f"ls /workspace; exit {i}"})
    url = f"{server.url}/#token={server.token}"
    dom = _headless(url, "--dump-dom").stdout
    for sid in ids:
        assert f'data-id="{sid}"' in dom, dom[-2000:]
    assert _status_text(dom).startswith("live")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    _headless(url, "--window-size=1400,900", "--hide-scrollbars", f"--screenshot={shot}")
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without the token the page says so instead of showing data
    assert _status_text(_headless(server.url + "/", "--dump-dom").stdout).startswith("unauthorized")
    for sid in ids:
        server.http.delete(f"/v1/sandboxes/{sid}")
