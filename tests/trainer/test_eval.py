"""Held-out evaluation: train and eval task sets disjoint (``envs[].task_ids``,
``eval.task_ids``), and each success rate with its 95 % Wilson interval, the episode count
and the seed."""

import pytest

from rockroll.trainer.algorithms.stats import wilson_interval
from rockroll.trainer.config import ConfigError, EnvConfig, load_config
from rockroll.trainer.envs import make_env
from rockroll.trainer.models import load_tokenizer
from rockroll.trainer.roles.runlog import eval_line
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from _scripted import ScriptEngine, recording_resets


@pytest.mark.parametrize("k, n, lo, hi", [
    # by hand: centre (p + z²/2n) / (1 + z²/n), half z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n), z = 1.96
    (5, 10, 0.2366, 0.7634),   # p 0.5: centre 0.5, half 0.36460 / 1.38415 = 0.26341
    (0, 10, 0.0, 0.2775),      # p 0: centre = half = 0.192075 / 1.38415 = 0.13877
    (10, 10, 0.7225, 1.0),     # mirror of 0/10
    (81, 100, 0.7222, 0.8749),  # the textbook example
    (1, 3, 0.0615, 0.7923),
])
def test_wilson_interval_matches_hand_computed_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert 0.0 <= got[0] <= k / n <= got[1] <= 1.0


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)  # nothing measured, nothing known
    narrow, wide = wilson_interval(160, 200), wilson_interval(16, 20)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]  # more episodes, a tighter interval
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_eval_task_ids_must_not_overlap_training_task_ids():
    env = {"id": "rock/FrozenLake-v0", "task_ids": [0, 1, 2]}
    with pytest.raises(ConfigError, match=r"eval\.task_ids: must be disjoint from envs\[0\]\.task_ids.*\['2'\]"):
        load_config({"envs": [env], "eval": {"task_ids": [2, 3]}})
    with pytest.raises(ConfigError, match=r"eval\.task_ids: must not be empty"):
        load_config({"envs": [env], "eval": {"task_ids": []}})
    cfg = load_config({"envs": [env], "eval": {"task_ids": [10, 11]}})
    assert cfg.eval.task_ids == [10, 11]


def test_task_ids_take_a_range_and_it_is_checked_for_overlap():
    env = {"id": "rock/FrozenLake-v0", "task_ids": {"range": [0, 20000]}}
    cfg = load_config({"envs": [env], "eval": {"task_ids": {"range": [100000, 100256]}}})
    assert cfg.envs[0].task_ids == list(range(20000))
    assert cfg.eval.task_ids[0] == 100000 and cfg.eval.task_ids[-1] == 100255 and len(cfg.eval.task_ids) == 256
    with pytest.raises(ConfigError, match=r"eval\.task_ids: must be disjoint from envs\[0\]\.task_ids.*'19999'"):
        load_config({"envs": [env], "eval": {"task_ids": {"range": [19999, 20010]}}})
    for bad in ({"range": [5, 5]}, {"range": [0]}, {"range": ["a", "b"]}, {"from": 0, "to": 3},
                {"range": [0, 3], "step": 2}):
        with pytest.raises(ConfigError, match=r"envs\[0\]\.task_ids: must be a list of task ids or \{range"):
            load_config({"envs": [{**env, "task_ids": bad}]})


def test_evaluation_plays_the_held_out_tasks_and_reports_the_interval(tmp_path):
    """Evaluation episodes cycle through ``eval.task_ids`` only (training groups through the
    env's own), and the metrics carry the interval, the episode count and the seed."""
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    tok = load_tokenizer(load_config({}).tokenizer, envs, tmp_path / "tok")
    seen = []

    def factory(spec):
        return recording_resets(make_env(spec), seen)

    cfg = load_config({"seed": 1, "generation": {"max_new_tokens": 2},
                       "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 3, "batch_wait_ms": 10_000},
                       "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1},
                                 "task_ids": [0, 1]}], "eval": {"task_ids": [7, 8, 9]}})
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = ScriptEngine(tok, ["Right", "Down"], stop_id=template.stop_id)
    mgr = RolloutManager(cfg, engine, template, env_factory=factory)
    mgr.start()
    mgr.pause()  # no training groups: the env factory is called by the evaluation alone
    try:
        out = mgr.evaluate(episodes=6, seed=5)
    finally:
        mgr.close()
    # (a training group may have started before the pause: its resets name tasks 0 and 1)
    assert sorted(o["task_id"] for o in seen if o["task_id"] not in (0, 1)) == [7, 7, 8, 8, 9, 9]
    assert out["eval/episodes"] == 6 and out["eval/seed"] == 5
    lo, hi = wilson_interval(round(out["eval/success"] * 6), 6)
    assert (out["eval/success_lo"], out["eval/success_hi"]) == pytest.approx((lo, hi))
    line = eval_line(3, out)
    assert line.startswith("eval at version 3: success ") and "(6 episodes, seed 5)" in line
    assert f"[{lo:.2f}, {hi:.2f}]" in line


def test_eval_temperature_samples_evaluation_episodes_at_its_own_temperature(tmp_path):
    """``eval.temperature`` (0: greedy) is the temperature of every evaluation request (in
    batches of their own, on the same engine); without it evaluation samples at
    ``generation.temperature``, as training does."""
    envs = [EnvConfig(id="rock/FrozenLake-v0", kwargs={"max_actions_per_turn": 1})]
    tok = load_tokenizer(load_config({}).tokenizer, envs, tmp_path / "tok")

    class Recording(ScriptEngine):
        def generate(self, prompts, sampling):
            temps.append(sampling.temperature)
            return super().generate(prompts, sampling)

    def temperatures(eval_section):
        cfg = load_config({"seed": 1, "generation": {"max_new_tokens": 2, "temperature": 0.7},
                           "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 3, "batch_wait_ms": 10},
                           "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1},
                                     "task_ids": [0, 1]}], "eval": {"task_ids": [7, 8, 9], **eval_section}})
        template = PromptTemplate(tok, cfg.tokenizer)
        mgr = RolloutManager(cfg, Recording(tok, ["Right", "Down"], stop_id=template.stop_id), template)
        mgr.pause()  # before the start: no training group at all
        mgr.start()
        try:
            temps.clear()
            out = mgr.evaluate(episodes=4, seed=5)
        finally:
            mgr.close()
        assert out["eval/episodes"] == 4
        return set(temps)

    temps: list[float] = []
    assert temperatures({"temperature": 0.0}) == {0.0}
    assert temperatures({}) == {0.7}
    with pytest.raises(ConfigError, match=r"eval\.temperature: must be >= 0"):
        load_config({"eval": {"temperature": -1}})
