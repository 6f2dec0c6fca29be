"""``scripts/smollm2_guess_study.py``: seeds evaluated on different schedules are pooled only at
the steps every seed evaluated, from their episodes (not by averaging rates), and a step a
resumed run evaluated twice counts once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rockroll.trainer.algorithms.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[2]


def run_dir(root: Path, name: str, rows: list[tuple[int, float, int]]) -> Path:
    d = root / name
    (d / "sft").mkdir(parents=True)
    (d / "sft" / "eval.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/success": k / n, "eval/episodes": float(n)}) + "\n" for s, k, n in rows))
    return d


def test_seeds_pool_at_their_common_steps_from_their_episodes(tmp_path):
    # seed 0 every 10 steps, and step 20 twice (a resume re-evaluates its start: the first row holds)
    a = run_dir(tmp_path, "run0", [(0, 0, 64), (10, 54, 64), (20, 55, 64), (20, 0, 64), (30, 62, 64), (40, 64, 64)])
    b = run_dir(tmp_path, "run1", [(0, 0, 32), (20, 20, 32), (40, 31, 32)])  # every 20, another episode count
    out = tmp_path / "img" / "guess"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "smollm2_guess_study.py"), str(out), str(a), str(b)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [p["step"] for p in doc["pooled"]] == [0, 20, 40]
    at20 = doc["pooled"][1]
    assert at20["episodes"] == 96 and at20["success"] == 75 / 96  # (55 + 20) / 96, not the rates' mean
    assert at20["wilson95"] == list(wilson_interval(75, 96))
    assert at20["success_per_seed"] == [55 / 64, 20 / 32]
    assert [p["step"] for p in doc["per_seed"]["run0"]] == [0, 10, 20, 30, 40]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "| 20 | 0.781 [" in r.stdout


def test_rl_runs_pool_their_format_errors_by_episodes(tmp_path):
    """``scripts/smollm2_math_rl_study.py``: RL runs (``eval.jsonl`` at the run's top) pooled with
    their format errors weighted by episodes, not averaged by seed."""
    def rl_dir(name: str, rows: list[tuple[int, int, int, float]]) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "eval.jsonl").write_text("".join(json.dumps(
            {"step": s, "eval/success": k / n, "eval/episodes": float(n), "eval/format_errors": f}) + "\n"
            for s, k, n, f in rows))
        return d

    a = rl_dir("s0", [(0, 3, 64, 0.5), (10, 5, 64, 0.25), (20, 8, 64, 0.0)])
    b = rl_dir("s1", [(0, 2, 32, 0.5), (10, 3, 32, 0.5), (20, 2, 32, 0.25)])  # another episode count
    out = tmp_path / "img" / "rl"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "smollm2_math_rl_study.py"), str(out), str(a), str(b)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.with_suffix(".json").read_text())
    at20 = doc["pooled"][2]
    assert at20["success"] == 10 / 96 and at20["format_errors"] == 8 / 96  # (0 * 64 + 0.25 * 32) / 96, not 0.125
    assert at20["wilson95"] == list(wilson_interval(10, 96)) and at20["success_per_seed"] == [8 / 64, 2 / 32]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "| 20 | 0.104 [" in r.stdout and r.stdout.rstrip().endswith("| 0.08 |")
