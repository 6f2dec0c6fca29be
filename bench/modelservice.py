"""The model endpoint inside a sandbox: per-call overhead and throughput, against a direct
loopback call to the same server and against a file-polling bridge (ROCK's design).

Three ways for an agent to reach the same model service (an echo generator in its own
process, so the model costs nothing and the transport is what is measured), each timed by
the same stdlib client script (``AGENT``):

- **direct**: the script on the host, HTTP straight to the service's loopback port (the
  floor: no sandbox at all);
- **endpoint**: the script inside a no-network sandbox, HTTP to ``127.0.0.1:8080``, which
  the sandbox's guest relays over its control pipe (``runtime/model_channel.py``);
- **file bridge**: ROCK's ModelService design, minimal and faithful: the agent writes each
  request to a file inside the sandbox and polls for the response file; the host polls the
  sandbox through the sandbox API (``run("ls")``), reads the request, calls the service,
  and writes the response file. Both ends poll every ``--poll-ms`` (ROCK sleeps 1 s between
  reads of its request log and checks from the host every 3 s: far slower than this).

Rows: sequential calls over one keep-alive connection and over a fresh connection per
call (median, p95); and calls/s with ``--agents`` agents at once (one sandbox each; the
direct row is as many host processes), each making ``--calls`` calls after a common start
instant. Target (issue #13): the endpoint adds at most 1.5 ms per call at the median.

    python bench/modelservice.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, sigterm_as_exit, stats, write_json  # noqa: E402

from rockroll.sandbox import SandboxSpec, open_async_sandbox  # noqa: E402
from rockroll.sandbox.modelservice.modes import Answer, Choice  # noqa: E402
from rockroll.sandbox.protocol.tokens import TOKEN_ENV  # noqa: E402
from rockroll.sandbox.runtime.model_channel import SANDBOX_PORT  # noqa: E402

TARGET_ADDED_MS = 1.5
# What bench/results/modelservice.json holds (tests/test_bench_smoke.py checks every run against it):
# a list's rows by their first column, in order (a row's label starts with its name); a
# dict's keys, each measured (not None); "" is the top level.
PROMISED = {
    "latency": ("direct, keep-alive", "endpoint, keep-alive", "direct, new connection per call",
                "endpoint, new connection per call", "file bridge"),
    "throughput": ("direct", "endpoint", "file bridge"),
    "": ("added_ms", "bridge_vs_endpoint"),
}
BRIDGE_DIR = "/tmp/llm-bridge"

# The client every row runs (stdlib only: the same python3 on the host and in the sandbox).
AGENT = r'''
import http.client, json, os, sys, time
a = json.loads(sys.argv[1])
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}).encode()

def check(data):
    assert json.loads(data)["choices"][0]["message"]["content"] == "ping", data[:300]

def http_call(state):
    if state.get("conn") is None:
        state["conn"] = http.client.HTTPConnection(a["host"], a["port"], timeout=120)
    conn = state["conn"]
    conn.request("POST", "/v1/chat/completions", BODY,
                 {"Authorization": "Bearer " + (a["key"] or os.environ["OPENAI_API_KEY"]),
                  "Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, data[:300]
    check(data)
    if not a["keepalive"]:
        conn.close()
        state["conn"] = None

def bridge_call(state):
    i, d = state.setdefault("i", 0), a["dir"]
    state["i"] = i + 1
    with open(f"{d}/.req-{i}", "wb") as f:
        f.write(BODY)
    os.rename(f"{d}/.req-{i}", f"{d}/req-{i}.json")  # the host never sees half a request
    while True:
        try:
            with open(f"{d}/resp-{i}.json", "rb") as f:
                data = f.read()
            check(data)
            return
        except (FileNotFoundError, ValueError):  # not there, or not whole yet
            time.sleep(a["poll_s"])

call, state, lat = bridge_call if a["mode"] == "bridge" else http_call, {}, []
time.sleep(max(0.0, a["start_at"] - time.monotonic()))  # every agent starts at once
start = time.monotonic()
for _ in range(a["n"]):
    t = time.perf_counter()
    call(state)
    lat.append(time.perf_counter() - t)
print(json.dumps({"start": start, "end": time.monotonic(), "lat": lat}))
'''


def note(what: str) -> None:
    print(f"[modelservice] {what}", file=sys.stderr, flush=True)


class Echo:
    """The bench's generator: answers each chat call with its last message, at no cost."""

    async def generate(self, call) -> Answer:
        return Answer([Choice(text=call.messages[-1]["content"] if call.messages else call.prompt or "")])


def serve() -> None:
    """``--serve``: run the echo model service in this process until stdin closes."""
    from rockroll.sandbox.modelservice import ModelService

    with ModelService(Echo()) as svc:
        print(json.dumps({"url": svc.url, "token": svc.token}), flush=True)
        sys.stdin.read()


class EchoService:
    """The echo model service in its own process (so the sandboxes' relay and the service
    do not share one interpreter's lock, as with a trainer's inference server)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        info = json.loads(self.proc.stdout.readline())
        self.url, self.token = info["url"], info["token"]
        self.port = int(self.url.rsplit(":", 1)[1])

    def key(self, name: str) -> str:
        import httpx

        r = httpx.post(self.url + "/rockroll/keys", json={"sandbox_id": name},
                       headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()["key"]

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _python() -> str:
    """The interpreter both sides run: the host's python3, which ``image="host"`` shows."""
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"


async def direct(svc: EchoService, agents: int, n: int, keepalive: bool) -> list[dict]:
    """``agents`` host processes, each ``n`` calls straight to the service."""
    args = {"mode": "http", "host": "127.0.0.1", "port": svc.port, "key": svc.key("direct"), "n": n,
            "keepalive": keepalive, "start_at": time.monotonic() + 1.0 + 0.02 * agents}
    procs = [await asyncio.create_subprocess_exec(_python(), "-I", "-c", AGENT, json.dumps(args),
                                                  stdout=subprocess.PIPE, env={})
             for _ in range(agents)]
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    assert all(p.returncode == 0 for p in procs), "a direct client failed"
    return [json.loads(out) for out, _ in outs]


async def in_sandboxes(boxes: list, svc: EchoService, n: int, *, mode: str, keepalive: bool = True,
                       poll_s: float = 0.01) -> list[dict]:
    """Each sandbox runs the client ``n`` times over its endpoint (``mode="http"``) or the
    file bridge (``mode="bridge"``, served from here by one poller per sandbox)."""
    args = {"mode": mode, "host": "127.0.0.1", "port": SANDBOX_PORT, "key": None, "n": n,
            "keepalive": keepalive, "dir": BRIDGE_DIR, "poll_s": poll_s,
            "start_at": time.monotonic() + 1.0 + 0.03 * len(boxes)}
    cmd = f"{_python()} -I /tmp/agent.py '{json.dumps(args)}'"
    pollers = []
    if mode == "bridge":
        import httpx

        http = httpx.AsyncClient(timeout=120)
        key = svc.key("bridge")
        for sb in boxes:
            await sb.run(f"rm -rf {BRIDGE_DIR}; mkdir -p {BRIDGE_DIR}")
        pollers = [asyncio.ensure_future(bridge_host(sb, http, svc.url, key, n, poll_s)) for sb in boxes]
    try:
        agents = asyncio.gather(*(sb.run(cmd, timeout=600) for sb in boxes))
        # a poller that fails would leave its agent polling forever: fail the run instead
        await asyncio.wait([agents, *pollers], return_when=asyncio.FIRST_EXCEPTION)
        for p in pollers:
            if p.done() and p.exception():
                agents.cancel()
                raise p.exception()
        results = await agents
    finally:
        for p in pollers:
            p.cancel()
        if pollers:
            await http.aclose()
    for r in results:
        assert r.exit_code == 0, r
    return [json.loads(r.stdout) for r in results]


async def bridge_host(sb, http, url: str, key: str, n: int, poll_s: float) -> None:
    """The host end of the file bridge for one sandbox: poll for request files through the
    sandbox API, answer each with the service, write the response file."""
    seen: set[str] = set()
    while len(seen) < n:
        # its own session: the agent's command holds the default one (ROCK also polls
        # from a separate session)
        listing = (await sb.run(f"ls {BRIDGE_DIR}", session="bridge")).stdout.split()
        new = [name for name in listing if name.startswith("req-") and name not in seen]
        if not new:
            await asyncio.sleep(poll_s)
            continue
        for name in new:
            seen.add(name)
            body = await sb.read_file(f"{BRIDGE_DIR}/{name}")
            resp = await http.post(url + "/v1/chat/completions", content=body,
                                   headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            await sb.write_file(f"{BRIDGE_DIR}/resp-{name[4:]}", resp.content)


def latency_row(name: str, runs: list[dict], base: dict | None) -> dict:
    s = stats([x for r in runs for x in r["lat"]])
    row = {"path": name, "median": s["median"], "p95": s["p95"], "n": s["n"]}
    if base is not None:
        row["added"] = s["median"] - base["median"]
        row["ratio"] = s["median"] / base["median"]
    return row


def throughput_row(name: str, runs: list[dict], base: dict | None) -> dict:
    calls = sum(len(r["lat"]) for r in runs)
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    row = {"path": name, "agents": len(runs), "calls": calls, "wall_s": wall, "calls_per_s": calls / wall,
           "median": stats([x for r in runs for x in r["lat"]])["median"]}
    if base is not None:
        row["ratio"] = row["calls_per_s"] / base["calls_per_s"]
    return row


async def run(args) -> dict:
    svc = EchoService()
    os.environ[TOKEN_ENV] = svc.token  # this process opens the sandboxes: it issues their keys
    spec = SandboxSpec(memory_mb=256, pids=64, timeout_s=600, model_endpoint=svc.url)
    boxes = []
    try:
        note(f"opening {args.agents} sandboxes")
        boxes = list(await asyncio.gather(*(open_async_sandbox(spec) for _ in range(args.agents))))
        await asyncio.gather(*(sb.write_file("/tmp/agent.py", AGENT) for sb in boxes))
        one = boxes[:1]
        await in_sandboxes(one, svc, 5, mode="http")  # warm both paths up (imports, first connection)
        await direct(svc, 1, 5, True)

        latency = []
        for keepalive, label in ((True, "keep-alive"), (False, "new connection per call")):
            note(f"sequential, {label}")
            base = latency_row(f"direct, {label}", await direct(svc, 1, args.seq, keepalive), None)
            ours = latency_row(f"endpoint, {label}", await in_sandboxes(one, svc, args.seq, mode="http",
                                                                        keepalive=keepalive), base)
            latency += [base, ours]
        note("sequential, file bridge")
        latency.append(latency_row(f"file bridge, poll {args.poll_ms} ms",
                                   await in_sandboxes(one, svc, args.bridge_seq, mode="bridge",
                                                      poll_s=args.poll_ms / 1e3), latency[0]))

        note(f"{args.agents} agents at once")
        base = throughput_row("direct", await direct(svc, args.agents, args.calls, True), None)
        throughput = [base,
                      throughput_row("endpoint", await in_sandboxes(boxes, svc, args.calls, mode="http"), base),
                      throughput_row(f"file bridge, poll {args.poll_ms} ms",
                                     await in_sandboxes(boxes, svc, args.bridge_calls, mode="bridge",
                                                        poll_s=args.poll_ms / 1e3), base)]
    finally:
        await asyncio.gather(*(sb.close() for sb in boxes), return_exceptions=True)
        svc.stop()
    return {"latency": latency, "throughput": throughput}


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few calls, 8 agents (a smoke run)")
    ap.add_argument("--agents", type=int, help="concurrent agents (default 64; --quick 8)")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="the file bridge's poll interval at both ends")
    args = ap.parse_args()
    args.agents = args.agents or (8 if args.quick else 64)
    args.seq, args.bridge_seq = (50, 10) if args.quick else (500, 50)
    args.calls, args.bridge_calls = (5, 2) if args.quick else (20, 5)
    sigterm_as_exit()
    result = asyncio.run(run(args))
    latency, throughput = result["latency"], result["throughput"]
    print_table("Per call, sequential, one agent (ms; added and ratio against direct with the same connection use)",
                latency, ["path", "median", "p95", "n", "added", "ratio"])
    print_table(f"{args.agents} agents at once (one sandbox each; direct: host processes)", throughput,
                ["path", "agents", "calls", "wall_s", "calls_per_s", "median", "ratio"])
    added = latency[1]["added"]
    met = added <= TARGET_ADDED_MS
    bridge = latency[-1]["median"] / latency[1]["median"]
    print(f"\nendpoint adds {added:.2f} ms per call at the median (keep-alive), target <= {TARGET_ADDED_MS} ms: "
          f"{'met' if met else 'NOT met'}; the file bridge takes {bridge:.1f}x the endpoint's time per call")
    path = write_json("modelservice", {"params": {"agents": args.agents, "seq": args.seq, "bridge_seq": args.bridge_seq,
                                                  "calls": args.calls, "bridge_calls": args.bridge_calls,
                                                  "poll_ms": args.poll_ms, "quick": args.quick},
                                       **result, "added_ms": added, "target_added_ms": TARGET_ADDED_MS, "met": met,
                                       "bridge_vs_endpoint": bridge})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
