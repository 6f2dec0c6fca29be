"""End to end: tiny GRPO runs on FrozenLake with the torch engine, artifacts of a run, every
algorithm's update, and checkpoint/resume equality (DeepSpeed: test_deepspeed.py)."""

import json

import pytest
import torch

import rockroll.trainer
from rockroll.trainer.algorithms import credit as C
from rockroll.trainer.config import AlgorithmConfig, ConfigError, EngineConfig, IPAConfig, ModelConfig
from rockroll.trainer.controller import train
from rockroll.trainer.algorithms.table import ADVANTAGES, LOSSES
from rockroll.trainer.roles.update import (
    collate, compute_advantages, compute_loss, micro_rows, target_logp, token_logp, update_policy,
)
from rockroll.trainer.models import build_model
from rockroll.trainer.engines.policy import ActorModule, make_policy
from rockroll.trainer.rollout.types import Group, Sample

from _tensors import LN, close, t  # noqa: E402
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


def _tiny_policy(engine=None, with_value=False):
    """A one-layer Llama (seed 0: every call builds the same weights) in a policy engine."""
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    return make_policy(ActorModule(lm, with_value=with_value), engine or EngineConfig(lr=0.01), batch_size=6)


@pytest.mark.parametrize("algo", ["grpo", "grpo_ipa", "cispo", "topr", "reinforce_pp", "ppo", "raft"])
def test_every_algorithm_updates_the_policy(algo):
    """update_policy on a hand-made multi-turn batch: finite loss, weights move, and only
    through response tokens: the logits at every position that predicts a prompt, observation
    or padding token get exactly zero gradient."""
    groups = multi_turn_groups()
    name = "grpo" if algo == "grpo_ipa" else algo
    acfg = AlgorithmConfig(name=name, ipa=IPAConfig(enabled=algo == "grpo_ipa", gamma=0.9),
                           kl_coef=0.01 if algo in ("reinforce_pp", "ppo") else 0.0,
                           mini_batches=2 if algo == "ppo" else 1, ppo_epochs=2 if algo == "ppo" else 1)
    policy = _tiny_policy(with_value=name == "ppo")
    lm = policy.module.lm
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    ref = lambda ids, a: (lm(input_ids=ids, attention_mask=a).logits.detach(), None)  # noqa: E731
    logit_grads = []

    def keep_logit_grad(module, inputs, logits):  # returns None: the output stays as it is
        if logits.requires_grad:
            logits.register_hook(logit_grads.append)

    hook = lm.lm_head.register_forward_hook(keep_logit_grad)
    batch = collate(groups, 0).to(policy.device)  # where the policy is (the GPU when there is one)
    try:
        with torch.no_grad():
            aux = {"ref_logp": token_logp(ref, batch, 1.0)[0]} if acfg.kl_coef else None
        met = update_policy(policy, acfg, batch, 1.0, aux=aux)
    finally:
        hook.remove()
    assert torch.isfinite(torch.tensor(met["loss/total"]))
    assert any(not torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert logit_grads  # one per gradient forward (ppo: 2 epochs x 2 mini-batches)
    for i, g in enumerate(logit_grads):  # backward i follows forward i: mini-batches in turn
        start = i % (batch.size // g.shape[0]) * g.shape[0]
        rows = batch.mask[start: start + g.shape[0]]
        # position t predicts target t (token t + 1); the last position predicts nothing
        predicts_response = torch.cat([rows, torch.zeros(rows.shape[0], 1, dtype=torch.bool, device=rows.device)], 1)
        # the logits start where a response token is first predicted (trim_prompt): only prompt is cut
        cut = predicts_response.shape[1] - g.shape[1]
        assert cut > 0 and not predicts_response[:, :cut].any()
        predicts_response = predicts_response[:, cut:]
        assert g[~predicts_response].abs().max() == 0
        assert g[predicts_response].abs().sum() > 0


def test_the_algorithm_table_names_what_update_runs():
    """Every estimator and loss a row of ALGORITHMS can select (credit options included) has
    an implementation in update.py and its list of config keys, each an algorithm.* key;
    and every implementation is selected by some row."""
    from dataclasses import fields

    from rockroll.trainer.algorithms.table import ADVANTAGE_KEYS, ALGORITHMS, LOSS_KEYS

    picked = {spec.parts(tc, ipa) for spec in ALGORITHMS.values()
              for tc in ("outcome", "discounted") for ipa in (False, True)}
    assert {a for a, _ in picked} == set(ADVANTAGES) == set(ADVANTAGE_KEYS)
    assert {loss for _, loss in picked} == set(LOSSES) == set(LOSS_KEYS)
    keys = {f.name for f in fields(AlgorithmConfig)}
    assert {k for ks in (*ADVANTAGE_KEYS.values(), *LOSS_KEYS.values()) for k in ks} <= keys
    assert AlgorithmConfig(ipa=IPAConfig(enabled=True), turn_credit="discounted").advantages == "turn"
    assert (AlgorithmConfig(name="cispo", ipa=IPAConfig(enabled=True)).loss, AlgorithmConfig(name="topr",
            turn_credit="discounted").advantages) == ("cispo", "dr_grpo")  # options only where they apply


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


def test_a_finished_run_started_again_keeps_its_logs_and_says_where_it_is(tmp_path):
    """Issue #36: starting a finished run again trains nothing and must not delete its final
    evaluation (an eval row's step is the version evaluated, which the checkpoint holds);
    asked for fewer steps than it has done, the CLI says the step it is at."""
    import yaml
    from click.testing import CliRunner

    from rockroll.cli import main
    from rockroll.trainer.config import config_to_dict

    over = {"checkpoint__dir": str(tmp_path / "ckpt"), "logging__tensorboard": False, "logging__plot": False,
            "rollout__async_ratio": 0, "eval__every": 2, "eval__episodes": 2, "steps": 3}
    train(_cfg(tmp_path, **over))
    logs = {name: (tmp_path / "run" / name).read_text() for name in ("metrics.jsonl", "eval.jsonl")}
    assert [json.loads(x)["step"] for x in logs["eval.jsonl"].splitlines()] == [0, 2, 3]
    again = train(_cfg(tmp_path, **over))
    assert (again["start_step"], again["history"]) == (3, [])
    assert {name: (tmp_path / "run" / name).read_text() for name in logs} == logs

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(_cfg(tmp_path, **over))))
    result = CliRunner().invoke(main, ["train", str(config), "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert "is at step 3, past the 1 steps asked" in result.output
    assert {name: (tmp_path / "run" / name).read_text() for name in logs} == logs


def test_the_eval_line_says_how_many_episodes_played():
    """Issue #41: an evaluation whose every episode hit an infrastructure error printed
    "success 0.000"; a success over no episode is no number."""
    from rockroll.trainer.roles.runlog import eval_line

    assert eval_line(3, {"eval/episodes": 0.0, "eval/infra_errors": 4.0}) == (
        "eval at version 3: no episode played, 4 left out for infrastructure errors")
    assert eval_line(5, {"eval/episodes": 6.0, "eval/infra_errors": 2.0, "eval/success": 0.5, "eval/reward": 0.25}) == (
        "eval at version 5: success 0.500 (6 episodes, 2 left out for infrastructure errors), reward 0.250")
    assert eval_line(5, {"eval/episodes": 8.0, "eval/infra_errors": 0.0, "eval/success": 1.0, "eval/reward": 1.0,
                         "eval/success_lo": 0.68, "eval/success_hi": 1.0, "eval/seed": 7.0}) == (
        "eval at version 5: success 1.000 [0.68, 1.00] (8 episodes, seed 7), reward 1.000")


# --------------------------------------------------------------------------- off-policy ratios


def _hand_batch(masks, behav, rewards, group_ids=None, turn_rewards=None):
    """A Batch from per-target lists: each sample gets a leading prompt token (mask 0), so
    position t of ``batch.mask`` / ``batch.behav_logp`` is ``masks[i][t]`` / ``behav[i][t]``."""
    samples = []
    for i, (m, b) in enumerate(zip(masks, behav)):
        samples.append(Sample(token_ids=list(range(3, 4 + len(m))), mask=[0, *m], behav_logp=[0.0, *b],
                              reward=rewards[i], group_id=0 if group_ids is None else group_ids[i], version=0,
                              turn_rewards=[] if turn_rewards is None else turn_rewards[i]))
    return collate([Group(0, "e", None, 0, samples)], 0)


def test_topr_weighs_negatives_by_the_behaviour_ratio():
    # one group, R = [1, 0] -> Dr.GRPO advantages [+0.5, -0.5]; seq-mean-token-sum (the paper's form)
    # logp = [[-1, -2], [-1, -1]]; old_logp = logp (a single update: the proximal policy is pi_theta)
    # negative sample: log mu = logp + ln 2 per token -> log rho = -2 ln 2, rho = 0.25 = its weight
    # loss = -(1/2) [0.5 (-1 - 2) + 0.25 (-0.5) (-1 - 1)] = -(1/2)(-1.5 + 0.25) = 0.625
    # (with old_logp as the denominator rho = 1: -(1/2)(-1.5 + 1) = 0.25)
    batch = _hand_batch([[1, 1], [1, 1]], [[-5.0, -5.0], [-1 + LN(2.0), -1 + LN(2.0)]], [1.0, 0.0])
    logp = t([[-1.0, -2.0], [-1.0, -1.0]], requires_grad=True)
    a = AlgorithmConfig(name="topr", loss_agg="seq-mean-token-sum")
    adv, _ = compute_advantages(a, batch, logp.detach(), logp.detach(), None)
    close(adv, [0.5, -0.5])
    loss, met = compute_loss(a, logp, logp.detach(), adv, batch)
    close(loss, 0.625)
    assert met["loss/neg_weight_mean"] == pytest.approx(0.25)
    assert "loss/tis_weight_mean" not in met  # TIS is for the PPO clip loss only
    loss.backward()
    # d loss / d logp = -w A / 2: positive sample -0.5 / 2 = -0.25; negative -(0.25)(-0.5) / 2 = 0.0625
    close(logp.grad, [[-0.25, -0.25], [0.0625, 0.0625]])


def _cispo_batch():
    # one group, R = [1, 0] -> GRPO advantages [+1, -1]; logp = [[-1, -1], [-2, -2]]
    # behaviour ratios pi / mu = [[1.5, 0.5], [1.0, 2.0]] (log mu = logp - ln r)
    logp = t([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    behav = [[-1 - LN(1.5), -1 - LN(0.5)], [-2.0, -2 - LN(2.0)]]
    return _hand_batch([[1, 1], [1, 1]], behav, [1.0, 0.0]), logp


def test_cispo_clips_the_behaviour_ratio():
    # MiniMax-M1's CISPO has no lower clip (issue #40: it used 1 - clip_low = 0.8 here):
    # w = clip(r, 0, 1 + 0.28) = [[1.28, 0.5], [1.0, 1.28]]
    # loss = -(1/4) sum w A logp = -(1/4)[1.28 (-1) + 0.5 (-1) + 1.0 (-1)(-2) + 1.28 (-1)(-2)]
    #      = -(1/4)(-1.28 - 0.5 + 2 + 2.56) = -0.695   (with r = 1: -(1/4)(-1 - 1 + 2 + 2) = -0.5)
    batch, logp = _cispo_batch()
    a = AlgorithmConfig(name="cispo")
    adv, _ = compute_advantages(a, batch, logp.detach(), logp.detach(), None)
    loss, met = compute_loss(a, logp, logp.detach(), adv, batch)
    close(loss, -0.695, tol=1e-4)
    assert met["loss/clip_frac"] == pytest.approx(0.5)  # 1.5 and 2.0 were clipped, 0.5 was not
    assert "loss/tis_weight_mean" not in met
    loss.backward()
    close(logp.grad, [[-0.32, -0.125], [0.25, 0.32]], tol=1e-4)  # -w A / 4


def test_grpo_clips_against_the_proximal_policy_times_the_tis_weight():
    # decoupled PPO: ratio pi / pi_old = 1 (one update), TIS weight min(pi_old / mu, 2) = the same
    # behaviour ratios [[1.5, 0.5], [1.0, 2.0]]; loss = -(1/4)[1.5 + 0.5 - 1.0 - 2.0] = 0.25
    batch, logp = _cispo_batch()
    a = AlgorithmConfig(name="grpo")
    adv, _ = compute_advantages(a, batch, logp.detach(), logp.detach(), None)
    loss, met = compute_loss(a, logp, logp.detach(), adv, batch)
    close(loss, 0.25, tol=1e-4)
    assert met["loss/tis_weight_mean"] == pytest.approx((1.5 + 0.5 + 1.0 + 2.0) / 4, abs=1e-5)
    loss, met = compute_loss(AlgorithmConfig(name="grpo", tis_cap=0.0), logp, logp.detach(), adv, batch)
    close(loss, 0.0, tol=1e-6)  # without TIS: -(1/4)(1 + 1 - 1 - 1)
    assert "loss/tis_weight_mean" not in met


def test_ipa_masks_a_chunk_whose_behaviour_ratio_is_above_h_in_update_policy():
    """A real update_policy call (issue #40: the ROME paper's Eqs 7-9): the behaviour
    log-probs equal the policy's except on the second turn of group 0's winner, where
    mu = pi / 8, so pi_old / mu = 8 > H = 5 and that one-token chunk is masked out (before
    issue #40: a two-sided [0.5, 2] band on pi_theta / mu, and PPO's clip)."""
    policy = _tiny_policy()
    batch = collate(multi_turn_groups(), 0).to(policy.device)
    with torch.no_grad():
        logp, _ = token_logp(policy.forward, batch, 1.0)
    second_turn = (C.chunk_ids(batch.mask) == 1) & (torch.arange(batch.size, device=policy.device) == 0).unsqueeze(-1)
    assert second_turn.sum() == 1
    batch.behav_logp = torch.where(second_turn, logp - LN(8.0), logp)
    met = update_policy(policy, AlgorithmConfig(ipa=IPAConfig(enabled=True)), batch, 1.0)
    # Eq 7 with gamma 1: every chunk's return is its episode's reward, absolute (winners 1,
    # losers 0: a loser's tokens carry no gradient). One update, so pi_theta = pi_old and
    # rho = 1; winners' chunks are positive: l_t = -G log pi_t, token-mean over all 24
    # response tokens, the masked token counting 0 in the numerator
    assert sorted(batch.rewards.tolist()) == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    won = (batch.rewards > 0).unsqueeze(-1) & batch.mask & ~second_turn
    assert met["loss/chunk_mask_frac"] == pytest.approx(1 / 24)
    assert met["loss/pg"] == pytest.approx(float(-logp[won].sum() / 24), abs=1e-5)
    assert "loss/tis_weight_mean" not in met


# --------------------------------------------------------------------------- per-turn credit


def test_discounted_turn_credit_from_the_samples_turn_rewards():
    # the hand-computed case of test_credit.test_turn_advantages, through Batch and the config:
    # A plays 2 turns with rewards [0, 1], B one turn with -0.1; gamma 0.5
    batch = _hand_batch([[1, 1, 0, 1], [0, 1, 1, 0]], [[0.0] * 4] * 2, [1.0, -0.1],
                        turn_rewards=[[0.0, 1.0], [-0.1]])
    a = AlgorithmConfig(turn_credit="discounted", gamma=0.5)
    adv, _ = compute_advantages(a, batch, None, None, None)
    close(adv, [[0.9999967, 0.9999967, 0.0, 0.0], [0.0, -0.9999967, -0.9999967, 0.0]])
    # outcome credit: one GRPO advantage per sample from the summed rewards [1, -0.1] -> [1, -1]
    close(compute_advantages(AlgorithmConfig(), batch, None, None, None)[0], [1.0, -1.0])
    bad = _hand_batch([[1, 0, 1]], [[0.0] * 3], [1.0], turn_rewards=[[1.0]])  # 2 chunks, 1 reward
    with pytest.raises(ValueError, match="turn rewards"):
        compute_advantages(a, bad, None, None, None)


# --------------------------------------------------------------------------- micro-batches


def test_target_logp_in_checkpointed_slices_matches_log_softmax():
    # 8 positions in slices of 3 (3 + 3 + 2), temperature 0.7: values and gradients equal the
    # plain full-vocabulary log_softmax, with and without autograd
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 8, 11, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (2, 8), generator=g)
    weights = torch.randn(2, 8, generator=g)
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), logits)
    got = target_logp(logits, targets, 0.7, chunk=3)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), logits)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad_got, grad_expected)
    with torch.no_grad():
        torch.testing.assert_close(target_logp(logits, targets, 0.7, chunk=3), expected.detach())


def _logits_bytes(batch, rows: int) -> int:
    """fp32 logits of ``rows`` of ``batch``'s longest row over the tiny model's vocabulary."""
    return rows * int(batch.attention_mask.sum(-1).max()) * len(TinyTok()) * 4


def test_micro_rows_keep_a_forwards_logits_within_the_limit():
    batch = collate(multi_turn_groups(), 0)  # 6 rows
    two_and_a_half = _logits_bytes(batch, 1) * 2.5 / 2**20  # MiB
    vocab = len(TinyTok())
    assert micro_rows(EngineConfig(logits_mib=two_and_a_half), batch, vocab) == 2
    assert micro_rows(EngineConfig(logits_mib=1e-9), batch, vocab) == 1  # never below one row
    assert micro_rows(EngineConfig(logits_mib=two_and_a_half * 3), batch, vocab) == 0  # 6 rows fit: one pass
    assert micro_rows(EngineConfig(logits_mib=0), batch, vocab) == 0  # off
    assert micro_rows(EngineConfig(logits_mib=1e-9, micro_batch_size=4), batch, vocab) == 4  # the user's wins
    with pytest.raises(ConfigError, match="engine.logits_mib"):
        EngineConfig(logits_mib=-1).validate("engine")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
@pytest.mark.parametrize("cut", ["micro_batch_size", "logits_mib"])
def test_micro_batches_take_the_same_step_as_one_pass(agg, engine, cut):
    """micro_batch_size=2, or a logits limit that holds 2.5 rows' logits, splits the 6 samples
    (3, 4, 5, 3, 4, 5 response tokens) into 3 micro-batches whose gradients accumulate into one
    optimizer step: the same loss, gradient norm (before clipping) and parameters as one pass.
    A per-micro-batch normalisation would weigh the micro-batches' tokens differently and
    change all three. DeepSpeed (ZeRO-1) accumulates across micro-batches and is compared with
    the one-pass torch step. Every forward of the split policy holds at most 2 rows."""
    a = AlgorithmConfig(loss_agg=agg, kl_coef=0.05)
    lm_ref = _tiny_policy().module.lm
    ref = lambda ids, m: (lm_ref(input_ids=ids, attention_mask=m).logits, None)  # noqa: E731
    whole = _tiny_policy(EngineConfig(lr=0.01, grad_clip=0.0, logits_mib=0))
    batch = collate(multi_turn_groups(), 0).to(whole.device)
    limit = ({"micro_batch_size": 2} if cut == "micro_batch_size"
             else {"logits_mib": _logits_bytes(batch, 1) * 2.5 / 2**20})  # 2.5 rows' logits
    split = _tiny_policy(EngineConfig(kind=engine, zero_stage=1, lr=0.01, grad_clip=0.0, **limit))
    rows, forward = [], split.forward
    split.forward = lambda ids, *args, **kw: rows.append(len(ids)) or forward(ids, *args, **kw)
    with torch.no_grad():
        aux = {"ref_logp": token_logp(ref, batch, 1.0)[0]}
    mets = [update_policy(p, a, batch, 1.0, aux=aux) for p in (whole, split)]
    assert rows == [2, 2, 2] * 2  # the no-grad pass for the proximal log-probs, then the update
    for k in ("loss/total", "loss/pg", "loss/kl", "grad_norm"):
        assert mets[1][k] == pytest.approx(mets[0][k], rel=1e-4, abs=1e-6), k
    w0, w1 = whole.sync_state_dict(), split.sync_state_dict()
    assert any(not torch.equal(w0[k], v) for k, v in _tiny_policy().sync_state_dict().items())  # it moved
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- runs


def test_package_entry_point_trains_from_a_dict_with_the_configured_format_penalty(tmp_path):
    """``rockroll.trainer.train(dict)``; FrozenLake scores a reply without a move with
    algorithm.format_penalty (-0.37, not the env's -0.1) and the goal with 1, nothing else, so
    every step's mean reward is -0.37 * mean format errors + mean success."""
    from rockroll.trainer.config import config_to_dict

    data = config_to_dict(_cfg(tmp_path, algorithm__format_penalty=-0.37, logging__tensorboard=False,
                               logging__plot=False))
    out = rockroll.trainer.train(data)
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1]
    assert sum(h["rollout/format_errors"] for h in hist) > 0  # the untrained policy babbles
    for h in hist:
        assert h["rollout/reward"] == pytest.approx(-0.37 * h["rollout/format_errors"] + h["rollout/success"])


def test_resume_with_async_rollout_trains_on_the_saved_buffer(tmp_path):
    """alpha = 2: at the checkpoint the rollout has run ahead, so groups finished under the
    old weights wait in the buffer. They are saved, and the resumed run's first step trains on
    the first of them (exactly: its samples, and the loss of the checkpoint's weights on them).
    Which groups finish first depends on thread timing, so two runs are not compared."""
    from rockroll.trainer.models import load_tokenizer

    ckpt = tmp_path / "ckpt"
    common = {"checkpoint__dir": str(ckpt), "checkpoint__every": 2, "rollout__async_ratio": 2,
              "rollout__batch_groups": 1, "logging__tensorboard": False, "logging__plot": False}
    train(_cfg(tmp_path, steps=2, **common))
    saved = torch.load(ckpt / "step_000002" / "state.pt", weights_only=False)["rollout"]["ready"]
    assert saved  # started under versions 0 and 1 ((1 + 2 + 1) groups), 2 used by steps 0 and 1
    resumed = train(_cfg(tmp_path, steps=3, **common))
    assert resumed["start_step"] == 2 and [h["step"] for h in resumed["history"]] == [2]
    step2 = resumed["history"][0]
    first = saved[0]["samples"]
    assert step2["rollout/samples"] == len(first)
    assert step2["rollout/reward"] == pytest.approx(sum(s["reward"] for s in first) / len(first))
    logged = [json.loads(x) for x in (tmp_path / "run" / "transcripts" / "step_000002.jsonl").read_text().splitlines()]
    assert [(r["group_id"], r["transcript"], r["reward"]) for r in logged] == \
        [(s["group_id"], s["transcript"], s["reward"]) for s in first[: len(logged)]]
    # the step's loss is the checkpoint's weights updated on the saved group
    cfg = _cfg(tmp_path, steps=3, **common)
    tok = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    policy = make_policy(ActorModule(build_model(cfg.model, tok, cfg.seed), with_value=False), cfg.engine, 3)
    policy.load(ckpt / "step_000002")
    group = Group(**{**saved[0], "samples": [Sample(**s) for s in first]})
    met = update_policy(policy, cfg.algorithm, collate([group], tok.pad_token_id), cfg.generation.temperature)
    assert met["loss/total"] == pytest.approx(step2["loss/total"], abs=1e-6)
