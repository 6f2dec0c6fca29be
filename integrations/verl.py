"""verl adapter: an agent loop that plays rockroll envs inside verl's rollout, the parquet
dataset it reads, and GRPO that leaves env failures out of the group statistics.

- :class:`RockrollAgentLoop` (registered as ``"rockroll"``, the dataset's ``agent_name``) makes
  the row's env, renders its first observation with the chat template and plays the episode
  token in, token out through ``server_manager.generate``: the model's ids are appended as they
  came (mask 1, their logprobs kept), the env's replies as chat-template tokens (mask 0), until
  the env ends the episode, ``max_turns`` is reached or ``rollout.response_length`` is spent.
  ``reward_score`` is the episode's return, so verl needs no reward function for these rows.
- An infrastructure failure (:class:`InfraFailure`, ``info["infra_error"]``, a sandbox error) is
  not a zero reward: the sample comes back *dropped* -- one placeholder token with
  ``response_mask`` 0 (no token of it reaches any loss), ``reward_score`` 0 and
  ``extra_fields["rockroll_dropped"] = True`` (in verl's ``non_tensor_batch``). verl keeps every
  sample of a batch, so an estimator has to skip it: ``algorithm.adv_estimator=rockroll_grpo``
  (:func:`grpo_without_dropped`) is GRPO over the samples that have a trainable token, the
  dropped ones getting advantage 0. verl's own ``grpo`` would count their 0 in the group mean.
- :func:`write_dataset` writes ``train.parquet`` / ``test.parquet`` (held-out task ids) in the
  columns verl's ``RLHFDataset`` reads: ``data_source``, ``prompt``, ``agent_name``,
  ``reward_model``, ``extra_info`` (the env spec as JSON under ``extra_info["rockroll"]``).

Every process that needs these names imports this module: verl's agent loop workers through
``agent_loop_config_path`` (examples/verl/agent_loop.yaml), the driver that computes advantages
through ``VERL_USE_EXTERNAL_MODULES=rockroll.integrations.verl`` (docs/integrations.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Sequence
from uuid import uuid4

from .episodes import EnvSpec, InfraFailure, held_out_split, require, write_rows

agent_loop = require("verl.experimental.agent_loop.agent_loop", "verl")
core_algos = require("verl.trainer.ppo.core_algos", "verl")

__all__ = ["AGENT_NAME", "DROPPED", "ESTIMATOR", "RockrollAgentLoop", "dataset_rows", "grpo_without_dropped",
           "spec_of", "write_dataset"]

AGENT_NAME = "rockroll"          # the dataset's ``agent_name`` and the registry key
ESTIMATOR = "rockroll_grpo"      # ``algorithm.adv_estimator``
DROPPED = "rockroll_dropped"     # ``extra_fields`` / ``non_tensor_batch`` key: True for a dropped sample
SPEC_KEY = "rockroll"            # ``extra_info[SPEC_KEY]``: the env spec, JSON


# ------------------------------------------------------------------ dataset
def dataset_rows(env_id: str, task_ids: Sequence[Any], *, env_kwargs: dict[str, Any] | None = None,
                 seed: int | None = None, split: str = "train") -> list[dict[str, Any]]:
    """One verl row per task id. The spec travels as a JSON string, so rows of different envs or
    task-id types share one parquet schema; ``prompt`` only names the task (the loop renders the
    env's own first observation) and is what verl's prompt-length filter measures."""
    rows = []
    for index, task_id in enumerate(task_ids):
        spec = EnvSpec(env_id, dict(env_kwargs or {}), task_id, seed)
        rows.append({
            "data_source": env_id,
            "prompt": [{"role": "user", "content": f"{env_id} task {task_id}"}],
            "agent_name": AGENT_NAME,
            "reward_model": {"style": "rockroll-env", "ground_truth": ""},
            "extra_info": {"index": index, "split": split, SPEC_KEY: json.dumps(spec.to_row())},
        })
    return rows


def write_dataset(path: str | Path, env_id: str, task_ids: Sequence[Any], *, held_out: int,
                  env_kwargs: dict[str, Any] | None = None, seed: int | None = None) -> dict[str, Path]:
    """``{"train": <path>/train.parquet, "test": <path>/test.parquet}``: the last ``held_out``
    task ids go to ``test`` only (``data.val_files``), the rest to ``train`` (``data.train_files``)."""
    train, test = held_out_split(list(task_ids), held_out)
    return {split: write_rows(dataset_rows(env_id, ids, env_kwargs=env_kwargs, seed=seed, split=split),
                              Path(path) / f"{split}.parquet", "verl")
            for split, ids in (("train", train), ("test", test))}


def spec_of(row: dict[str, Any]) -> EnvSpec:
    """The env spec of a row as verl hands it to the loop (its ``extra_info``)."""
    extra = row.get("extra_info") or {}
    raw = extra.get(SPEC_KEY)
    if raw is None:
        raise KeyError(f"row has no extra_info[{SPEC_KEY!r}]: write it with rockroll.integrations.verl.write_dataset")
    return EnvSpec.from_row(json.loads(raw) if isinstance(raw, str) else dict(raw))


# ------------------------------------------------------------------ advantage
@core_algos.register_adv_est(ESTIMATOR)
def grpo_without_dropped(token_level_rewards: Any, response_mask: Any, index: Any, epsilon: float = 1e-6,
                         norm_adv_by_std_in_grpo: bool = True, config: Any = None, **_: Any) -> tuple[Any, Any]:
    """verl's GRPO outcome advantage over the kept samples of each group: a sample with no
    trainable token (a dropped one) is left out of its group's mean and std and gets 0."""
    import torch

    kept = response_mask.sum(dim=-1) > 0
    scores = token_level_rewards.sum(dim=-1)
    if config is not None and hasattr(config, "get"):
        norm_adv_by_std_in_grpo = config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    out = torch.zeros_like(scores)
    with torch.no_grad():
        groups: dict[Any, list[int]] = {}
        for i, uid in enumerate(index):
            if kept[i]:
                groups.setdefault(uid, []).append(i)
        for members in groups.values():
            s = scores[members]
            mean, std = (s.mean(), s.std()) if len(members) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
            out[members] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
        adv = out.unsqueeze(-1) * response_mask
    return adv, adv


# ------------------------------------------------------------------ the agent loop
SANDBOX_ERRORS: tuple[type[BaseException], ...] = (InfraFailure,)
try:  # a sandbox that died under an env is the infrastructure's failure, not the model's
    from rockroll.sandbox.errors import SandboxError

    SANDBOX_ERRORS = (InfraFailure, SandboxError)
except ImportError:  # pragma: no cover - the sandbox ships with rockroll
    pass


@agent_loop.register(AGENT_NAME)
class RockrollAgentLoop(agent_loop.AgentLoopBase):
    """One rockroll episode per dataset row (see the module docstring).

    ``max_turns`` (agent_loop.yaml) caps the model's turns; the env's own limit still holds.
    Env calls run in a thread, so a slow sandbox never stalls the other episodes of the worker.
    """

    def __init__(self, *args: Any, max_turns: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        self.max_turns = max_turns or multi_turn.get("max_assistant_turns") or None

    async def _env(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        spec = spec_of(kwargs)
        want_logprobs = bool(sampling_params.get("logprobs"))
        metrics = {"generate_sequences": 0.0, "tool_calls": 0.0}
        env, prompt_ids = None, None
        try:
            t = time.perf_counter()
            env = await self._env(spec.make)
            obs, _ = await self._env(spec.reset, env)
            metrics["tool_calls"] += time.perf_counter() - t
            messages = [{"role": "user", "content": obs}]
            prompt_ids = await self.ct_build_initial_tokens(messages)
            return await self._play(env, spec, messages, prompt_ids, sampling_params, metrics, want_logprobs)
        except SANDBOX_ERRORS as e:
            if prompt_ids is None:  # no observation to show: the dataset's prompt stands in
                prompt_ids = await self.ct_build_initial_tokens(list(kwargs.get("raw_prompt") or []))
            return self._dropped(spec, prompt_ids, metrics, want_logprobs, str(e))
        finally:
            if env is not None:
                await self._env(env.close)

    async def _play(self, env: Any, spec: EnvSpec, messages: list[dict[str, Any]], prompt_ids: list[int],
                    sampling_params: dict[str, Any], metrics: dict[str, float], want_logprobs: bool) -> Any:
        ids, mask = list(prompt_ids), []
        logprobs: list[float] | None = [] if want_logprobs else None
        request_id, turns, shown, rewards, ended = uuid4().hex, 0, 0, [], False
        while not ended and len(mask) < self.response_length and (self.max_turns is None or turns < self.max_turns):
            # 1. the model's turn, token ids in and out; its ids are kept as they came
            params = {**sampling_params, "max_tokens": self.response_length - len(mask)}
            t = time.perf_counter()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=ids, sampling_params=params)
            metrics["generate_sequences"] += time.perf_counter() - t
            merge, mask, logprobs = await self.ct_merge_assistant_token(
                ids, out.token_ids, mask, logprobs if want_logprobs else None,
                assistant_logprobs=(out.log_probs or [0.0] * len(out.token_ids)) if want_logprobs else None)
            ids, turns = merge.token_ids, turns + 1
            reply = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            # 2. the env's turn on the decoded reply
            t = time.perf_counter()
            obs, reward, terminated, truncated, info = await self._env(env.step, reply)
            metrics["tool_calls"] += time.perf_counter() - t
            if info.get("infra_error"):
                raise InfraFailure(spec.env_id, str(info["infra_error"]))
            rewards.append(float(reward))
            ended = terminated or truncated
            if ended or len(mask) >= self.response_length or (self.max_turns and turns >= self.max_turns):
                break
            # 3. the env's reply as chat-template tokens, mask 0; an episode that cannot show it ends
            previous = messages + [{"role": "assistant", "content": reply}]
            messages = previous + [{"role": "user", "content": obs}]
            merge, new_mask, new_logprobs = await self.ct_merge_context_msg(
                previous, messages, ids, mask, logprobs if want_logprobs else None)
            if len(new_mask) >= self.response_length:
                break
            ids, mask, logprobs = merge.token_ids, new_mask, new_logprobs if want_logprobs else None
            shown += 1
        response_ids = ids[len(ids) - len(mask):] if mask else []
        return agent_loop.AgentLoopOutput(
            prompt_ids=ids[:len(ids) - len(mask)],
            response_ids=response_ids[:self.response_length],
            response_mask=mask[:self.response_length],
            response_logprobs=logprobs[:self.response_length] if want_logprobs else None,
            reward_score=float(sum(rewards)),
            num_turns=1 + turns + shown,  # the first observation, the model's turns, the env replies shown
            metrics=metrics,
            extra_fields={"turn_scores": rewards, "tool_rewards": [], DROPPED: False, "rockroll_env_id": spec.env_id},
        )

    def _dropped(self, spec: EnvSpec, prompt_ids: list[int], metrics: dict[str, float], want_logprobs: bool,
                 error: str) -> Any:
        """The sample verl keeps but nothing learns from: one masked placeholder token (verl pads and
        scores every sample; an empty response would put the score before the response)."""
        pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.tokenizer.pad_token_id
        return agent_loop.AgentLoopOutput(
            prompt_ids=list(prompt_ids), response_ids=[pad or 0], response_mask=[0],
            response_logprobs=[0.0] if want_logprobs else None, reward_score=0.0, num_turns=1, metrics=metrics,
            extra_fields={"turn_scores": [], "tool_rewards": [], DROPPED: True, "rockroll_env_id": spec.env_id,
                          "rockroll_infra_error": error},
        )
