"""`examples/swe_demo.py`, the main job of `make demo`, run as a user runs it: one rock/SWE-v0
episode on the default task set, its transcript and its reward printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "swe_demo.py"


@pytest.mark.timeout(900)  # a fresh local cache pulls the SWE envs first
def test_swe_demo_plays_an_episode_and_solves_it(swe_hub):
    # The default hub of this process is the test home's; the demo is pointed at the one
    # holding the default set. Its sandboxes stay under the test home.
    proc = subprocess.run([sys.executable, str(DEMO)], env={**os.environ, "ROCKROLL_HUB": swe_hub},
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    transcript, _, summary = proc.stdout.rpartition("=" * 72)
    # The transcript: the issue, each agent turn and what it got back, and the grade.
    assert "Issue:" in transcript and transcript.count(">>> agent") == 4 and "exit code: 0" in transcript
    assert "Submitted. Tests that had to be fixed:" in transcript
    assert "; reward 1.0; FAIL_TO_PASS passing 1.0, PASS_TO_PASS passing 1.0" in summary, summary
