"""rock/Agent-v0 (issue #13 part 3): a real agent program (openai-tool-agent, on the
official ``openai`` client; mini-swe-agent from PyPI on a SWE task) runs in a no-network
sandbox; the test is its model, supplying each completion through ``step``; the task's
checker gives the reward.

The agent's image: the openai client is copied from this venv (``tests/_openai_client.py``)
into ``AGENT_PYLIB`` and the agent's script is written by its own first install step,
in one sandbox that is snapshotted; every episode's sandbox starts from that snapshot
(``snapshot=``). ``test_agent_image_built_as_a_hub_env`` builds the real image instead:
both install steps run at build time, the second being ``pip install`` from PyPI with network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import time
import warnings

import gymnasium
import openai
import pytest
from _mini_swe_agent import gold_fix, toolz_task, wrong_fix
from _openai_client import ATTACK, snapshot_with_agent

from rockroll.gem import TerminalTask
from rockroll.gem.agent_env import AGENT_SESSION, AgentEnv, render_chatml, shared_model_service
from rockroll.gem.agents import AGENT_PYLIB, AGENTS, AgentSpec
from rockroll.gem.tools import close_pools
from rockroll.registry.builtin import register_builtin
from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.modelservice import HandoffMode, ModelService
from rockroll.sandbox.sync import run_sync

TOOL_AGENT = AGENTS["openai-tool-agent"]
SPEC = SandboxSpec(memory_mb=512, pids=128, timeout_s=60)


def write_task(i: int) -> TerminalTask:
    return TerminalTask(id=f"write-{i}", category="test", instruction=f"Write the number {i} into n.txt.",
                        setup="rm -f n.txt", check=f'[ "$(cat n.txt)" = {i} ]', solution=f"echo {i} > n.txt")


TASKS = [write_task(7)]


def bash_call(command: str) -> str:
    """A completion that calls the agent's bash tool (Hermes format, which the service parses)."""
    return 'Let me do that.<tool_call>{"name": "bash", "arguments": %s}</tool_call>' % json.dumps(
        {"command": command})


@pytest.fixture(scope="module")
def service():
    register_builtin()
    before = live()
    yield shared_model_service()  # lives as long as the process
    run_sync(close_pools())
    assert live() <= before  # no sandbox of this module's episodes (failed ones included) is left


@pytest.fixture(scope="module")
def agent_snapshot(service, tmp_path_factory):
    """A snapshot with the agent installed: its client copied, its script step run."""
    digest = snapshot_with_agent(SPEC, TOOL_AGENT, tmp_path_factory.mktemp("pylib"))
    with open_sandbox(SPEC, snapshot=digest) as sb:
        r = sb.run("python3 -c 'import openai; print(openai.__version__)'", env=TOOL_AGENT.env)
        assert r.stdout.strip() == openai.__version__, r
    return digest


def make_env(agent_snapshot, agent=TOOL_AGENT, tasks=TASKS, **kwargs):
    kwargs.setdefault("sandbox_spec", SPEC)
    return gymnasium.make("rock/Agent-v0", agent=agent, task_set="terminal", task_kwargs={"tasks": tasks},
                          snapshot=agent_snapshot, **kwargs)


def records_of(service, episode):
    return [r for r in service.recorder.records if r["episode"] == episode]


def live() -> set[str]:
    return set(current_run().live())


# --------------------------------------------------------------------------- episodes


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_scripted_episode_is_graded_by_the_checker(agent_snapshot, service, stream):
    agent = dataclasses.replace(TOOL_AGENT, env={**TOOL_AGENT.env, "AGENT_STREAM": "1" if stream else "0"})
    env = make_env(agent_snapshot, agent=agent)
    try:
        obs, info = env.reset(seed=0)
        assert "infra_error" not in info, info
        episode = info["episode"]
        # the agent's own first request: its system prompt, the task's instruction, its bash tool
        assert [m["role"] for m in info["messages"]] == ["system", "user"]
        assert info["messages"][1]["content"] == "Write the number 7 into n.txt."
        assert [t["function"]["name"] for t in info["tools"]] == ["bash"]
        assert obs == render_chatml(info["messages"], info["tools"]) and obs.endswith("<|im_start|>assistant\n")
        assert info["call_index"] == 0 and info["task_id"] == "write-7" and info["sampling"]["n"] == 1

        obs, reward, term, trunc, info = env.step(bash_call("echo 7 > n.txt && pwd"))
        assert (reward, term, trunc) == (0.0, False, False)
        # the client got the tool call as OpenAI tool_calls, ran it, and sent back its output
        assistant, tool = info["messages"][-2:]
        assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["bash"]
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"command": "echo 7 > n.txt && pwd"}
        assert tool["role"] == "tool" and tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
        assert tool["content"].startswith("exit code: 0\nstdout:\n/workspace\n")
        assert "<tool_response>\nexit code: 0" in obs and info["call_index"] == 1

        obs, reward, term, trunc, info = env.step("Done: n.txt holds 7.")
        assert (reward, term, trunc) == (1.0, True, False), obs
        assert info["agent_status"] == "exited" and info["success"] is True
        assert info["agent_stdout"] == "Done: n.txt holds 7."
        recs = records_of(service, episode)
        assert [r["call_index"] for r in recs] == [0, 1] and all(r["mode"] == "HandoffMode" for r in recs)
        assert all(bool(r["request"].get("stream")) == stream for r in recs)
        assert recs[0]["choices"][0]["text"] == bash_call("echo 7 > n.txt && pwd")  # the raw completion
    finally:
        env.close()


def test_each_env_records_its_calls_in_its_own_runs_file(agent_snapshot, service, tmp_path):
    """Envs of two runs share the process's model service: each env's calls go to the file
    its run named (record_calls), and deleting the first run's folder breaks no call of the
    second (the service used to record to whichever run named a file last). A run's file is
    final once its env is closed: the call its agent was waiting on, refused by the close, is
    recorded in the service's file only (it used to land in the run's file at any time after
    close, even in a folder the user had just removed)."""
    envs = {run: make_env(agent_snapshot) for run in ("run1", "run2")}
    try:
        episodes = {}
        for run, env in envs.items():
            env.unwrapped.record_calls(tmp_path / run / "model_calls.jsonl")
        for run, env in envs.items():  # a call is recorded once answered: by the step
            obs, info = env.reset(seed=0)
            assert "infra_error" not in info, info
            episodes[run] = info["episode"]
            obs, reward, term, trunc, info = env.step(bash_call("pwd"))
            assert not term and "exit code: 0" in obs, obs

        def recorded(run):
            return [json.loads(x)["episode"] for x in (tmp_path / run / "model_calls.jsonl").read_text().splitlines()]

        assert recorded("run1") == [episodes["run1"]] and recorded("run2") == [episodes["run2"]]
        envs["run1"].close()
        deadline = time.monotonic() + 30  # the refused call is recorded by the service's thread
        while not [r for r in records_of(service, episodes["run1"]) if r["error"]] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r["error"] is not None for r in records_of(service, episodes["run1"])] == [False, True]
        assert recorded("run1") == [episodes["run1"]]
        (tmp_path / "run1" / "model_calls.jsonl").unlink()
        (tmp_path / "run1").rmdir()
        obs, reward, term, trunc, info = envs["run2"].step(bash_call("echo 7 > n.txt"))
        assert not term and "exit code: 0" in obs, obs
        assert recorded("run2") == [episodes["run2"]] * 2
    finally:
        for env in envs.values():
            env.close()


def test_wrong_work_gets_zero(agent_snapshot):
    env = make_env(agent_snapshot)
    try:
        env.reset()
        env.step(bash_call("echo 8 > n.txt"))
        obs, reward, term, trunc, info = env.step("Done.")
        assert (reward, term) == (0.0, True) and info["agent_status"] == "exited" and info["success"] is False
        assert "infra_error" not in info
    finally:
        env.close()


KEY_AGENT = dataclasses.replace(TOOL_AGENT, name="key-writer",
                                command="printenv OPENAI_API_KEY > /tmp/episode-key && " + TOOL_AGENT.command)

CALL_WITH = """
import openai, sys
try:
    openai.OpenAI(api_key=open(sys.argv[1]).read().strip() if sys.argv[1].startswith("/") else sys.argv[1],
                  max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    print("ANSWERED")
except openai.AuthenticationError as e:
    print(e.status_code, e.body["code"])
"""


def sandbox_python(env, code: str, *args: str) -> str:
    sb = env.unwrapped.sandbox
    run_sync(sb.write_file("/tmp/call.py", code))
    r = run_sync(sb.run("python3 /tmp/call.py " + " ".join(args), env=TOOL_AGENT.env, timeout=60))
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


def test_forged_key_and_calls_after_the_episode_are_refused(agent_snapshot, service):
    env = make_env(agent_snapshot, agent=KEY_AGENT)
    try:
        _, info = env.reset()
        episode = info["episode"]
        # a forged key, from inside the episode's sandbox: refused, nothing handed to the env
        assert sandbox_python(env, CALL_WITH, "rr-forged-key") == "401 invalid_api_key"
        env.step(bash_call("echo 7 > n.txt"))
        *_, term, _, info = env.step("Done.")
        assert term and info["agent_status"] == "exited"
        # the episode is over: its own key is refused too, and the call was not recorded
        assert sandbox_python(env, CALL_WITH, "/tmp/episode-key") == "401 invalid_api_key"
        assert [r["call_index"] for r in records_of(service, episode)] == [0, 1]
    finally:
        env.close()


def test_handoff_refuses_calls_of_episodes_that_are_not_running():
    mode = HandoffMode()
    with ModelService(mode) as svc:
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.admit("sb", "ep-1"), max_retries=0,
                               timeout=20)  # a lost call fails the test instead of hanging it
        def ask():
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.AuthenticationError) as e:  # never opened: refused at once, not left waiting
            ask()
        assert e.value.body["code"] == "episode_ended"

        async def call_then_close():
            mode.open("ep-1")
            asking = asyncio.ensure_future(asyncio.to_thread(ask))
            pending = await mode.next_call("ep-1")
            assert pending.call.messages == [{"role": "user", "content": "x"}] and pending.waiting
            mode.close("ep-1")  # the waiting call is refused, and the waiter learns the episode is over
            assert await mode.next_call("ep-1") is None and not pending.answer("late")
            return await asyncio.gather(asking, return_exceptions=True)

        (err,) = asyncio.run(call_then_close())
        assert isinstance(err, openai.AuthenticationError) and err.body["code"] == "episode_ended"

        async def cancelled_wait_loses_no_call():
            mode.open("ep-1")
            waiting = asyncio.ensure_future(mode.next_call("ep-1"))
            await asyncio.sleep(0.05)
            waiting.cancel()  # e.g. the env's call_timeout
            await asyncio.gather(waiting, return_exceptions=True)
            asking = asyncio.ensure_future(asyncio.to_thread(ask))
            pending = await asyncio.wait_for(mode.next_call("ep-1"), 10)  # queued for the next wait
            assert pending.answer("the answer")
            return (await asking).choices[0].message.content

        assert asyncio.run(cancelled_wait_loses_no_call()) == "the answer"
        with pytest.raises(openai.BadRequestError) as e:  # one completion per call: the env gives one
            client.chat.completions.create(model="m", n=2, messages=[{"role": "user", "content": "x"}])
        assert e.value.body["param"] == "n"
        mode.close("ep-1")


CRASHER = AgentSpec(name="crasher", env=TOOL_AGENT.env, command=(
    "python3 -c 'import openai; openai.OpenAI(max_retries=0).chat.completions.create(model=\"m\", "
    "messages=[{\"role\": \"user\", \"content\": open(\"'{task}'\").read()}]); raise RuntimeError(\"agent bug\")'"))
HANGER = AgentSpec(name="hanger", env=TOOL_AGENT.env, command=(
    "python3 -c 'import openai, time; openai.OpenAI(max_retries=0).chat.completions.create(model=\"m\", "
    "messages=[{\"role\": \"user\", \"content\": \"hi\"}]); time.sleep(3600)'"))
SILENT = AgentSpec(name="silent", command="sleep 3600")


def test_crashing_agent_ends_with_zero_not_an_infra_error(agent_snapshot):
    env = make_env(agent_snapshot, agent=CRASHER)
    try:
        _, info = env.reset()
        assert info["messages"][0]["content"] == "Write the number 7 into n.txt."  # {task}: the instruction file
        obs, reward, term, trunc, info = env.step("whatever")
        assert (reward, term) == (0.0, True) and info["agent_status"] == "crashed"
        assert info["agent_exit_code"] == 1 and "RuntimeError: agent bug" in info["agent_stderr"]
        assert "infra_error" not in info and "crashed" in obs
    finally:
        env.close()


def test_hung_agent_times_out_typed_and_is_stopped(agent_snapshot):
    env = make_env(agent_snapshot, agent=HANGER, call_timeout=3)
    try:
        env.reset()
        obs, reward, term, trunc, info = env.step("hello")
        assert (reward, term) == (0.0, True) and info["agent_status"] == "timeout" and "infra_error" not in info
        sb = env.unwrapped.sandbox
        assert AGENT_SESSION not in run_sync(sb.sessions())  # its session (and the sleeping agent) closed
        assert "time.sleep" not in run_sync(sb.run("ps -eo args")).stdout
    finally:
        env.close()


def test_agent_that_never_calls_is_an_infra_error_of_reset(agent_snapshot):
    env = make_env(agent_snapshot, agent=SILENT, call_timeout=2)
    try:
        obs, info = env.reset()
        assert "no model call" in info["infra_error"] and "Environment error" in obs
    finally:
        env.close()


def test_sandbox_killed_mid_episode_is_an_infra_error(agent_snapshot):
    env = make_env(agent_snapshot)
    try:
        env.reset()
        sb_id = env.unwrapped.sandbox.id
        pids = json.loads((current_run().dir / sb_id / "guest.json").read_text())
        os.kill(pids["init_pid"], signal.SIGKILL)  # pid 1 of the sandbox: everything in it dies
        obs, reward, term, trunc, info = env.step(bash_call("echo 7 > n.txt"))
        assert info["infra_error"] and term and reward == 0.0
        _, info = env.reset()  # the next episode starts in a fresh sandbox
        assert "infra_error" not in info and env.unwrapped.sandbox.id != sb_id
    finally:
        env.close()


def host_addresses() -> list[str]:
    """This host's own non-loopback IPv4 addresses (traffic to them never leaves the host)."""
    out = []
    for line in open("/proc/net/fib_trie").read().split("/32 host LOCAL")[:-1]:
        addr = line.rsplit("|--", 1)[-1].strip()
        if not addr.startswith("127.") and addr not in out:
            out.append(addr)
    return out


def test_network_stays_closed_during_an_episode(agent_snapshot, service):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    svc_port = service.url.rsplit(":", 1)[1]
    env = make_env(agent_snapshot)
    try:
        env.reset()  # the agent is waiting on its relayed call
        targets = [f"127.0.0.1:{svc_port}", f"127.0.0.1:{other.getsockname()[1]}", "127.0.0.1:8081"]
        targets += [f"{a}:{svc_port}" for a in host_addresses()]
        got = sandbox_python(env, ATTACK, *targets).split()
        assert got[:3] == ["ECONNREFUSED"] * 3, got  # host loopback is not the sandbox's loopback
        assert got[3:] == ["ENETUNREACH"] * len(host_addresses()), got  # no route anywhere
        env.step(bash_call("echo 7 > n.txt"))  # while the relay still carries the agent's calls
        assert env.step("Done.")[1] == 1.0
    finally:
        env.close()
        other.close()


def test_turn_limit_stops_the_agent_and_grades_its_work(agent_snapshot):
    env = make_env(agent_snapshot, max_turns=1)
    try:
        env.reset()
        obs, reward, term, trunc, info = env.step(bash_call("echo 7 > n.txt"))
        assert (reward, term, trunc) == (1.0, False, True) and info["agent_status"] == "turn_limit"
    finally:
        env.close()


@pytest.mark.timeout(900)  # 64 Python agents on a shared machine: minutes, bounded
def test_64_concurrent_agents_each_answered_in_its_own_episode(agent_snapshot, service):
    n = 64
    tasks = [write_task(i) for i in range(n)]
    envs = gymnasium.make_vec("rock/Agent-v0", num_envs=n, vectorization_mode="vector_entry_point",
                              agent=TOOL_AGENT, task_set="terminal", task_kwargs={"tasks": tasks},
                              sandbox_spec=dataclasses.replace(SPEC, memory_mb=256), snapshot=agent_snapshot,
                              autoreset=False)
    try:
        obs, infos = envs.reset(options=[{"task_id": t.id} for t in tasks])  # all together, on one loop
        assert "infra_error" not in infos, infos.get("infra_error")
        episodes = list(infos["episode"])
        assert len(set(episodes)) == n
        # each env's first request carries its own task
        assert all(infos["messages"][i][1]["content"] == f"Write the number {i} into n.txt." for i in range(n))
        obs, rewards, terms, truncs, infos = envs.step(tuple(bash_call(f"echo {i} > n.txt") for i in range(n)))
        assert not terms.any() and list(infos["call_index"]) == [1] * n
        obs, rewards, terms, truncs, infos = envs.step(tuple("Done." for _ in range(n)))
        assert terms.all() and list(rewards) == [1.0] * n and list(infos["agent_status"]) == ["exited"] * n
        for i, episode in enumerate(episodes):  # every call answered, attributed to its own episode
            recs = records_of(service, episode)
            assert [r["call_index"] for r in recs] == [0, 1] and all(r["error"] is None for r in recs)
            assert recs[0]["messages"][1]["content"] == f"Write the number {i} into n.txt."
            assert {r["sandbox_id"] for r in recs} == {envs.envs[i].sandbox.id}
    finally:
        held = [e.sandbox for e in envs.envs if e.sandbox is not None]
        envs.close()
    assert all(e.sandbox is None for e in envs.envs) and not set(held) & set(envs.envs[0]._lease.pool._busy)


def test_every_sandbox_goes_back_after_close_and_errors(agent_snapshot):
    env = make_env(agent_snapshot)
    env.reset()
    sb = env.unwrapped.sandbox
    episode = env.unwrapped.episode
    env.close()
    env.close()  # idempotent
    assert env.unwrapped.sandbox is None and not env.unwrapped.service.mode.is_open(episode)
    pool = env.unwrapped._lease.pool
    assert sb not in pool._busy
    with pytest.raises(ValueError, match="network"):
        make_env(agent_snapshot, sandbox_spec=SandboxSpec(network=True))
    with pytest.raises(ValueError, match="agent must be one of"):
        make_env(agent_snapshot, agent="no-such-agent")


def test_gymnasium_check_env(agent_snapshot):
    from gymnasium.utils.env_checker import check_env

    env = make_env(agent_snapshot)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=True)  # random words answer the agent: it just exits
        assert [str(w.message) for w in caught] == []
    finally:
        env.close()


# A stdlib-only agent, carried whole by its command (SWE images hold no openai client): it
# asks once, applies the answer as a patch, and exits.
PATCHER = AgentSpec(name="patcher", command=(
    "python3 -c 'import json, os, subprocess, sys, urllib.request\n"
    "body = {\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": open(sys.argv[1]).read()}]}\n"
    "req = urllib.request.Request(os.environ[\"OPENAI_BASE_URL\"] + \"/chat/completions\", json.dumps(body).encode(),\n"
    "    {\"Authorization\": \"Bearer \" + os.environ[\"OPENAI_API_KEY\"], \"Content-Type\": \"application/json\"})\n"
    "patch = json.load(urllib.request.urlopen(req))[\"choices\"][0][\"message\"][\"content\"]\n"
    "subprocess.run([\"git\", \"apply\"], input=patch.encode(), check=True)' {task}"))


def test_swe_task_set_is_graded_by_the_swe_grader(service, swe_hub):
    from rockroll.gem.swe import hub_swe_tasks

    task = hub_swe_tasks(swe_hub)[0]
    env = gymnasium.make("rock/Agent-v0", agent=PATCHER, task_set="swe",
                         task_kwargs={"hub": swe_hub, "task_ids": [task.id]})
    try:
        obs, info = env.reset()
        assert "infra_error" not in info, info
        assert task.problem_statement in info["messages"][0]["content"] and info["task_id"] == task.id
        obs, reward, term, trunc, info = env.step(task.patch)  # the reference fix, as the model's answer
        assert (reward, term) == (1.0, True) and info["agent_status"] == "exited", obs
        assert info["resolved"] and info["f2p_pass_fraction"] == 1.0  # the SWE grader's own verdict
        obs, info = env.reset()
        obs, reward, term, trunc, info = env.step("not a patch")
        assert (reward, term) == (0.0, True) and info["agent_status"] == "crashed"  # git apply failed
    finally:
        env.close()


def test_agent_image_built_as_a_hub_env(service, tmp_path):
    """The agent put into an image at build time (``agent_package``), published, made like
    any hub env: episodes start from warm sandboxes of that image. Its setup is the agent's
    own install steps, the second ``pip install``-ing the pinned client from PyPI in the
    build's sandbox, which has network and the host's resolver (issue #13); the image's
    sandboxes have neither, and import the client installed there."""
    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish
    from rockroll.envhub.pull import pull
    from rockroll.envhub.store import HubStore
    from rockroll.gem.agents import OPENAI_CLIENT, agent_package
    from rockroll.registry.hub import make_hub_env
    from rockroll.sandbox.deployment.rootfs import NO_NETWORK_ETC

    folder = agent_package("openai-tool-agent", tmp_path / "pkg")
    hub = f"file://{tmp_path / 'hub'}"
    publish(build(folder).manifest, HubStore(hub))
    pull("agent-openai-tool-agent@1.0.0", hub=hub)
    with open_sandbox(dataclasses.replace(SPEC, image="hub:agent-openai-tool-agent@1.0.0")) as sb:
        assert not sb.spec.network
        r = sb.run("python3 -c 'import openai, pydantic_core; print(openai.__version__, openai.__file__)'",
                   env=TOOL_AGENT.env)
        assert r.exit_code == 0 and r.stdout.split() == [OPENAI_CLIENT.split("==")[1],
                                                          f"{AGENT_PYLIB}/openai/__init__.py"], r
        for name, text in NO_NETWORK_ETC.items():  # the build's resolver is not in the image
            assert sb.read_file(f"/etc/{name}").decode() == text
    env = make_hub_env(hub_url=hub, hub_env="agent-openai-tool-agent", hub_version="1.0.0", task_set="terminal",
                       task_kwargs={"tasks": TASKS}, sandbox_spec=SPEC)
    try:
        assert env.agent == TOOL_AGENT  # named by the package's kwargs
        _, info = env.reset()
        assert "infra_error" not in info, info
        assert env.sandbox.spec.image == "hub:agent-openai-tool-agent@1.0.0"
        env.step(bash_call("echo 7 > n.txt"))
        assert env.step("Done.")[1] == 1.0
    finally:
        env.close()


def test_a_custom_agent_published_is_the_agent_made_by_id(service, tmp_path):
    """Issue #41: ``agent_package`` of a spec of one's own writes that spec (it wrote
    ``openai-tool-agent``, which the image does not hold); ``gymnasium.make`` of the published
    id runs it."""
    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish
    from rockroll.envhub.store import HubStore
    from rockroll.gem.agents import agent_package
    from rockroll.registry.hub import register_hub

    mine = AgentSpec(name="echoer", command="bash /opt/echoer.sh {task}",
                     install=("mkdir -p /opt && printf 'cat \"$1\"\\n' > /opt/echoer.sh",),
                     env={"ECHOER": "on \"quotes\" and é"})
    hub = f"file://{tmp_path / 'hub'}"
    publish(build(agent_package(mine, tmp_path / "pkg")).manifest, HubStore(hub))
    assert "rock/agent-echoer-v1" in register_hub(hub)
    env = gymnasium.make("rock/agent-echoer-v1", task_set="terminal", task_kwargs={"tasks": TASKS},
                         sandbox_spec=SPEC)
    try:
        assert env.unwrapped.agent == mine
        with open_sandbox(dataclasses.replace(SPEC, image="hub:agent-echoer@1.0.0")) as sb:
            assert sb.run("cat /opt/echoer.sh").stdout == 'cat "$1"\n'  # its install step ran
    finally:
        env.close()


def test_build_agent_cli_builds_the_chat_agent_image_that_plays_the_corridor(service, tmp_path):
    """``rockroll envs build-agent``: the agent's install steps run at build time (the client
    pip-installed from PyPI, byte-compiled by pip), published as hub:agent-<name>@1.0.0; an
    episode of the corridor task set runs from that image. An unknown agent is a usage error
    naming the choices, and publishes nothing."""
    import subprocess
    import sys

    from rockroll.envhub.pull import pull

    hub = f"file://{tmp_path / 'hub'}"
    cli = [sys.executable, "-m", "rockroll.cli", "envs", "build-agent", "--hub", hub]
    bad = subprocess.run([*cli, "no-such-agent"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "openai-chat-agent" in bad.stderr, bad.stderr
    assert not (tmp_path / "hub").exists()
    r = subprocess.run([*cli, "openai-chat-agent"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "image hub:agent-openai-chat-agent@1.0.0" in r.stdout, r.stderr[-3000:]
    pull("agent-openai-chat-agent@1.0.0", hub=hub)
    env = AgentEnv(agent="openai-chat-agent", task_set="corridor", image="hub:agent-openai-chat-agent@1.0.0",
                   sandbox_spec=SPEC, call_timeout=60)
    try:
        obs, info = env.reset(options={"task_id": "left-1"})
        assert "infra_error" not in info, info
        assert info["messages"] == [{"role": "user", "content": "Walk to the goal.\n_P___ Left or Right? The goal "
                                                                "is the left end."}]
        _, reward, terminated, _, info = env.step("Left")
        assert (reward, terminated, info["agent_status"]) == (1.0, True, "exited")
    finally:
        env.close()


# --------------------------------------------------------------------------- mini-swe-agent on SWE tasks
# The real mini-swe-agent (pip, unmodified) on a real swe-toolz task, made by name: the swe task
# set runs it in the task env's variant with the agent installed (build-swe --agent).


@pytest.fixture(scope="module")
def toolz(swe_hub, swe_agent_variant):
    return toolz_task(swe_hub, swe_agent_variant)


def episode_of(env, script: list[str]) -> tuple[list[str], float, dict, list[dict]]:
    """Reset, answer each call with the script's next reply: (the observations, the reward,
    the last info, the episode's call records). Every reply but the last leaves it running."""
    obs, info = env.reset()
    assert "infra_error" not in info, info
    observations, episode = [obs], info["episode"]
    for k, text in enumerate(script):
        obs, reward, term, trunc, info = env.step(text)
        observations.append(obs)
        assert term == (k == len(script) - 1) and not trunc, (k, obs)
    return observations, reward, info, records_of(env.unwrapped.service, episode)


@pytest.mark.timeout(1800)  # the first run on a hub builds the variant (minutes)
def test_mini_swe_agent_solves_a_swe_task_by_name(service, swe_hub, toolz):
    before = live()
    env = gymnasium.make("rock/Agent-v0", agent="mini-swe-agent", task_set="swe",
                         task_kwargs={"hub": swe_hub, "task_ids": [toolz.id]},
                         sandbox_spec=SandboxSpec(memory_mb=2048, pids=512, timeout_s=900))
    sandboxes = set()
    try:
        assert [t.image for t in env.unwrapped.tasks] == ["hub:swe-toolz-mini-swe-agent@0.12.1"]
        script = gold_fix(toolz)
        observations, reward, info, recs = episode_of(env, script)
        assert reward == 1.0 and info["agent_status"] == "exited", observations[-1]
        assert info["resolved"] and info["f2p_pass_fraction"] == 1.0  # the rock/SWE-v0 grader's verdict
        # what the policy saw: mini-swe-agent's own prompt, then each command's output
        assert [r["call_index"] for r in recs] == [0, 1, 2, 3] and all(r["error"] is None for r in recs)
        system, user = recs[0]["messages"]
        assert system["role"] == "system" and "mswea_bash_command" in system["content"]  # mini_textbased.yaml
        assert toolz.problem_statement in user["content"]  # the task's instruction, via {task}
        assert recs[0]["model"] == "rockroll"  # its env reached it: MSWEA_MODEL_NAME=openai/rockroll
        assert observations[0] == render_chatml(recs[0]["messages"], None)
        assert "<returncode>0</returncode>" in observations[2]  # git apply of the fix
        assert "1 passed" in observations[3]  # the failing test, run by the agent
        assert [r["choices"][0]["text"] for r in recs] == script  # the env's answers, as given
        sandboxes |= {r["sandbox_id"] for r in recs}

        observations, reward, info, recs = episode_of(env, wrong_fix(toolz))
        assert reward == 0.0 and info["agent_status"] == "exited" and not info["resolved"], observations[-1]
        assert info["patch_chars"] > 0 and info["f2p_pass_fraction"] < 1.0  # graded: it just does not fix
        sandboxes |= {r["sandbox_id"] for r in recs}

        env.reset()  # the agent waits on its first call: try its sandbox's network
        sandboxes.add(env.unwrapped.sandbox.id)
        episode = env.unwrapped.episode
        port = service.url.rsplit(":", 1)[1]
        got = sandbox_python(env, ATTACK, f"127.0.0.1:{port}", *(f"{a}:{port}" for a in host_addresses())).split()
        assert got == ["ECONNREFUSED"] + ["ENETUNREACH"] * len(host_addresses()), got
    finally:
        env.close()
    assert env.unwrapped.sandbox is None and not env.unwrapped.service.mode.is_open(episode)
    run_sync(close_pools())
    assert not sandboxes & live() and live() <= before  # the graders' sandboxes went too


def test_swe_tasks_go_where_the_agent_is_installed(service, swe_hub, toolz):
    from rockroll.gem.swe import hub_swe_tasks

    env = gymnasium.make("rock/Agent-v0", agent="mini-swe-agent", task_set="swe", task_kwargs={"hub": swe_hub})
    try:  # every hub task whose env has the agent's variant, in it
        tasks = env.unwrapped.tasks
        assert {t.id for t in hub_swe_tasks(swe_hub) if t.repo == "toolz"} <= {t.id for t in tasks}
        assert all("-mini-swe-agent@" in t.image for t in tasks)
    finally:
        env.close()
    never_built = AgentSpec(name="never-built", command="true", install=("true",))
    with pytest.raises(ValueError, match="build-swe --package toolz==0.12.1 --agent never-built"):
        gymnasium.make("rock/Agent-v0", agent=never_built, task_set="swe",
                       task_kwargs={"hub": swe_hub, "task_ids": [toolz.id]})
    env = gymnasium.make("rock/Agent-v0", agent="mini-swe-agent", task_set="swe",
                         task_kwargs={"hub": swe_hub, "task_ids": [toolz.id], "agent": None})
    try:  # told to leave them where they are
        assert [t.image for t in env.unwrapped.tasks] == [toolz.image] == ["hub:swe-toolz@0.12.1"]
    finally:
        env.close()


def test_an_agent_is_named_given_or_written_as_a_mapping():
    """``agent=``: an ``AGENTS`` name, an ``AgentSpec``, or a mapping of its fields (a YAML
    training config); anything else is a ``ValueError`` that says what is accepted."""
    from rockroll.gem.agents import agent_spec

    assert agent_spec("openai-chat-agent") is AGENTS["openai-chat-agent"]
    mine = {"name": "mine", "command": "python3 /opt/mine.py {task}", "install": ["pip install mine"],
            "env": {"A": "1"}}
    assert agent_spec(mine) == AgentSpec("mine", "python3 /opt/mine.py {task}", ("pip install mine",), {"A": "1"})
    with pytest.raises(ValueError, match="openai-chat-agent"):
        agent_spec("no-such-agent")
    with pytest.raises(ValueError, match="needs name and command"):
        agent_spec({"name": "mine"})
    with pytest.raises(ValueError, match="needs name and command"):
        agent_spec({"name": "mine", "command": "x", "typo": 1})
