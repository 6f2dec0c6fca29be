"""The trainer's CUDA paths, on a GPU (``gpu``-marked: CI has none; ``scripts/gpu_check.sh`` runs
them where one is lent): generation on the device with the log-probs the trainer computes,
and a training run whose weight sync keeps the generator on the device with the policy's
weights. The DeepSpeed ZeRO tests (tests/trainer/test_deepspeed.py) and the offload test
(test_offload.py) run on the GPU too when there is one (NCCL instead of gloo)."""

import copy
import random

import pytest
import torch

from rockroll.trainer.config import ModelConfig
from rockroll.trainer.controller import train
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.engines.sampling import SamplingParams
from rockroll.trainer.models import build_model, load_tokenizer
from rockroll.trainer.roles.local import PolicyTrainer
from rockroll.trainer.roles.update import target_logp

from _tiny import TinyTok, run_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _recomputed(lm, prompt: list[int], out) -> torch.Tensor:
    """The log-probs of ``out``'s tokens by one full forward pass of ``lm`` (the trainer's way)."""
    ids = torch.tensor([prompt + out.token_ids], device="cuda")
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[:, len(prompt) - 1:-1]
    return target_logp(logits, ids[:, len(prompt):], 1.0)[0]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-3), ("bfloat16", 0.05)])
def test_generation_runs_on_the_gpu_and_its_logprobs_are_the_trainers(dtype, tol):
    """Continuous batching on the device (more prompts than rows, so requests join a running
    batch and leave it): every token's log-prob, taken from the KV-cached decode step, is the
    one a full forward pass gives (exact in fp32; bf16 within its rounding)."""
    lm = build_model(ModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256, dtype=dtype),
                     TinyTok(), 0)
    engine = TransformersEngine(copy.deepcopy(lm), pad_token_id=0, max_batch=4)
    try:
        assert next(engine.model.parameters()).device.type == "cuda"
        rng = random.Random(0)
        prompts = [[rng.randrange(3, 32) for _ in range(rng.randrange(2, 12))] for _ in range(10)]
        lengths = [4 + i % 9 for i in range(10)]  # rows leave at different steps, and others take their place
        futures = [engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=n, seeds=[i]))
                   for i, (p, n) in enumerate(zip(prompts, lengths))]
        outs = [f.result(timeout=120) for f in futures]
    finally:
        engine.close()
    assert engine.batcher.joins > 0  # requests joined a running batch
    lm = lm.cuda()
    diffs = []
    for prompt, out, n in zip(prompts, outs, lengths):
        assert len(out.token_ids) == n  # no stop token: every reply runs its length
        diffs += (torch.tensor(out.logprobs, device="cuda") - _recomputed(lm, prompt, out)).abs().tolist()
    assert max(diffs) < tol, (dtype, max(diffs))


@pytest.mark.parametrize("kind,stage", [("torch", 0), ("deepspeed", 1), ("deepspeed", 2)])
def test_a_run_on_the_gpu_syncs_its_weights_into_the_generator_on_the_device(tmp_path, kind, stage):
    """Two GRPO steps of the tiny FrozenLake run: the policy and the generator both live on
    the GPU, the generator holds the trained weights after the last sync, and what it samples
    next has the log-probs the trained weights give."""
    out = train(run_config(tmp_path, engine__kind=kind, engine__zero_stage=stage, logging__tensorboard=False,
                           logging__plot=False))
    policy, generator = out["policy"], out["generator"]  # the run closed the generator's loop; its model stays
    assert policy.device.type == "cuda" and next(generator.model.parameters()).device.type == "cuda"
    assert generator.version == 2
    trained = policy.sync_state_dict(policy.device)
    held = generator.model.state_dict()
    for k, v in trained.items():
        assert v.is_cuda and held[k].is_cuda
        torch.testing.assert_close(held[k], v, atol=0, rtol=0)
    prompt = [5, 6, 7]
    engine = TransformersEngine(generator.model, pad_token_id=0)
    try:
        [sample] = engine.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=4, seeds=[0]))
    finally:
        engine.close()
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64),
                     out["tokenizer"], 0).cuda()
    lm.load_state_dict(trained)
    got = torch.tensor(sample.logprobs, device="cuda")
    torch.testing.assert_close(got, _recomputed(lm, prompt, sample), atol=1e-4, rtol=0)


def test_the_weights_the_trainer_syncs_in_its_process_stay_on_the_gpu(tmp_path):
    """What the local roles load into the generator after each step: a copy of the policy's
    weights on its GPU (a device-to-device copy, no round trip through host memory), in
    storage of its own, so the next optimizer step does not change it."""
    cfg = run_config(tmp_path)
    tok = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "tok")
    trainer = PolicyTrainer(cfg, build_model(cfg.model, tok, cfg.seed), tok)
    weights, live = trainer.weights(), trainer.policy.module.lm.state_dict()
    for k, v in weights.items():
        assert v.is_cuda and torch.equal(v, live[k]) and v.data_ptr() != live[k].data_ptr(), k
