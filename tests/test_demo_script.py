"""`make demo` as a user runs it (`scripts/demo.sh`), with two-step SFT and RL runs of the real
model, evaluated on 8 held-out problems instead of 64: every
phase runs and is timed, the held-out curve of both stages, the SWE episode and the sandbox demo print; a demo
that fails leaves nothing it started in the background running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("install rockroll (no extras)", "first sandbox answers", "train extras (torch, Transformers, DeepSpeed)",
          "the packaged model (SmolLM2-135M-Instruct)", "SFT on worked solutions (SmolLM2, Math-v0)", "GRPO from the SFT model", "held-out curve", "SWE tasks, built in the background meanwhile",
          "waiting for the SWE tasks", "one rock/SWE-v0 episode", "sandbox demo", "make demo, in all")


def demo(tmp_path: Path, hub: str, args: str, sft_args: str = "--steps 2 --set eval.episodes=8") -> subprocess.CompletedProcess:
    # This venv (its packages are the ones make demo installs: pip finds them satisfied).
    env = {**os.environ, "VENV": sys.prefix, "ROCKROLL_HUB": hub, "DEMO_DIR": str(tmp_path / "demo"),
           "DEMO_ARGS": args, "DEMO_SFT_ARGS": sft_args}
    return subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1100, start_new_session=True)


def running(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout.splitlines()


@pytest.mark.timeout(1200)
def test_make_demo_runs_and_times_every_phase(swe_hub, tmp_path):
    # The hub holding the SWE tasks (build-swe --demo finds its package there), a short run.
    run_dir = tmp_path / "demo"
    proc = demo(tmp_path, swe_hub, "--steps 2 --set eval.episodes=8")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "a sandbox answered" in out
    assert "sft steps 0..2: loss" in out  # the SFT stage, then RL from its model
    assert "steps 0..2: reward" in out and (run_dir / "curve.png").is_file()  # the curve, and its plot
    assert "SFT step 2" in out and "RL version 2" in out  # both stages' held-out evaluations
    assert (run_dir / "heldout.png").is_file()
    assert "already published" in (tmp_path / "demo-swe.log").read_text()  # --demo's package, on the hub
    assert "Submitted. Tests that had to be fixed:" in out  # the SWE episode's transcript
    assert "acquire from warm pool" in out  # the sandbox demo's table
    table = out[out.rindex("phase"):].splitlines()[1:]
    timed = {line[:48].strip(): line[48:].strip() for line in table}
    assert list(timed) == list(PHASES), table
    assert all(v.isdigit() for v in timed.values()), table


@pytest.mark.timeout(600)
def test_a_failed_demo_stops_its_background_build(tmp_path):
    # An empty hub: the SWE build has minutes of work (a Debian base first) when the training
    # run fails on a bad option; the demo fails, and takes its whole build down with it.
    hub = tmp_path / "empty-hub"
    proc = demo(tmp_path, str(hub), "--set no_such_key=1")
    assert proc.returncode != 0
    assert "no_such_key" in proc.stderr + proc.stdout  # the training run's error, not the build's
    assert "building the base env" in (tmp_path / "demo-swe.log").read_text()  # it was under way
    deadline = time.monotonic() + 30
    while (left := running(f"build-swe --demo|{hub}|debootstrap")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []
