"""The supervised warm start: ``rockroll sft CONFIG`` (``sft(config)``).

Why a command of its own over the training config (and not a ``stage`` key): SFT and RL share
the policy (``model``, ``tokenizer``, ``engine``), the envs and the evaluation, so one YAML
describes both stages; ``rockroll sft cfg.yaml`` reads its ``sft`` section and writes a model
folder, then ``rockroll train cfg.yaml --set model.init_from=<that folder>`` starts RL from it.
Each stage keeps its own logs, checkpoints and resume (SFT under ``<logging.dir>/sft`` and
``<checkpoint.dir>/sft``), and a stage key would have made one run folder mean two runs.

Per step: ``sft.batch_size`` examples drawn by a step-seeded RNG (so a resumed run draws
what the uninterrupted one would), packed into micro-batches of at most
``sft.tokens_per_micro_batch`` tokens (longest first, so little padding, and no example
attends to another), the loss the mean negative log-likelihood of the assistant's tokens
(mask 1) over the whole batch, one optimizer step on the trainer's engine (torch or
DeepSpeed). Evaluation as ``eval`` says: success over fresh episodes on the generator, and
``eval/nll``, the NLL per assistant token of ``eval.episodes`` expert episodes per env on the
held-out ``eval.task_ids``.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, Callable

import torch

from rockroll.sandbox.lifecycle import install_exit_handlers

from .config import EnvConfig, TrainConfig, config_to_dict, load_config
from .engines.lora import save_lm
from .engines.policy import ActorModule, make_policy
from .envs import make_env, resolve_envs
from .models import build_model, load_tokenizer, model_folder
from .roles.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .roles.local import make_generator, seed_everything
from .roles.runlog import RunLogger
from .rollout.manager import PromptTemplate, RolloutManager
from .rollout.sft_data import SFTExample, expert_examples, messages_examples, record_examples

__all__ = ["load_examples", "masked_nll", "pack", "sft"]


def load_examples(cfg: TrainConfig, template: PromptTemplate, env_factory: Callable[[EnvConfig], Any],
                  task_ids: list[Any] | None = None, seed: int | None = None,
                  episodes: int | None = None) -> tuple[list[SFTExample], dict]:
    """The examples of every ``sft.sources`` entry, and counts by source. ``task_ids``: play
    the expert episodes on these tasks instead (the held-out ones), with ``seed``, and
    ``episodes`` of them per env where given (else each source's own count)."""
    out: list[SFTExample] = []
    counts: dict[str, int] = {}
    for i, src in enumerate(cfg.sft.sources):
        if src.kind == "expert":
            for spec in cfg.envs:
                got = expert_examples(spec, template, env_factory, episodes=episodes or src.episodes, epsilon=src.epsilon,
                                      seed=cfg.seed + i if seed is None else seed, max_turns=cfg.rollout.max_turns,
                                      task_ids=task_ids, keep_failed=src.keep_failed, habit=src.habit,
                                      habit_rate=src.habit_rate, habit_episodes=src.habit_episodes)
                out += got
                counts[f"expert:{spec.id}"] = counts.get(f"expert:{spec.id}", 0) + len(got)
                counts["expert_success"] = counts.get("expert_success", 0) + sum(bool(e.success) for e in got)
        elif task_ids is not None:
            continue  # held-out examples come from the experts alone
        elif src.kind == "records":
            got, how = record_examples(src.path, template)
            out += got
            for k, v in how.items():
                counts[f"records_{k}"] = counts.get(f"records_{k}", 0) + v
        else:
            got = messages_examples(src.path, template)
            out += got
            counts["messages"] = counts.get("messages", 0) + len(got)
    return out, counts


def pack(examples: list[SFTExample], tokens: int) -> list[list[SFTExample]]:
    """Micro-batches of ``examples``, longest first, each at most ``tokens`` tokens once padded
    to its longest (an example longer than ``tokens`` alone)."""
    batches: list[list[SFTExample]] = []
    for ex in sorted(examples, key=lambda e: -len(e.token_ids)):
        if batches and len(batches[-1][0].token_ids) * (len(batches[-1]) + 1) <= tokens:
            batches[-1].append(ex)
        else:
            batches.append([ex])
    return batches


def _collate(batch: list[SFTExample], pad_id: int, device: torch.device):
    n = max(len(e.token_ids) for e in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), n), dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.float32)
    for i, e in enumerate(batch):
        ids[i, : len(e.token_ids)] = torch.tensor(e.token_ids)
        attn[i, : len(e.token_ids)] = 1
        mask[i, : len(e.mask)] = torch.tensor(e.mask, dtype=torch.float32)
    return ids.to(device), attn.to(device), mask.to(device)


def masked_nll(policy: Any, examples: list[SFTExample], pad_id: int, tokens: int, *, train: bool) -> dict[str, float]:
    """The NLL of the assistant's tokens of ``examples`` (summed over tokens, then divided by
    their count); with ``train`` its gradients are accumulated and one optimizer step taken.
    Returns ``loss`` (per assistant token), ``tokens`` and, when training, ``grad_norm``."""
    total = sum(sum(e.mask[1:]) for e in examples)
    if total == 0:
        raise ValueError("no assistant tokens to train on")
    batches, nll = pack(examples, tokens), 0.0
    for k, batch in enumerate(batches):
        ids, attn, mask = _collate(batch, pad_id, policy.device)
        with torch.set_grad_enabled(train):
            # logits from the first assistant token on: the prompts' LM head and softmax are skipped
            held = mask[:, 1:].any(0).nonzero()
            first = int(held[0]) if len(held) else 0
            logits, _ = policy.forward(ids, attn, logits_to_keep=ids.shape[1] - first)
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, first + 1:, None]).squeeze(-1)
            loss = -(logp * mask[:, first + 1:]).sum() / total
        if train:
            policy.backward(loss, last=k == len(batches) - 1)
        nll += float(loss.detach()) * total
    out = {"loss": nll / total, "tokens": float(total)}
    if train:
        out["grad_norm"] = policy.step()
    return out


def sft(config: TrainConfig | dict | str | Path, *,
        env_factory: Callable[[EnvConfig], Any] | None = None) -> dict[str, Any]:
    """Run the SFT stage as ``config`` says; return a summary: ``model_dir`` (for
    ``model.init_from``), ``start_step``, ``history`` (metrics per step), ``evals``, ``counts``
    (examples by source), ``heldout_examples`` (the expert episodes ``eval/nll`` is measured on)."""
    install_exit_handlers()  # SIGTERM -> a normal exit, so the expert's sandboxes are closed (as train's)
    cfg = config if isinstance(config, TrainConfig) else load_config(config)
    if env_factory is None:
        resolve_envs(cfg)
    factory = env_factory or make_env
    s = cfg.sft
    run_dir = Path(cfg.logging.dir) / "sft"
    ckpt_dir = str(Path(cfg.checkpoint.dir) / "sft") if cfg.checkpoint.dir else None
    model_dir = Path(s.output_dir or run_dir / "model")
    seed_everything(cfg.seed, cfg.deterministic)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, Path(cfg.logging.dir) / "tokenizer",
                               model_folder(cfg.model))
    lm = build_model(cfg.model, tokenizer, cfg.seed)
    template = PromptTemplate(tokenizer, cfg.tokenizer)
    data, counts = load_examples(cfg, template, factory)
    if not data:
        raise ValueError("sft: the sources gave no examples")
    heldout: list[SFTExample] = []
    nll_episodes = cfg.eval.episodes if s.heldout_nll_episodes is None else s.heldout_nll_episodes
    if cfg.eval.task_ids and nll_episodes and any(src.kind == "expert" for src in s.sources):
        # as many held-out expert episodes as asked, not the source's training count: with a real
        # model, 512 of them cost ~100 s of forward per evaluation
        heldout, _ = load_examples(cfg, template, factory, task_ids=cfg.eval.task_ids, seed=cfg.eval.seed,
                                   episodes=nll_episodes)
    mgr = generator = None
    if cfg.eval.every:
        generator = make_generator(cfg, lm, tokenizer)  # a copy of lm, taken before the engine wraps it
        mgr = RolloutManager(cfg, generator, template, env_factory=env_factory)
        mgr.pause()  # no training rollouts: it only evaluates
        mgr.start()
    engine = dataclasses.replace(cfg.engine, lr=s.lr or cfg.engine.lr)
    policy = make_policy(ActorModule(lm, with_value=False, lora=cfg.model.lora), engine, s.batch_size)
    ckpt = latest_checkpoint(ckpt_dir) if cfg.checkpoint.resume else None
    start = load_checkpoint(ckpt, policy)["step"] if ckpt else 0
    if ckpt:
        print(f"rockroll: sft resumed from {ckpt} at step {start}")
    pad, budget = tokenizer.pad_token_id, s.tokens_per_micro_batch
    log = RunLogger(run_dir, tensorboard=cfg.logging.tensorboard, plot=cfg.logging.plot, transcripts=0,
                    progress=cfg.logging.progress, total_steps=s.steps, start_step=start,
                    plot_every=cfg.logging.plot_every, curve_keys=("sft/loss", "eval/success"), desc="sft",
                    reevaluate_start=bool(cfg.eval.every) and start < s.steps and start % cfg.eval.every == 0)
    history, evals = [], []

    def evaluate(step: int) -> None:
        out: dict[str, float] = {}
        if mgr is not None:
            mgr.load_weights(policy.sync_state_dict(), step)
            out.update(mgr.evaluate(cfg.eval.episodes, cfg.eval.seed))
        if heldout:
            out["eval/nll"] = masked_nll(policy, heldout, pad, budget, train=False)["loss"]
        log.log_eval(step, out)
        evals.append({"step": step, **out})

    try:
        for step in range(start, s.steps):
            if cfg.eval.every and step % cfg.eval.every == 0:
                evaluate(step)
            rng = random.Random(cfg.seed * 1_000_003 + step)
            batch = [data[rng.randrange(len(data))] for _ in range(s.batch_size)]
            metrics = {f"sft/{k}": v for k, v in masked_nll(policy, batch, pad, budget, train=True).items()}
            log.log(step, metrics)
            history.append({"step": step, **metrics})
            if ckpt_dir and cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                save_checkpoint(ckpt_dir, step + 1, policy, {}, config_to_dict(cfg), keep=cfg.checkpoint.keep)
        if cfg.eval.every and s.steps > start:
            evaluate(s.steps)
        if ckpt_dir and s.steps > start and (not cfg.checkpoint.every or s.steps % cfg.checkpoint.every):
            save_checkpoint(ckpt_dir, s.steps, policy, {}, config_to_dict(cfg), keep=cfg.checkpoint.keep)
        model_dir.mkdir(parents=True, exist_ok=True)
        save_lm(policy.module.lm, model_dir)  # with LoRA: the merged model, and its adapter in adapter/
        tokenizer.save_pretrained(model_dir)
    finally:
        try:
            if mgr is not None:
                mgr.close()
            if hasattr(generator, "close"):
                generator.close()
        finally:
            log.close()
    return {"model_dir": str(model_dir), "start_step": start, "steps": s.steps, "history": history,
            "evals": evals, "counts": counts, "heldout_examples": len(heldout), "run_dir": str(run_dir),
            "policy": policy, "tokenizer": tokenizer}
