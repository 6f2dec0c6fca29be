"""rockroll sandboxes as the runtime of the real ``verifiers`` (0.4.0, v1): a rollout run by
verifiers' own ``Agent.run`` -> ``Rollout`` (task setup, harness setup and launch, finalize,
rewards reading the box, teardown) in a box it borrows, as ``Agent.run(task, runtime=box)``
places one (verifiers/v1/agent.py ``_rollout_params``, rollout.py ``open``/``close``).

The harness is this file's own (a verifiers ``Harness`` subclass, exported through
``__all__`` the way verifiers' loader finds harnesses by module): it runs the task's prompt as
a shell script in the runtime. Verifiers' built-in harnesses install their program with ``uv``
from the network at setup, which neither this host nor a no-network box has.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import verifiers.v1 as vf
from rockroll.integrations import verifiers as rv
from rockroll.sandbox import SandboxSpec
from rockroll.sandbox.deployment.cgroups import Cgroup, cgroup_mode
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.home import state_home
from verifiers.v1.errors import SandboxError

__all__ = ["ScriptHarness"]  # verifiers' loader takes the one Harness subclass a module exports


class ScriptHarness(vf.Harness[vf.HarnessConfig]):
    """The task's prompt, run by ``sh -c`` in the runtime as the rollout's main program."""

    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        return await runtime.run_program(["sh", "-c", data.prompt], {"VF_ENDPOINT": endpoint})


class ScriptData(vf.TaskData):
    setup_cmd: str = "true"


class ScriptTask(vf.Task[ScriptData]):
    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        result = await runtime.run(["sh", "-c", self.data.setup_cmd], {})
        assert result.exit_code == 0, result.stderr

    @vf.reward(weight=1.0)
    async def saw_setup(self, runtime: vf.Runtime) -> float:
        # written by the harness program from what the setup exec left
        return float((await runtime.read("out/seen.txt")).decode().strip() == "from-setup")


def agent() -> vf.Agent:
    harness = vf.HarnessConfig(id=__name__)
    return vf.Agent(vf.AgentConfig(model="none", harness=harness, runtime=vf.SubprocessConfig()))


def leftovers(sandbox_id: str) -> list[str]:
    """What of one sandbox is still on the host: tests/sandbox/_leaks.py's checks (its run
    registry entry, cgroups, processes charged to them, files under ROCKROLL_HOME), narrowed
    to this sandbox because the run itself lives on for the rest of the test session."""
    left = [f"live {sandbox_id}"] if sandbox_id in current_run().live() else []
    left += [f"path {p}" for p in state_home().rglob(f"*{sandbox_id}*")]
    if cgroup_mode() != "none":
        left += [f"cgroup {n}" for n in Cgroup.leftovers() if n.endswith("." + sandbox_id)]
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f".{sandbox_id}" in (proc / "cgroup").read_text():
                left.append(f"process {proc.name}")
        except OSError:
            continue  # exited meanwhile
    return left


PROBE = (
    "mkdir -p out && cat from-setup.txt > out/seen.txt && hostname > out/hostname"
    " && (cd / && pwd > /workspace/out/cd) && pwd > out/pwd"
    " && { python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)' 2> out/net;"
    " echo $? > out/net_rc; }; echo \"$VF_ENDPOINT\" > out/endpoint"
)


def test_a_verifiers_rollout_runs_inside_a_rockroll_sandbox():
    async def main():
        task = ScriptTask(ScriptData(prompt=PROBE, setup_cmd="echo from-setup > from-setup.txt"))
        async with rv.provision(SandboxSpec()) as box:
            trace = await agent().run(task, runtime=box)
            sandbox_id = box.info.id
            files = {name: (await box.read(f"out/{name}")).decode().strip()
                     for name in ("hostname", "pwd", "cd", "net_rc", "net", "endpoint")}
            assert leftovers(sandbox_id)  # the check sees a live box
        return trace, sandbox_id, files

    trace, sandbox_id, files = asyncio.run(main())
    assert trace.ok, trace.errors
    assert trace.reward == 1.0  # the setup exec's file, seen by the harness exec, read back by the reward
    assert trace.agent.runtime.type == "rockroll" and trace.agent.runtime.id == sandbox_id
    assert trace.agent.runtime.borrowed
    assert files["hostname"] == sandbox_id != socket.gethostname()
    assert files["pwd"] == "/workspace" and files["cd"] == "/"
    assert files["net_rc"] != "0" and "Network is unreachable" in files["net"]
    assert files["endpoint"].startswith("http://127.0.0.1:")  # verifiers' interception, on host loopback
    assert leftovers(sandbox_id) == []


def test_each_run_is_a_fresh_process_and_runs_go_concurrently():
    async def main():
        async with rv.RockrollRuntime(SandboxSpec()) as box:
            await box.run(["cd", "/tmp"], {})  # bare builtins: the session's shell runs them
            await box.run(["export", "X=1"], {})
            box.env = {"TASK_VAR": "t"}
            first = await box.run(["sh", "-c", "echo $TASK_VAR-$LEAK"], {"LEAK": "l"})
            second = await box.run(["sh", "-c", "pwd; echo ${X:-unset} ${LEAK:-unset}; env | grep -c ROCKROLL_ || true"], {})
            # one run waits for a file another makes: deadlocks if runs were serialized
            waiter = box.run(["sh", "-c", "until [ -e flag ]; do sleep 0.05; done; echo seen"], {})
            maker = box.run(["touch", "flag"], {})
            waited, _ = await asyncio.wait_for(asyncio.gather(waiter, maker), 30)
            await box.write("deep/dir/f.bin", b"\x00\xffdata")
            exact = await box.read("deep/dir/f.bin")
            with pytest.raises(SandboxError, match="over the 3 byte limit"):
                await box.read("deep/dir/f.bin", max_bytes=3)
            return first, second, waited, exact

    first, second, waited, exact = asyncio.run(main())
    assert first.stdout.strip() == "t-l"
    assert second.stdout.split() == ["/workspace", "unset", "unset", "0"]  # nothing of the host's env
    assert waited.stdout.strip() == "seen" and exact == b"\x00\xffdata"


def test_failures_are_verifiers_error_types_and_nothing_is_left():
    async def main():
        out = {}
        async with rv.provision(SandboxSpec(timeout_s=1)) as box:
            sandbox_id = box.info.id
            with pytest.raises(SandboxError, match="SandboxFileNotFound"):
                await box.read("missing.txt")
            slow = await box.run(["sleep", "5"], {})
            out["timeout"] = (slow.exit_code, slow.stderr)
            failing = ScriptTask(ScriptData(prompt="echo broken >&2; exit 3"))
            out["harness"] = await agent().run(failing, runtime=box)
        out["after"] = leftovers(sandbox_id)
        with pytest.raises(SandboxError, match="no live sandbox"):
            await box.run(["true"], {})
        assert not await box.alive()

        # the box dies under the rollout (closed by the task's setup): verifiers' SandboxError
        class KilledTask(ScriptTask):
            async def setup(self, trace, runtime):
                await runtime.sandbox.close()

        async with rv.provision(SandboxSpec()) as box:
            out["killed"] = await agent().run(KilledTask(ScriptData(prompt="true")), runtime=box)
            killed_id = box.info.id
        out["killed_after"] = leftovers(killed_id)

        # an error in the caller's code inside the context still closes the box
        with pytest.raises(ZeroDivisionError):
            async with rv.provision(SandboxSpec()) as box:
                raised_id = box.info.id
                1 / 0
        out["raised_after"] = leftovers(raised_id)

        # a start that fails is verifiers' SandboxError, and leaves no sandbox
        before = current_run().live()
        with pytest.raises(SandboxError, match="starting a sandbox"):
            async with rv.provision(SandboxSpec(image="no-such-image-anywhere")):
                pass
        out["failed_start"] = sorted(set(current_run().live()) - set(before))
        return out

    out = asyncio.run(main())
    assert out["timeout"][0] == 137 and "killed at its timeout of 1 s" in out["timeout"][1]
    harness = out["harness"]
    assert not harness.ok and harness.errors[-1].type == "HarnessError"
    assert "exited 3" in harness.errors[-1].message and "broken" in harness.errors[-1].message
    assert out["after"] == []
    killed = out["killed"]
    assert not killed.ok and killed.errors[-1].type == "SandboxError", killed.errors
    assert out["killed_after"] == [] and out["raised_after"] == [] and out["failed_start"] == []


def test_a_cancelled_rollout_stops_its_box():
    async def main():
        box = rv.RockrollRuntime(SandboxSpec())
        task = ScriptTask(ScriptData(prompt="sleep 60"))

        async def rollout():
            async with box:
                await agent().run(task, runtime=box)

        running = asyncio.ensure_future(rollout())
        while box.info.id is None or not (await box.run(["sh", "-c", "pgrep -x sleep || true"], {})).stdout:
            await asyncio.sleep(0.1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return box.info.id

    assert leftovers(asyncio.run(main())) == []
