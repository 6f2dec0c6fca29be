"""AsyPPO (mini-critics, uncertainty-aware loss), the entropy metric and bonus, and RAFT:
the maths on hand-computed tensors, the critics' shards, and runs through ``train()``."""

import math

import pytest
import torch

from rockroll.trainer.algorithms import pg as A
from rockroll.trainer.config import (
    AlgorithmConfig, ConfigError, CriticsConfig, EngineConfig, ModelConfig, RAFTConfig, load_config,
)
from rockroll.trainer.controller import train
from rockroll.trainer.roles.critics import CriticsRole, shard_of_rows, shards
from rockroll.trainer.models import build_model
from rockroll.trainer.engines.policy import ActorModule, make_policy
from rockroll.trainer.rollout.types import Group, Sample
from rockroll.trainer.roles.update import collate, compute_loss, token_entropy, token_logp, update_policy

from _tensors import close, t  # noqa: E402
from _tiny import TinyTok, multi_turn_groups, run_config  # noqa: E402

M = [[1, 1, 1, 0], [1, 1, 0, 0]]


# ----------------------------------------------------------------------------- the maths


def test_uncertainty_masks_by_quantiles_of_the_masked_stds():
    # masked stds 0.1 0.5 0.9 0.3 0.7 (n = 5); the unmasked 0.0 and 9.0 must not count.
    # quantile 0.25: floor(1.25) = 1 lowest (0.1) agree; 0.75: floor(1.25) = 1 highest (0.9) disagree
    std = t([[0.1, 0.5, 0.9, 0.0], [0.3, 0.7, 9.0, 9.0]])
    agree, disagree = A.uncertainty_masks(std, t(M), mask_quantile=0.25, entropy_quantile=0.75)
    assert agree.tolist() == [[True, False, False, False], [False, False, False, False]]
    assert disagree.tolist() == [[False, False, True, False], [False, False, False, False]]
    agree, disagree = A.uncertainty_masks(std, t(M), mask_quantile=0.5, entropy_quantile=0.5)
    assert agree.tolist() == [[True, False, False, False], [True, False, False, False]]  # 0.1, 0.3
    assert disagree.tolist() == [[False, False, True, False], [False, True, False, False]]  # 0.9, 0.7
    # 1 - 0.8 is 0.19999...: still 2 of 10 states
    _, disagree = A.uncertainty_masks(torch.arange(10.0).view(2, 5), torch.ones(2, 5), mask_quantile=0,
                                      entropy_quantile=0.8)
    assert disagree.flatten().tolist() == [False] * 8 + [True] * 2
    # quantile 0 / 1 switch the effects off
    agree, disagree = A.uncertainty_masks(std, t(M), mask_quantile=0.0, entropy_quantile=1.0)
    assert not agree.any() and not disagree.any()
    # ties (identical states) by position: the earlier ones rank lower
    agree, disagree = A.uncertainty_masks(torch.zeros(2, 4), t(M), mask_quantile=0.4, entropy_quantile=0.6)
    assert agree.tolist() == [[True, True, False, False], [False, False, False, False]]
    assert disagree.tolist() == [[False, False, False, False], [True, True, False, False]]


def test_gae_on_the_mean_of_the_critics():
    """AsyPPO's baseline is the critics' mean: V = mean(0.2 0.4 | 0.6 0.0) = (0.4, 0.2); reward
    1 on the last token, gamma = lam = 1: A_1 = 1 - 0.2 = 0.8, A_0 = (0 + 0.2 - 0.4) + 0.8 = 0.6;
    returns = A + V = (1.0, 1.0)."""
    v = torch.stack([t([[0.2, 0.4]]), t([[0.6, 0.0]])]).mean(0)
    r = A.outcome_on_last_token(t([1.0]), t([[1, 1]]))
    adv, ret = A.gae(r, v, t([[1, 1]]), gamma=1.0, lam=1.0)
    close(adv, [[0.6, 0.8]])
    close(ret, [[1.0, 1.0]])
    close(A.outcome_on_last_token(t([2.0, 3.0]), t(M)), [[0, 0, 2, 0], [0, 3, 0, 0]])


def test_raft_accepts_the_best_of_each_group_above_the_threshold():
    r = t([0.0, 1.0, 0.5, 1.0, 0.2, 0.2, -1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    # group 0 ranks 1(1.0) 3(1.0, later) 2(0.5) 0; group 1 ranks 4 5 (tie: earlier first) 6
    assert A.raft_accept(r, g, top_k=1).tolist() == [0, 1, 0, 0, 1, 0, 0]
    assert A.raft_accept(r, g, top_k=2).tolist() == [0, 1, 0, 1, 1, 1, 0]
    assert A.raft_accept(r, g, top_k=2, min_reward=0.3).tolist() == [0, 1, 0, 1, 0, 0, 0]
    assert A.raft_accept(r, g, top_k=0, min_reward=0.0).tolist() == [0, 1, 1, 1, 1, 1, 0]
    # an episode split into two rows (weights 1/2) counts once: both its rows are the best one
    w = t([1.0, 0.5, 0.5, 1.0])
    acc = A.raft_accept(t([0.0, 1.0, 1.0, 0.5]), torch.tensor([0, 0, 0, 0]), top_k=1, weights=w)
    assert acc.tolist() == [0, 1, 1, 0]


def test_sft_loss_is_the_nll_of_the_accepted_tokens():
    logp = t([[-1.0, -2.0, -9.0, 0.0], [-3.0, -4.0, 0.0, 0.0]]).requires_grad_()
    loss, met = A.sft_loss(logp, t([1.0, 0.0]), t(M))
    close(loss, (1.0 + 2.0 + 9.0) / 5)  # token-mean over all 5 response tokens, rejected ones weigh 0
    close(met["nll_accepted"], 4.0)
    close(met["accepted_frac"], 0.5)
    loss.backward()
    close(logp.grad, [[-0.2, -0.2, -0.2, 0], [0, 0, 0, 0]])


def test_token_entropy_of_known_distributions():
    V = 8
    logits = torch.zeros(2, 3, V)
    logits[1, 0, 0] = 1e4  # one-hot
    ent = token_entropy(logits, 1.0, chunk=2)
    close(ent, [[math.log(V)] * 3, [0.0, math.log(V), math.log(V)]])
    # over allowed ids only (constrained decoding): log 3; temperature divides the logits
    close(token_entropy(logits, 1.0, allowed=torch.tensor([1, 2, 3]))[0], [math.log(3)] * 3)
    two = torch.tensor([[[0.0, math.log(3.0)]]])  # p = (1/4, 3/4) at T=1
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(token_entropy(two, 1.0), [[h]])
    close(token_entropy(two * 2, 2.0), [[h]])


def test_entropy_bonus_only_on_the_entropy_mask():
    """loss -= c * sum(H over entropy_mask) / #mask: dloss/dH_t = -c / 5 on the kept tokens,
    0 on the excluded one and off the mask; the metric is the plain token mean of H."""
    a = AlgorithmConfig(name="grpo", entropy_coef=0.1)
    b = collate(multi_turn_groups(), 0)
    b = b.select(torch.arange(2))
    m = torch.zeros_like(b.mask)
    m[0, :3], m[1, :2] = True, True
    b.mask = m
    ent = torch.rand(m.shape).requires_grad_()
    zero = torch.zeros(m.shape)
    keep = m.clone()
    keep[0, 2] = False  # excluded: the critics disagree there
    loss, met = compute_loss(a, zero, zero, torch.zeros(2), b, entropy=ent, entropy_mask=keep)
    loss.backward()
    expected = torch.where(keep, -0.1 / 5, 0.0)
    close(ent.grad, expected.tolist())
    close(met["loss/entropy"], float(ent.detach()[m].mean()))
    close(met["loss/entropy_bonus"], float(ent.detach()[keep].sum() / 5))


def test_config_keys_are_validated():
    cfg = load_config({"algorithm": {"name": "asyppo", "critics": {"count": 3, "lr": 0.01}}})
    assert cfg.algorithm.critics == CriticsConfig(count=3, lr=0.01)
    # the paper's quantiles: 20 % lowest sigma masked, the top 40 % out of the entropy bonus (Fig 7c)
    assert (cfg.algorithm.critics.mask_quantile, cfg.algorithm.critics.entropy_quantile) == (0.2, 0.6)
    # each prompt's responses are split among the critics: more critics than responses is an error
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config({"algorithm": {"name": "asyppo", "critics": {"count": 3}}, "rollout": {"group_size": 2,
                                                                                          "batch_groups": 8}})
    for bad, key in [({"name": "asyppo", "critics": {"count": 1}}, "algorithm.critics.count"),
                     ({"name": "asyppo", "critics": {"hidden": 4}}, "algorithm.critics.hidden"),
                     ({"name": "asyppo", "critics": {"mask_quantile": 1.5}}, "algorithm.critics.mask_quantile"),
                     ({"name": "asyppo", "critics": {"count": 9}}, "algorithm.critics.count"),  # > group_size
                     ({"name": "grpo", "critics": {"count": 3}}, "algorithm.critics"),
                     ({"name": "grpo", "raft": {"top_k": 2}}, "algorithm.raft"),
                     ({"name": "raft", "raft": {"top_k": -1}}, "algorithm.raft.top_k"),
                     ({"name": "raft", "raft": {"top_k": 0}}, "algorithm.raft.top_k"),
                     ({"name": "grpo", "entropy_coef": -1}, "algorithm.entropy_coef")]:
        with pytest.raises(ConfigError) as e:
            load_config({"algorithm": bad})
        assert e.value.key == key, (bad, e.value)
    assert load_config({"algorithm": {"name": "raft", "raft": {"top_k": 0, "min_reward": 0.5}}}).algorithm.raft == \
        RAFTConfig(top_k=0, min_reward=0.5)


# ----------------------------------------------------------------------------- the critics


def _same_text_groups(n_groups=4, size=2):
    """Groups whose samples are one and the same token sequence; within every group response
    0 earns 1 and response 1 earns 0 (issue #40: the shards split each prompt's responses)."""
    ids, mask = [5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1]
    return [Group(g, "e", None, 0, [Sample(token_ids=ids, mask=mask, behav_logp=[0.0] * 6,
                                           reward=float(j % 2 == 0), group_id=g, version=0)
                                    for j in range(size)]) for g in range(n_groups)]


def test_shards_split_every_prompts_responses_across_the_critics():
    """AsyPPO (arXiv 2510.01656, section 4.1): response i of every prompt goes to critic
    i mod M, so every critic sees every prompt and no response is seen twice. Three prompts
    with 3, 2 and 1 responses, M = 2: critic 0 gets responses 0 and 2 of prompt 0, response 0
    of prompts 1 and 2; critic 1 response 1 of prompts 0 and 1. (Before issue #40 whole groups
    were dealt round robin: critic 0 got prompts {0, 2}, critic 1 prompt {1}.)"""
    groups = [Group(g, "e", None, 0, [Sample(token_ids=[1, 2], mask=[0, 1], behav_logp=[0.0] * 2,
                                             reward=float(j), group_id=g, version=0) for j in range(n)])
              for g, n in enumerate([3, 2, 1])]
    parts = shards(groups, 2)
    assert [[(g.group_id, [s.reward for s in g.samples]) for g in part] for part in parts] == [
        [(0, [0.0, 2.0]), (1, [0.0]), (2, [0.0])], [(0, [1.0]), (1, [1.0])]]
    # the rows of collate(groups): prompt 0's responses 0 1 2, prompt 1's 0 1, prompt 2's 0
    assert shard_of_rows(groups, 2).tolist() == [0, 1, 0, 0, 1, 0]


def test_each_critic_learns_from_its_own_responses_only(tmp_path):
    """Two critics, four groups of two responses of one identical text: response 0 of every
    group earns 1, response 1 earns 0. Critic 0 trains on the responses 0, critic 1 on the
    responses 1 (every critic sees every prompt): each learns its shard's return (1 and 0)
    for the very same states; critics dealt whole groups (the pre-issue-#40 split) would both
    learn 0.5. Their mean is then 0.5 and their std 0.5."""
    cfg = run_config(tmp_path, algorithm__name="asyppo", algorithm__gamma=1.0, algorithm__lam=1.0,
                     algorithm__critics={"count": 2, "hidden_size": 16, "intermediate_size": 16, "lr": 0.02},
                     rollout__batch_groups=4)
    role = CriticsRole(cfg, None, TinyTok())
    groups = _same_text_groups()
    losses = []
    for _ in range(60):
        aux = role.annotate(groups)
        losses.append(role.train(groups, aux)["critic/value_loss"])
    assert role.seen == [[[g, 0] for g in range(4)], [[g, 1] for g in range(4)]]
    m = collate(groups, 0).mask
    with torch.no_grad():
        v = [role._values(c, collate(groups, 0)) for c in role.critics]
    assert (v[0][m] - 1).abs().max() < 0.1 and v[1][m].abs().max() < 0.1
    aux = role.annotate(groups)
    assert (aux["values"][m] - 0.5).abs().max() < 0.1 and (aux["value_std"][m] - 0.5).abs().max() < 0.1
    assert losses[-1] < 0.1 * losses[0]


def _tiny_policy():
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    return make_policy(ActorModule(lm, with_value=False), EngineConfig(lr=0.01), batch_size=6)


def test_agreed_states_get_no_policy_gradient():
    """update_policy for asyppo with hand-made critic annotations: the positions whose std is
    below the mask quantile have advantage 0, so their logits get exactly no gradient (the
    entropy bonus off); every other response position gets some. Metrics: the fractions."""
    groups = multi_turn_groups()
    batch = collate(groups, 0)
    torch.manual_seed(0)
    std = torch.rand(batch.mask.shape)
    aux = {"values": torch.randn(batch.mask.shape) * 0.1, "value_std": std}
    a = AlgorithmConfig(name="asyppo", critics=CriticsConfig(mask_quantile=0.4, entropy_quantile=0.9))
    policy = _tiny_policy()
    grads = []

    def keep_logit_grad(module, inputs, logits):  # returns None: the output stays as it is
        if logits.requires_grad:
            logits.register_hook(grads.append)

    hook = policy.module.lm.lm_head.register_forward_hook(keep_logit_grad)
    try:
        met = update_policy(policy, a, batch, 1.0, aux=aux)
    finally:
        hook.remove()
    agree, disagree = A.uncertainty_masks(std, batch.mask, mask_quantile=0.4, entropy_quantile=0.9)
    (g,) = grads
    # the logits start at the first position that predicts a response token (trim_prompt): pad back
    g = torch.nn.functional.pad(g, (0, 0, batch.input_ids.shape[1] - g.shape[1], 0))
    g = g[:, :-1].abs().sum(-1)  # position t predicts target t
    assert agree.any() and (g[agree] == 0).all()
    assert (g[batch.mask & ~agree] > 0).all()
    close(met["asyppo/adv_masked_frac"], float(agree.sum() / batch.mask.sum()))
    assert 0 < disagree.sum() < agree.sum()
    close(met["asyppo/entropy_excluded_frac"], float(disagree.sum() / batch.mask.sum()))
    assert met["loss/entropy"] > 0


@pytest.mark.parametrize("name", ["grpo", "ppo", "topr", "cispo", "reinforce_pp", "raft"])
def test_entropy_metric_for_every_algorithm(name):
    """loss/entropy is the token mean of the policy's entropy over the response tokens."""
    groups = multi_turn_groups()
    batch = collate(groups, 0)
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    policy = make_policy(ActorModule(lm, with_value=name == "ppo"), EngineConfig(lr=0.01), batch_size=6)
    with torch.no_grad():
        _, _, ent = token_logp(policy.forward, batch, 1.0, with_entropy=True)
    met = update_policy(policy, AlgorithmConfig(name=name), batch, 1.0)
    close(met["loss/entropy"], float(ent[batch.mask].mean()))


# ----------------------------------------------------------------------------- runs


def test_asyppo_run_through_train(tmp_path):
    """A tiny FrozenLake run with algorithm asyppo: the critics' value loss falls, and every
    AsyPPO and entropy metric is logged."""
    cfg = run_config(tmp_path, steps=8, algorithm__name="asyppo", algorithm__entropy_coef=0.01,
                     algorithm__critics={"hidden_size": 16, "intermediate_size": 16, "lr": 0.01},
                     logging__tensorboard=False, logging__plot=False)
    hist = train(cfg)["history"]
    for h in hist:
        for k in ("critic/0/value_loss", "critic/1/value_loss", "asyppo/adv_masked_frac",
                  "asyppo/entropy_excluded_frac", "loss/entropy", "loss/entropy_bonus"):
            assert math.isfinite(h[k]), k
    first = sum(h["critic/value_loss"] for h in hist[:2]) / 2
    last = sum(h["critic/value_loss"] for h in hist[-2:]) / 2
    assert last < 0.5 * first, [h["critic/value_loss"] for h in hist]
    assert 0 < hist[-1]["asyppo/adv_masked_frac"] < 0.5


def test_raft_raises_the_likelihood_of_accepted_samples():
    """Three RAFT steps on the hand-made batch: the accepted samples (best of each group)
    gain log-probability, and only the accepted ones are trained on."""
    groups = multi_turn_groups()
    batch = collate(groups, 0)
    policy = _tiny_policy()
    a = AlgorithmConfig(name="raft", raft=RAFTConfig(top_k=1, min_reward=0.5))
    acc = A.raft_accept(batch.rewards, batch.group_ids, top_k=1, min_reward=0.5).bool()
    assert acc.tolist() == [True, False, False, False, True, False]

    def seq_logp():
        with torch.no_grad():
            lp, _ = token_logp(policy.forward, batch, 1.0)
        return torch.where(batch.mask, lp, 0.0).sum(-1)

    before = seq_logp()
    for _ in range(3):
        met = update_policy(policy, a, batch, 1.0)
    after = seq_logp()
    assert (after[acc] > before[acc] + 0.5).all(), (before, after)
    close(met["loss/accepted_frac"], 2 / 6)


# ----------------------------------------------------------------------------- checkpoints


def _critic_tensors(role):
    """Every tensor of the critics' state: parameters and optimizer moments, by name."""
    out = {}
    for i, (c, o) in enumerate(zip(role.critics, role.optimizers)):
        out.update({f"{i}/{k}": v for k, v in c.state_dict().items()})
        for p, st in o.state_dict()["state"].items():
            out.update({f"{i}/opt/{p}/{k}": v for k, v in st.items() if torch.is_tensor(v)})
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_the_critics_state_round_trips_bit_exactly(tmp_path):
    """state_dict -> file -> a freshly built role's load_state_dict: the same parameters and Adam
    moments, bit for bit, and the next training step is the same on both; the saved state is a
    copy that later training does not touch."""
    cfg = run_config(tmp_path, algorithm__name="asyppo",
                     algorithm__critics={"count": 2, "hidden_size": 16, "intermediate_size": 16, "lr": 0.02},
                     rollout__batch_groups=4)
    groups = _same_text_groups()
    a = CriticsRole(cfg, None, TinyTok())
    for _ in range(2):
        a.train(groups, a.annotate(groups))
    torch.save(a.state_dict(), tmp_path / "critics.pt")
    saved = torch.load(tmp_path / "critics.pt", weights_only=False)
    b = CriticsRole(cfg, None, TinyTok())
    assert not all(torch.equal(x, y) for x, y in zip(_critic_tensors(a).values(), _critic_tensors(b).values()))
    b.load_state_dict(saved)
    _assert_same(_critic_tensors(a), _critic_tensors(b))
    assert b.seen == a.seen == [[[g, 0] for g in range(4)], [[g, 1] for g in range(4)]]
    ma, mb = a.train(groups, a.annotate(groups)), b.train(groups, b.annotate(groups))
    assert ma == mb
    _assert_same(_critic_tensors(a), _critic_tensors(b))
    assert not torch.equal(saved["critics"][0]["head.weight"], a.critics[0].head.weight)  # a copy, not the live one
    bad = run_config(tmp_path, algorithm__name="asyppo", algorithm__critics={"count": 3, "hidden_size": 16,
                     "intermediate_size": 16}, rollout__batch_groups=4)
    with pytest.raises(ValueError, match="holds 2 critics, algorithm.critics.count is 3"):
        CriticsRole(bad, None, TinyTok()).load_state_dict(saved)


def test_asyppo_resume_restores_the_critics_and_continues_as_a_straight_run(tmp_path):
    """4 steps straight vs 2 steps, a checkpoint, and a resume for 2 more: the checkpoint's
    critics are those the first run ended with (bit for bit), and the resumed run's critic
    losses, policy losses and final critics are the straight run's (critics that restarted
    from scratch would regress from their initial values again)."""
    common = {"steps": 4, "checkpoint__every": 2, "logging__tensorboard": False, "logging__plot": False,
              "rollout__async_ratio": 0, "algorithm__name": "asyppo",
              "algorithm__critics": {"hidden_size": 16, "intermediate_size": 16, "lr": 0.01}}
    straight = train(run_config(tmp_path / "a", checkpoint__dir=str(tmp_path / "a" / "ckpt"), **common))
    ckpt = tmp_path / "b" / "ckpt"
    first = train(run_config(tmp_path / "b", checkpoint__dir=str(ckpt), **{**common, "steps": 2}))
    saved = torch.load(ckpt / "step_000002" / "roles.pt", weights_only=False)
    assert set(saved) == {"critics"}
    (role,) = first["batch_roles"]
    for c, s in zip(role.critics, saved["critics"]["critics"]):
        _assert_same(c.state_dict(), s)
    resumed = train(run_config(tmp_path / "b", checkpoint__dir=str(ckpt), **common))
    assert resumed["start_step"] == 2
    both = first["history"] + resumed["history"]
    for key in ("critic/0/value_loss", "critic/1/value_loss", "loss/total", "rollout/reward"):
        assert [h[key] for h in straight["history"]] == pytest.approx([h[key] for h in both], abs=1e-6), key
    for c, d in zip(straight["batch_roles"][0].critics, resumed["batch_roles"][0].critics):
        for k, v in c.state_dict().items():
            torch.testing.assert_close(v, d.state_dict()[k], atol=1e-6, rtol=1e-5)
