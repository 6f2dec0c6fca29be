"""The TRL adapter on the real TRL (``GRPOTrainer``), a tiny random-init Llama and a word tokenizer.

The env is ``EchoEnv`` below, driven through the adapter by its id (``test_trl:EchoEnv``, this
file's folder being on sys.path as pytest's prepend mode puts it): two turns, each asking for a
word ("Say Up." then "Now say Left."), 0.5 for each right one, success when both are. The task
id names the two words, so held-out pairs can only be won by reading each turn's observation.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys

import pytest
import torch

from rockroll.gem.core import GemEnv, InfraError
from rockroll.integrations.episodes import EnvSpec, MissingTrainer
from rockroll.trainer.models import save_word_tokenizer

trl_adapter = pytest.importorskip("rockroll.integrations.trl")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

ENV = f"{__name__}:EchoEnv"
WORDS = ["Up", "Down", "Left", "Right"]
# a pair is held out only where each of its words is met in the same turn in training
HELD_OUT = ["Up-Down", "Down-Left", "Left-Right", "Right-Up"]
TASKS = [f"{a}-{b}" for a in WORDS for b in WORDS if f"{a}-{b}" not in HELD_OUT] + HELD_OUT


class EchoEnv(GemEnv):
    """Two turns, each asking for the word its task id names; ``fail_on`` (a reply) and
    ``fail_reset`` make the env fail as infrastructure. Counts the envs made and closed."""

    opened = closed = 0

    def __init__(self, *, fail_on: str | None = None, fail_reset: bool = False):
        super().__init__(max_turns=2, format_penalty=0.0)
        self.fail_on, self.fail_reset, self.words, self.right = fail_on, fail_reset, ["Up", "Up"], 0
        EchoEnv.opened += 1

    def _reset(self, task_id, options):
        if self.fail_reset:
            raise InfraError("sandbox never started")
        self.words, self.right = str(task_id).split("-"), 0
        return f"Say {self.words[0]}.", {"success": False}

    def _step(self, action):
        if self.fail_on is not None and action.strip() == self.fail_on:
            raise InfraError("sandbox lost")
        turn = self._turn - 1
        win = action.strip() == self.words[turn]
        self.right += win
        return (f"Now say {self.words[1]}." if turn == 0 else "Done."), 0.5 * win, False, {"success": self.right == 2}

    def close(self):
        EchoEnv.closed += 1


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    save_word_tokenizer([" ", ".", "Say", "Now", "say", "Done", *WORDS], folder)
    t = AutoTokenizer.from_pretrained(folder)
    t.padding_side = "left"
    return t


def tiny_model(tok, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                                        num_key_value_heads=1, intermediate_size=64, pad_token_id=tok.pad_token_id,
                                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


def only_words(tok) -> list[int]:
    """``suppress_tokens`` for replies of one of WORDS (a policy trained from scratch has no
    prior for the format)."""
    allowed = set(tok.convert_tokens_to_ids(WORDS))
    return [i for i in range(len(tok)) if i not in allowed]


def grpo(tok, model, tmp_path, dataset, *, rollout=True, reward=None, turn_tokens=3, **config) -> GRPOTrainer:
    """A GRPOTrainer on ``dataset`` with our rollout (replies of at most ``turn_tokens``) and
    env_reward, or without a rollout_func and with ``reward``; ``config``: GRPOConfig's."""
    config = {"per_device_train_batch_size": 8, "num_generations": 8, "max_completion_length": 24, "max_steps": 1,
              "learning_rate": 0.005, "lr_scheduler_type": "constant", "beta": 0.0, "temperature": 1.0,
              "report_to": [], "save_strategy": "no", "logging_steps": 10, "disable_tqdm": True, "seed": 0, **config}
    return GRPOTrainer(model=model, processing_class=tok, train_dataset=dataset,
                       args=GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, **config),
                       reward_funcs=reward or trl_adapter.env_reward,
                       rollout_func=trl_adapter.multi_turn_rollout(max_turn_tokens=turn_tokens) if rollout else None)


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each run of 1s in ``mask``."""
    edges = [k for k in range(len(mask) + 1) if (mask[k - 1] if k else 0) != (mask[k] if k < len(mask) else 0)]
    return list(zip(edges[::2], edges[1::2]))


def rows(dataset, n: int) -> list[dict]:
    return [copy.deepcopy(dataset[i % len(dataset)]) for i in range(n)]


def test_dataset_rows_carry_the_prompt_and_the_spec():
    train, held = trl_adapter.train_eval_datasets(ENV, TASKS, held_out=4, seed=7)
    assert len(train) == 12 and [trl_adapter.spec_of(p).task_id for p in held["prompt"]] == HELD_OUT
    row = train[1]
    assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"] == "Say Up."
    spec = trl_adapter.spec_of(row["prompt"])
    assert (spec.env_id, spec.task_id, spec.seed) == (ENV, "Up-Left", 7)
    assert EnvSpec.from_row(json.loads(row["env_spec"])) == spec


def test_rollout_is_token_exact(tok, tmp_path):
    """What TRL gets back: each reply's ids exactly as ``generate`` sampled them (cut at the
    end-of-turn token or the turn's budget), env_mask 1 on them and 0 on the rest, the rest
    decoding to the observations as the chat template renders them, and the log-probs the
    model gives the sampled tokens at the sampling temperature."""
    model = tiny_model(tok, 0)
    train, _ = trl_adapter.train_eval_datasets(ENV, TASKS, held_out=4)
    trainer = grpo(tok, model, tmp_path, train, temperature=0.7)
    sampled = []  # each generate call's new tokens, row by row
    generate = model.generate

    def spy(**kw):
        out = generate(**kw)
        sampled.append(out.sequences[:, kw["input_ids"].size(1):].tolist())
        return out

    model.generate = spy
    torch.manual_seed(1)
    batch = rows(train, 16)
    out = trainer.rollout_func([r["prompt"] for r in batch], trainer)
    del model.generate
    eos = tok.eos_token_id
    saw_closed = saw_open = False
    for i, row in enumerate(batch):
        ids, mask, logps = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
        assert len(ids) == len(mask) == len(logps)
        assert out["prompt_ids"][i] == tok.apply_chat_template(
            [{"role": "user", "content": row["prompt"][-1]["content"]}], add_generation_prompt=True, return_dict=False)
        words = trl_adapter.spec_of(row["prompt"]).task_id.split("-")
        pos = 0
        for turn in range(2):
            reply = sampled[turn][i]  # every episode plays both turns: rows stay in order
            reply = reply[:next((k + 1 for k, t in enumerate(reply) if t == eos), 3)]
            assert ids[pos:pos + len(reply)] == reply and mask[pos:pos + len(reply)] == [1] * len(reply)
            pos += len(reply)
            closed = reply[-1] == eos
            saw_closed, saw_open = saw_closed or closed, saw_open or not closed
            env_text = "" if closed else "<|end|>"
            if turn == 0:
                env_text += f"<|user|>Now say {words[1]}.<|end|><|assistant|>"
            n_env = next((k for k, m in enumerate(mask[pos:]) if m), len(mask) - pos)
            assert tok.decode(ids[pos:pos + n_env]) == env_text and set(mask[pos:pos + n_env]) <= {0}
            assert logps[pos:pos + n_env] == [0.0] * n_env
            pos += n_env
        assert pos == len(ids)
        with torch.no_grad():
            logits = model(torch.tensor([out["prompt_ids"][i] + ids])).logits[0, len(out["prompt_ids"][i]) - 1:-1]
        want = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        on = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(logps)[on], want[on], atol=1e-4)
        replies = [tok.decode(ids[a:b], skip_special_tokens=True) for a, b in runs(mask)]
        assert out["episode_reward"][i] == 0.5 * sum(r == w for r, w in zip(replies, words))
    assert saw_closed and saw_open  # both endings of a reply were met
    assert EchoEnv.opened == EchoEnv.closed


class WordsEnv(GemEnv):
    """As many turns as its task id names words ("Up-Down-Left": three), one point a right one."""

    def __init__(self):
        super().__init__(max_turns=8, format_penalty=0.0)
        self.words = ["Up"]

    def _reset(self, task_id, options):
        self.words = str(task_id).split("-")
        return f"Say {self.words[0]}.", {}

    def _step(self, action):
        turn = self._turn - 1
        last = turn == len(self.words) - 1
        return ("Done." if last else f"Now say {self.words[turn + 1]}."), float(action.strip() == self.words[turn]), last, {}


def test_kept_kv_cache_gives_the_episodes_a_full_prefill_gives(tok):
    """Episodes of 1 to 4 turns (and some cut by the budget) leave the batch at different turns;
    with the KV cache kept between turns, the sampled episodes are the ones re-feeding every
    sequence whole gives, token for token, and every sampled token's log-prob is the one a
    single forward over the whole episode gives (a token at a wrong position, or seeing a
    masked hole, would differ), while the model is fed far fewer tokens."""
    model = tiny_model(tok, 3)
    tasks = ["-".join(WORDS[k % 4] for k in range(j, j + n)) for n in (1, 2, 3, 4) for j in range(4)]
    prompts = list(trl_adapter.episode_dataset(f"{__name__}:WordsEnv", tasks)["prompt"])
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)
    fed = []
    hook = model.model.register_forward_pre_hook(lambda mod, args, kw: fed.append(kw["input_ids"].numel()),
                                                 with_kwargs=True)
    try:
        outs = {}
        for reuse in (True, False):  # the same draws: the same batches sample the same number of times
            fed.clear()
            torch.manual_seed(0)
            outs[reuse] = trl_adapter.play_episodes(model, tok, prompts, generation_config=cfg, max_completion_length=40,
                                                    max_turn_tokens=3, reuse_cache=reuse)
            outs[reuse]["fed"] = sum(fed)
    finally:
        hook.remove()
    kept, whole = outs[True], outs[False]
    for key in ("prompt_ids", "completion_ids", "env_mask", "episode_reward"):
        assert kept[key] == whole[key], key
    replies = [len(runs(mask)) for mask in kept["env_mask"]]
    assert len(set(replies)) >= 3, replies  # rows left the batch at several turns
    ends = [ids[b - 1] == tok.eos_token_id for ids, mask in zip(kept["completion_ids"], kept["env_mask"])
            for _, b in runs(mask)]
    assert any(ends) and not all(ends)  # replies closed by the model and cut by the budget
    for prompt, ids, mask, logps in zip(kept["prompt_ids"], kept["completion_ids"], kept["env_mask"], kept["logprobs"]):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
        want = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        on = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(logps)[on], want[on], atol=1e-4)
    assert kept["fed"] < 0.6 * whole["fed"], (kept["fed"], whole["fed"])


def test_infra_failure_is_a_dropped_sample_not_a_zero(tok, tmp_path):
    """Episodes whose env failed (at a reply "Left", or at reset) reach TRL with reward None:
    its GRPO baseline is the mean of the other samples of the group, their advantage 0 and
    their tokens masked out; every env is closed."""
    model = tiny_model(tok, 0)
    train, _ = trl_adapter.train_eval_datasets(ENV, TASKS, held_out=4, env_kwargs={"fail_on": "Left"})
    trainer = grpo(tok, model, tmp_path, train, turn_tokens=1, per_device_train_batch_size=16,
                   generation_kwargs={"suppress_tokens": only_words(tok)})
    batch = rows(train.select([1]), 8) + rows(train.select([2]), 8)  # two groups of 8
    broken = copy.deepcopy(batch[15])  # the env of the group's last sample never starts
    spec = trl_adapter.spec_of(broken["prompt"])
    spec.kwargs["fail_reset"] = True
    broken["prompt"][-1]["env_spec"] = broken["env_spec"] = json.dumps(spec.to_row())
    batch[15] = broken
    opened, closed = EchoEnv.opened, EchoEnv.closed
    torch.manual_seed(0)
    scored = trainer._generate_and_score_completions(batch)
    assert EchoEnv.opened - opened == EchoEnv.closed - closed == 16
    rewards = [r["episode_reward"] for r in batch]  # what the rollout gave the reward function
    failed = [r is None for r in rewards]
    assert failed[15] and 0 < sum(failed[:8]) < 8, rewards  # each group holds both kinds
    adv, mask = scored["advantages"], scored["tool_mask"] * scored["completion_mask"]  # what the loss weighs
    for g in (0, 1):
        ok = [i for i in range(8 * g, 8 * g + 8) if not failed[i]]
        r = torch.tensor([rewards[i] for i in ok])
        want = (r - r.mean()) / (r.std() + 1e-4)  # the baseline over the scored samples only
        assert torch.allclose(adv[ok], want, atol=1e-5), (rewards, adv)
    assert all(adv[i] == 0 and mask[i].sum() == 0 for i in range(16) if failed[i])


def test_single_turn_reward_steps_the_env_once(tok, tmp_path):
    """Plain GRPOTrainer (no rollout_func) with step_reward: a fresh episode of the row's task,
    stepped once with the completion; an env failure is None, not 0."""
    train, _ = trl_adapter.train_eval_datasets(ENV, TASKS, held_out=4, env_kwargs={"fail_on": "Left"})
    prompts = [train[1]["prompt"]] * 3  # "Up-Left": the first turn wants Up
    completions = [[{"role": "assistant", "content": c}] for c in ("Up", "Down", "Left")]
    closed = EchoEnv.closed
    assert trl_adapter.step_reward(prompts, completions) == [0.5, 0.0, None]
    assert EchoEnv.closed - closed == 3
    trainer = grpo(tok, tiny_model(tok, 0), tmp_path, train, rollout=False, reward=trl_adapter.step_reward,
                   max_completion_length=1, generation_kwargs={"suppress_tokens": only_words(tok)})
    torch.manual_seed(0)
    scored = trainer._generate_and_score_completions(rows(train.select([1]), 8))
    assert scored["advantages"].shape == (8,)


def held_out_success(model, tok, held, episodes: int = 16) -> float:
    """Success over ``episodes`` sampled episodes of each held-out task (temperature 1)."""
    cfg = GenerationConfig(do_sample=True, temperature=1.0, suppress_tokens=only_words(tok),
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(123)
    out = trl_adapter.play_episodes(model, tok, [p for p in held["prompt"] for _ in range(episodes)],
                                    generation_config=cfg, max_completion_length=16, max_turn_tokens=1)
    return sum(out["episode_success"]) / len(out["episode_success"])


LEARN_STEPS = 40


def test_grpo_trainer_raises_held_out_success(tok, tmp_path):
    """TRL's own GRPOTrainer, our rollout_func and env_reward, one-word replies, groups of 8,
    four groups a step, 40 steps: success on the four held-out word pairs (64 episodes) goes
    from chance (1/16) to most. A reply mask off by a token, env tokens learned as the policy's
    or an advantage of the wrong sign keeps it near chance.

    Bounds from a measured spread (this config, seeds 0-4 of model init and GRPOConfig.seed,
    2 torch threads, 64 held-out episodes): before 0.031, 0.047, 0.047, 0.047, 0.047; after
    0.922, 0.938, 0.953, 0.844, 0.641. So before <= 0.2 (chance is 0.0625) and after >= 0.4:
    the weakest seed's 0.64 falls under 0.4 on 64 episodes with a probability below 1e-4."""
    train, held = trl_adapter.train_eval_datasets(ENV, TASKS, held_out=4)
    model = tiny_model(tok, 0)
    before = held_out_success(model, tok, held)
    trainer = grpo(tok, model, tmp_path, train, per_device_train_batch_size=32, max_steps=LEARN_STEPS, turn_tokens=1,
                   generation_kwargs={"suppress_tokens": only_words(tok)})
    trainer.train()
    after = held_out_success(model, tok, held)
    assert before <= 0.2 and after >= 0.4, (before, after)


def test_missing_trl_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # what an environment without TRL gives
    monkeypatch.delitem(sys.modules, "rockroll.integrations.trl")
    with pytest.raises(MissingTrainer, match=r"rockroll\[trl\]"):
        importlib.import_module("rockroll.integrations.trl")
