"""Attention-rhythm credit: WAAD, FAI and the three credit schemes on hand-built attention
maps and signals (rockroll.trainer.rhythm); the attention role on a tiny model; its credit
in the update and in a tiny training run."""

import pytest
import torch

from rockroll.trainer.algorithms import rhythm as R
from rockroll.trainer.config import AlgorithmConfig, ConfigError, EngineConfig, IPAConfig, ModelConfig, load_config
from rockroll.trainer.controller import train
from rockroll.trainer.models import build_model
from rockroll.trainer.engines.policy import ActorModule, make_policy
from rockroll.trainer.roles.local import AttentionRole, LocalRoles, batch_role_classes
from rockroll.trainer.roles.update import collate, update_policy

from _tensors import close, t  # noqa: E402
from _tiny import TinyTok, multi_turn_groups, run_config  # noqa: E402

# a causal attention map: row t (a query) over keys s <= t, each row sums to 1
ATTN = t([[1.0, 0.0, 0.0, 0.0],
          [0.5, 0.5, 0.0, 0.0],
          [0.2, 0.3, 0.5, 0.0],
          [0.1, 0.2, 0.3, 0.4]])


# ----------------------------------------------------------------------------- WAAD and FAI


def test_waad_weighs_each_distance_clipped_at_the_window():
    # row 3, window 2: 0.1 * min(3, 2) + 0.2 * 2 + 0.3 * 1 + 0.4 * 0
    close(R.waad(ATTN, window=2), [0.0, 0.5, 0.2 * 2 + 0.3, 0.1 * 2 + 0.2 * 2 + 0.3])
    close(R.waad(ATTN, window=10), [0.0, 0.5, 0.7, 0.1 * 3 + 0.2 * 2 + 0.3])
    close(R.waad(ATTN[None].expand(3, 4, 4), window=1), [[0.0, 0.5, 0.5, 0.6]] * 3)  # batched


def test_fai_is_the_mean_attention_from_later_counted_queries():
    # H = [1, 100] (every later query)
    close(R.fai(ATTN[None], torch.ones(1, 4, dtype=torch.bool), 1, 100), [[0.8 / 3, 0.25, 0.3, 0.0]])
    # row 2 does not count: key 0 gets (0.5 + 0.1) / 2, key 1 only row 3's 0.2
    close(R.fai(ATTN[None], torch.tensor([[True, True, False, True]]), 1, 100), [[0.3, 0.2, 0.3, 0.0]])
    close(R.fai(ATTN[None], torch.zeros(1, 4, dtype=torch.bool), 1, 100), [[0.0, 0.0, 0.0, 0.0]])


def test_fai_averages_only_the_queries_h_lo_to_h_hi_later():
    """The paper's FAI_s = mean over t in [s + H_lo, s + H_hi] (issue #40: it was every later
    row, H_lo = 1 and no upper bound). H = [2, 2]: key s from row s + 2 only; H = [1, 1]: from
    row s + 1; the default H = [10, 100] sees nothing in a 4-token map."""
    rows = torch.ones(1, 4, dtype=torch.bool)
    close(R.fai(ATTN[None], rows, 2, 2), [[0.2, 0.2, 0.0, 0.0]])
    close(R.fai(ATTN[None], rows, 1, 1), [[0.5, 0.3, 0.3, 0.0]])
    close(R.fai(ATTN[None], rows, 2, 3), [[0.15, 0.2, 0.0, 0.0]])
    close(R.fai(ATTN[None], rows), [[0.0] * 4])


def test_split_heads_takes_the_most_local_and_the_most_global_heads():
    """Three heads, ranked by their mean look-back: a diagonal head (span 0), ATTN (spans
    0, 0.5, 0.7, 1.0: mean 0.55) and a head that attends to token 0 only (spans 0..3: 1.5).
    head_fraction 0.3 of 3 heads: ceil(0.9) = 1 each: local = the diagonal one, global = the
    token-0 one, whatever their order."""
    diag, first = torch.eye(4), torch.zeros(4, 4)
    first[:, 0] = 1.0
    heads = torch.stack([ATTN, first, diag])[None]  # (1, 3, 4, 4)
    close(R.head_spans(heads, torch.ones(1, 4, dtype=torch.bool)), [[0.55, 1.5, 0.0]])
    local, glob = R.split_heads(heads, torch.ones(1, 4, dtype=torch.bool), 0.3)
    close(local, diag[None].tolist())
    close(glob, first[None].tolist())
    # 0.5 of 3: ceil(1.5) = 2 heads each: local = mean(diag, ATTN), global = mean(ATTN, first)
    local, glob = R.split_heads(heads, torch.ones(1, 4, dtype=torch.bool), 0.5)
    close(local, ((diag + ATTN) / 2)[None].tolist())
    close(glob, ((ATTN + first) / 2)[None].tolist())


def test_action_signals_take_row_and_column_t_plus_one():
    """Position t of the mask holds token t+1: the paper gives token t+1 its own row (its
    query's look-back) and its own column (issue #40: it used to get row t, one token early).
    FAI counts later response tokens only (tokens 2 and 3)."""
    mask = torch.tensor([[False, True, True]])  # tokens 2 and 3 are the response
    w, f = R.action_signals(ATTN[None], ATTN[None], mask, window=2, fai_lo=1, fai_hi=100)
    close(w, [[0.5, 0.7, 0.1 * 2 + 0.2 * 2 + 0.3]])
    # token 1 (position 0, a prompt token): rows 2 and 3 give 0.3 and 0.2; token 2: row 3's 0.3;
    # token 3 no later token
    close(f, [[0.25, 0.3, 0.0]])
    # WAAD from the local map, FAI from the global one
    w, f = R.action_signals(torch.eye(4)[None], ATTN[None], mask, window=2, fai_lo=1, fai_hi=100)
    close(w, [[0.0, 0.0, 0.0]])
    close(f, [[0.25, 0.3, 0.0]])


def test_next_and_previous_response_positions_skip_observations():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 0, 0]], dtype=torch.bool)
    assert R.next_action(mask).tolist() == [[1, 4, 4, 4, 5, 6], [1, 3, 3, 6, 6, 6]]
    assert R.prev_action(mask).tolist() == [[-1, 0, 1, 1, 1, 4], [-1, -1, 1, 1, 3, 3]]


def test_top_fraction_counts_the_response_and_keeps_to_the_eligible():
    score = t([[5.0, 4.0, 3.0, 2.0, 1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    assert R.top_fraction(score, mask, mask, 0.4).tolist() == [[True, True, False, False, False]]  # ceil(2.0)
    assert R.top_fraction(score, mask, mask, 0.3).sum() == 2  # ceil(1.5)
    many = torch.ones(1, 25, dtype=torch.bool)
    assert R.top_fraction(torch.arange(25.0)[None], many, many, 0.28).sum() == 7  # 0.28 * 25 is 7.000000000000001
    eligible = torch.tensor([[False, True, False, False, True]])
    assert R.top_fraction(score, eligible, mask, 1.0).tolist() == [eligible[0].tolist()]


def test_middle_layers_spread_over_the_middle_third():
    assert R.middle_layers(36, 3) == [12, 18, 23]
    assert R.middle_layers(9, 2) == [3, 5]
    assert R.middle_layers(12, 10) == [4, 5, 6, 7]
    assert R.middle_layers(2, 3) == [0, 1] and R.middle_layers(1, 3) == [0]


# ----------------------------------------------------------------------------- credit schemes

# Row 0: prompt token then 5 response tokens. |WAAD_t - WAAD_next| to the next response
# token: 4 (pos 1), 3, 3.5 (pos 3), 2.5, none: pre-planning {1, 3}; the top-2 FAI response
# tokens (anchors) are 5 and 2 (position 0's 0.9 is the prompt's). Row 1: two turns with an
# observation (2, 3) between; position 1's next response token is 4 (not the observation's
# high WAAD): |6 - 0| = 6; position 0: |2 - 6| = 4 (a rise counts: the paper's Delta is an
# absolute change; before issue #40 only drops did), position 4: 1: pre-planning {0, 1};
# anchors 4 and 0.
MASK = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1]], dtype=torch.bool)
WAAD = t([[9.0, 5.0, 1.0, 4.0, 0.5, 3.0], [2.0, 6.0, 9.0, 9.0, 0.0, 1.0]])
FAI = t([[0.9, 0.1, 0.3, 0.2, 0.05, 0.6], [0.45, 0.1, 0.9, 0.9, 0.5, 0.2]])


def _scale(scheme, waad=WAAD, fai=FAI, mask=MASK, **kw):
    args = dict(top_k=0.4, amplify_preplan=0.5, amplify_anchor=1.0, pass_fraction=0.5)
    return R.credit_scale(waad, fai, mask, scheme=scheme, **{**args, **kw})


def test_preplan_and_anchor_tokens():
    assert R.preplan_tokens(WAAD, MASK, 0.4).nonzero().tolist() == [[0, 1], [0, 3], [1, 0], [1, 1]]
    assert R.anchor_tokens(FAI, MASK, 0.4).nonzero().tolist() == [[0, 2], [0, 5], [1, 0], [1, 4]]


def test_local_chunk_amplifies_preplan_tokens():
    close(_scale("local_chunk"), [[1, 1.5, 1, 1.5, 1, 1], [1.5, 1.5, 1, 1, 1, 1]])


def test_global_anchor_amplifies_top_fai_tokens():
    close(_scale("global_anchor"), [[1, 1, 2, 1, 1, 2], [2, 1, 1, 1, 2, 1]])
    torch.testing.assert_close(_scale("global_anchor", top_k=1.0), torch.where(MASK, 2.0, 1.0))  # all of it


def test_coupled_passes_part_of_an_anchors_credit_to_a_preplan_token_within_k():
    """The paper's coupling: a pre-planning token within the last k (default 3) tokens before
    the anchor, the nearest one (issue #40: it was the previous response token only).
    Row 0: anchor 2 <- pre-planning 1 (k = 1); anchor 5 <- pre-planning 3 (k = 2, 4 is not
    one): 1 + 0.5 each, and + 0.5 to 1 and 3. Row 1: anchor 0 is pre-planning itself (keeps
    2); anchor 4 <- 1 (3 positions back across the observation)."""
    close(_scale("coupled"), [[1, 1.5, 1.5, 1.5, 1, 1.5], [2, 1.5, 1, 1, 1.5, 1]])
    torch.testing.assert_close(_scale("coupled", pass_fraction=0.0), _scale("global_anchor"))
    close(_scale("coupled", pass_fraction=1.0), [[1, 2, 1, 2, 1, 1], [2, 2, 1, 1, 1, 1]])
    # k = 1: anchor 5's neighbour 4 is not pre-planning, anchor 4's neighbour 3 is an observation
    close(_scale("coupled", couple_within=1), [[1, 1.5, 1.5, 1, 1, 2], [2, 1, 1, 1, 2, 1]])
    # tau = 2: anchor 5 (WAAD 3) is not local, so it is not coupled; anchor 2 (WAAD 1) and row
    # 1's anchor 4 (WAAD 0) are
    close(_scale("coupled", couple_waad_max=2.0), [[1, 1.5, 1.5, 1, 1, 2], [2, 1.5, 1, 1, 1.5, 1]])


def test_coupled_an_anchor_that_is_its_own_preplan_token_keeps_its_credit():
    # pre-planning {0, 1} (drops 1 and 4); anchors {1, 2}: 1 is pre-planning itself, so it keeps
    # its 2 (passes nothing to 0) and receives half of anchor 2's extra credit
    mask = torch.ones(1, 4, dtype=torch.bool)
    close(_scale("coupled", waad=t([[5.0, 4.0, 0.0, 0.0]]), fai=t([[0.1, 0.9, 0.5, 0.0]]), mask=mask),
          [[1.0, 2.5, 1.5, 1.0]])


def test_no_response_no_credit_and_unknown_scheme():
    empty = torch.zeros(2, 6, dtype=torch.bool)
    for scheme in R.SCHEMES:
        torch.testing.assert_close(_scale(scheme, mask=empty), torch.ones(2, 6))
    with pytest.raises(ValueError, match="scheme"):
        _scale("rhythmic")


def test_scale_advantages_broadcasts_sequence_advantages():
    scale = t([[1.0, 2.0, 0.5], [1.0, 1.0, 3.0]])
    close(R.scale_advantages(t([2.0, -1.0]), scale), [[2.0, 4.0, 1.0], [-1.0, -1.0, -3.0]])
    close(R.scale_advantages(t([[1.0, 1.0, 1.0], [0.0, 2.0, 2.0]]), scale), [[1.0, 2.0, 0.5], [0.0, 2.0, 6.0]])
    with pytest.raises(ValueError, match="credit scale"):
        R.scale_advantages(torch.ones(2, 4), scale)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("rhythm,key", [
    ({"scheme": "rhythmic"}, "algorithm.rhythm.scheme"),
    ({"top_k": 0.0}, "algorithm.rhythm.top_k"),
    ({"window": 0}, "algorithm.rhythm.window"),
    ({"layers": 0}, "algorithm.rhythm.layers"),
    ({"amplify_anchor": -1.0}, "algorithm.rhythm.amplify_anchor"),
    ({"pass_fraction": 1.5}, "algorithm.rhythm.pass_fraction"),
    ({"scheme": "local_chunk", "pass_fraction": 0.2}, "algorithm.rhythm.pass_fraction"),
    ({"scheme": "global_anchor", "amplify_preplan": 1.0}, "algorithm.rhythm.amplify_preplan"),
    ({"tempo": 1}, "algorithm.rhythm.tempo"),
    ({"fai_window_low": 0}, "algorithm.rhythm.fai_window_low"),
    ({"fai_window_low": 20, "fai_window_high": 10}, "algorithm.rhythm.fai_window_low"),
    ({"head_fraction": 0.6}, "algorithm.rhythm.head_fraction"),
    ({"couple_within": 0}, "algorithm.rhythm.couple_within"),
    ({"scheme": "global_anchor", "couple_within": 2}, "algorithm.rhythm.couple_within"),
    ({"scheme": "local_chunk", "couple_waad_max": 2.0}, "algorithm.rhythm.couple_waad_max"),
])
def test_config_errors_name_the_key(rhythm, key):
    with pytest.raises(ConfigError) as e:
        load_config({"algorithm": {"rhythm": {"enabled": True, **rhythm}}})
    assert e.value.key == key


def test_config_refuses_a_sequence_level_loss_and_lists_the_role():
    with pytest.raises(ConfigError) as e:
        load_config({"algorithm": {"name": "topr", "rhythm": {"enabled": True}}})
    assert e.value.key == "algorithm.rhythm.enabled"
    cfg = load_config({"algorithm": {"kl_coef": 0.1, "rhythm": {"enabled": True, "scheme": "local_chunk",
                                                                  "amplify_preplan": 1.0}}})
    assert batch_role_classes(cfg)[-1] is AttentionRole
    assert AttentionRole not in batch_role_classes(load_config({}))


# ----------------------------------------------------------------------------- in the update


def _tiny_policy(with_value=False):
    lm = build_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64), TinyTok(), 0)
    return make_policy(ActorModule(lm, with_value=with_value), EngineConfig(lr=0.01), batch_size=6)


def test_the_update_scales_each_tokens_advantage():
    """A credit scale of zero on every token but one: only that position's logits get a
    gradient; a scale of 2 everywhere doubles the policy-gradient loss."""
    groups = multi_turn_groups()
    batch = collate(groups, 0)
    b0, t0 = 2, int(batch.mask[2].nonzero()[0])  # sample 2 of group 0: a nonzero advantage
    scale = torch.zeros(batch.mask.shape)
    scale[b0, t0] = 1.0
    policy = _tiny_policy()
    grads = []

    def keep_logit_grad(module, inputs, logits):  # returns None: the output stays as it is
        logits.register_hook(grads.append)

    hook = policy.module.lm.lm_head.register_forward_hook(keep_logit_grad)
    try:
        update_policy(policy, AlgorithmConfig(), batch, 1.0, aux={"credit_scale": scale})
    finally:
        hook.remove()
    (g,) = grads
    # the logits start at the first position that predicts a response token (trim_prompt): pad back
    g = torch.nn.functional.pad(g, (0, 0, batch.input_ids.shape[1] - g.shape[1], 0))
    nonzero = g.abs().sum(-1) > 0
    assert nonzero.nonzero().tolist() == [[b0, t0]]
    plain = update_policy(_tiny_policy(), AlgorithmConfig(), batch, 1.0)
    doubled = update_policy(_tiny_policy(), AlgorithmConfig(), batch, 1.0,
                            aux={"credit_scale": torch.full(batch.mask.shape, 2.0)})
    assert doubled["loss/pg"] == pytest.approx(2 * plain["loss/pg"], rel=1e-5) and plain["loss/pg"] != 0


@pytest.mark.parametrize("name", ["ppo", "cispo", "reinforce_pp", "grpo_ipa"])
def test_the_credit_scales_every_estimators_advantages(name):
    """Token advantages (GAE, REINFORCE++, IPA) and sequence ones alike: a zero scale leaves
    no policy-gradient loss (PPO's value loss still trains)."""
    batch = collate(multi_turn_groups(), 0)
    a = AlgorithmConfig(name=name.removesuffix("_ipa"), ipa=IPAConfig(enabled=name.endswith("_ipa")))
    met = update_policy(_tiny_policy(with_value=name == "ppo"), a, batch, 1.0,
                        aux={"credit_scale": torch.zeros(batch.mask.shape)})
    assert met["loss/pg"] == 0.0


# ----------------------------------------------------------------------------- the role


def test_attention_role_scales_only_response_tokens_and_follows_the_policy(tmp_path):
    # the tiny samples are a few tokens long: FAI from the tokens 1 to 100 later (the paper's
    # H_lo = 10 would leave every token of them without a measured influence)
    cfg = run_config(tmp_path, model__num_layers=2, model__num_heads=2,
                     algorithm__rhythm={"enabled": True, "scheme": "global_anchor", "fai_window_low": 1})
    roles = LocalRoles(cfg)
    try:
        (role,) = roles.batch_roles
        assert isinstance(role, AttentionRole) and role.model.config._attn_implementation == "eager"
        assert roles.trainer.policy.module.lm.config._attn_implementation != "eager"  # its own copy
        groups = multi_turn_groups()
        scale = role.annotate(groups)["credit_scale"]
        batch = collate(groups, roles.tokenizer.pad_token_id)
        assert scale.shape == batch.mask.shape and scale.device.type == "cpu"
        assert bool((scale[~batch.mask] == 1).all())
        # global_anchor: ceil(0.4 n) anchors per row, each 1 + amplify_anchor, among the tokens
        # that a later response token attends to (not the last one)
        expected = torch.minimum((0.4 * batch.mask.sum(-1).double() - 1e-9).ceil(), batch.mask.sum(-1).double() - 1)
        assert (scale == 1.5).sum(-1).tolist() == expected.tolist()
        # the update trains the policy; after the sync the attention copy holds its weights
        before = {k: v.clone() for k, v in role.model.state_dict().items()}
        roles.update(groups)
        roles.sync_weights(1)
        policy = roles.trainer.policy.module.lm.state_dict()
        got = role.model.state_dict()
        assert set(got) == set(policy)
        for k, v in policy.items():
            torch.testing.assert_close(got[k], v, atol=0, rtol=0)
        assert any(not torch.equal(before[k], got[k]) for k in got)
        assert role.train(groups, {})["rhythm/weights_version"] == 0.0  # annotated before the sync
    finally:
        roles.close()


def test_training_with_rhythm_credit(tmp_path):
    # FAI over the tokens 1-1000 later: a turn's one-token reply is ~200 tokens of map before
    # the next (the paper's H = [10, 100] would measure no reply's influence here)
    out = train(run_config(tmp_path, steps=3, algorithm__rhythm={"enabled": True, "fai_window_low": 1,
                                                                 "fai_window_high": 1000}))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1, 2]
    for h in hist:
        assert torch.isfinite(torch.tensor(h["loss/total"]))
        # the attention copy annotated step s with the weights the samples were drawn from
        assert h["rhythm/weights_version"] == h["step"]
        assert 0 < h["rhythm/anchor_frac"] <= 1 and h["rhythm/scale_mean"] > 1
