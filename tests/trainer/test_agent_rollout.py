"""Agent-native rollout (issue #13 part 4): ``rock/Agent-v0`` episodes driven by the trainer's
rollout loop, token-in/token-out across an unmodified agent's model calls. The agent is the
real ``openai-chat-agent`` (official ``openai`` client) playing the corridor game in sandboxes
without network; the tokenizer's own chat template renders each call's messages.

- An agent that keeps its conversation: its calls merge into one sample; every prompt the
  engine saw is a prefix of it, every mask-1 run is exactly one call's generated ids.
- An agent that rewrites its history (a sliding window): a new segment per rewrite, never a
  sequence the policy did not see; the batch trains each segment as a row, the episode's
  rows share its advantage and count once in its group.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _openai_client import snapshot_with_agent

from rockroll.gem.agent_env import AgentEnv
from rockroll.gem.agents import AGENTS
from rockroll.gem.tools import close_pools
from rockroll.sandbox import SandboxSpec
from rockroll.sandbox.sync import run_sync
from rockroll.trainer.config import load_config
from rockroll.trainer.algorithms.credit import num_chunks
from rockroll.trainer.models import PRETOKENIZE, save_word_tokenizer
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager, request_ids
from _scripted import ScriptEngine, first_batch
from rockroll.trainer.roles.update import collate, compute_advantages

CHAT_AGENT = AGENTS["openai-chat-agent"]
SPEC = SandboxSpec(memory_mb=512, pids=128, timeout_s=60)
TEXT = "Walk to the goal.\n_P___ Left or Right? The goal is the left end. You reached the goal right lost"


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    yield snapshot_with_agent(SPEC, CHAT_AGENT, tmp_path_factory.mktemp("pylib"))
    run_sync(close_pools())


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    import re
    import string

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tok")  # tok0, tok1...: another module may have made one first
    save_word_tokenizer(set(string.printable) | set(re.findall(PRETOKENIZE, TEXT)), folder)
    return AutoTokenizer.from_pretrained(folder)


def play(tok, snapshot, agent, task: str, group_size: int = 2, algorithm: dict | None = None):
    """One group of corridor episodes through the rollout manager, the engine always saying Left."""
    cfg = load_config({"seed": 0, "rollout": {"group_size": group_size, "batch_groups": 1, "max_turns": 6,
                                              "batch_wait_ms": 50},
                       "generation": {"max_new_tokens": 2}, "algorithm": algorithm or {},
                       "envs": [{"id": "rock/Agent-v0", "task_ids": [task]}]})
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = ScriptEngine(tok, ["Left"], stop_id=template.stop_id)
    factory = lambda spec: AgentEnv(agent=agent, task_set="corridor", snapshot=snapshot,  # noqa: E731
                                    sandbox_spec=SPEC, call_timeout=60)
    mgr = RolloutManager(cfg, engine, template, env_factory=factory)
    groups = first_batch(mgr, timeout=300)
    return cfg, groups, engine


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every run of 1s."""
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def check_rows_are_what_was_generated(engine, sample):
    """Each row: every mask-1 run is one engine output, generated after exactly the row's
    tokens before it (the prompt the engine was given); nothing re-tokenised."""
    generated = [(p, o) for prompts, outs in engine.calls for p, o in zip(prompts, outs)]
    for row in sample.rows():
        for start, end in runs(row.mask):
            assert any(p == row.token_ids[:start] and o.token_ids == row.token_ids[start:end]
                       and o.logprobs == row.behav_logp[start:end] for p, o in generated)
    return [len(runs(row.mask)) for row in sample.rows()]


def test_an_agent_keeping_its_conversation_makes_one_sample(tok, snapshot):
    cfg, groups, engine = play(tok, snapshot, CHAT_AGENT, "left-3")
    for s in groups[0].samples:
        assert s.infra_error is None and s.success and s.reward == 1.0  # Left x3 from cell 3
        assert s.segments == []  # every call extended the one before: merged
        assert check_rows_are_what_was_generated(engine, s) == [3] == [s.num_turns]  # one chunk per call
        # the first call's prompt is the tokenizer's chat template over the agent's first message
        first = request_ids(tok, "chat", [{"role": "user", "content": "Walk to the goal.\n___P_ Left or Right? "
                                                                      "The goal is the left end."}], None, None)
        assert s.token_ids[: len(first)] == first
        assert tok.decode(s.token_ids).count("The goal is the left end.") == 3  # its three requests' states
    batch = collate(groups, tok.pad_token_id)
    assert batch.size == 2 and batch.row_weights.tolist() == [1.0, 1.0] and batch.chunks_after.tolist() == [0, 0]


def test_an_agent_rewriting_its_history_starts_new_segments(tok, snapshot):
    window = dataclasses.replace(CHAT_AGENT, name="windowed", env={**CHAT_AGENT.env, "AGENT_HISTORY": "1"})
    cfg, groups, engine = play(tok, snapshot, window, "left-3", algorithm={"ipa": {"enabled": True, "gamma": 0.5}})
    for s in groups[0].samples:
        assert s.infra_error is None and s.success and s.num_turns == 3
        # call 2 = first message + exchange 1: extends call 1. Call 3 = first message + exchange 2
        # only: exchange 1 was dropped, so it starts a segment of its own.
        assert len(s.segments) == 1
        assert check_rows_are_what_was_generated(engine, s) == [2, 1]
        assert tok.decode(s.token_ids).count("The goal is the left end.") == 2
    batch = collate(groups, tok.pad_token_id)
    assert batch.size == 4 and batch.row_weights.tolist() == [0.5] * 4
    assert batch.chunks_after.tolist() == [1, 0, 1, 0] and num_chunks(batch.mask).tolist() == [2, 1, 2, 1]
    # the episode's turns are numbered across its rows: gamma^(turns to the episode's end)
    a = cfg.algorithm
    batch.rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # the first episode won, the second lost
    adv, _ = compute_advantages(a, batch, None, None, None)
    per_chunk = [sorted({round(x, 4) for x in adv[i][batch.mask[i]].tolist()}) for i in range(4)]
    # IPA's Eq 7 returns are absolute (issue #40): the lost episode's turns get 0, not a
    # negative group-normalised credit
    assert per_chunk == [[0.25, 0.5], [1.0], [0.0], [0.0]]
    # per-turn returns need a turn's position in its group: a split episode has none
    turn = load_config({"algorithm": {"turn_credit": "discounted"}}).algorithm
    with pytest.raises(ValueError, match="split into segments"):
        compute_advantages(turn, batch, None, None, None)


def test_the_corridor_expert_answers_the_agents_calls_and_wins(snapshot):
    """``rock/Agent-v0``'s expert (SFT data): every call of the real agent on a corridor task is
    answered with the goal's direction, and the episode is won, on either goal; a noisy expert
    draws from Left and Right."""
    env = AgentEnv(agent=CHAT_AGENT, task_set="corridor", snapshot=snapshot, sandbox_spec=SPEC, call_timeout=60)
    try:
        assert env.action_words == ("Left", "Right")
        for task, word in (("left-2", "Left"), ("right-3", "Right")):
            env.reset(options={"task_id": task})
            replies = []
            while True:
                replies.append(env.expert_action())
                *_, term, trunc, info = env.step(replies[-1])
                if term or trunc:
                    break
            assert info["success"] and set(replies) == {word}, (task, replies, info)
        with pytest.raises(ValueError, match="no episode"):
            env.expert_action()
    finally:
        env.close()


@pytest.mark.parametrize("history", ["all", "windowed"])
def test_expert_episodes_of_the_agent_are_framed_as_its_rollouts(tok, snapshot, history):
    """SFT data of ``rock/Agent-v0`` (``sft.sources: expert``) is token for token what a rollout
    of the same replies trains on: each call's prompt rendered by the chat template from the
    agent's request (not from the observation text), merged when it extends the sequence, a new
    example where the agent rewrote its history (a rollout's new segment)."""
    from rockroll.trainer.rollout.sft_data import expert_examples

    agent = CHAT_AGENT if history == "all" else dataclasses.replace(
        CHAT_AGENT, name="windowed", env={**CHAT_AGENT.env, "AGENT_HISTORY": "1"})
    cfg, groups, _ = play(tok, snapshot, agent, "left-3", group_size=1)
    rows = groups[0].samples[0].rows()
    factory = lambda spec: AgentEnv(agent=agent, task_set="corridor", snapshot=snapshot,  # noqa: E731
                                    sandbox_spec=SPEC, call_timeout=60)
    got = expert_examples(cfg.envs[0], PromptTemplate(tok, cfg.tokenizer), factory, episodes=1, epsilon=0.0,
                          seed=0, max_turns=6)
    assert len(rows) == (1 if history == "all" else 2) == len(got)
    for row, ex in zip(rows, got):
        assert ex.success and ex.token_ids == row.token_ids and ex.mask == row.mask
