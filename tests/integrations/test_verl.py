"""The verl adapter driven the way verl drives an agent loop: verl's own ``AgentLoopWorker`` (built
from verl's reference config, our examples/verl/agent_loop.yaml as its agent_loop_config_path)
gets a batch from verl's ``RLHFDataset`` over the parquet ``write_dataset`` wrote, and its
``server_manager`` is a generator of ours: a tiny random-init Llama sampling token ids (one test
scripts the right answer). What comes back is verl's padded ``DataProto``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import rockroll  # noqa: E402,F401  (registers the rock/ ids)
from rockroll.gem.factory import make_env  # noqa: E402
from rockroll.integrations import verl as adapter  # noqa: E402
from rockroll.integrations.episodes import EnvSpec, MissingTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AGENT_LOOP_YAML = ROOT / "examples/verl/agent_loop.yaml"
PROMPT_LEN, RESPONSE_LEN = 1024, 600
SPECIAL = ["<|pad|>", "<|bos|>", "<|end|>"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# ------------------------------------------------------------------ tiny model, worker, generators
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A byte-level BPE over the envs' own texts (with a chat template) and a one-layer random Llama,
    saved as one Hugging Face folder: what verl's HFModelConfig loads for the worker."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = []
    for env_id in ("rock/FrozenLake-v0", "rock/Math-v0"):
        env = make_env(env_id)
        for task in range(3):
            obs, _ = env.reset(seed=0, options={"task_id": task})
            texts += [obs, env.step("no move here")[0]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts * 4, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL + ["<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|end|>")
    hf.chat_template = TEMPLATE
    folder = tmp_path_factory.mktemp("tiny")
    hf.save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(hf), hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                                 num_key_value_heads=1, intermediate_size=32, max_position_embeddings=4096,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
                     ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def worker(model_dir):
    """verl's AgentLoopWorker on verl's reference config, loading our agent_loop.yaml."""
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    rollout = config.actor_rollout_ref.rollout
    config.actor_rollout_ref.model.path = str(model_dir)
    rollout.name, rollout.prompt_length, rollout.response_length = "vllm", PROMPT_LEN, RESPONSE_LEN
    rollout.agent.agent_loop_config_path = str(AGENT_LOOP_YAML)
    return AgentLoopWorker(config, llm_client=None)


class TinyModelServer:
    """verl's server-manager interface (``generate(request_id=, prompt_ids=, sampling_params=)`` ->
    ``TokenOutput``) over a tiny random Llama that samples; ``calls`` records every turn."""

    def __init__(self, folder, cap: int = 12, seed: int = 0):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()
        self.cap, self.calls, self.gen = cap, [], torch.Generator().manual_seed(seed)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        n = min(self.cap, sampling_params.get("max_tokens", self.cap))
        ids, out, logps = torch.tensor([prompt_ids]), [], []
        with torch.no_grad():
            for _ in range(n):
                logits = self.model(ids).logits[0, -1].float()
                logp = torch.log_softmax(logits, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
                out.append(tok)
                logps.append(float(logp[tok]))
                ids = torch.cat([ids, torch.tensor([[tok]])], 1)
                if tok == self.model.config.eos_token_id:
                    break
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": out})
        return TokenOutput(token_ids=out, log_probs=logps if sampling_params.get("logprobs") else None)


class AnswerServer:
    """The one scripted generator: answers each Math task with the right ``\\boxed{...}``."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        text = self.tokenizer.decode(prompt_ids)
        answer = next(a for q, a in self.answers.items() if q in text)
        out = self.tokenizer.encode(f"\\boxed{{{answer}}}", add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.calls.append(out)
        return TokenOutput(token_ids=out, log_probs=[-0.5] * len(out))


class FlakyEnv:
    """An env whose sandbox dies: at ``step`` (``info["infra_error"]``) or already at ``reset``."""

    def __init__(self, fail_at: str = "step"):
        self.fail_at, self.closed = fail_at, False
        FlakyEnv.made.append(self)

    made: list = []

    def reset(self, seed=None, options=None):
        return "Say anything.", ({"infra_error": "sandbox gone"} if self.fail_at == "reset" else {})

    def step(self, action):
        return "", 0.0, False, False, {"infra_error": "sandbox died mid-episode"}

    def close(self):
        self.closed = True


def batch(tmp_path, tokenizer, env_id, task_ids, *, env_kwargs=None, repeat=1) -> DataProto:
    """What verl's trainer hands the rollout: RLHFDataset over our parquet, collated, repeated n times."""
    paths = adapter.write_dataset(tmp_path / "data", env_id, list(task_ids) + ["held"], held_out=1,
                                  env_kwargs=env_kwargs, seed=0)
    dataset = RLHFDataset(str(paths["train"]), tokenizer,
                          OmegaConf.create({"max_prompt_length": PROMPT_LEN, "return_raw_chat": True,
                                            "cache_dir": str(tmp_path / "cache"),
                                            "filter_overlong_prompts_workers": 1}))
    data = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    data.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(data))], dtype=object)
    return data.repeat(repeat, interleave=True) if repeat > 1 else data


def run(worker, server, data) -> DataProto:
    worker.llm_client = server
    return _await(worker.generate_sequences(data))


def _await(coro):
    import asyncio

    return asyncio.new_event_loop().run_until_complete(coro)


def sample(out: DataProto, i: int):
    """Sample ``i`` unpadded: (prompt ids, response ids, response mask, logprobs, score)."""
    prompt_mask = out.batch["attention_mask"][i, :PROMPT_LEN].bool()
    n = int(out.batch["attention_mask"][i, PROMPT_LEN:].sum())
    return (out.batch["prompts"][i][prompt_mask].tolist(), out.batch["responses"][i, :n].tolist(),
            out.batch["response_mask"][i, :n].tolist(), out.batch["rollout_log_probs"][i, :n].tolist(),
            float(out.batch["rm_scores"][i].sum()))


def task_of(out: DataProto, i: int):
    return adapter.spec_of({"extra_info": out.non_tensor_batch["extra_info"][i]}).task_id


# ------------------------------------------------------------------ tests
def test_multi_turn_episodes_are_token_exact(worker, model_dir, tmp_path):
    """Each turn's generated ids are in the response exactly as generated (mask 1, their logprobs),
    the env's replies between them are mask 0 and decode to what the env said, each turn's prompt
    is the whole sequence so far, and rm_scores carries the episode's return."""
    server = TinyModelServer(model_dir)
    out = run(worker, server, batch(tmp_path, worker.tokenizer, "rock/FrozenLake-v0", [0, 1],
                                    env_kwargs={"max_turns": 4}))
    tok = worker.tokenizer
    by_request: dict[str, list] = {}
    for call in server.calls:
        by_request.setdefault(call["request_id"], []).append(call)
    assert len(by_request) == 2 and all(len(c) >= 2 for c in by_request.values())  # several turns each
    for i in range(2):
        prompt, response, mask, logps, score = sample(out, i)
        calls = next(c for c in by_request.values() if c[0]["prompt_ids"] == prompt)
        env = make_env("rock/FrozenLake-v0", max_turns=4)
        obs, _ = env.reset(seed=0, options={"task_id": task_of(out, i)})
        assert prompt == tok.apply_chat_template([{"role": "user", "content": obs}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        pos, ret = 0, 0.0
        for k, call in enumerate(calls):
            assert call["prompt_ids"] == prompt + response[:pos]  # token in: the sequence so far, unchanged
            gen = call["token_ids"]
            assert response[pos:pos + len(gen)] == gen and mask[pos:pos + len(gen)] == [1] * len(gen)
            assert all(lp < 0 for lp in logps[pos:pos + len(gen)])
            pos += len(gen)
            obs, r, term, trunc, _ = env.step(tok.decode(gen, skip_special_tokens=True))
            ret += r
            env_ids = (calls[k + 1]["prompt_ids"][len(prompt) + pos:] if k + 1 < len(calls) else response[pos:])
            assert mask[pos:pos + len(env_ids)] == [0] * len(env_ids)
            if k + 1 < len(calls):
                assert obs in tok.decode(env_ids) and tok.decode(env_ids).startswith("<|user|>")
            pos += len(env_ids)
        assert pos == len(response)
        assert score == pytest.approx(ret) and ret < 0  # format penalties of a random model
        assert out.non_tensor_batch[adapter.DROPPED][i] is False


def test_the_right_answer_scores_one(worker, tmp_path):
    answers = {}
    for task in (0, 1, 2):
        env = make_env("rock/Math-v0")
        env.reset(seed=0, options={"task_id": task})
        answers[env.question] = env.answer
    server = AnswerServer(worker.tokenizer, answers)
    out = run(worker, server, batch(tmp_path, worker.tokenizer, "rock/Math-v0", [0, 1, 2]))
    for i in range(3):
        _, response, mask, _, score = sample(out, i)
        assert score == 1.0 and response in server.calls and mask == [1] * len(response)
    assert list(out.non_tensor_batch["__num_turns__"]) == [2, 2, 2]


@pytest.mark.parametrize("fail_at", ["step", "reset"])
def test_an_infra_failure_is_dropped_not_scored(worker, model_dir, tmp_path, fail_at):
    FlakyEnv.made.clear()
    out = run(worker, TinyModelServer(model_dir), batch(tmp_path, worker.tokenizer, f"{__name__}:FlakyEnv", [0],
                                                       env_kwargs={"fail_at": fail_at}))
    _, response, mask, _, score = sample(out, 0)
    assert mask == [0] * len(response) and score == 0.0
    assert out.non_tensor_batch[adapter.DROPPED][0] is True
    assert "sandbox" in out.non_tensor_batch["rockroll_infra_error"][0]
    assert FlakyEnv.made and all(e.closed for e in FlakyEnv.made)


def test_rockroll_grpo_leaves_dropped_samples_out_of_the_group(worker, model_dir, tmp_path):
    """Through verl's compute_advantage: a group of 3 where one failed is GRPO over the other two
    (advantages +-0.5/std), the failed one gets 0; verl's grpo would count its 0 in the mean."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[1, 0], rewards[3, 2] = 1.0, 0.0, 0.5
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array(["a", "a", "a", "b"], dtype=object)})
    adv = compute_advantage(data, adv_estimator=adapter.ESTIMATOR,
                            config=OmegaConf.create({"norm_adv_by_std_in_grpo": True})).batch["advantages"]
    half = 0.5 / 0.5 ** 0.5  # (1 - 0.5) / std([1, 0]) of the two kept samples
    assert torch.allclose(adv[0], torch.tensor([half, half, 0]), atol=1e-5)
    assert torch.allclose(adv[1], torch.tensor([-half, 0, 0]), atol=1e-5)
    assert adv[2].abs().sum() == 0  # dropped
    assert torch.allclose(adv[3], torch.tensor([0.5, 0.5, 0.5]))  # a group of one: verl's mean 0, std 1
    verl_grpo = compute_advantage(data, adv_estimator="grpo").batch["advantages"]
    assert not torch.allclose(verl_grpo[:2], adv[:2])


def test_the_dataset_reads_back_through_verls_dataset(worker, tmp_path):
    paths = adapter.write_dataset(tmp_path / "d", "rock/FrozenLake-v0", list(range(10)), held_out=3,
                                  env_kwargs={"max_turns": 5}, seed=7)
    config = OmegaConf.create({"max_prompt_length": 64, "return_raw_chat": True, "cache_dir": str(tmp_path / "c"),
                               "filter_overlong_prompts_workers": 1})
    read = {split: RLHFDataset(str(p), worker.tokenizer, config) for split, p in paths.items()}
    assert (len(read["train"]), len(read["test"])) == (7, 3)
    specs = {split: [adapter.spec_of(ds[i]) for i in range(len(ds))] for split, ds in read.items()}
    assert [s.task_id for s in specs["train"]] == list(range(7)) and [s.task_id for s in specs["test"]] == [7, 8, 9]
    assert specs["test"][0] == EnvSpec("rock/FrozenLake-v0", {"max_turns": 5}, 7, 7)
    row = read["train"][2]
    assert row["agent_name"] == adapter.AGENT_NAME and row["data_source"] == "rock/FrozenLake-v0"
    assert row["index"] == 2 and row["raw_prompt"][0]["role"] == "user"
    with pytest.raises(ValueError):
        adapter.write_dataset(tmp_path / "e", "rock/FrozenLake-v0", [0, 1], held_out=2)


def test_the_example_config_names_only_keys_verl_has():
    """examples/verl/rockroll_grpo.yaml overrides keys of verl's reference config, none it lacks."""
    reference = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    ours = OmegaConf.to_container(OmegaConf.load(ROOT / "examples/verl/rockroll_grpo.yaml"))
    ours.pop("hydra"), ours.pop("defaults")
    env_vars = ours.pop("ray_kwargs")["ray_init"]["runtime_env"]["env_vars"]
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == adapter.__name__

    def walk(node, prefix=""):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    def has(key):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(reference, parent) if parent else reference
        return node is not None and leaf in node.keys()  # keys(): a mandatory "???" key counts

    missing = [k for k in walk(ours) if not has(k)]
    assert missing == []
    assert ours["algorithm"]["adv_estimator"] == adapter.ESTIMATOR
    assert ours["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] == adapter.AGENT_NAME


def test_verl_imports_the_adapter_as_an_external_module():
    """VERL_USE_EXTERNAL_MODULES (the example's runtime env) registers the estimator at ``import verl``."""
    import subprocess

    code = ("import verl; from verl.trainer.ppo.core_algos import get_adv_estimator_fn; "
            "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r; "
            f"print(get_adv_estimator_fn('{adapter.ESTIMATOR}').__name__, r['{adapter.AGENT_NAME}'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "VERL_USE_EXTERNAL_MODULES": adapter.__name__})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "grpo_without_dropped" in out.stdout and "RockrollAgentLoop" in out.stdout


def test_without_verl_the_adapter_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")] + [adapter.__name__]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verl", None)
    with pytest.raises(MissingTrainer, match=r"rockroll\[verl\]"):
        importlib.import_module(adapter.__name__)
