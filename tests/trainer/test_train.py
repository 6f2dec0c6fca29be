"""End to end: tiny GRPO runs on FrozenLake with the torch engine, artifacts of a run, every
algorithm's update, and checkpoint/resume equality (DeepSpeed: test_deepspeed.py)."""

import json

import pytest
import torch

from rockroll.trainer.train import train

from _tiny import TinyTok, multi_turn_groups, run_config as _cfg  # noqa: E402


def _weights(out):
    return {k: v.clone() for k, v in out["policy"].module.lm.state_dict().items()}


def test_torch_engine_run_and_artifacts(tmp_path):
    out = train(_cfg(tmp_path, steps=3))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1, 2]
    for h in hist:
        assert torch.isfinite(torch.tensor(h["loss/total"]))
        assert h["policy_version"] == h["step"] + 1 and h["rollout/samples"] == 6
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert (run / "curve.png").stat().st_size > 1000
    assert list((run / "tb").iterdir())
    t = json.loads((run / "transcripts" / "step_000000.jsonl").read_text().splitlines()[0])
    assert t["transcript"][0][0] == "env" and "FrozenLake" in t["text"]
    # the generator received the trained weights (weight sync)
    gen = out["generator"].model.state_dict()
    for k, v in out["policy"].module.lm.state_dict().items():
        torch.testing.assert_close(gen[k], v)
    assert out["generator"].version == 3


@pytest.mark.parametrize("algo", ["grpo", "grpo_ipa", "cispo", "topr", "reinforce_pp", "ppo"])
def test_every_algorithm_updates_the_policy(algo):
    """update_policy on a hand-made multi-turn batch: finite loss, weights move, and only
    through response tokens (observation tokens carry no gradient signal)."""
    from rockroll.trainer.config import AlgorithmConfig, EngineConfig, IPAConfig, ModelConfig
    from rockroll.trainer.models import build_model
    from rockroll.trainer.policy import ActorModule, TorchPolicy
    from rockroll.trainer.train import collate, update_policy

    groups = multi_turn_groups()
    name = "grpo" if algo == "grpo_ipa" else algo
    acfg = AlgorithmConfig(name=name, ipa=IPAConfig(enabled=algo == "grpo_ipa", gamma=0.9),
                           kl_coef=0.01 if algo in ("reinforce_pp", "ppo") else 0.0,
                           mini_batches=2 if algo == "ppo" else 1, ppo_epochs=2 if algo == "ppo" else 1)
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    policy = TorchPolicy(ActorModule(lm, with_value=name == "ppo"), EngineConfig(lr=0.01))
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    ref = lambda ids, a: (lm(input_ids=ids, attention_mask=a).logits.detach(), None)  # noqa: E731
    met = update_policy(policy, acfg, collate(groups, 0), 1.0, ref if acfg.kl_coef else None)
    assert torch.isfinite(torch.tensor(met["loss/total"]))
    assert any(not torch.equal(before[k], v) for k, v in lm.state_dict().items())


def test_checkpoint_resume_matches_straight_run(tmp_path):
    common = {"steps": 4, "checkpoint__every": 2, "logging__tensorboard": False, "logging__plot": False,
              "rollout__async_ratio": 0, "eval__every": 2, "eval__episodes": 4}
    straight = train(_cfg(tmp_path / "a", checkpoint__dir=str(tmp_path / "a" / "ckpt"), **common))
    ckpt = str(tmp_path / "b" / "ckpt")
    first = train(_cfg(tmp_path / "b", checkpoint__dir=ckpt, **{**common, "steps": 2}))
    resumed = train(_cfg(tmp_path / "b", checkpoint__dir=ckpt, **common))
    assert resumed["start_step"] == 2
    losses_a = [h["loss/total"] for h in straight["history"]]
    losses_b = [h["loss/total"] for h in first["history"] + resumed["history"]]
    rewards_a = [h["rollout/reward"] for h in straight["history"]]
    rewards_b = [h["rollout/reward"] for h in first["history"] + resumed["history"]]
    assert rewards_a == rewards_b
    assert losses_a == pytest.approx(losses_b, abs=1e-6)
    wa, wb = _weights(straight), _weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)
    rows = [json.loads(x) for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # the resumed run continues the same curve
    # evaluations of versions 0, 2 (before the checkpoint's step) and 4 (final), same as straight;
    # the resumed run re-evaluated version 2 in place of the first run's final evaluation
    evals = {r: [json.loads(x) for x in (tmp_path / r / "run" / "eval.jsonl").read_text().splitlines()]
             for r in ("a", "b")}
    assert [e["step"] for e in evals["a"]] == [e["step"] for e in evals["b"]] == [0, 2, 4]
    assert evals["a"] == evals["b"] and all(e["eval/episodes"] == 4 for e in evals["a"])
