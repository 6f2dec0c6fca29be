"""mini-swe-agent, the real one (pip ``mini-swe-agent``, unmodified), repairs a ``rock/SWE-v0``
task inside a no-network sandbox; its model calls go through litellm to the sandbox's
``OPENAI_BASE_URL``, i.e. the model service, which proxies them to a scripted upstream
OpenAI-compatible server on 127.0.0.1. The rock/SWE-v0 grader decides the reward.

The upstream answers in mini-swe-agent's text format (a THOUGHT, then one
```` ```mswea_bash_command ```` block per reply): look at the repository, apply the task's
reference fix (the gold patch, read from the hub's hidden task data) or a wrong one, run a
failing test, then mini-swe-agent's submit command. The agent is installed in the
variant env ``swe-toolz-mini-swe-agent`` (``rockroll envs build-swe --agent``), built by
the ``swe_agent_variant`` fixture when the hub lacks it.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _mini_swe_agent import AGENT, gold_fix, reply, toolz_task, wrong_fix

from rockroll.envhub import pull
from rockroll.gem.agents import MINI_SWE_AGENT_VERSION
from rockroll.gem.swe import TASKS_FILE, SWEEnv, hub_swe_tasks, load_swe_tasks
from rockroll.gem.swe import agent_tasks
from rockroll.sandbox import SandboxSpec
from rockroll.sandbox.modelservice import ModelService, ProxyMode
from rockroll.sandbox.protocol.tokens import TOKEN_ENV

# The first test may build the variant (pip inside the build sandbox, then packing it).
pytestmark = pytest.mark.timeout(1800)

TASK_FILE = "/tmp/rockroll-task.md"


def bash(command: str) -> str:
    return json.dumps({"name": "bash", "arguments": {"command": command}})


class ScriptedUpstream:
    """An OpenAI-compatible chat server whose k-th answer in a conversation is ``script[k]``
    (k = the assistant turns already in the request): what a model solving the task says."""

    def __init__(self):
        self.script: list[str] = []
        self.requests: list[dict] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.requests.append(body)
                turn = sum(m.get("role") == "assistant" for m in body["messages"])
                text = upstream.script[min(turn, len(upstream.script) - 1)]
                out = json.dumps({
                    "id": f"chatcmpl-{len(upstream.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def task(swe_hub, swe_agent_variant):
    return toolz_task(swe_hub, swe_agent_variant)


@pytest.fixture(scope="module")
def upstream():
    up = ScriptedUpstream()
    yield up
    up.close()


@pytest.fixture(scope="module")
def service(upstream, tmp_path_factory):
    records = tmp_path_factory.mktemp("records") / "calls.jsonl"
    with ModelService(ProxyMode(upstream.url), records=records) as svc, pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, svc.token)  # lets this host issue each sandbox its key
        yield svc


@pytest.fixture(scope="module")
def env(task, service, swe_hub):
    variant = pull(f"swe-toolz-{AGENT.name}@0.12.1", hub=swe_hub)  # a bare hub: ref now means this hub's
    tasks = [t for t in load_swe_tasks(variant.private_dir / TASKS_FILE) if t.id == task.id]
    assert tasks == agent_tasks([task], AGENT.name)  # its hidden records: the task, in the variant's image
    assert not any(t.image == tasks[0].image for t in hub_swe_tasks(swe_hub))  # rock/SWE-v0: no task twice
    spec = SandboxSpec(model_endpoint=service.url, memory_mb=2048, pids=512, timeout_s=900)
    e = SWEEnv(tasks=tasks, sandbox_spec=spec, step_timeout=600, pool_size=1)
    yield e
    e.close()


def run_agent(env, task, script, upstream) -> tuple[str, dict, str]:
    """One episode: the agent's command in the task's sandbox, then submit. Returns (the
    agent step's observation, the grade's info, the sandbox id), the reward in info."""
    upstream.script[:] = script
    upstream.requests.clear()
    obs, info = env.reset(options={"task_id": task.id})
    assert info["task_id"] == task.id
    sandbox_id = env.sandbox.id
    obs, _, done, _, info = env.step(bash(f"cat > {TASK_FILE} <<'ROCKROLL_TASK'\n{task.problem_statement}\nROCKROLL_TASK"))
    assert info["exit_code"] == 0 and not done, obs
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in AGENT.env.items())
    obs, _, done, _, step_info = env.step(bash(f"env {assignments} {AGENT.command.replace('{task}', TASK_FILE)}"))
    assert not done and not step_info["timed_out"], obs
    assert step_info["exit_code"] == 0, obs
    _, reward, done, _, info = env.step("<submit/>")
    assert done
    return obs, {**info, "reward": reward}, sandbox_id


def records(service) -> list[dict]:
    with open(service.recorder.path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_mini_swe_agent_fixes_a_task_through_the_model_service(env, task, upstream, service):
    script = gold_fix(task)
    obs, info, sandbox_id = run_agent(env, task, script, upstream)
    assert info["reward"] == 1.0 and info["resolved"], (info, obs)

    # mini-swe-agent made the four calls, through litellm's OpenAI provider, with its own
    # prompts; the upstream saw each command's output come back (the fix applied, the test passed).
    assert len(upstream.requests) == 4
    first = upstream.requests[0]
    assert first["model"] == "rockroll"  # "openai/rockroll": litellm strips the provider
    assert "mswea_bash_command" in first["messages"][0]["content"]  # mini_textbased.yaml's system prompt
    assert task.problem_statement in first["messages"][1]["content"]
    last = upstream.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user"] + ["assistant", "user"] * 3
    assert "<returncode>0</returncode>" in last[5]["content"]  # git apply of the fix
    assert "1 passed" in last[7]["content"]

    # the model service recorded every call, attributed to this sandbox's key
    recs = records(service)
    assert len(recs) == 4
    assert {r["sandbox_id"] for r in recs} == {sandbox_id}
    assert [r["call_index"] for r in recs] == [0, 1, 2, 3]
    assert all(r["mode"] == "ProxyMode" and r["error"] is None for r in recs)
    assert recs[1]["choices"][0]["content"] == script[1]
    assert recs[3]["messages"] == last


def test_a_wrong_fix_gets_nothing(env, task, upstream, service):
    before = len(records(service))
    script = wrong_fix(task)
    obs, info, sandbox_id = run_agent(env, task, script, upstream)
    assert info["reward"] == 0.0 and not info["resolved"] and info["f2p_pass_fraction"] < 1.0, (info, obs)
    assert info["patch_chars"] > 0  # the agent's change reached the grader; it just does not fix
    recs = records(service)[before:]
    assert len(recs) == 2 and {r["sandbox_id"] for r in recs} == {sandbox_id}
    assert [r["call_index"] for r in recs] == [0, 1]  # a new sandbox: a new key, counted from 0


def test_the_agent_is_the_pinned_release_and_the_sandbox_has_no_network(env, task, upstream):
    upstream.script[:] = [reply("x", "true")]
    env.reset(options={"task_id": task.id})
    obs, *_ = env.step(bash("/opt/mini-swe-agent/bin/pip show mini-swe-agent litellm | grep -E '^(Name|Version)'; "
                            "/opt/mini-swe-agent/bin/python -c \"import urllib.request as u; "
                            "u.urlopen('https://index.example/simple/', timeout=5)\" 2>&1 | tail -1"))
    assert f"Version: {MINI_SWE_AGENT_VERSION}" in obs and "Version: 1.110.2" in obs, obs
    assert "URLError" in obs, obs  # the build had network; the task's sandbox has none


def test_the_variant_is_makeable_by_its_own_id(swe_hub, task):
    import gymnasium

    from rockroll.registry.hub import register_hub

    assert "rock/swe-toolz-mini-swe-agent-v0" in register_hub(swe_hub)
    env = gymnasium.make("rock/swe-toolz-mini-swe-agent-v0")
    try:
        tasks = env.unwrapped.tasks
        assert len(tasks) == 10 and task.id in {t.id for t in tasks}
        assert {t.image for t in tasks} == {"hub:swe-toolz-mini-swe-agent@0.12.1"}
    finally:
        env.close()


def test_agent_tasks_point_at_the_variant_and_refuse_other_tasks():
    from rockroll.gem.swe import SWETask

    t = SWETask(id="toolz-0.12.1__cmp-3", repo="toolz", problem_statement="p", fail_to_pass=("a",),
                pass_to_pass=("b",), image="hub:swe-toolz@0.12.1", snapshot="hub:swe-toolz@0.12.1#toolz-0.12.1__cmp-3",
                base_commit="c0ffee", patch="diff --git a/x b/x\n")
    [v] = agent_tasks([t], "mini-swe-agent")
    assert v.image == "hub:swe-toolz-mini-swe-agent@0.12.1"
    assert v.snapshot == "hub:swe-toolz-mini-swe-agent@0.12.1#toolz-0.12.1__cmp-3"
    assert (v.id, v.base_commit, v.patch, v.fail_to_pass) == (t.id, t.base_commit, t.patch, t.fail_to_pass)
    assert agent_tasks([v], "mini-swe-agent") == [v]  # already in its variant: left as it is
    with pytest.raises(ValueError, match="not a task of a hub SWE env"):
        agent_tasks([SWETask(id="x", repo="r", problem_statement="p", fail_to_pass=("a",), pass_to_pass=(),
                             image="swebench/sweb.eval.x86_64.x:latest")], "mini-swe-agent")


def test_an_unknown_agent_is_refused_before_any_build(tmp_path):
    from click.testing import CliRunner

    from rockroll.cli import main

    result = CliRunner().invoke(main, ["envs", "build-swe", "--package", "toolz==0.12.1", "--agent", "nope",
                                       "--hub", str(tmp_path / "hub")])
    assert result.exit_code == 2 and "--agent" in result.output and "mini-swe-agent" in result.output
    assert not (tmp_path / "hub").exists()

