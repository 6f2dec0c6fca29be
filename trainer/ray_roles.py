"""Ray roles: the same controller loop, with each part in its own actor.

- :class:`PolicyTrainer` owns the policy (torch or DeepSpeed engine) and runs ``update``;
- :class:`Generator` owns a generation engine (Transformers here, vLLM on GPU);
- :class:`EnvWorker` runs a :class:`RolloutManager` (many envs on one asyncio loop) whose
  requests go to a Generator actor through :class:`RemoteEngine`.

Weights travel through the Ray object store: the trainer ``ray.put``s its state dict once
and every generator loads it from the same object. ``ray.init`` is always local and on
127.0.0.1 (:func:`init_local_ray`).
"""

from __future__ import annotations

from typing import Any

from .config import TrainConfig
from .engines import SamplingParams


def init_local_ray(num_cpus: int | None = None) -> None:
    """A local Ray on 127.0.0.1 only (no dashboard), as the rest of rockroll does."""
    import ray

    from rockroll.sandbox.raycluster import keep_loopback

    if ray.is_initialized():
        return
    keep_loopback()
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus,
             ignore_reinit_error=True, log_to_driver=False)


class _GeneratorImpl:
    def __init__(self, cfg: TrainConfig, tokenizer_dir: str):
        from transformers import AutoTokenizer

        from .models import build_model
        from .train import make_generator

        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.engine = make_generator(cfg, build_model(cfg.model, self.tok, cfg.seed), self.tok)

    def generate(self, prompts, sampling: SamplingParams):
        return self.engine.generate(prompts, sampling), self.engine.version

    def load_weights(self, state_dict, version: int) -> int:
        self.engine.load_weights(state_dict, version)
        return version

    def version(self) -> int:
        return self.engine.version


class RemoteEngine:
    """The :class:`GenerationEngine` interface over a Generator actor."""

    def __init__(self, actor: Any):
        import ray

        self.actor, self._ray = actor, ray
        self.version = ray.get(actor.version.remote())

    def generate(self, prompts, sampling):
        outs, self.version = self._ray.get(self.actor.generate.remote([list(p) for p in prompts], sampling))
        return outs

    def load_weights(self, state_dict, version: int) -> None:
        self._ray.get(self.actor.load_weights.remote(state_dict, version))
        self.version = version


class _EnvWorkerImpl:
    def __init__(self, cfg: TrainConfig, tokenizer_dir: str, generator: Any):
        from transformers import AutoTokenizer

        from .rollout import PromptTemplate, RolloutManager

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.engine = RemoteEngine(generator)
        self.mgr = RolloutManager(cfg, self.engine, PromptTemplate(tok, cfg.tokenizer))
        self.mgr.start()

    def get_batch(self, step: int):
        return self.mgr.get_batch(step)

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        return self.mgr.evaluate(episodes, seed)

    def set_version(self, version: int) -> None:
        self.engine.version = version
        self.mgr.set_version(version)

    def close(self) -> None:
        self.mgr.close()


class _PolicyTrainerImpl:
    def __init__(self, cfg: TrainConfig, tokenizer_dir: str):
        import torch
        from transformers import AutoTokenizer

        from .models import build_model
        from .policy import ActorModule, make_policy

        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        lm = build_model(cfg.model, self.tok, cfg.seed)
        self.policy = make_policy(ActorModule(lm, with_value=cfg.algorithm.name == "ppo"), cfg.engine,
                                  cfg.rollout.batch_groups * cfg.rollout.group_size)

    def update(self, groups) -> dict[str, float]:
        from .train import collate, update_policy

        return update_policy(self.policy, self.cfg.algorithm, collate(groups, self.tok.pad_token_id),
                             self.cfg.generation.temperature)

    def weights(self):
        return self.policy.sync_state_dict()


def make_actor_classes():
    """The Ray actor classes (built lazily: ``ray`` is an optional extra)."""
    import ray

    opts = {"num_cpus": 0}  # CPU smoke runs share cores; GPU runs set num_gpus per role
    return (ray.remote(**opts)(_PolicyTrainerImpl), ray.remote(**opts)(_GeneratorImpl),
            ray.remote(**opts)(_EnvWorkerImpl))


def train_with_ray(cfg: TrainConfig, tokenizer_dir: str, *, num_env_workers: int = 1) -> list[dict[str, float]]:
    """The controller loop over actors: rollout -> update -> weights via the object store."""
    import ray

    Trainer, Generator, EnvWorker = make_actor_classes()
    trainer = Trainer.remote(cfg, tokenizer_dir)
    generator = Generator.remote(cfg, tokenizer_dir)
    ray.get(generator.load_weights.remote(trainer.weights.remote(), 0))  # start from the trainer's weights
    workers = [EnvWorker.remote(cfg, tokenizer_dir, generator) for _ in range(num_env_workers)]
    history = []
    try:
        for step in range(cfg.steps):
            evaluated = {}
            if cfg.eval.every and step % cfg.eval.every == 0:  # the weights of version `step`
                evaluated = ray.get(workers[0].evaluate.remote(cfg.eval.episodes, cfg.eval.seed))
            results = ray.get([w.get_batch.remote(step) for w in workers])         # rollout
            groups = [g for gs, _ in results for g in gs]
            metrics = ray.get(trainer.update.remote(groups))                        # advantages, loss, step
            metrics.update(evaluated)
            weights = ray.put(ray.get(trainer.weights.remote()))                    # one copy in the object store
            ray.get(generator.load_weights.remote(weights, step + 1))               # weight sync
            ray.get([w.set_version.remote(step + 1) for w in workers])              # version += 1
            metrics.update({k: v for k, v in results[0][1].items()})
            metrics["policy_version"] = step + 1
            history.append({"step": step, **metrics})
    finally:
        ray.get([w.close.remote() for w in workers])
        for a in [*workers, generator, trainer]:
            ray.kill(a)
    return history
