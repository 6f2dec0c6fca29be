"""Issue #36's journey, as a newcomer takes it with the README and docs only: an env package of
their own (``examples/envs/sort3``, the recipe of docs/env-contract.md) written into a folder,
built and published to a file hub with the CLI, made by id in a fresh process and checked
with gymnasium's ``check_env``, trained two steps by ``rockroll train`` with the hub named
only in the config, made through gem-llm's ``gem.make("rock:...")``, and one command run in
its ``hub:`` image through ``rockroll serve``. Each step is a separate process, as a user's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "ROCKROLL_HUB"}  # no hub but those named
    proc = subprocess.run(args, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _python(code: str, cwd: Path, **env: str) -> str:
    # from the run folder, never the checkout: a root on sys.path would shadow gem-llm's `gem`
    return _run([sys.executable, "-c", code], cwd, **env).stdout


def test_own_env_from_package_to_training_and_service(tmp_path):
    pkg, hub = tmp_path / "sort3", tmp_path / "my-hub"
    shutil.copytree(ROOT / "examples" / "envs" / "sort3", pkg)
    _run([str(BIN / "rockroll"), "hub", "build", str(pkg)], tmp_path)
    out = _run([str(BIN / "rockroll"), "hub", "publish", str(pkg), "--hub", "./my-hub"], tmp_path).stdout
    assert "sort3@1.0.0 published" in out and (hub / "envs" / "sort3" / "1.0.0.json").is_file()

    # made by id in a fresh process, from the hub ROCKROLL_HUB names; gymnasium's own checker
    played = _python(
        "import gymnasium, rockroll\n"
        "from gymnasium.utils.env_checker import check_env\n"
        "env = gymnasium.make('rock/sort3-v1')\n"
        "check_env(env.unwrapped, skip_render_check=True)\n"
        "obs, info = env.reset(options={'task_id': 7})\n"
        "nums = sorted(int(x) for x in obs.split('.')[0].split()[1:])\n"
        "print(env.step('<answer>9 9 9</answer>')[:3])\n"
        "print(env.step('<answer>%s</answer>' % ' '.join(map(str, nums)))[:3])\n", tmp_path, ROCKROLL_HUB=str(hub))
    assert played.splitlines()[-2:] == ["('wrong: try once more, smallest first', 0.0, False)", "('correct', 1.0, True)"]

    # rockroll train with the hub named only in the config (no ROCKROLL_HUB anywhere)
    config = yaml.safe_load((ROOT / "examples" / "sort3_cpu.yaml").read_text())
    assert config["hubs"] == ["./my-hub"] and config["envs"][0]["id"] == "rock/sort3-v1"
    config.update(steps=2, rollout={**config["rollout"], "group_size": 2, "batch_groups": 2},
                  eval={"every": 2, "episodes": 2}, logging={"dir": "run", "progress": False, "tensorboard": False})
    (tmp_path / "sort3.yaml").write_text(yaml.safe_dump(config))
    out = _run([str(BIN / "rockroll"), "train", "sort3.yaml"], tmp_path)
    assert "steps 0..2" in out.stdout, out.stdout + out.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["rollout/samples"] > 0 for r in rows)

    # gem-llm, unmodified: rockroll's ids are rock: ids of its registry
    made = _python("import rockroll, gem\nenv = gem.make('rock:sort3-v1')\nobs, info = env.reset()\n"
                   "print(type(env).__name__, obs.startswith('Sort '))\n", tmp_path, ROCKROLL_HUB=str(hub))
    assert made.split()[-2:] == ["RockEnv", "True"]

    # one command in the package's hub: image, through rockroll serve (which resolves hub:
    # images from its own ROCKROLL_HUB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ROCKROLL_HUB": str(hub), "ROCKROLL_TOKEN": "journey-token"}
    serve = subprocess.Popen([str(BIN / "rockroll"), "serve", "--port", str(port)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer journey-token"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/healthz", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert serve.poll() is None and time.monotonic() < deadline, "rockroll serve did not start"
                time.sleep(0.2)
        with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
            r = http.post("/v1/sandboxes", json={"image": "hub:sort3@1.0.0", "memory_mb": 128})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            r = http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": "ls /rockenv/python"})
            assert r.status_code == 200, r.text
            assert r.json()["stdout"].split() == ["sort3_env.py"]
            assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
