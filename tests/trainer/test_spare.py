"""Spare groups (rollout.spare_groups): more groups start than a step trains on. "first"
trains on those that finish first, which on an env where long episodes earn more
(``LengthEnv``: task k lasts k turns and pays k/6) biases the batch toward short, low-reward
episodes; "quorum" removes that bias. The statistic: the trained groups' mean reward against
the mean over every group started (the population the batch should represent)."""

import pytest

from rockroll.trainer.config import ConfigError, EnvConfig, load_config
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from _synthetic import LengthEnv
from _scripted import ScriptEngine
from rockroll.trainer.models import load_tokenizer

STEPS = 12


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    return load_tokenizer(load_config({}).tokenizer, envs, tmp_path_factory.mktemp("tok"))


def _run(tok, selection: str, spare: int = 2):
    cfg = load_config({
        "seed": 4,
        "envs": [{"id": "_synthetic:LengthEnv", "task_ids": [1, 2, 3, 4, 5, 6]}],
        "rollout": {"group_size": 2, "batch_groups": 2, "max_turns": 7, "batch_wait_ms": 1,
                    "spare_groups": spare, "spare_selection": selection},
        "generation": {"max_new_tokens": 2},
    })
    envs = []

    def factory(spec):
        envs.append(LengthEnv(max_turns=6, step_s=0.03))
        return envs[-1]

    template = PromptTemplate(tok, cfg.tokenizer)
    mgr = RolloutManager(cfg, ScriptEngine(tok, ["Go"], stop_id=template.stop_id), template, env_factory=factory)
    mgr.start()
    trained, metrics = [], {}
    try:
        for step in range(STEPS):
            groups, metrics = mgr.get_batch(step, timeout=120)
            trained += [s.reward for g in groups for s in g.samples]
            mgr.load_weights({}, step + 1)
    finally:
        mgr.close()
    started = [e.task / 6 for e in envs]  # every env reset with its group's task: each group counted G times
    return sum(trained) / len(trained), sum(started) / len(started), metrics


def test_first_to_finish_is_biased_toward_short_episodes_and_quorum_is_not(tok):
    first, population_f, metrics = _run(tok, "first")
    assert first < population_f - 0.12, (first, population_f)  # the short, low-reward groups won the race
    assert first < metrics["rollout/finished_reward"] - 0.1  # the bias against what the run logs
    quorum, population_q, _ = _run(tok, "quorum")
    assert abs(quorum - population_q) < 0.08, (quorum, population_q)
    assert quorum > first + 0.1


def test_spare_config_errors():
    with pytest.raises(ConfigError, match=r"rollout\.spare_groups: must be >= 0"):
        load_config({"rollout": {"spare_groups": -1}})
    with pytest.raises(ConfigError, match=r"rollout\.spare_selection: must be first or quorum"):
        load_config({"rollout": {"spare_selection": "fastest"}})
