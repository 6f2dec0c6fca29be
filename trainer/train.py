"""The controller: rollout -> advantages -> loss -> optimizer step -> weight sync, per step.

:func:`train` reads top to bottom; the maths lives in :mod:`.algorithms` and :mod:`.credit`
(pure functions), the moving parts in :mod:`.rollout` (async envs), :mod:`.engines`
(generation), :mod:`.policy` (torch / DeepSpeed), :mod:`.checkpoint` and :mod:`.runlog`.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import algorithms as A
from . import credit as C
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import AlgorithmConfig, TrainConfig, config_to_dict, load_config
from .engines import TransformersEngine, VLLMEngine
from .models import build_model, load_tokenizer
from .policy import ActorModule, make_policy
from .rollout import Group, PromptTemplate, RolloutManager
from .runlog import RunLogger

__all__ = ["Batch", "collate", "compute_loss", "train"]


class Batch:
    """Groups as padded tensors, aligned on *predicted* tokens: position t of ``mask``,
    ``targets``, ``behav_logp`` is token t+1 of the sequence, predicted by logits at t."""

    def __init__(self, groups: list[Group], pad_id: int):
        samples = [s for g in groups for s in g.samples]
        L = max(len(s.token_ids) for s in samples)
        B = len(samples)
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        attn = torch.zeros(B, L, dtype=torch.long)
        mask = torch.zeros(B, L, dtype=torch.bool)
        blp = torch.zeros(B, L)
        for i, s in enumerate(samples):
            n = len(s.token_ids)
            ids[i, :n] = torch.tensor(s.token_ids)
            attn[i, :n] = 1
            mask[i, :n] = torch.tensor(s.mask, dtype=torch.bool)
            blp[i, :n] = torch.tensor(s.behav_logp)
        self.input_ids, self.attention_mask = ids, attn
        self.targets, self.mask, self.behav_logp = ids[:, 1:], mask[:, 1:], blp[:, 1:]
        self.rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        self.group_ids = torch.tensor([s.group_id for s in samples])
        self.size = B

    def select(self, idx: torch.Tensor) -> "Batch":
        b = copy.copy(self)
        for k in ("input_ids", "attention_mask", "targets", "mask", "behav_logp", "rewards", "group_ids"):
            setattr(b, k, getattr(self, k)[idx])
        b.size = len(idx)
        return b


def collate(groups: list[Group], pad_id: int) -> Batch:
    return Batch(groups, pad_id)


def token_logp(policy_forward, batch: Batch, temperature: float):
    """log pi(target_t) with logits / temperature (the distribution the generator sampled),
    and values if the module has a value head."""
    logits, values = policy_forward(batch.input_ids, batch.attention_mask)
    logits = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    return logp, (values[:, :-1] if values is not None else None)


def compute_advantages(a: AlgorithmConfig, batch: Batch, old_logp, ref_logp, values):
    """Advantages (B,) or (B, T) for the configured algorithm, and PPO returns (or None)."""
    if a.name == "reinforce_pp":
        return A.reinforce_pp_advantages(batch.rewards, batch.mask, old_logp, ref_logp, kl_coef=a.kl_coef), None
    if a.name == "ppo":
        # outcome reward on the last response token; GAE over response tokens (observations transparent)
        T = batch.mask.shape[1]
        pos = torch.arange(T).expand_as(batch.mask)
        last = torch.where(batch.mask, pos, -1).max(-1).values.clamp(min=0)
        r_tok = torch.zeros_like(old_logp)
        r_tok[torch.arange(batch.size), last] = batch.rewards
        adv, returns = A.gae(r_tok, values, batch.mask, gamma=a.gamma, lam=a.lam)
        mean = A.masked_mean(adv, batch.mask)
        std = A.masked_mean((adv - mean) ** 2, batch.mask).sqrt()
        return torch.where(batch.mask, (adv - mean) / (std + 1e-6), 0.0), returns
    if a.name == "topr":  # a baseline (Dr.GRPO), no std scaling: TOPR weighs by reward sign
        return A.grpo_advantages(batch.rewards, batch.group_ids, std_normalize=False), None
    if a.ipa.enabled:
        return C.ipa_advantages(batch.rewards, batch.group_ids, batch.mask, a.ipa.gamma,
                                std_normalize=a.std_normalize), None
    return A.grpo_advantages(batch.rewards, batch.group_ids, std_normalize=a.std_normalize), None


def compute_loss(a: AlgorithmConfig, logp, old_logp, adv, batch: Batch, ref_logp=None, values=None,
                 returns=None) -> tuple[torch.Tensor, dict[str, float]]:
    """The configured policy loss over masked response tokens (+ KL, + value loss)."""
    m = batch.mask
    is_w = A.tis_weights(old_logp, batch.behav_logp, m, cap=a.tis_cap) if a.tis_cap > 0 else None
    if a.name == "topr":
        loss, met = A.topr_loss(logp, old_logp, adv, m, agg=a.loss_agg)
    elif a.name == "cispo":
        loss, met = A.cispo_loss(logp, old_logp, adv, m, eps_high=a.clip_high, eps_low=a.clip_low, agg=a.loss_agg)
    elif a.ipa.enabled:
        loss, met = C.ipa_loss(logp, old_logp, adv, m, ratio_low=a.ipa.ratio_low, ratio_high=a.ipa.ratio_high,
                               clip=a.clip_low, agg=a.loss_agg)
    else:
        loss, met = A.ppo_clip_loss(logp, old_logp, adv, m, clip_low=a.clip_low, clip_high=a.clip_high,
                                    dual_clip=a.dual_clip, is_weight=is_w, agg=a.loss_agg)
    met = {f"loss/{k}": v for k, v in met.items()}
    met["loss/pg"] = float(loss.detach())
    if a.kl_coef > 0 and a.name != "reinforce_pp" and ref_logp is not None:
        kl = A.aggregate(A.kl_k3(logp, ref_logp), m, a.loss_agg)
        loss = loss + a.kl_coef * kl
        met["loss/kl"] = float(kl.detach())
    if a.name == "ppo" and values is not None:
        vf = A.masked_mean((values - returns) ** 2, m)
        loss = loss + a.vf_coef * vf
        met["loss/value"] = float(vf.detach())
    if is_w is not None:
        met["loss/tis_weight_mean"] = A.masked_mean(is_w, m).item()
    met["loss/total"] = float(loss.detach())
    return loss, met


def update_policy(policy, a: AlgorithmConfig, batch: Batch, temperature: float, ref_forward=None) -> dict[str, float]:
    """One training step on a batch: advantages, then ppo_epochs x mini_batches optimizer steps."""
    single = a.ppo_epochs == 1 and a.mini_batches == 1
    with torch.no_grad():
        ref_logp = token_logp(ref_forward, batch, temperature)[0] if ref_forward is not None else None
        old_logp, old_values = (None, None) if single else token_logp(policy.forward, batch, temperature)
    metrics: dict[str, list[float]] = {}
    if single:  # the proximal policy is the current one: reuse this forward for old_logp
        logp, values = token_logp(policy.forward, batch, temperature)
        old_logp = logp.detach()
        ref = ref_logp if ref_logp is not None else old_logp
        adv, returns = compute_advantages(a, batch, old_logp, ref, values.detach() if values is not None else None)
        loss, met = compute_loss(a, logp, old_logp, adv, batch, ref_logp, values, returns)
        met["grad_norm"] = policy.step(loss)
        return met
    ref = ref_logp if ref_logp is not None else old_logp
    adv, returns = compute_advantages(a, batch, old_logp, ref, old_values)
    for _ in range(a.ppo_epochs):
        for idx in torch.arange(batch.size).chunk(a.mini_batches):
            mb = batch.select(idx)
            logp, values = token_logp(policy.forward, mb, temperature)
            loss, met = compute_loss(a, logp, old_logp[idx], adv[idx], mb,
                                     None if ref_logp is None else ref_logp[idx], values,
                                     None if returns is None else returns[idx])
            met["grad_norm"] = policy.step(loss)
            for k, v in met.items():
                metrics.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in metrics.items()}


def _seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def make_generator(cfg: TrainConfig, lm, tokenizer):
    if cfg.generation.backend == "vllm":
        path = cfg.model.name_or_path
        if not path:  # a tiny model built from the config: vLLM loads models from a folder
            path = str(Path(cfg.logging.dir) / "generator_model")
            lm.save_pretrained(path)
            tokenizer.save_pretrained(path)
        return VLLMEngine(path, gpu_memory_utilization=cfg.generation.gpu_memory_utilization, seed=cfg.seed,
                          dtype=cfg.model.dtype)
    gen_model = copy.deepcopy(lm)  # its own copy: weights move only at sync points
    return TransformersEngine(gen_model, tokenizer.pad_token_id)


def train(config: TrainConfig | dict | str | Path, *, env_factory=None) -> dict[str, Any]:
    """Run RL training as configured; return a summary (final step, metrics history)."""
    cfg = config if isinstance(config, TrainConfig) else load_config(config)
    _seed_everything(cfg.seed, cfg.deterministic)
    run_dir = Path(cfg.logging.dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    # ---- models: tokenizer, policy (+ value head for PPO), frozen reference, generator
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, run_dir / "tokenizer")
    lm = build_model(cfg.model, tokenizer, cfg.seed)
    module = ActorModule(lm, with_value=cfg.algorithm.name == "ppo")
    ref_forward = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(lm).eval().requires_grad_(False)
        ref_forward = lambda ids, attn: (ref(input_ids=ids, attention_mask=attn, use_cache=False).logits, None)  # noqa: E731
    # The generator copies ``lm`` before the policy engine wraps it: ZeRO-3 partitions the
    # parameters in place (each becomes an empty placeholder), so a later copy has no weights.
    generator = make_generator(cfg, lm, tokenizer)
    batch_size = cfg.rollout.batch_groups * cfg.rollout.group_size
    policy = make_policy(module, cfg.engine, batch_size // cfg.algorithm.mini_batches)
    template = PromptTemplate(tokenizer, cfg.tokenizer)
    rollout = RolloutManager(cfg, generator, template, env_factory=env_factory)

    # ---- resume
    start = 0
    ckpt = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if ckpt is not None:
        state = load_checkpoint(ckpt, policy)
        start = state["step"]
        rollout.load_state_dict(state["rollout"])
        print(f"rockroll: resumed from {ckpt} at step {start}")
    generator.load_weights(policy.sync_state_dict(), version=start)
    rollout.version = start

    log = RunLogger(run_dir, tensorboard=cfg.logging.tensorboard, plot=cfg.logging.plot,
                    transcripts=cfg.logging.transcripts, progress=cfg.logging.progress,
                    total_steps=cfg.steps, start_step=start, plot_every=cfg.logging.plot_every)
    rollout.start()
    history = []
    try:
        for step in range(start, cfg.steps):
            if cfg.eval.every and step % cfg.eval.every == 0:  # the weights of version `step`
                log.log_eval(step, rollout.evaluate(cfg.eval.episodes, cfg.eval.seed))
            t0 = time.perf_counter()
            groups, metrics = rollout.get_batch(step)                        # 1. rollout
            t_roll = time.perf_counter() - t0
            batch = collate(groups, tokenizer.pad_token_id)
            metrics.update(update_policy(policy, cfg.algorithm, batch,       # 2-4. advantages, loss, step
                                         cfg.generation.temperature, ref_forward))
            log.transcripts(step, groups, tokenizer)
            if cfg.checkpoint.dir and cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                rollout.pause()  # in-flight groups finish on the old weights, then the buffer is saved
                save_checkpoint(cfg.checkpoint.dir, step + 1, policy, rollout.state_dict(),
                                config_to_dict(cfg), keep=cfg.checkpoint.keep)
            generator.load_weights(policy.sync_state_dict(), version=step + 1)  # 5. weight sync
            rollout.set_version(step + 1)                                    # 6. policy version += 1
            rollout.resume()
            metrics.update({"time/rollout_wait_s": t_roll, "time/step_s": time.perf_counter() - t0,
                            "policy_version": step + 1})
            log.log(step, metrics)
            history.append({"step": step, **metrics})
        if cfg.eval.every and cfg.steps > start:  # the final weights, wherever the interval ends
            log.log_eval(cfg.steps, rollout.evaluate(cfg.eval.episodes, cfg.eval.seed))
        if cfg.checkpoint.dir and cfg.steps > start and (not cfg.checkpoint.every or cfg.steps % cfg.checkpoint.every):
            rollout.pause()
            save_checkpoint(cfg.checkpoint.dir, cfg.steps, policy, rollout.state_dict(), config_to_dict(cfg),
                            keep=cfg.checkpoint.keep)
    finally:
        rollout.close()
        log.close()
    return {"steps": cfg.steps, "start_step": start, "history": history, "run_dir": str(run_dir),
            "policy": policy, "generator": generator, "tokenizer": tokenizer}
