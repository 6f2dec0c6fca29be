"""Issue #41's journey, as a researcher with an agent of their own takes it (docs/agents.md):
an agent script on the official ``openai`` client written into a folder, packaged with
``agent_package`` (the script and the client copied in with ``files``), built and published
to a file hub, made by id, trained two steps by ``rockroll train`` with the hub named in the
config, and its model calls read back from the run's records with the token ids the trainer
used. Then the failures a run must survive: an agent that never calls the model stops the
run with a clear error instead of retrying forever, and a run killed with SIGTERM or SIGINT
while its sandboxes are live leaves none behind. Each step is a process of its own, with
its own state home, read from the host's side (``rockroll sandbox ls``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from _openai_client import copy_client

BIN = Path(sys.executable).parent

ROOT = Path(__file__).resolve().parents[1]
MOVER = ROOT / "examples" / "agents" / "mover.py"  # docs/agents.md's agent, as a user copies it


def _publish(tmp_path: Path, name: str, command: str) -> str:
    """An agent package of ``command`` with the script and the client, built and published to
    ``tmp_path/hub``; the hub's URL."""
    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish
    from rockroll.envhub.store import HubStore
    from rockroll.gem.agents import AGENT_PYLIB, AgentSpec, agent_package

    folder = tmp_path / f"pkg-{name}"
    copy_client(folder / "pylib")
    (folder / "mover.py").write_text(MOVER.read_text())
    spec = AgentSpec(name=name, command=command, install=(f"python3 -m compileall -q {AGENT_PYLIB} >/dev/null",),
                     env={"PYTHONPATH": AGENT_PYLIB})
    agent_package(spec, folder, files={"pylib": AGENT_PYLIB, "mover.py": "/opt/mover/mover.py"})
    hub = f"file://{tmp_path / 'hub'}"
    publish(build(folder).manifest, HubStore(hub))
    return hub


def _config(tmp_path: Path, hub: str, env_id: str, steps: int) -> Path:
    data = {
        "steps": steps, "seed": 0, "hubs": [hub],
        "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
        "tokenizer": {"build_dir": str(tmp_path / "tok")},
        "envs": [{"id": env_id, "kwargs": {"task_set": "corridor", "call_timeout": 30, "pool_size": 2},
                  "task_ids": ["right-1", "right-3"]}],
        "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 5, "batch_wait_ms": 50},
        "algorithm": {"name": "grpo", "dynamic_sampling": False},
        "generation": {"max_new_tokens": 1, "allowed_tokens": ["Left", "Right"]},
        "logging": {"dir": str(tmp_path / "run"), "progress": False, "tensorboard": False},
    }
    path = tmp_path / f"{env_id.split('/')[1]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _env(home: Path) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "ROCKROLL_HUB"}, "ROCKROLL_HOME": str(home)}


def _sandboxes(home: Path) -> list:
    out = subprocess.run([str(BIN / "rockroll"), "sandbox", "ls", "--json"], env=_env(home), capture_output=True,
                         text=True, check=True).stdout
    return [r for r in json.loads(out) if r["sandboxes"]]


def test_own_agent_packaged_published_trained_and_its_calls_recorded(tmp_path):
    hub = _publish(tmp_path, "mover", "python3 /opt/mover/mover.py {task}")
    home = tmp_path / "home"
    proc = subprocess.run([str(BIN / "rockroll"), "train", str(_config(tmp_path, hub, "rock/agent-mover-v1", 2))],
                          cwd=tmp_path, env=_env(home), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["rollout/samples"] == 2 for r in rows)
    assert all(r["rollout/infra_samples_dropped"] == 0 and r["rollout/agent_crashes"] == 0 for r in rows)
    # every call the agent made, answered with the tokens the trainer generated and trained on
    calls = [json.loads(x) for x in (tmp_path / "run" / "model_calls.jsonl").read_text().splitlines()]
    assert len(calls) >= 4 and {c["mode"] for c in calls} == {"HandoffMode"}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    for c in calls:
        assert c["error"] is None and c["version"] in (0, 1) and len(c["prompt_ids"]) > 10
        assert len(c["completion_ids"]) == len(c["logprobs"]) == 1 and c["logprobs"][0] < 0
        assert tok.decode(c["completion_ids"]) == c["choices"][0]["text"] in ("Left", "Right")
    assert _sandboxes(home) == []


def test_a_silent_agent_stops_the_run_with_what_it_printed(tmp_path):
    """An agent that exits before its first model call: every episode is an infrastructure
    error, and the run stops after the bound with the agent's output in one error line."""
    hub = _publish(tmp_path, "silent", "echo 'no key for you' >&2; exit 0")
    home = tmp_path / "home"
    proc = subprocess.run([str(BIN / "rockroll"), "train", str(_config(tmp_path, hub, "rock/agent-silent-v1", 2))],
                          cwd=tmp_path, env=_env(home), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "rollout failed: " in error and "episodes in a row were dropped for infrastructure errors" in error
    assert "the agent exited (code 0) before its first model call: its stderr: no key for you" in error
    assert proc.stderr.count("episode dropped, infrastructure error") <= 2 * 2 * 1 + 2  # the bound (twice a batch), not forever
    assert _sandboxes(home) == []


@pytest.mark.parametrize("command,sig", [("train", signal.SIGTERM), ("train", signal.SIGINT), ("sft", signal.SIGTERM)])
def test_a_run_killed_with_live_sandboxes_leaves_none(tmp_path, command, sig):
    """Killed while its envs' sandboxes are up, ``rockroll train`` (rollouts) and ``rockroll
    sft`` (the expert's episodes) close them all: ``sft`` used to leave them for ``sandbox gc``."""
    hub = _publish(tmp_path, "mover", "python3 /opt/mover/mover.py {task}")
    home = tmp_path / "home"
    config = _config(tmp_path, hub, "rock/agent-mover-v1", 1000)
    if command == "sft":  # the corridor's expert plays far more episodes than the test waits for
        data = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**data, "sft": {"steps": 1, "sources": [{"kind": "expert", "episodes": 100000}]}}))
    # SIGINT as a terminal's Ctrl-C finds it: handled (a suite started in the background, as by
    # `nohup ... &`, hands its children SIGINT ignored, and Python then keeps it ignored)
    proc = subprocess.Popen([str(BIN / "rockroll"), command, str(config)],
                            cwd=tmp_path, env=_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not _sandboxes(home):
            assert proc.poll() is None and time.monotonic() < deadline, "no sandbox came up"
            time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _sandboxes(home) == []
    runs = home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
