"""`rockroll train CONFIG.yaml`: config errors name the key; a one-step run; the vLLM
engine names its extra when vLLM is missing."""

import importlib.util
import json

import pytest
from click.testing import CliRunner

from rockroll.cli import main


def test_train_cli_bad_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  group_size: 0\n")
    res = CliRunner().invoke(main, ["train", str(p)])
    assert res.exit_code == 2 and "rollout.group_size: must be >= 1" in res.output


def test_train_cli_set_errors_name_the_override(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 1\n")
    res = CliRunner().invoke(main, ["train", str(p), "--set", "rollout.group_size=0"])
    assert res.exit_code == 2 and "error: --set rollout.group_size: rollout.group_size: must be >= 1" in res.output
    res = CliRunner().invoke(main, ["train", str(p), "--set", "rollout.nope=1"])
    assert res.exit_code == 2 and "error: --set rollout.nope: rollout.nope: unknown key" in res.output
    res = CliRunner().invoke(main, ["train", str(p), "--set", "steps=4", "--steps", "3"])
    assert res.exit_code == 2 and "error: --steps 3 and --set steps=4 both set steps: give one" in res.output


def test_train_cli_one_step_then_nothing_to_do_then_fresh(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(f"""
steps: 1
model: {{hidden_size: 64, num_layers: 1, num_heads: 1, intermediate_size: 64}}
envs: [{{id: rock/FrozenLake-v0, kwargs: {{max_actions_per_turn: 1}}, task_ids: [0]}}]
rollout: {{group_size: 2, batch_groups: 1, max_turns: 2}}
generation: {{max_new_tokens: 1}}
logging: {{dir: {tmp_path / 'run'}, tensorboard: false, progress: false}}
checkpoint: {{dir: {tmp_path / 'ckpt'}}}
""")
    metrics = tmp_path / "run" / "metrics.jsonl"
    res = CliRunner().invoke(main, ["train", str(p), "--set", "seed=5"])
    assert res.exit_code == 0, res.output
    assert "steps 0..1" in res.output and len(metrics.read_text().splitlines()) == 1
    # the same config again: a finished run, said so with the ways out, and nothing trained
    again = CliRunner().invoke(main, ["train", str(p), "--set", "seed=5"])
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output and "--fresh" in again.output and "logging.dir" in again.output
    assert len(metrics.read_text().splitlines()) == 1
    # --fresh starts over: step 0 again, in an emptied run folder
    fresh = CliRunner().invoke(main, ["train", str(p), "--set", "seed=5", "--fresh"])
    assert fresh.exit_code == 0, fresh.output
    assert "steps 0..1" in fresh.output and "nothing to do" not in fresh.output
    assert len(metrics.read_text().splitlines()) == 1


def test_show_curve_help_and_run(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "show_curve.py"
    helped = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "run_dir" in helped.stdout
    (tmp_path / "metrics.jsonl").write_text('{"rollout/success": 0.5, "rollout/reward": 0.5}\n')
    shown = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert shown.returncode == 0 and "0.50" in shown.stdout, shown.stderr


def test_compare_runs_plots_every_run_and_tabulates_their_evaluations(tmp_path):
    """examples/compare_runs.py: one PNG, and a table with each run's evaluation at each version
    (a version one run lacks stays empty); a bad argument names the expected form."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "compare_runs.py"
    for name, evals in (("a", {0: 0.1, 5: 0.4}), ("b", {0: 0.2, 5: 0.9, 10: 1.0})):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "rollout/success": 0.5}) + "\n" for s in range(10)))
        (run / "eval.jsonl").write_text("".join(
            json.dumps({"step": s, "eval/success": v}) + "\n" for s, v in evals.items()))
    out = tmp_path / "img" / "cmp.png"
    res = subprocess.run([sys.executable, str(script), str(out), f"GRPO={tmp_path / 'a'}", f"mine={tmp_path / 'b'}"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| GRPO | 0.10 | 0.40 |  |" in res.stdout and "| mine | 0.20 | 0.90 | 1.00 |" in res.stdout
    bad = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "a")], capture_output=True, text=True)
    assert bad.returncode == 2 and "LABEL=RUN_DIR" in bad.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed")
def test_vllm_engine_names_its_extra():
    from rockroll.trainer.engines.generation import EngineUnavailable, VLLMEngine

    with pytest.raises(EngineUnavailable, match=r"rockroll\[vllm\]"):
        VLLMEngine("some/model")
