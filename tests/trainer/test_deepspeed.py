"""Real DeepSpeed on CPU (gloo, world size 1, master 127.0.0.1, set up by DeepSpeedPolicy).

ZeRO stages 1, 2 and 3 take the same optimizer steps as the plain torch engine on the same
batch: equal losses step after step and equal weights, within float tolerance. Full runs
with ZeRO-1 and ZeRO-3 sync the trained weights to the generator and resume from their
checkpoint.
"""

import pytest
import torch

from rockroll.trainer.config import AlgorithmConfig, EngineConfig, ModelConfig
from rockroll.trainer.models import build_model
from rockroll.trainer.engines.policy import ActorModule, DeepSpeedPolicy, make_policy
from rockroll.trainer.controller import train
from rockroll.trainer.roles.update import collate, update_policy

from _tiny import TinyTok, multi_turn_groups, run_config  # noqa: E402

STEPS = 3


def _train_steps(kind: str, stage: int):
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    policy = make_policy(ActorModule(lm, with_value=False), EngineConfig(kind=kind, zero_stage=stage, lr=0.01),
                         batch_size=6)
    batch = collate(multi_turn_groups(), 0)
    losses = [update_policy(policy, AlgorithmConfig(), batch, 1.0)["loss/total"] for _ in range(STEPS)]
    return policy, losses, policy.sync_state_dict()


@pytest.fixture(scope="module")
def torch_steps():
    return _train_steps("torch", 0)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_takes_the_same_steps_as_torch(stage, torch_steps):
    _, ref_losses, ref_weights = torch_steps
    policy, losses, weights = _train_steps("deepspeed", stage)
    assert isinstance(policy, DeepSpeedPolicy) and policy.engine.zero_optimization_stage() == stage
    assert abs(ref_losses[1] - ref_losses[0]) > 1e-2  # the steps change the loss: the comparison means something
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert weights.keys() == ref_weights.keys()
    for k, v in ref_weights.items():
        assert weights[k].shape == v.shape  # ZeRO-3: gathered, not the empty partitions
        torch.testing.assert_close(weights[k], v, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_run_syncs_the_generator_and_resumes(tmp_path, stage):
    over = {"engine__kind": "deepspeed", "engine__zero_stage": stage, "logging__tensorboard": False,
            "logging__plot": False, "checkpoint__dir": str(tmp_path / "ckpt")}
    out = train(run_config(tmp_path, **over))
    assert [h["step"] for h in out["history"]] == [0, 1]
    assert all(torch.isfinite(torch.tensor(h["loss/total"])) for h in out["history"])
    assert out["policy"].engine.zero_optimization_stage() == stage
    trained = out["policy"].sync_state_dict()
    generator = out["generator"].model.state_dict()
    for k, v in trained.items():
        torch.testing.assert_close(generator[k].cpu(), v)  # the generator is on the GPU when there is one
    assert out["generator"].version == 2
    resumed = train(run_config(tmp_path, **over))  # steps reached: loads the checkpoint, trains nothing
    assert resumed["start_step"] == 2 and resumed["history"] == []
    for k, v in resumed["policy"].sync_state_dict().items():
        torch.testing.assert_close(v, trained[k])
