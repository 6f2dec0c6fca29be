"""Ray roles smoke test on a real local Ray (127.0.0.1): trainer, generator and env-worker
actors run two training steps; weights reach the generator through the object store; the env
worker evaluates the starting weights."""

import pytest

ray = pytest.importorskip("ray")

from rockroll.trainer.config import load_config  # noqa: E402
from rockroll.trainer.models import load_tokenizer  # noqa: E402
from rockroll.trainer.ray_roles import init_local_ray, train_with_ray  # noqa: E402


def test_ray_roles_two_steps(tmp_path):
    cfg = load_config({
        "steps": 2, "seed": 0,
        "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
        "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0]}],
        "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 2},
        "generation": {"max_new_tokens": 1},
        "eval": {"every": 2, "episodes": 3},
    })
    tok_dir = tmp_path / "tok"
    load_tokenizer(cfg.tokenizer, cfg.envs, tok_dir)
    init_local_ray(num_cpus=2)
    try:
        hist = train_with_ray(cfg, str(tok_dir))
    finally:
        ray.shutdown()
    assert [h["step"] for h in hist] == [0, 1]
    assert hist[-1]["policy_version"] == 2
    assert all(h["rollout/samples"] == 2 for h in hist)
    assert hist[1]["rollout/staleness_max"] == 0  # step 1 was generated with the synced weights
    assert hist[0]["eval/episodes"] == 3 and "eval/success" in hist[0] and "eval/success" not in hist[1]
