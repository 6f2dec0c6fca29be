"""Trainer config: YAML loading, validation errors that name the dotted key."""

from pathlib import Path

import pytest

from rockroll.trainer.config import ConfigError, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_load(name):
    cfg = load_config(EXAMPLES / name)
    assert cfg.rollout.group_size >= 1 and cfg.envs


def test_defaults_and_nested():
    cfg = load_config({"algorithm": {"name": "grpo", "ipa": {"enabled": True, "gamma": 0.9}},
                       "envs": [{"id": "rock/Sokoban-v0", "weight": 2, "kwargs": {"size": 6}}]})
    assert cfg.algorithm.ipa.gamma == 0.9 and cfg.envs[0].weight == 2.0
    assert cfg.engine.kind == "torch"


@pytest.mark.parametrize("data, key", [
    ({"rollout": {"group_size": 0}}, "rollout.group_size: must be >= 1"),
    ({"rollout": {"async_ratio": -1}}, "rollout.async_ratio: must be >= 0"),
    ({"rollout": {"groupsize": 4}}, "rollout.groupsize: unknown key"),
    ({"algorithm": {"name": "dpo"}}, "algorithm.name: must be one of"),
    ({"algorithm": {"loss_agg": "mean"}}, "algorithm.loss_agg: must be one of"),
    ({"algorithm": {"ipa": {"gamma": 1.5}}}, "algorithm.ipa.gamma: must be in (0, 1]"),
    ({"algorithm": {"ipa": {"foo": 1}}}, "algorithm.ipa.foo: unknown key"),
    ({"engine": {"zero_stage": 4}}, "engine.zero_stage: must be 0, 1, 2 or 3"),
    ({"engine": {"kind": "fsdp"}}, "engine.kind"),
    ({"generation": {"temperature": 0}}, "generation.temperature: must be > 0"),
    ({"generation": {"max_new_tokens": "many"}}, "generation.max_new_tokens: must be an integer"),
    ({"envs": [{"id": "rock/FrozenLake-v0", "weight": -1}]}, "envs[0].weight: must be > 0"),
    ({"eval": {"episodes": 0}}, "eval.episodes: must be >= 1"),
    ({"eval": {"every": -1}}, "eval.every: must be >= 0"),
    ({"envs": [{"id": "x", "bogus": 1}]}, "envs[0].bogus: unknown key"),
    ({"envs": []}, "envs: needs at least one"),
    ({"checkpoint": {"every": -2}}, "checkpoint.every: must be >= 0"),
    ({"stepz": 3}, "stepz: unknown key"),
    ({"rollout": 5}, "rollout: must be a mapping"),
    ({"deterministic": "yes"}, "deterministic: must be true or false"),
    ({"rollout": {"curriculum": {"promote_at": 0}}}, "rollout.curriculum.promote_at: must be in (0, 1]"),
    ({"rollout": {"curriculum": {"window": 0}}}, "rollout.curriculum.window: must be >= 1"),
    ({"rollout": {"curriculum": {"enable": True}}}, "rollout.curriculum.enable: unknown key"),
    ({"rollout": {"curriculum": {"enabled": True}}}, "rollout.curriculum.enabled: needs an env with task_ids"),
    ({"rollout": {"curriculum": {"enabled": True}},
      "envs": [{"id": "rock/FrozenLake-v0", "task_ids": [0]}, {"id": "rock/FrozenLake-v0", "task_ids": [1]}]},
     "rollout.curriculum.enabled: needs distinct env ids"),
    # combinations whose setting the trainer would ignore
    ({"algorithm": {"name": "topr", "ipa": {"enabled": True}}}, "algorithm.ipa.enabled: IPA"),
    ({"algorithm": {"name": "cispo", "ipa": {"enabled": True}}}, "algorithm.ipa.enabled: IPA"),
    ({"algorithm": {"name": "reinforce_pp", "ipa": {"enabled": True}}}, "algorithm.ipa.enabled: IPA"),
    ({"algorithm": {"name": "ppo", "ipa": {"enabled": True}}}, "algorithm.ipa.enabled: IPA"),
    ({"algorithm": {"name": "cispo", "dual_clip": 3.0}}, "algorithm.dual_clip: not used by algorithm.name=cispo"),
    ({"algorithm": {"ipa": {"enabled": True}, "dual_clip": 3.0}}, "algorithm.dual_clip: not used"),
    ({"algorithm": {"name": "topr", "tis_cap": 0.0}}, "algorithm.tis_cap: not used by algorithm.name=topr"),
    ({"algorithm": {"ipa": {"enabled": True}, "tis_cap": 1.5}}, "algorithm.tis_cap: not used"),
    # IPA is the paper's TOPR-style loss (issue #40): no PPO clip, and the old two-sided band is gone
    ({"algorithm": {"ipa": {"enabled": True}, "clip_high": 0.3}}, "algorithm.clip_high: not used"),
    ({"algorithm": {"ipa": {"enabled": True}, "std_normalize": False}}, "algorithm.std_normalize: not used"),
    ({"algorithm": {"ipa": {"enabled": True, "ratio_high": 2.0}}},
     "algorithm.ipa.ratio_high: removed: IPA now masks a chunk one-sided on pi_old / mu"),
    ({"algorithm": {"ipa": {"ratio_low": 0.5}}}, "use algorithm.ipa.mask_threshold"),
    ({"algorithm": {"ipa": {"mask_threshold": 0.5}}}, "algorithm.ipa.mask_threshold: must be >= 1"),
    ({"algorithm": {"ipa": {"returns": "whitened"}}}, "algorithm.ipa.returns: must be one of absolute, group_normalized"),
    ({"algorithm": {"name": "topr", "clip_high": 0.5}}, "algorithm.clip_high: not used"),
    ({"algorithm": {"name": "cispo", "clip_low": 0.3}}, "algorithm.clip_low: not used"),  # MiniMax: no lower clip
    ({"algorithm": {"name": "reinforce_pp", "std_normalize": False}}, "algorithm.std_normalize: not used"),
    ({"algorithm": {"lam": 0.9}}, "algorithm.lam: not used by algorithm.name=grpo"),
    ({"algorithm": {"gamma": 0.9}}, "algorithm.gamma: not used"),
    ({"algorithm": {"turn_credit": "per_token"}}, "algorithm.turn_credit: must be one of outcome, discounted"),
    ({"algorithm": {"name": "topr", "turn_credit": "discounted"}}, "algorithm.turn_credit: discounted needs"),
    ({"algorithm": {"turn_credit": "discounted", "ipa": {"enabled": True, "gamma": 0.9}}},
     "algorithm.ipa.gamma: unused with turn_credit=discounted"),
    ({"algorithm": {"dynamic_sampling": True, "dynamic_sampling_max_batches": 0}},
     "algorithm.dynamic_sampling_max_batches: must be >= 1"),
    ({"tokenizer": {"name_or_path": "some/model", "add_tokens": ["\\boxed{1}"]}},
     "tokenizer.add_tokens: only for a built tokenizer"),
    ({"tokenizer": {"add_tokens": [""]}}, "tokenizer.add_tokens: must be non-empty strings"),
])
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as e:
        load_config(data)
    assert str(e.value).startswith(key) or key in str(e.value), str(e.value)


@pytest.mark.parametrize("algorithm", [
    {"name": "ppo", "gamma": 0.99, "lam": 0.9, "vf_coef": 0.1, "dual_clip": 3.0},
    {"name": "cispo", "turn_credit": "discounted", "gamma": 0.9, "std_normalize": False},
    {"ipa": {"enabled": True, "gamma": 0.9, "mask_threshold": 3.0}, "turn_credit": "outcome"},
    {"ipa": {"enabled": True, "returns": "group_normalized"}},
    {"ipa": {"enabled": True}, "turn_credit": "discounted", "gamma": 0.8},
    {"name": "topr", "kl_coef": 0.01, "ppo_epochs": 2},
    {"dynamic_sampling": True, "dynamic_sampling_max_batches": 1},
])
def test_settings_the_algorithm_reads_are_accepted(algorithm):
    assert load_config({"algorithm": algorithm}).algorithm.name == algorithm.get("name", "grpo")


def test_yaml_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  group_size: 4\n")
    cfg = load_config(p, {"rollout.batch_groups": 3, "algorithm.name": "topr"})
    assert (cfg.rollout.group_size, cfg.rollout.batch_groups, cfg.algorithm.name) == (4, 3, "topr")
    p.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_into_lists_and_bad_paths():
    base = {"steps": 3, "envs": [{"id": "rock/FrozenLake-v0"}, {"id": "rock/Sokoban-v0", "weight": 2}]}
    cfg = load_config(base, {"envs.1.weight": 0.5, "envs.0.kwargs": {"size": 6}})
    assert (cfg.envs[1].weight, cfg.envs[0].kwargs) == (0.5, {"size": 6})
    assert base["envs"][1]["weight"] == 2  # the caller's mapping is not modified
    for over, key in [({"steps.x": 1}, "steps: is 3, not a section"),
                      ({"envs.2.id": "x"}, "envs.2: not an index of this list of 2 items"),
                      ({"envs.first.id": "x"}, "envs.first: not an index"),
                      ({"envs.0.id.x": 1}, "envs.0.id: is 'rock/FrozenLake-v0', not a section"),
                      ({"rollout.group_size": 0}, "rollout.group_size: must be >= 1")]:
        with pytest.raises(ConfigError) as e:
            load_config(base, over)
        assert str(e.value).startswith(key), str(e.value)
    with pytest.raises(ConfigError, match="^steps: must be an integer"):  # a new section where a number goes
        load_config({}, {"steps.x": 1})
