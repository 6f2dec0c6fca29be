"""`rockroll train CONFIG.yaml`: config errors name the key; a one-step run; the vLLM
engine names its extra when vLLM is missing."""

import importlib.util

import pytest
from click.testing import CliRunner

from rockroll.cli import main


def test_train_cli_bad_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  group_size: 0\n")
    res = CliRunner().invoke(main, ["train", str(p)])
    assert res.exit_code == 2 and "rollout.group_size: must be >= 1" in res.output


def test_train_cli_one_step(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(f"""
steps: 1
model: {{hidden_size: 64, num_layers: 1, num_heads: 1, intermediate_size: 64}}
envs: [{{id: rock/FrozenLake-v0, kwargs: {{max_actions_per_turn: 1}}, task_ids: [0]}}]
rollout: {{group_size: 2, batch_groups: 1, max_turns: 2}}
generation: {{max_new_tokens: 1}}
logging: {{dir: {tmp_path / 'run'}, tensorboard: false, progress: false}}
""")
    res = CliRunner().invoke(main, ["train", str(p), "--set", "seed=5"])
    assert res.exit_code == 0, res.output
    assert "steps 0..1" in res.output and (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed")
def test_vllm_engine_names_its_extra():
    from rockroll.trainer.engines import EngineUnavailable, VLLMEngine

    with pytest.raises(EngineUnavailable, match=r"rockroll\[vllm\]"):
        VLLMEngine("some/model")
