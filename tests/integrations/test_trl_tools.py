"""TRL's ``environment_factory`` on a rockroll env (:mod:`rockroll.integrations.trl_tools`):
the episode played through ``act`` tool calls, infrastructure failures as unscored rollouts,
and TRL 1.16's own GRPOTrainer parsing a model's tool calls, running them on our env and
scoring it with ``get_reward`` (docs/integrations.md, "TRL's environment_factory")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

tools = pytest.importorskip("rockroll.integrations.trl_tools")
import trl  # noqa: E402
from test_trl import ENV, TASKS, EchoEnv  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rockroll.integrations.episodes import InfraFailure  # noqa: E402
from rockroll.trainer.model_store import resolve_model  # noqa: E402

SYSTEM = "Play the game with the act tool."
WORDS = ["Up", "Down", "Left", "Right"]


def test_act_env_plays_the_rows_episode_and_reuses_its_env():
    train, held = tools.tool_datasets(ENV, TASKS, held_out=4, system_prompt=SYSTEM)
    assert len(train) == 12 and train[0]["prompt"] == [{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": ""}]
    env, opened = tools.ActEnv(), EchoEnv.opened
    assert env.reset(**train[1]) == "Say Up."  # task "Up-Left"
    assert env.act("Up") == "Now say Left."
    assert env.act("Left") == "Done.\n" + tools.OVER
    assert env.act("Left") == tools.OVER and env.get_reward() == 1.0
    assert env.steps == [("Up", "Now say Left.", 0.5), ("Left", "Done.", 0.5)]
    assert env.reset(**held[0]) == "Say Up." and env.act("Left") == "Now say Down."  # "Up-Down"
    assert env.get_reward() == 0.0 and len(env.steps) == 1
    assert EchoEnv.opened - opened == 1  # one env for both rows (same id and kwargs)
    closed = EchoEnv.closed
    del env
    assert EchoEnv.closed - closed == 1  # closed when TRL lets the instance go


def test_infra_failure_is_unscored_not_zero():
    train, _ = tools.tool_datasets(ENV, TASKS, held_out=4, env_kwargs={"fail_on": "Left"})
    env = tools.ActEnv()
    env.reset(**train[1])
    assert env.act("Up") == "Now say Left."
    with pytest.raises(InfraFailure, match="sandbox lost"):
        env.act("Left")
    assert env.get_reward() is None
    with pytest.raises(InfraFailure, match="had failed"):
        env.act("Up")
    env.reset(**train[1])  # the next row starts clean
    assert env.act("Up") == "Now say Left." and env.get_reward() == 0.5
    broken, _ = tools.tool_datasets(ENV, TASKS, held_out=4, env_kwargs={"fail_reset": True})
    assert "failed to start" in env.reset(**broken[0]) and env.get_reward() is None
    with pytest.raises(ValueError, match="env_spec"):
        env.reset(prompt=[])


def _conversation(words: list[str]) -> list[dict]:
    """An expert episode in chat messages: a tool call per turn, then a plain answer."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say {words[0]}."}]
    for k, word in enumerate(words):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"type": "function", "function": {"name": "act", "arguments": {"action": word}}}]})
        messages.append({"role": "tool", "name": "act",
                         "content": f"Now say {words[1]}." if k == 0 else "Done.\n" + tools.OVER})
    return [*messages, {"role": "assistant", "content": "Done."}]


@pytest.fixture(scope="module")
def tool_caller():
    """A tiny random Llama with SmolLM2's real byte-level BPE and TRL's own Qwen2.5 chat template
    (one whose tool calls TRL parses), taught by 200 SFT steps to answer in ``act`` tool calls.
    A model that never calls a tool would leave TRL's tool loop untested."""
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    schema = [tools.ActEnv().act]
    data = []
    for a in WORDS:
        for b in WORDS:
            messages, ids, labels = _conversation([a, b]), [], []
            for k in range(1, len(messages) + 1):  # loss on the assistant turns only
                full = tok.apply_chat_template(messages[:k], tools=schema, tokenize=True, return_dict=False)
                new = full[len(ids):]
                labels += new if messages[k - 1]["role"] == "assistant" else [-100] * len(new)
                ids = full
            data.append((ids, labels))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>")))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        batch = [data[i] for i in torch.randint(len(data), (4,)).tolist()]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, tok


def test_grpo_trainer_runs_its_tool_loop_on_our_env(tool_caller, tmp_path):
    """One GRPO step of TRL's own trainer with ``environment_factory=ActEnv``: for every rollout,
    the actions TRL parsed from the model's tool calls are the ones our env was stepped with, in
    order; each tool message TRL put in the conversation is the env's observation; the reward
    TRL logged under ``ActEnv`` is the env's return; the policy's weights moved."""
    model, tok = tool_caller
    train, _ = tools.tool_datasets(ENV, TASKS, held_out=4, system_prompt=SYSTEM)
    seen = []

    def probe(completions, environments, **kwargs):
        for completion, env in zip(completions, environments, strict=True):
            calls = [c["function"]["arguments"]["action"] for m in completion if m["role"] == "assistant"
                     for c in m.get("tool_calls") or []]
            results = [m["content"] for m in completion if m["role"] == "tool"]
            seen.append((calls, results, [s[0] for s in env.steps], list(env.steps), env.get_reward()))
        return [None] * len(completions)  # a probe, not a reward

    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model, processing_class=tok, train_dataset=train, reward_funcs=[probe], environment_factory=tools.ActEnv,
        args=GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=8,
                        num_generations=4, max_completion_length=160, max_tool_calling_iterations=3, max_steps=1,
                        learning_rate=1e-3, beta=0.0, temperature=1.0, report_to=[], save_strategy="no",
                        disable_tqdm=True, seed=0, logging_steps=1))
    trainer.train()
    assert len(seen) == 8
    logged = trainer.state.log_history[0]
    assert logged["tools/failure_frequency"] == 0  # every call TRL ran reached act with its arguments
    played = 0
    for calls, results, actions, steps, reward in seen:
        assert calls[:len(steps)] == actions  # TRL ran each parsed call on our env, in order
        for k, result in enumerate(results):  # each tool message is the env's answer to its call
            assert result == (tools.OVER if k >= len(steps) else steps[k][1] + ("\n" + tools.OVER if k == 1 else ""))
        # every call is played until the episode's two turns end (TRL may drop an over-budget result)
        assert len(results) <= len(steps) or len(steps) == 2
        assert reward == sum(r for *_, r in steps)
        played += len(steps)
    assert played >= 4  # the model does call its tool (13 env steps measured with this seed)
    want = sum(s[4] for s in seen) / len(seen)
    assert logged["rewards/ActEnv/mean"] == pytest.approx(want, abs=1e-6)
    assert any(not torch.equal(before[k], p) for k, p in model.named_parameters())
