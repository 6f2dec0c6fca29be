"""``scripts/sft_rl_compare.py --merge``: runs made in parallel (one process per arm or seed) join
into one comparison only when they ran the same comparison, and their pooled points are
recomputed from every seed's episodes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sft_rl_compare.py"
META = {"task": "t", "config": "c.yaml", "overrides": {"model.num_layers": 4}}
KNOBS = {"sft-only": {"sft_steps": 40, "sft_eval_every": 20}, "rl-scratch": {"rl_steps": 4},
         "sft-rl": {"sft_steps": 20, "rl_steps": 2}}


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("sft_rl_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(arm: str, seed: int, successes: list[float], episodes: int = 100, meta: dict = META) -> dict:
    points = [{"step": 20 * i, "phase": "sft", "seconds": 10.0 * i + seed, "success": s, "episodes": episodes}
              for i, s in enumerate(successes)]
    return {"meta": meta, "arms": {arm: {"knobs": KNOBS[arm], "per_seed": {str(seed): {"seconds": 30, "points": points}}}}}


def test_merge_pools_the_seeds_of_parallel_runs(compare):
    docs = [run("sft-only", 2, [0.0, 0.5, 0.9]), run("sft-only", 0, [0.0, 0.3, 0.7], episodes=300),
            run("sft-rl", 1, [0.1, 0.6])]
    arms = compare.merge(docs, META, KNOBS)
    assert set(arms) == {"sft-only", "sft-rl"}
    assert list(arms["sft-only"]["per_seed"]) == ["0", "2"]  # in seed order, whatever the files' order
    last = arms["sft-only"]["pooled"][-1]
    # pooled over episodes, not a mean of rates: (0.7 * 300 + 0.9 * 100) / 400
    assert last["episodes"] == 400 and last["success"] == pytest.approx(0.75)
    assert last["wilson95"][0] < 0.75 < last["wilson95"][1] and last["success_per_seed"] == [0.7, 0.9]
    assert [p["step"] for p in arms["sft-only"]["pooled"]] == [0, 20, 40]
    assert arms["sft-rl"]["pooled"][-1]["success"] == pytest.approx(0.6)


@pytest.mark.parametrize("doc, says", [
    (run("sft-only", 1, [0.2], meta={**META, "overrides": {"model.num_layers": 2}}), "overrides"),
    ({"meta": META, "arms": {"rl-scratch": {"knobs": {"rl_steps": 8}, "per_seed": {}}}}, "rl_steps"),
    (run("sft-only", 0, [0.2]), "seed 0 is in two"),
])
def test_merge_refuses_runs_of_another_comparison(compare, doc, says):
    with pytest.raises(ValueError, match=says):
        compare.merge([run("sft-only", 0, [0.1]), doc], META, KNOBS)


def test_the_cli_refuses_a_foreign_run_and_writes_nothing(tmp_path):
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps(run("sft-only", 0, [0.3])))
    out = tmp_path / "joined"
    r = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "examples" / "frozenlake_read_cpu.yaml"),
                        "--name", "t", "--sft-only-steps", "40", "--sft-eval-every", "20", "--rl-steps", "4",
                        "--warm-steps", "20", "--rl-after-steps", "2", "--merge", str(foreign), "--only",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "cannot be pooled" in r.stderr and "config" in r.stderr, r.stderr[-2000:]
    assert not out.with_suffix(".json").exists() and not out.with_suffix(".png").exists()


def test_the_cli_merge_joins_and_runs_nothing(compare, tmp_path):
    """``--merge`` without ``--only`` joins the files and trains nothing: the seeds a merge lacks
    (here every arm but one, and sft-only's seed 2) are not run behind the user's back."""
    example = str(ROOT / "examples" / "frozenlake_read_cpu.yaml")
    cfg = compare.config(example, {}, 0, tmp_path / "unused", {})
    meta = compare.describe("t", example, {}, cfg)
    parts = []
    for seed, successes in ((1, [0.0, 0.4, 0.8]), (0, [0.0, 0.2, 0.6])):
        parts.append(tmp_path / f"so_{seed}.json")
        parts[-1].write_text(json.dumps(run("sft-only", seed, successes, meta=meta)))
    out = tmp_path / "joined"
    r = subprocess.run([sys.executable, str(SCRIPT), example, "--name", "t", "--sft-only-steps", "40",
                        "--sft-eval-every", "20", "--rl-steps", "4", "--warm-steps", "20", "--rl-after-steps", "2",
                        "--merge", *map(str, parts), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    joined = json.loads(out.with_suffix(".json").read_text())
    assert list(joined["arms"]) == ["sft-only"] and list(joined["arms"]["sft-only"]["per_seed"]) == ["0", "1"]
    assert joined["arms"]["sft-only"]["pooled"][-1]["success"] == pytest.approx(0.7)  # (0.6 + 0.8) / 2, 100 each
    assert out.with_suffix(".png").stat().st_size > 0 and " seed " not in r.stderr
