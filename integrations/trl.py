"""TRL's ``GRPOTrainer`` on rockroll envs: a dataset of tasks, a multi-turn rollout, rewards.

    from trl import GRPOConfig, GRPOTrainer
    from rockroll.integrations.trl import env_reward, multi_turn_rollout, train_eval_datasets

    train, held_out = train_eval_datasets("rock/FrozenLake-v0", list(range(8)), held_out=2)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=train, eval_dataset=held_out,
                          reward_funcs=env_reward, rollout_func=multi_turn_rollout())

Why ``rollout_func`` and not ``environment_factory`` (TRL 1.16): ``environment_factory`` makes
an object whose public methods become *tools* of the model's chat template: the model must
emit tool calls its tokenizer's ``response_schema`` parses, the env's ``reset(**row)`` may only
append text to the prompt, and TRL re-renders the tool results itself. A rockroll env is text
in, text out (``step(str)``): any reply is an action, a malformed one is an observation, and an
episode has its own end, reward and ``info["infra_error"]``. ``rollout_func`` hands us the whole
episode: we generate, step, append the env's reply as tokens with ``env_mask`` 0, and return
the exact token ids the policy produced, so there is no decode/re-encode of the model's tokens
and no tool-calling format to learn first.

The pieces:

- :func:`episode_dataset` / :func:`train_eval_datasets`: one row per task, ``prompt`` being the
  env's first observation as chat messages. The row's :class:`EnvSpec` (JSON, column
  ``env_spec``) also rides in the prompt's last message under ``"env_spec"``, because TRL gives
  ``rollout_func`` the prompts only; chat templates read ``role`` and ``content`` and ignore it.
- :func:`multi_turn_rollout`: the ``rollout_func``. Per prompt (TRL has already repeated each
  ``num_generations`` times) it makes the env, resets it to the row's task and seed, and loops:
  sample a reply with the trainer's model (``GRPOConfig``'s temperature, top-p/k, and
  ``generation_kwargs``: a ``suppress_tokens`` list constrains replies), step the env with its
  text, append the observation rendered by the tokenizer's chat template as a user turn, until
  the episode ends or ``max_completion_length`` tokens are spent, keeping the KV cache between
  turns (a turn prefills only what is new: :class:`_Sampler`). The envs are closed after.
- :func:`env_reward`: the reward function that returns the episode's reward from the rollout.
- :func:`step_reward`: single-turn training without a ``rollout_func``: steps a fresh episode
  once with the completion and returns its reward.

An infrastructure failure (``info["infra_error"]``, :class:`InfraFailure`, the env's
``InfraError`` or a ``SandboxError``) makes the sample's reward ``None``. TRL turns it into NaN,
leaves it out of its group's mean and std (``nanmean``/``nanstd``) and zeroes its advantage;
the rollout also sets its whole ``env_mask`` to 0, so not even the KL term trains on it.

For models that call tools, :mod:`rockroll.integrations.trl_tools` is the ``environment_factory``
way in.

Not done yet: generation through vLLM (``use_vllm``: it raises), multimodal prompts, and
resuming a mid-episode snapshot from a row.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from rockroll.gem.core import InfraError
from rockroll.sandbox import SandboxError

from .episodes import EnvSpec, InfraFailure, held_out_split, require

trl = require("trl", "trl")
datasets = require("datasets", "trl")

__all__ = ["SPEC_KEY", "env_reward", "episode_dataset", "multi_turn_rollout", "play_episodes", "step_reward",
           "train_eval_datasets"]

#: where a prompt's last message (and a dataset row) carries its EnvSpec, as JSON
SPEC_KEY = "env_spec"
# what counts as the environment failing rather than the model (a bug still propagates)
_INFRA = (InfraFailure, InfraError, SandboxError)


# ---- datasets -------------------------------------------------------------------------------

def episode_dataset(env_id: str, task_ids: list[Any], *, env_kwargs: dict[str, Any] | None = None,
                    seed: int | None = None, system_prompt: str | None = None) -> Any:
    """A ``datasets.Dataset`` with a row per task id: ``prompt`` (chat messages: the optional
    system prompt, then the env's first observation as the user turn) and ``env_spec`` (the
    :meth:`EnvSpec.to_row` JSON the rollout restarts the episode from). Each env is reset once
    here to read its observation, then closed; an env that cannot start raises InfraFailure."""
    rows = []
    for task_id in task_ids:
        spec = EnvSpec(env_id, dict(env_kwargs or {}), task_id, seed)
        env = spec.make()
        try:
            obs, _ = spec.reset(env)
        finally:
            env.close()
        blob = json.dumps(spec.to_row())
        system = [{"role": "system", "content": system_prompt, SPEC_KEY: None}] if system_prompt else []
        rows.append({"prompt": [*system, {"role": "user", "content": obs, SPEC_KEY: blob}], SPEC_KEY: blob})
    return datasets.Dataset.from_list(rows)


def train_eval_datasets(env_id: str, task_ids: list[Any], held_out: int, **kwargs: Any) -> tuple[Any, Any]:
    """``(train, eval)`` datasets of :func:`episode_dataset`, the last ``held_out`` task ids
    (:func:`held_out_split`) kept for evaluation only."""
    train_ids, eval_ids = held_out_split(task_ids, held_out)
    return episode_dataset(env_id, train_ids, **kwargs), episode_dataset(env_id, eval_ids, **kwargs)


def spec_of(prompt: list[dict[str, Any]]) -> EnvSpec:
    """The EnvSpec a dataset prompt carries (its last message's ``env_spec``)."""
    blob = prompt[-1].get(SPEC_KEY)
    if not blob:
        raise ValueError("the prompt carries no env_spec: build the dataset with rockroll.integrations.trl."
                         "episode_dataset")
    return EnvSpec.from_row(json.loads(blob))


def _messages(prompt: list[dict[str, Any]], first_obs: str) -> list[dict[str, str]]:
    """The prompt as the chat template gets it: role and content only, the last user turn the
    observation of the live reset (the same as the dataset's for a deterministic task)."""
    head = [{"role": m["role"], "content": m["content"]} for m in prompt[:-1]]
    return [*head, {"role": "user", "content": first_obs}]


# ---- chat-template rendering -----------------------------------------------------------------

def _ids(tokenizer: Any, messages: list[dict[str, str]], *, generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                        return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) else out)


def env_turn_ids(tokenizer: Any, observation: str, *, reply_closed: bool,
                 end_ids: list[int] | None = None) -> list[int]:
    """The tokens the chat template puts between an assistant reply and the next generation:
    the reply's closing (its end-of-turn token, unless the reply already ended with it), the
    observation as a user turn, and the assistant header. Computed as TRL does for tool turns:
    the template on a dummy conversation with and without the user turn, the common prefix
    cut after its last end-of-turn token (one of ``end_ids``, default the tokenizer's eos)."""
    closing, tail = _turn_parts(tokenizer, observation, set(end_ids or [tokenizer.eos_token_id]))
    return ([] if reply_closed else closing) + tail


def _turn_parts(tokenizer: Any, observation: str, ends: set[int]) -> tuple[list[int], list[int]]:
    """``(closing, tail)``: the end-of-turn token of an assistant reply as the template writes
    it, and what follows it up to the next assistant header, the observation's user turn."""
    dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    prefix = _ids(tokenizer, dummy, generation_prompt=False)
    full = _ids(tokenizer, [*dummy, {"role": "user", "content": observation}], generation_prompt=True)
    at = [k for k, t in enumerate(prefix) if t in ends]
    cut = at[-1] + 1 if at else len(prefix)
    if full[:cut] != prefix[:cut]:
        raise ValueError("the chat template renders an earlier turn differently once a user turn follows; "
                         "multi-turn token ids cannot be appended turn by turn")
    return prefix[at[-1]:cut] if at else [], full[cut:]


# ---- the rollout ---------------------------------------------------------------------------

class _Sampler:
    """Batched ``model.generate`` over the live episodes, turn after turn, keeping the KV cache
    between turns: a turn feeds each episode only what the cache lacks (the last reply's final
    token and the observation; the whole prompt on the first turn), not its whole history again.

    The cache's columns are shared by the rows: a turn's new tokens are left-padded to the
    longest, so a row's own history has holes (that padding; a reply's tokens after its end or
    its budget). They are masked out, and ``generate`` counts positions on the attention mask,
    so every token sits at the position and sees the context it would have without the cache.
    ``reuse=False`` re-feeds each whole sequence every turn (one left-padded batch)."""

    def __init__(self, model: Any, generation_config: Any, pad_id: int, temperature: float, reuse: bool):
        self.model, self.config, self.pad_id, self.temperature, self.reuse = (
            model, generation_config, pad_id, temperature, reuse)
        self.cache = None  # the DynamicCache of the rows' fed tokens, or None (first turn, or not reused)
        self.ids = self.mask = None  # the cached columns' token ids and mask, rows x cache length
        self.fed: list[int] = []  # per row, how many of its sequence's tokens the cache holds

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (indices into the last ``sample``'s), in this order."""
        if self.cache is None or rows == list(range(len(self.fed))):
            return
        if not rows:
            self.cache = self.ids = self.mask = None
            self.fed = []
        else:
            import torch

            index = torch.tensor(rows, dtype=torch.long, device=self.ids.device)
            self.cache.batch_select_indices(index)
            self.ids, self.mask = self.ids[index], self.mask[index]
            self.fed = [self.fed[r] for r in rows]

    def sample(self, sequences: list[list[int]], max_new: int, budgets: list[int],
               end_ids: set[int]) -> list[tuple[list[int], list[float]]]:
        """Per sequence, its reply: the new token ids up to its first end-of-turn token (one of
        ``end_ids``) or its budget (``budgets``, at most ``max_new``), and their log-probs
        under the sampling temperature (raw logits / T, as TRL scores them)."""
        import torch

        device = self.model.device
        cached = self.cache is not None
        new = [s[self.fed[r]:] if cached else s for r, s in enumerate(sequences)]
        width = max(map(len, new))
        ids = torch.tensor([[self.pad_id] * (width - len(s)) + s for s in new], device=device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in new], device=device)
        if cached:
            ids, mask = torch.cat([self.ids, ids], 1), torch.cat([self.mask, mask], 1)
        cfg = copy.deepcopy(self.config)
        cfg.max_new_tokens, cfg.return_dict_in_generate, cfg.output_logits = max_new, True, True
        if self.reuse:
            cfg.use_cache = True
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                      **({"past_key_values": self.cache} if cached else {}))
        total = ids.size(1)
        got = out.sequences[:, total:]
        logps = torch.stack(out.logits, dim=1).float().div(self.temperature).log_softmax(-1)
        picked = logps[:, :got.size(1)].gather(-1, got.unsqueeze(-1)).squeeze(-1)
        replies = []
        for r, budget in enumerate(budgets):
            ids = got[r, :budget].tolist()
            n = next((k + 1 for k, t in enumerate(ids) if t in end_ids), len(ids))
            replies.append((ids[:n], picked[r, :n].tolist()))
        if self.reuse and getattr(out, "past_key_values", None) is not None:
            # the cache holds every token generate fed: all but the last one it sampled
            fed_new = got.size(1) - 1
            self.cache = out.past_key_values
            kept = [min(len(ids), fed_new) for ids, _ in replies]
            gen_mask = torch.tensor([[1] * k + [0] * (fed_new - k) for k in kept], dtype=mask.dtype, device=device)
            self.mask = torch.cat([mask, gen_mask], 1)
            self.ids = out.sequences[:, :total + fed_new].masked_fill(self.mask == 0, self.pad_id)
            self.fed = [len(s) + k for s, k in zip(sequences, kept)]
        return replies


def play_episodes(model: Any, tokenizer: Any, prompts: list[list[dict[str, Any]]], *, generation_config: Any,
                  max_completion_length: int, max_turn_tokens: int | None = None, max_turns: int | None = None,
                  temperature: float = 1.0, eos_token_ids: list[int] | None = None,
                  reuse_cache: bool = True) -> dict[str, list]:
    """Play one episode per prompt (a dataset prompt carrying its env_spec) with ``model`` and
    return what TRL's ``rollout_func`` returns: ``prompt_ids``, ``completion_ids``,
    ``logprobs``, ``env_mask`` (1: sampled by the model, 0: the env's turns), and per episode
    ``episode_reward`` (the sum of the step rewards; None after an infrastructure failure),
    ``episode_success`` (the last ``info["success"]``, None if the env does not say) and
    ``infra_error`` (the message or None).

    Each turn samples at most ``max_turn_tokens`` (default: what is left of the budget) and stops
    at an end-of-turn token; ``max_completion_length`` bounds the whole completion (replies plus
    observations). An episode ends when the env terminates or truncates, after ``max_turns``
    replies, or when the next observation would not fit (then it counts what it earned).

    ``reuse_cache``: keep the KV cache between turns, so a turn prefills only the last reply's
    end and the new observation instead of the episode so far (``_Sampler``); False re-feeds
    every sequence whole each turn."""
    eos_ids = set(eos_token_ids or [tokenizer.eos_token_id])
    n = len(prompts)
    out: dict[str, list] = {"prompt_ids": [None] * n, "completion_ids": [[] for _ in range(n)],
                            "logprobs": [[] for _ in range(n)], "env_mask": [[] for _ in range(n)],
                            "episode_reward": [0.0] * n, "episode_success": [None] * n, "infra_error": [None] * n}
    envs: list[Any] = [None] * n
    active: list[int] = []
    turns = [0] * n
    rendered: dict[tuple[str, bool], list[int]] = {}  # an observation's turn tokens, rendered once per call
    closing = _turn_parts(tokenizer, "", eos_ids)[0] or [tokenizer.eos_token_id]  # a reply's end of turn

    def fail(i: int, exc: BaseException | str) -> None:
        out["infra_error"][i] = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        out["episode_reward"][i] = out["episode_success"][i] = None
        out["env_mask"][i] = [0] * len(out["env_mask"][i])  # nothing of it is learned from
        if not out["completion_ids"][i]:  # TRL reads each completion's last token
            out["completion_ids"][i], out["logprobs"][i], out["env_mask"][i] = [tokenizer.eos_token_id], [0.0], [0]

    def extend(i: int, ids: list[int], logps: list[float], mask: int) -> None:
        out["completion_ids"][i] += ids
        out["logprobs"][i] += logps
        out["env_mask"][i] += [mask] * len(ids)

    try:
        # 1. one env per prompt, reset to the row's task and seed
        for i, prompt in enumerate(prompts):
            spec = spec_of(prompt)
            try:
                envs[i] = spec.make()
                obs, _ = spec.reset(envs[i])
            except _INFRA as exc:
                out["prompt_ids"][i] = _ids(tokenizer, _messages(prompt, prompt[-1]["content"]), generation_prompt=True)
                fail(i, exc)
                continue
            out["prompt_ids"][i] = _ids(tokenizer, _messages(prompt, obs), generation_prompt=True)
            active.append(i)
        # 2. turn by turn, the live episodes together: sample, step, append the observation
        sampler = _Sampler(model, generation_config, tokenizer.pad_token_id, temperature, reuse_cache)
        while active:
            left = {i: max_completion_length - len(out["completion_ids"][i]) for i in active}
            cap = min(max(left.values()), max_turn_tokens or max_completion_length)

            replies = sampler.sample([out["prompt_ids"][i] + out["completion_ids"][i] for i in active], cap,
                                     [min(left[i], cap) for i in active], eos_ids)
            still = []
            for row, (i, (ids, logps)) in enumerate(zip(active, replies)):
                ended = ids[-1] in eos_ids  # else it stopped at its budget
                extend(i, ids, logps, 1)
                turns[i] += 1
                try:
                    obs, reward, terminated, truncated, info = envs[i].step(
                        tokenizer.decode(ids, skip_special_tokens=True))
                except _INFRA as exc:
                    fail(i, exc)
                    continue
                if info.get("infra_error"):
                    fail(i, str(info["infra_error"]))
                    continue
                out["episode_reward"][i] += float(reward)
                if "success" in info:
                    out["episode_success"][i] = bool(info["success"])
                done = terminated or truncated or (max_turns is not None and turns[i] >= max_turns)
                if done:
                    if not ended:  # close the last reply's turn, so TRL does not count it truncated
                        extend(i, closing, [0.0] * len(closing), 0)
                    continue
                key = (obs, bool(ended))
                if key not in rendered:
                    rendered[key] = env_turn_ids(tokenizer, obs, reply_closed=bool(ended), end_ids=sorted(eos_ids))
                env_ids = rendered[key]
                if len(out["completion_ids"][i]) + len(env_ids) >= max_completion_length:
                    continue  # no room for the observation and a reply: the budget ends the episode
                extend(i, env_ids, [0.0] * len(env_ids), 0)
                still.append(row)
            sampler.keep(still)
            active = [active[row] for row in still]
    finally:
        # 3. no env outlives its episode (a sandbox env holds a sandbox)
        for env in envs:
            if env is not None:
                env.close()
    return out


def multi_turn_rollout(*, max_turn_tokens: int | None = None, max_turns: int | None = None,
                       reuse_cache: bool = True) -> Callable[[list, Any], dict[str, list]]:
    """A ``rollout_func`` for ``GRPOTrainer``: :func:`play_episodes` with the trainer's model,
    tokenizer, generation config (``GRPOConfig.temperature``, ``top_p``, ``top_k``,
    ``generation_kwargs``), ``max_completion_length`` and end-of-turn ids. ``max_turn_tokens``
    caps one reply, ``max_turns`` the replies of an episode; ``reuse_cache``: keep the KV cache
    between an episode's turns (see :func:`play_episodes`). Pair it with :func:`env_reward`."""

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        if trainer.use_vllm:
            raise NotImplementedError("rockroll's TRL rollout generates with the trainer's model; "
                                      "use_vllm is not supported yet")
        from trl.models import unwrap_model_for_generation

        # as TRL's own generation: checkpointing off while sampling, its generation kwargs over the model's
        with unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) as model:
            return play_episodes(model, trainer.processing_class, prompts, generation_config=trainer.generation_config,
                                 max_completion_length=trainer.max_completion_length, max_turn_tokens=max_turn_tokens,
                                 max_turns=max_turns, temperature=trainer.temperature,
                                 eos_token_ids=trainer.eos_token_ids, reuse_cache=reuse_cache)

    return rollout


# ---- rewards ---------------------------------------------------------------------------------

def env_reward(completions: list, episode_reward: list[float | None] | None = None,
               episode_success: list[bool | None] | None = None, log_metric: Callable | None = None,
               **kwargs: Any) -> list[float | None]:
    """The reward function of :func:`multi_turn_rollout`: each episode's env reward, None for an
    infrastructure failure (TRL drops it from the group statistics). Logs ``env/success`` (the
    share of scored episodes that succeeded) and ``env/infra_errors`` through TRL's ``log_metric``."""
    if episode_reward is None:
        raise ValueError("env_reward scores rockroll episodes: pass rollout_func=multi_turn_rollout() to GRPOTrainer")
    if log_metric is not None:
        flags = [s for s in (episode_success or []) if s is not None]
        if flags:
            log_metric("env/success", sum(flags) / len(flags))
        log_metric("env/infra_errors", sum(r is None for r in episode_reward) / max(1, len(episode_reward)))
    return [None if r is None else float(r) for r in episode_reward]


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role") == "assistant")


def step_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    """Single-turn training with a plain ``GRPOTrainer`` (no ``rollout_func``): for each
    completion, a fresh episode of its prompt's task stepped once with the completion's text;
    its reward, or None when the env failed (dropped, not scored 0). The env is closed after."""
    specs = kwargs.get(SPEC_KEY) or [None] * len(prompts)
    rewards: list[float | None] = []
    for prompt, completion, blob in zip(prompts, completions, specs):
        spec = EnvSpec.from_row(json.loads(blob)) if blob else spec_of(prompt)
        env = None
        try:
            env = spec.make()
            spec.reset(env)
            _, reward, _, _, info = env.step(_text(completion))
            rewards.append(None if info.get("infra_error") else float(reward))
        except _INFRA:
            rewards.append(None)
        finally:
            if env is not None:
                env.close()
    return rewards
