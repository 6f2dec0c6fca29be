r"""The roles in this process: the policy trainer, the env worker, the batch roles, and
:class:`LocalRoles` that holds them for :func:`~rockroll.trainer.loop.run`.

- :class:`PolicyTrainer` and :class:`EnvWorker` are the roles' code, written once:
  :class:`LocalRoles` runs them in this process, :mod:`.ray` in Ray actors
  (``ray.remote`` of the same classes), with as many env workers and generators as asked.
- :class:`ReferenceRole` (the KL reference) and :class:`AttentionRole` (attention-rhythm
  credit) are :class:`~.base.BatchRole`\ s, as is :class:`~.critics.CriticsRole`.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..algorithms import rhythm as R
from ..config import EnvConfig, TrainConfig, config_to_dict
from ..engines.generation import TransformersEngine, VLLMEngine
from ..engines.offload import Offloadable
from ..engines.policy import ActorModule, make_policy
from ..models import allowed_token_ids, build_model, load_tokenizer, model_folder
from ..rollout.manager import PromptTemplate, RolloutManager
from ..rollout.reward import RewardRole
from ..rollout.types import Group
from .base import BatchRole, Roles
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .critics import CriticsRole
from .placement import role_name
from .update import collate, micro_rows, token_logp, update_policy

__all__ = ["AttentionRole", "EnvWorker", "LocalRoles", "PolicyTrainer", "ReferenceRole", "batch_role_classes",
           "batch_roles", "build_policy", "make_generator", "seed_everything"]


# ----------------------------------------------------------------------------- building blocks


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def make_generator(cfg: TrainConfig, lm, tokenizer):
    """The generation engine over a copy of ``lm`` (vLLM or Transformers)."""
    if cfg.generation.backend == "vllm":
        path = model_folder(cfg.model)
        if not path:  # a tiny model built from the config: vLLM loads models from a folder
            path = str(Path(cfg.logging.dir) / "generator_model")
            lm.save_pretrained(path)
            tokenizer.save_pretrained(path)
        return VLLMEngine(path, gpu_memory_utilization=cfg.generation.gpu_memory_utilization, seed=cfg.seed,
                          dtype=cfg.model.dtype)
    gen_model = copy.deepcopy(lm)  # its own copy: weights move only at sync points
    return TransformersEngine(gen_model, tokenizer.pad_token_id, max_batch=cfg.rollout.max_batch_size,
                              on_load=cfg.generation.on_weight_load, prefix_cache_mb=cfg.generation.prefix_cache_mb)


def build_policy(cfg: TrainConfig, lm) -> Any:
    """The policy engine over ``lm`` (+ a value head for PPO).

    Copies of ``lm`` (the reference's, the generator's) are taken before this call: ZeRO-3
    partitions the parameters in place (each becomes an empty placeholder), so a later copy
    has no weights.
    """
    batch_size = cfg.rollout.batch_groups * cfg.rollout.group_size
    return make_policy(ActorModule(lm, with_value=cfg.algorithm.spec.value_head, lora=cfg.model.lora), cfg.engine,
                       batch_size // cfg.algorithm.mini_batches)


def batch_role_classes(cfg: TrainConfig) -> list[type]:
    """The batch roles a config asks for. Each is built as ``cls(cfg, lm, tokenizer)``, ``lm``
    a copy of the policy's starting model of its own (which a role may ignore): the KL
    reference when ``algorithm.kl_coef > 0``, AsyPPO's mini-critics for ``algorithm.name: asyppo``,
    the attention pass when ``algorithm.rhythm.enabled``."""
    a = cfg.algorithm
    return ([ReferenceRole] if a.kl_coef > 0 else []) + ([CriticsRole] if a.spec.critics else []) + \
        ([AttentionRole] if a.rhythm.enabled else [])


def batch_roles(cfg: TrainConfig, lm, tokenizer: Any) -> list[BatchRole]:
    """The batch roles of :func:`batch_role_classes` in this process, each over its own copy
    of ``lm`` (taken before the policy engine wraps it)."""
    return [cls(cfg, copy.deepcopy(lm), tokenizer) for cls in batch_role_classes(cfg)]


# ----------------------------------------------------------------------------- the roles


class ReferenceRole(BatchRole, Offloadable):
    """:class:`BatchRole`: the frozen KL reference, ``lm`` at the start of training;
    annotates ``ref_logp``, log-probs under the distribution the generator samples from.
    No checkpoint state: the start model is rebuilt from the config and seed."""

    name = "reference"  # its key in ray.roles (placement)

    def __init__(self, cfg: TrainConfig, lm: Any, tokenizer: Any):
        self.cfg, self.pad_id = cfg, tokenizer.pad_token_id
        # on the GPU when there is one, as the policy is (its annotations come back to the CPU)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = lm.eval().requires_grad_(False).to(self.device)
        ids = allowed_token_ids(tokenizer, cfg.generation.allowed_tokens)
        self.allowed = None if ids is None else torch.tensor(ids, device=self.device)

    def _forward(self, ids, attn, logits_to_keep: int = 0):
        return self.model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=logits_to_keep).logits, None

    def annotate(self, groups: list[Group]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            g = self.cfg.generation
            batch = collate(groups, self.pad_id).to(self.device)
            micro = micro_rows(self.cfg.engine, batch, self.model.config.vocab_size)
            logp, _ = token_logp(self._forward, batch, g.temperature, micro, self.allowed, g.top_k, g.top_p,
                                 min_p=g.min_p, repetition_penalty=g.repetition_penalty, trim_prompt=True)
        return {"ref_logp": logp.cpu()}

    def train(self, groups: list[Group], aux: dict[str, torch.Tensor]) -> dict[str, float]:
        return {}

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        pass  # frozen

    def resident_state(self):
        return [self.model], []


class AttentionRole(BatchRole, Offloadable):
    """:class:`BatchRole`: attention-rhythm credit (:mod:`rockroll.trainer.algorithms.rhythm`).
    An eager-attention copy of the policy (SDPA and flash kernels never materialise the
    attention maps), loaded with the policy's weights at every sync, forwards each sampled
    sequence once; of the heads of ``algorithm.rhythm.layers`` layers of the middle third, the
    ``head_fraction`` that look least far back over the response (local) give each response
    token's WAAD and the ``head_fraction`` that look farthest (global) its FAI (per sequence,
    :func:`~rockroll.trainer.algorithms.rhythm.split_heads`), and the configured scheme
    turns them into ``credit_scale`` (B, T), which multiplies the advantages (1 off the
    response). No checkpoint state: its weights and version are the policy's, loaded at the
    first sync after a resume."""

    def __init__(self, cfg: TrainConfig, lm: Any, tokenizer: Any):
        self.cfg, self.rc, self.pad_id = cfg, cfg.algorithm.rhythm, tokenizer.pad_token_id
        self.model = lm.to("cuda" if torch.cuda.is_available() else "cpu").eval().requires_grad_(False)
        self.model.set_attn_implementation("eager")
        self.layers = R.middle_layers(self.model.config.num_hidden_layers, self.rc.layers)
        self.version, self._metrics = 0, {}

    def _attention(self, ids, attn) -> torch.Tensor:
        """(b, layers x heads, n, n): every head of the read layers."""
        maps = self.model(input_ids=ids, attention_mask=attn, output_attentions=True, use_cache=False).attentions
        return torch.cat([maps[i].float() for i in self.layers], 1)

    def annotate(self, groups: list[Group]) -> dict[str, torch.Tensor]:
        batch, rc = collate(groups, self.pad_id), self.rc
        scale = torch.ones(batch.mask.shape)
        device = next(self.model.parameters()).device
        step = self.cfg.engine.micro_batch_size or batch.size
        picked = {"preplan": 0.0, "anchor": 0.0}
        with torch.no_grad():
            for idx in torch.arange(batch.size).split(step):
                mb = batch.select(idx).to(device)
                n = int(mb.attention_mask.sum(-1).max())  # left-aligned: later columns are padding
                mask = mb.mask[:, : n - 1]
                heads = self._attention(mb.input_ids[:, :n], mb.attention_mask[:, :n])
                local, glob = R.split_heads(heads, torch.nn.functional.pad(mask, (1, 0)), rc.head_fraction)
                w, f = R.action_signals(local, glob, mask, rc.window, fai_lo=rc.fai_window_low,
                                        fai_hi=rc.fai_window_high)
                scale[idx, : n - 1] = R.credit_scale(
                    w, f, mask, scheme=rc.scheme, top_k=rc.top_k, amplify_preplan=rc.amplify_preplan,
                    amplify_anchor=rc.amplify_anchor, pass_fraction=rc.pass_fraction,
                    couple_within=rc.couple_within, couple_waad_max=rc.couple_waad_max).cpu()
                picked["preplan"] += float(R.preplan_tokens(w, mask, rc.top_k).sum())
                picked["anchor"] += float(R.anchor_tokens(f, mask, rc.top_k).sum())
        tokens = max(float(batch.mask.sum()), 1.0)
        self._metrics = {f"rhythm/{k}_frac": v / tokens for k, v in picked.items()}
        self._metrics["rhythm/scale_mean"] = float(scale[batch.mask].mean()) if batch.mask.any() else 1.0
        self._metrics["rhythm/weights_version"] = float(self.version)
        return {"credit_scale": scale}

    def train(self, groups: list[Group], aux: dict[str, torch.Tensor]) -> dict[str, float]:
        return self._metrics  # what this step's annotation picked

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version

    def resident_state(self):
        return [self.model], []


class PolicyTrainer(Offloadable):
    """:class:`Trainer` over ``lm``: the policy engine (torch or DeepSpeed, PPO's value head as
    the critic)."""

    shard = (0, 1)  # (rank, world size) of a data-parallel trainer: the ranks split each mini-batch

    def __init__(self, cfg: TrainConfig, lm: Any, tokenizer: Any):
        self.cfg, self.pad_id = cfg, tokenizer.pad_token_id
        self.allowed_ids = allowed_token_ids(tokenizer, cfg.generation.allowed_tokens)
        self.policy = build_policy(cfg, lm)

    def update(self, groups: list[Group], aux: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        return update_policy(self.policy, self.cfg.algorithm, collate(groups, self.pad_id),
                             self.cfg.generation.temperature, self.allowed_ids, aux, self.shard,
                             top_k=self.cfg.generation.top_k, top_p=self.cfg.generation.top_p,
                             min_p=self.cfg.generation.min_p,
                             repetition_penalty=self.cfg.generation.repetition_penalty)

    def weights(self) -> dict[str, Any]:
        # on the policy's device: the generator and the batch roles of this process load them
        # from there (on one GPU, device to device)
        return self.policy.sync_state_dict(self.policy.device)

    def restore(self) -> dict[str, Any] | None:
        ckpt = latest_checkpoint(self.cfg.checkpoint.dir) if self.cfg.checkpoint.resume else None
        return None if ckpt is None else {**load_checkpoint(ckpt, self.policy), "path": str(ckpt)}

    def save(self, step: int, rollout_state: dict[str, Any], roles_state: dict[str, Any] | None = None) -> None:
        save_checkpoint(self.cfg.checkpoint.dir, step, self.policy, rollout_state, config_to_dict(self.cfg),
                        keep=self.cfg.checkpoint.keep, rank=self.shard[0], roles_state=roles_state)

    def resident_state(self):
        # the torch engine's (config.py refuses offload with DeepSpeed, which places its own state)
        return [self.policy.module], [self.policy.optimizer]


class EnvWorker:
    """:class:`Rollout` by a :class:`RolloutManager` (many envs on one asyncio loop) whose
    requests go to ``engine``. Its groups are numbered from ``first_group_id``: equal ids of
    two workers would merge their GRPO groups."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any, engine: Any, first_group_id: int = 0,
                 env_factory: Callable[[EnvConfig], Any] | None = None, reward: Any = None):
        # reward: a reward.RemoteReward over a shared reward actor (None: cfg.reward in this process)
        if reward is None and cfg.reward.active:
            reward = RewardRole(cfg, tokenizer)
        self.mgr = RolloutManager(cfg, engine, PromptTemplate(tokenizer, cfg.tokenizer), env_factory=env_factory,
                                  reward=reward, call_records=Path(cfg.logging.dir) / "model_calls.jsonl")
        self.mgr.next_gid = first_group_id

    def start(self, version: int, state: dict[str, Any] | None = None) -> None:
        if state is not None:
            self.mgr.load_state_dict(state)
        self.advance(version)
        self.mgr.start()

    def get_batch(self, step: int) -> tuple[list[Group], dict[str, float]]:
        return self.mgr.get_batch(step)

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        return self.mgr.evaluate(episodes, seed)

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Weights into an in-process engine, between two of its generate calls."""
        self.mgr.load_weights(state_dict, version)

    def advance(self, version: int) -> None:
        # samples are labelled with the version each generate call reports, not this one
        self.mgr.set_version(version)
        self.mgr.resume()

    def pause(self) -> None:
        self.mgr.pause()

    def state_dict(self) -> dict[str, Any]:
        return self.mgr.state_dict()

    def close(self) -> None:
        self.mgr.close()


class LocalRoles(Roles):
    """Every role in this process: one policy trainer, one env worker whose generator is an
    engine of its own (a copy of the starting weights)."""

    def __init__(self, cfg: TrainConfig, env_factory: Callable[[EnvConfig], Any] | None = None):
        seed_everything(cfg.seed, cfg.deterministic)
        self.tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, Path(cfg.logging.dir) / "tokenizer",
                                        model_folder(cfg.model))
        lm = build_model(cfg.model, self.tokenizer, cfg.seed)
        self.generator = make_generator(cfg, lm, self.tokenizer)  # copies of lm, taken before the engine wraps it
        self.batch_roles = batch_roles(cfg, lm, self.tokenizer)
        self.batch_names = [role_name(cls) for cls in batch_role_classes(cfg)]
        self.trainer = PolicyTrainer(cfg, lm, self.tokenizer)
        self.rollout = EnvWorker(cfg, self.tokenizer, self.generator, env_factory=env_factory)

    def sync_weights(self, version: int) -> None:
        weights = self.trainer.weights()
        self.rollout.load_weights(weights, version)
        for role in self.batch_roles:
            role.load_weights(weights, version)

    def close(self) -> None:
        self.rollout.close()
        if hasattr(self.generator, "close"):  # the continuous-batching thread
            self.generator.close()

    def summary(self) -> dict[str, Any]:
        return {"policy": self.trainer.policy, "generator": self.generator, "batch_roles": self.batch_roles}
