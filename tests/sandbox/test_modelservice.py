"""The model endpoint inside no-network sandboxes (issue #13 parts 1-2), driven by the real
``openai`` client.

The client runs *inside* local sandboxes: it is copied from this venv
(``tests/_openai_client.py``) into one sandbox's ``/opt/pylib`` (``PYTHONPATH``), which is snapshotted
once; every test sandbox starts from that snapshot, so each gets its own key and channel
while the upload happens once per module. The sandbox's ``python3`` is the host's
``/usr/bin/python3`` (the host image's read-only ``/usr``).
"""

import asyncio
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from _openai_client import ATTACK, copy_client

from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.modelservice import (ModelService, PolicyMode, ProxyMode, ReplayMode, Sample,
                                           parse_hermes)
from rockroll.sandbox.protocol.tokens import TOKEN_ENV

from _model import ENVIRONS

PYLIB = "/opt/pylib"
VERSION = 7
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


# --------------------------------------------------------------------------- a tiny policy


class BytePolicy:
    """A deterministic policy over bytes (token id = byte value): it answers "echo: " + the
    last user message, or a Hermes tool call when tools are offered and the user asks about
    weather. Log-probs are a fixed function of the position, so tests can check them."""

    @staticmethod
    def render(messages, tools) -> str:
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}\n" for m in messages)
        return (json.dumps(tools) + "\n" if tools else "") + text + "<|assistant|>"

    def prompt_ids(self, call):
        text = self.render(call.messages, call.tools) if call.kind == "chat" else call.prompt
        return list(text.encode())

    def reply(self, prompt: str) -> str:
        if prompt.startswith("[") and "weather" in prompt:
            return 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        last = prompt.rsplit("<|user|>", 1)[-1].split("\n", 1)[0]
        return "echo: " + last

    async def sample(self, prompt_ids, sampling):
        text = self.reply(bytes(prompt_ids).decode())
        out = []
        for k in range(sampling.n):
            ids, reason = list(f"{text}{' #' + str(k) if k else ''}".encode()), "stop"
            for s in sampling.stop:
                at = bytes(ids).find(s.encode())
                if at >= 0:
                    ids = ids[:at]
            if sampling.max_tokens is not None and len(ids) > sampling.max_tokens:
                ids, reason = ids[:sampling.max_tokens], "length"
            out.append(Sample(ids, [-0.01 * (i % 5) for i in range(len(ids))], reason, VERSION))
        return out

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    records = tmp_path_factory.mktemp("records") / "calls.jsonl"
    svc = ModelService(PolicyMode(BytePolicy()), records=records)
    svc.start()
    old = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = svc.token
    yield svc
    svc.stop()
    if old is None:
        os.environ.pop(TOKEN_ENV, None)
    else:
        os.environ[TOKEN_ENV] = old


@pytest.fixture(scope="module")
def spec(service):
    return SandboxSpec(memory_mb=512, pids=128, timeout_s=60, model_endpoint=service.url,
                       env={"PYTHONPATH": PYLIB})


@pytest.fixture(scope="module")
def client_snapshot(spec, tmp_path_factory):
    """A snapshot holding the openai client under /opt/pylib."""
    lib = copy_client(tmp_path_factory.mktemp("pylib"))
    with open_sandbox(spec) as sb:
        sb.upload(str(lib), PYLIB)
        r = sb.run("python3 -c 'import openai; print(openai.__version__)'")
        assert r.stdout.strip() == openai.__version__, r
        yield sb.snapshot()


@pytest.fixture
def agent_sb(spec, client_snapshot):
    with open_sandbox(spec, snapshot=client_snapshot) as sb:
        yield sb


def run_py(sb, code: str, **kw):
    sb.write_file("/tmp/agent.py", code)
    return sb.run("python3 /tmp/agent.py", **kw)


def records_of(service, sandbox_id):
    return [r for r in service.recorder.records if r["sandbox_id"] == sandbox_id]


# --------------------------------------------------------------------------- in the sandbox

CHAT = """
import json, openai
client = openai.OpenAI()   # OPENAI_BASE_URL / OPENAI_API_KEY from the sandbox's environment
r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], logprobs=True)
print(json.dumps({"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
                  "logprobs": [t.logprob for t in r.choices[0].logprobs.content]}))
parts, finish = [], None
for chunk in client.chat.completions.create(model="m", stream=True,
                                            messages=[{"role": "user", "content": "stream me"}]):
    for c in chunk.choices:
        parts.append(c.delta.content or "")
        finish = c.finish_reason or finish
print(json.dumps({"content": "".join(parts), "finish": finish}))
print(json.dumps([m.id for m in client.models.list()]))
"""


def test_openai_client_in_a_no_network_sandbox(agent_sb, service):
    r = run_py(agent_sb, CHAT)
    assert r.exit_code == 0, r.stderr
    plain, streamed, models = (json.loads(line) for line in r.stdout.splitlines())
    assert plain["content"] == "echo: hello" and plain["finish"] == "stop"
    assert plain["logprobs"] == [-0.01 * (i % 5) for i in range(len("echo: hello"))]
    assert streamed == {"content": "echo: stream me", "finish": "stop"}
    assert models == ["rockroll"]
    # every call is recorded against this sandbox, with the policy's exact tokens
    recs = records_of(service, agent_sb.id)
    assert [r["call_index"] for r in recs] == [0, 1]
    first = recs[0]
    assert first["episode"] == agent_sb.id and first["version"] == VERSION
    assert bytes(first["prompt_ids"]).decode() == BytePolicy.render([{"role": "user", "content": "hello"}], None)
    assert bytes(first["completion_ids"]).decode() == "echo: hello"
    assert first["logprobs"] == plain["logprobs"] and first["finish_reason"] == "stop"
    assert first["latency_s"] >= 0 and first["messages"] == [{"role": "user", "content": "hello"}]


TOOL = """
import json, openai
client = openai.OpenAI()
r = client.chat.completions.create(model="m", tools=%s,
                                   messages=[{"role": "user", "content": "what is the weather in Paris?"}])
m = r.choices[0]
print(json.dumps({"finish": m.finish_reason, "content": m.message.content,
                  "calls": [[c.type, c.function.name, json.loads(c.function.arguments)] for c in m.message.tool_calls]}))
calls = {}
for chunk in client.chat.completions.create(model="m", tools=%s, stream=True,
                                            messages=[{"role": "user", "content": "weather?"}]):
    for c in chunk.choices:
        for t in c.delta.tool_calls or []:
            calls.setdefault(t.index, [t.function.name, ""])[1] += t.function.arguments or ""
print(json.dumps(sorted(calls.items())))
""" % (json.dumps(TOOLS), json.dumps(TOOLS))


def test_tool_call_parsed_into_tool_calls(agent_sb, service):
    r = run_py(agent_sb, TOOL)
    assert r.exit_code == 0, r.stderr
    plain, streamed = (json.loads(line) for line in r.stdout.splitlines())
    assert plain == {"finish": "tool_calls", "content": "Let me check.",
                     "calls": [["function", "get_weather", {"city": "Paris"}]]}
    assert [(name, json.loads(args)) for _, (name, args) in streamed] == [("get_weather", {"city": "Paris"})]
    rec = records_of(service, agent_sb.id)[0]
    assert rec["tools"] == TOOLS and rec["choices"][0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "<tool_call>" in rec["choices"][0]["text"]  # the raw output is kept for training


FORGED = """
import openai
try:
    openai.OpenAI(api_key=%r).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    print("ANSWERED")
except openai.AuthenticationError as e:
    print(e.status_code, e.body["code"], e.body["type"])
"""


def test_forged_key_refused_with_401(agent_sb, service):
    r = run_py(agent_sb, FORGED % "rr-forged-key")
    assert r.stdout.split() == ["401", "invalid_api_key", "invalid_request_error"], r
    assert records_of(service, agent_sb.id) == []


def test_keys_are_per_sandbox_and_closed_sandboxes_are_refused(spec, client_snapshot, service):
    with open_sandbox(spec, snapshot=client_snapshot) as a:
        key_a = a.run("printf %s $OPENAI_API_KEY").stdout
        with open_sandbox(spec, snapshot=client_snapshot) as b:
            key_b = b.run("printf %s $OPENAI_API_KEY").stdout
            # each its own key (the snapshot's creator's key is not inherited), each attributed
            assert key_a != key_b and key_a.startswith("rr-")
            assert service.caller(key_a).sandbox_id == a.id and service.caller(key_b).sandbox_id == b.id
            # a's key is nowhere in b: not in its environment, processes or files
            r = b.run(f"grep -rsl -- {key_a} /proc/[0-9]*/environ /tmp /workspace /opt /root /dev/.rr; echo end")
            assert key_a not in r.stdout and r.stdout.strip().endswith("end")
        # b is closed: its key is refused, even from a live sandbox that got hold of it
        r = run_py(a, FORGED % key_b)
        assert r.stdout.split() == ["401", "invalid_api_key", "invalid_request_error"], r
    assert service.caller(key_a) is None


def test_network_stays_closed_for_everything_else(agent_sb, service):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    svc_port = int(service.url.rsplit(":", 1)[1])
    try:
        agent_sb.write_file("/tmp/attack.py", ATTACK)
        r = agent_sb.run(f"python3 /tmp/attack.py 127.0.0.1:{other.getsockname()[1]} 127.0.0.1:{svc_port} "
                         "127.0.0.1:8081")
        assert r.exit_code == 0, r.stderr
        # another host port, the model service's own host port, another sandbox port
        assert r.stdout.split() == ["ECONNREFUSED"] * 3, r.stdout
        r = agent_sb.run("cat /proc/net/dev")
        ifaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]]
        assert ifaces == ["lo"]
    finally:
        other.close()


def test_admin_token_and_host_environment_stay_out(agent_sb, service):
    """Sessions get their key; no process the sandbox can see (its pid 1 included) carries
    the admin token or anything of the host's environment (``PYTEST_CURRENT_TEST`` is in
    every process this test run starts, spare agents included)."""
    environ = agent_sb.run(ENVIRONS).stdout
    assert "OPENAI_API_KEY=rr-" in environ  # the probe reads what it should
    assert service.token not in environ and TOKEN_ENV not in environ and "PYTEST_CURRENT_TEST" not in environ


CONCURRENT = """
import concurrent.futures, json, openai
client = openai.OpenAI()
def ask(i):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"agent {i}"}])
    return r.choices[0].message.content
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    print(json.dumps(list(pool.map(ask, range(32)))))
"""


def test_concurrent_calls_share_the_channel(agent_sb, service):
    r = run_py(agent_sb, CONCURRENT)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == [f"echo: agent {i}" for i in range(32)]
    assert sorted(r["call_index"] for r in records_of(service, agent_sb.id)) == list(range(32))


def test_oversized_body_refused(host_client, service):
    with pytest.raises(openai.APIStatusError) as e:
        host_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * (33 << 20)}])
    assert e.value.status_code == 413 and e.value.body["code"] == "too_large"


MODELS_URLLIB = """
import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
print(json.loads(urllib.request.urlopen(req).read())["data"][0]["id"])
"""


def test_endpoint_and_key_survive_reset(agent_sb, service):
    key = agent_sb.run("printf %s $OPENAI_API_KEY").stdout
    agent_sb.reset()  # a new agent (and relay) over the bare image: no openai, same key
    assert agent_sb.run("printf %s $OPENAI_API_KEY").stdout == key
    r = run_py(agent_sb, MODELS_URLLIB)
    assert r.stdout == "rockroll\n", r
    assert service.caller(key).sandbox_id == agent_sb.id


FLOOD = """
import socket, time
socks = []
for _ in range(300):
    socks.append(socket.create_connection(("127.0.0.1", 8080)))
time.sleep(2)
closed = 0
for s in socks:
    s.setblocking(False)
    try:
        closed += s.recv(1) == b""
    except ConnectionResetError:
        closed += 1
    except BlockingIOError:  # still open: relayed to the service
        pass
print(closed)
"""


def test_connection_flood_is_bounded(agent_sb):
    from rockroll.sandbox.guest.model import MODEL_MAX_CONNS

    r = run_py(agent_sb, FLOOD)
    assert r.exit_code == 0, r.stderr
    assert int(r.stdout) == 300 - MODEL_MAX_CONNS  # the rest were closed at once
    relay = agent_sb.aio._conn.relay
    for _ in range(100):  # the agent closed them all when the script exited: so does the host
        if not relay.conns and not relay.tasks:
            break
        time.sleep(0.1)
    assert not relay.conns and not relay.tasks


# --------------------------------------------------------------------------- the server's API


@pytest.fixture
def host_client(service):
    """An openai client on the host with a key of its own (what a test harness would do)."""
    key = service.admit("host-harness", episode="ep-host")
    yield openai.OpenAI(base_url=service.url + "/v1", api_key=key, max_retries=0)
    service.revoke(key)


class StreamingPolicy(BytePolicy):
    """``BytePolicy`` answering one token at a time (``sample_stream``). After its first
    piece it waits until the caller has received that piece (``seen``): an answer streamed
    only once whole would keep it waiting until ``waited_out``. ``fail_after``: raise
    after that many pieces."""

    def __init__(self, fail_after: int | None = None):
        self.seen, self.waited_out, self.fail_after = threading.Event(), False, fail_after

    async def sample_stream(self, prompt_ids, sampling):
        whole = (await self.sample(prompt_ids, sampling))[0]
        n = len(whole.completion_ids)
        for i, (token, logprob) in enumerate(zip(whole.completion_ids, whole.logprobs)):
            if i == self.fail_after:
                raise RuntimeError("the policy broke")
            yield Sample([token], [logprob], whole.finish_reason if i == n - 1 else None, VERSION)
            if i == 0:
                self.waited_out = not await asyncio.to_thread(self.seen.wait, 60)


def test_each_caller_records_to_its_own_file_and_a_deleted_one_breaks_no_other(tmp_path):
    """One service answers the episodes of several runs (agent envs share the process's):
    each key's records go to its own run's file as well as the service's, and a run folder
    deleted (a finished run cleaned up) breaks no call of another run."""
    shared = tmp_path / "service.jsonl"
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    with ModelService(PolicyMode(BytePolicy()), records=shared) as svc:
        keys = {run: svc.admit(f"sb-{run}", f"ep-{run}", records=tmp_path / run / "calls.jsonl")
                for run in ("run1", "run2")}

        def ask(run: str, text: str) -> str:
            client = openai.OpenAI(base_url=svc.url + "/v1", api_key=keys[run], max_retries=0)
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}],
                                                  max_tokens=4).choices[0].message.content

        ask("run1", "a")
        ask("run2", "b")
        ask("run2", "c")
        episodes = {run: [json.loads(x)["episode"] for x in (tmp_path / run / "calls.jsonl").read_text().splitlines()]
                    for run in ("run1", "run2")}
        assert episodes == {"run1": ["ep-run1"], "run2": ["ep-run2", "ep-run2"]}
        (tmp_path / "run1" / "calls.jsonl").unlink()
        (tmp_path / "run1").rmdir()
        ask("run2", "d")  # run1's folder is gone: run2 is not affected
        assert len((tmp_path / "run2" / "calls.jsonl").read_text().splitlines()) == 3
    assert [json.loads(x)["episode"] for x in shared.read_text().splitlines()] == [
        "ep-run1", "ep-run2", "ep-run2", "ep-run2"]


def test_answers_stream_as_they_are_generated(tmp_path):
    policy = StreamingPolicy()
    with ModelService(PolicyMode(policy)) as svc:
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb-stream"), max_retries=0)
        pieces, last = [], None
        for last in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "abc"}],
                                                   stream=True, logprobs=True,
                                                   stream_options={"include_usage": True}):
            if last.choices and last.choices[0].delta.content:
                pieces.append((last.choices[0].delta.content, last.choices[0].logprobs.content[0].logprob))
                policy.seen.set()  # the first token is here while the policy still generates
        assert not policy.waited_out
        assert pieces == [(ch, -0.01 * (i % 5)) for i, ch in enumerate("echo: abc")]  # one event per token
        assert last.usage.completion_tokens == 9
        rec = svc.recorder.records[-1]  # recorded whole, as a non-streamed call is
        assert rec["completion_ids"] == list(b"echo: abc") and rec["choices"][0]["content"] == "echo: abc"
        assert rec["prompt_ids"] and rec["version"] == VERSION and rec["finish_reason"] == "stop" and not rec["error"]

        r = client.completions.create(model="m", prompt="<|user|>xy\n", stream=True)
        assert [c.choices[0].text for c in r] == [*"echo: xy", ""]  # the last: the finish chunk

        # tools: parsed from the whole text, so streamed whole (still a valid stream)
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "weather?"}],
                                                     tools=TOOLS, stream=True))
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if c.choices]
        assert [tc.function.name for tc in calls] == ["get_weather"]


def test_a_stream_that_breaks_ends_with_an_error_event():
    with ModelService(PolicyMode(StreamingPolicy(fail_after=3))) as svc:
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb-broken"), max_retries=0)
        got = []
        with pytest.raises(openai.APIError, match="the policy broke"):
            for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "abc"}],
                                                        stream=True):
                got.append(chunk.choices[0].delta.content or "")
                svc.mode.policy.seen.set()
        assert "".join(got) == "ech"
        rec = svc.recorder.records[-1]
        assert "the policy broke" in rec["error"] and rec["completion_ids"] == list(b"ech")
    with ModelService(PolicyMode(StreamingPolicy(fail_after=0))) as svc:  # before any token: a plain 500
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb-broken"), max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "abc"}], stream=True)
        assert e.value.body["code"] == "mode_failed"


def test_completions_and_sampling_parameters(host_client, service):
    r = host_client.completions.create(model="m", prompt="<|user|>abc\n", max_tokens=4, logprobs=1)
    assert r.choices[0].text == "echo" and r.choices[0].finish_reason == "length"
    assert r.choices[0].logprobs.tokens == list("echo") and r.choices[0].logprobs.text_offset == [0, 1, 2, 3]
    r = host_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "abc"}], n=2,
                                            stop=[": "], temperature=0.5)
    assert [c.message.content for c in r.choices] == ["echo", "echo"] and r.usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError) as e:
        host_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=7)
    assert e.value.body["param"] == "temperature"
    chunks = list(host_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "s"}], n=2,
                                                      stream=True, stream_options={"include_usage": True}))
    texts = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert texts == {0: "echo: s", 1: "echo: s #1"} and chunks[-1].usage.completion_tokens == 17
    host_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "abc"}], n=2,
                                        stop=[": "], temperature=0.5)
    rec = [r for r in service.recorder.records if r["episode"] == "ep-host"][-1]  # the 400 was not a call
    assert rec["sampling"]["n"] == 2 and list(rec["sampling"]["stop"]) == [": "]
    assert rec["sampling"]["temperature"] == 0.5 and len(rec["choices"]) == 2


class Upstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream that fails twice (429, then 503) before answering."""
    script = []
    seen = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Upstream.seen.append((self.path, self.headers.get("Authorization"), body))
        status = Upstream.script.pop(0) if Upstream.script else 200
        out = {"error": {"message": "busy"}} if status != 200 else {
            "id": "up-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "from upstream: " + body["messages"][-1]["content"]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Upstream.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_proxy_mode_retries_and_records(upstream, tmp_path):
    Upstream.script[:] = [429, 503]
    with ModelService(ProxyMode(upstream, api_key="up-key", backoff_s=0.01), records=tmp_path / "p.jsonl") as svc:
        key = svc.admit("sb-proxy")
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=key, max_retries=0)
        chunks = list(client.chat.completions.create(model="m", stream=True,
                                                     messages=[{"role": "user", "content": "hi"}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "from upstream: hi"
    assert len(Upstream.seen) == 3 and all(s[1] == "Bearer up-key" for s in Upstream.seen)
    assert "stream" not in Upstream.seen[-1][2]  # asked whole, streamed by us
    (rec,) = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rec["mode"] == "ProxyMode" and rec["response"]["id"] == "up-1" and rec["request"]["stream"] is True


def test_proxy_mode_gives_up_with_an_openai_error(upstream):
    Upstream.script[:] = [500, 500, 500]
    with ModelService(ProxyMode(upstream, retries=2, backoff_s=0.01)) as svc:
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb"), max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_error" and len(Upstream.seen) == 3


def test_replay_reproduces_a_recorded_run(agent_sb, service, tmp_path):
    assert run_py(agent_sb, TOOL).exit_code == 0
    recorded = records_of(service, agent_sb.id)
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recorded))
    with ModelService(ReplayMode(path)) as replay:
        client = openai.OpenAI(base_url=replay.url + "/v1", api_key=replay.admit("sb-replay"), max_retries=0)
        r = client.chat.completions.create(model="m", tools=TOOLS,
                                           messages=[{"role": "user", "content": "what is the weather in Paris?"}])
        assert r.choices[0].message.content == "Let me check."
        assert r.choices[0].message.tool_calls[0].model_dump() == recorded[0]["choices"][0]["tool_calls"][0]
        replayed = replay.recorder.records[0]
        assert replayed["completion_ids"] == recorded[0]["completion_ids"] and replayed["version"] == VERSION
        with pytest.raises(openai.NotFoundError) as e:  # the recorded answer was used up
            client.chat.completions.create(model="m", tools=TOOLS,
                                           messages=[{"role": "user", "content": "what is the weather in Paris?"}])
        assert e.value.body["code"] == "replay_miss"


def test_admin_routes_need_the_admin_token(service):
    import httpx

    r = httpx.post(service.url + "/rockroll/keys", json={"sandbox_id": "x"}, headers={"Authorization": "Bearer no"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    key = service.admit("sb-admin")  # a sandbox's own key is no admin token either
    r = httpx.delete(f"{service.url}/rockroll/keys/{key}", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401 and service.caller(key) is not None
    service.revoke(key)


@pytest.mark.parametrize("text, content, calls", [
    ("plain", "plain", []),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', None, [("f", {"a": 1})]),
    ('a<tool_call>{"name": "f", "arguments": {}}</tool_call>b<tool_call>{"name": "g"}</tool_call>', "ab",
     [("f", {}), ("g", {})]),
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
])
def test_hermes_parser(text, content, calls):
    got_content, got = parse_hermes(text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert len({c["id"] for c in got}) == len(got)
