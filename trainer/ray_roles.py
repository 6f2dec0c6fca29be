"""Ray roles: the controller loop of :mod:`.controller`, with each part in its own actor.

- :class:`PolicyTrainer` (one) owns the policy (torch or DeepSpeed engine, with PPO's value
  head as the critic) and, when ``algorithm.kl_coef > 0``, a frozen reference copy of the
  starting model; it runs ``update``.
- :class:`Generator` (``ray.num_generators``) owns a generation engine (Transformers here,
  vLLM on GPU).
- :class:`EnvWorker` (``ray.num_env_workers``) runs a :class:`RolloutManager` (many envs on
  one asyncio loop) whose requests go to one Generator through :class:`RemoteEngine`. Each
  worker fills its share of ``rollout.batch_groups`` from a seed stream of its own and numbers
  its groups in a block of its own, so groups of two workers never merge in GRPO.

Weight sync after each step (``ray.weight_sync``): ``object_store``, the trainer's state dict
is one object in Ray's object store that every generator loads; ``collective``, the trainer
broadcasts it over torch.distributed (:mod:`.weight_sync`: gloo on CPU, NCCL on GPU). Every
sample carries the version of the generator weights that produced it.

``ray.init`` is local and on 127.0.0.1 (:func:`init_local_ray`) unless ``ray.address`` names
a cluster to join.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import EnvConfig, TrainConfig, config_to_dict
from .controller import _seed_everything, build_policy, collate, make_generator, update_policy
from .curriculum import initialized_metrics
from .engines import SamplingParams
from .models import build_model, load_tokenizer
from .rollout import PromptTemplate, RolloutManager, _mix, batch_metrics
from .runlog import RunLogger
from .weight_sync import Manifest, WeightGroup, checksum, manifest

__all__ = ["GROUP_ID_BLOCK", "Roles", "init_local_ray", "merge_rollout_metrics", "start_roles", "stop_roles",
           "sync_weights", "train_with_ray", "worker_config"]

GROUP_ID_BLOCK = 1 << 32  # env worker i numbers its groups from i * GROUP_ID_BLOCK


def init_local_ray(num_cpus: int | None = None) -> None:
    """A local Ray on 127.0.0.1 only (no dashboard), as the rest of rockroll does."""
    import ray

    from rockroll.sandbox.deployment.ray import keep_loopback

    if ray.is_initialized():
        return
    keep_loopback()
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus,
             ignore_reinit_error=True, log_to_driver=False)


def _node_ip() -> str:
    """This process's node address as Ray knows it (127.0.0.1 under :func:`init_local_ray`)."""
    import ray

    return ray.util.get_node_ip_address()


def worker_config(cfg: TrainConfig, index: int) -> TrainConfig:
    """Env worker ``index``'s config: an even share of ``rollout.batch_groups`` (a step still
    trains on ``batch_groups`` groups) and a seed of its own, which draws its tasks, env seeds
    and sampling seeds. Worker 0 keeps ``cfg.seed``: one worker draws what the local loop does."""
    n, bg = cfg.ray.num_env_workers, cfg.rollout.batch_groups
    share = bg // n + (index < bg % n)
    return dataclasses.replace(cfg, seed=cfg.seed if index == 0 else _mix(cfg.seed, index),
                               rollout=dataclasses.replace(cfg.rollout, batch_groups=share))


# ----------------------------------------------------------------------------- actors


class _GeneratorImpl:
    def __init__(self, cfg: TrainConfig, tokenizer: Any):
        self.engine = make_generator(cfg, build_model(cfg.model, tokenizer, cfg.seed), tokenizer)
        self.group: WeightGroup | None = None

    def generate(self, prompts, sampling: SamplingParams):
        return self.engine.generate(prompts, sampling), self.engine.version

    def version(self) -> int:
        return self.engine.version

    def load_weights(self, state_dict, version: int) -> None:
        self.engine.load_weights(state_dict, version)

    def join_weight_group(self, address: tuple[str, int], rank: int, world_size: int) -> None:
        self.group = WeightGroup(rank, world_size)
        self.group.connect(_node_ip(), address)

    def receive_weights(self, spec: Manifest, version: int) -> None:
        # NCCL leaves CUDA tensors here, which an in-process vLLM engine loads as they are
        self.engine.load_weights(self.group.receive(spec), version)

    def weights_checksum(self) -> str:  # Transformers engine: its model is in this process
        return checksum(self.engine.model.state_dict())


class RemoteEngine:
    """The generating half of :class:`GenerationEngine` over a Generator actor (weights reach
    the generator from the controller, never through an env worker)."""

    def __init__(self, actor: Any):
        import ray

        self.actor, self._ray = actor, ray
        self.version = ray.get(actor.version.remote())

    def generate(self, prompts, sampling):
        outs, self.version = self._ray.get(self.actor.generate.remote([list(p) for p in prompts], sampling))
        return outs


class _EnvWorkerImpl:
    def __init__(self, cfg: TrainConfig, tokenizer: Any, generator: Any, first_group_id: int,
                 env_factory: Callable[[EnvConfig], Any] | None = None):
        self.engine = RemoteEngine(generator)
        self.mgr = RolloutManager(cfg, self.engine, PromptTemplate(tokenizer, cfg.tokenizer), env_factory=env_factory)
        self.mgr.next_gid = first_group_id  # equal ids of two workers would merge their GRPO groups

    def start(self, version: int, state: dict | None = None) -> None:
        """Start producing groups for the weights of ``version`` (from a checkpoint's state)."""
        if state is not None:
            self.mgr.load_state_dict(state)
        self.advance(version)
        self.mgr.start()

    def get_batch(self, step: int):
        return self.mgr.get_batch(step)

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        return self.mgr.evaluate(episodes, seed)

    def advance(self, version: int) -> None:
        """The generator now serves ``version``: admit the groups it allows (and end a pause).
        Samples are labelled with the version each generate call reports, not this one."""
        self.mgr.set_version(version)
        self.mgr.resume()

    def pause(self) -> None:
        self.mgr.pause()

    def state_dict(self) -> dict[str, Any]:
        return self.mgr.state_dict()

    def close(self) -> None:
        self.mgr.close()


class _PolicyTrainerImpl:
    def __init__(self, cfg: TrainConfig, tokenizer: Any):
        _seed_everything(cfg.seed, cfg.deterministic)
        self.cfg, self.pad_id = cfg, tokenizer.pad_token_id
        self.policy, self.ref_forward = build_policy(cfg, build_model(cfg.model, tokenizer, cfg.seed))
        self.group: WeightGroup | None = None

    def update(self, groups) -> dict[str, float]:
        return update_policy(self.policy, self.cfg.algorithm, collate(groups, self.pad_id),
                             self.cfg.generation.temperature, self.ref_forward)

    def weights(self):
        return self.policy.sync_state_dict()

    def weights_checksum(self) -> str:
        return checksum(self.policy.sync_state_dict())

    def open_weight_group(self, world_size: int) -> tuple[tuple[str, int], Manifest]:
        """Rank 0 of the weight group: its store's address, and what the generators receive."""
        self.group = WeightGroup(0, world_size)
        return self.group.host_store(_node_ip()), manifest(self.policy.sync_state_dict())

    def join_weight_group(self) -> None:
        self.group.connect(_node_ip())

    def send_weights(self) -> None:
        self.group.send(self.policy.sync_state_dict())

    def restore(self) -> dict[str, Any] | None:
        """Load the latest checkpoint if there is one: ``{"step", "rollout", "path"}``."""
        ckpt = latest_checkpoint(self.cfg.checkpoint.dir) if self.cfg.checkpoint.resume else None
        return None if ckpt is None else {**load_checkpoint(ckpt, self.policy), "path": str(ckpt)}

    def save(self, step: int, worker_states: list[dict]) -> None:
        save_checkpoint(self.cfg.checkpoint.dir, step, self.policy, {"workers": worker_states},
                        config_to_dict(self.cfg), keep=self.cfg.checkpoint.keep)


def make_actor_classes(num_gpus: float = 0.0):
    """The Ray actor classes (built lazily: ``ray`` is an optional extra). ``num_cpus=0``: CPU
    smoke runs share cores; ``num_gpus`` goes to the trainer and to each generator."""
    import ray

    return (ray.remote(num_cpus=0, num_gpus=num_gpus)(_PolicyTrainerImpl),
            ray.remote(num_cpus=0, num_gpus=num_gpus)(_GeneratorImpl),
            ray.remote(num_cpus=0)(_EnvWorkerImpl))


# ----------------------------------------------------------------------------- the roles


@dataclasses.dataclass
class Roles:
    trainer: Any
    generators: list[Any]
    workers: list[Any]                     # env worker i asks generators[i % len(generators)]
    manifest: Manifest | None = None       # set when weights go by collective broadcast
    sync_address: tuple[str, int] | None = None


def start_roles(cfg: TrainConfig, tokenizer: Any, env_factory: Callable[[EnvConfig], Any] | None = None) -> Roles:
    """Create the actors (env workers built, not started) and, for ``collective`` weight
    sync, the trainer + generators process group."""
    import ray

    Trainer, Generator, EnvWorker = make_actor_classes(cfg.ray.num_gpus)
    trainer = Trainer.remote(cfg, tokenizer)
    generators = [Generator.remote(cfg, tokenizer) for _ in range(cfg.ray.num_generators)]
    workers = [EnvWorker.remote(worker_config(cfg, i), tokenizer, generators[i % len(generators)],
                                i * GROUP_ID_BLOCK, env_factory) for i in range(cfg.ray.num_env_workers)]
    roles = Roles(trainer, generators, workers)
    if cfg.ray.weight_sync == "collective":
        world = 1 + len(generators)
        roles.sync_address, roles.manifest = ray.get(trainer.open_weight_group.remote(world))
        ray.get([trainer.join_weight_group.remote(),  # all members at once: the rendezvous waits for each
                 *[g.join_weight_group.remote(roles.sync_address, i + 1, world) for i, g in enumerate(generators)]])
    return roles


def sync_weights(roles: Roles, version: int) -> None:
    """The trainer's weights to every generator, which then serves ``version``."""
    import ray

    if roles.manifest is None:  # one object in the store; each generator fetches it
        state = roles.trainer.weights.remote()
        ray.get([g.load_weights.remote(state, version) for g in roles.generators])
    else:
        ray.get([roles.trainer.send_weights.remote(),
                 *[g.receive_weights.remote(roles.manifest, version) for g in roles.generators]])


def stop_roles(roles: Roles) -> None:
    import ray

    try:
        ray.get([w.close.remote() for w in roles.workers], timeout=60)
    finally:
        for actor in [*roles.workers, *roles.generators, roles.trainer]:
            ray.kill(actor)


def merge_rollout_metrics(results: list[tuple[list, dict[str, float]]], step: int) -> dict[str, float]:
    """One step's rollout metrics over every env worker's ``(groups, metrics)``: batch
    statistics recomputed over all groups, event counts (``rollout/*`` counters) summed, and
    per-worker gauges (each worker's curriculum) averaged."""
    groups = [g for gs, _ in results for g in gs]
    merged = batch_metrics(groups, step)
    if any("curriculum/initialized" in m for _, m in results):
        merged.update(initialized_metrics(groups))
    rest: dict[str, list[float]] = {}
    for _, m in results:
        for k, v in m.items():
            if k not in merged:
                rest.setdefault(k, []).append(v)
    for k, vs in rest.items():
        merged[k] = sum(vs) if k.startswith("rollout/") else sum(vs) / len(vs)
    return merged


# ----------------------------------------------------------------------------- the controller


def train_with_ray(cfg: TrainConfig, *, env_factory: Callable[[EnvConfig], Any] | None = None) -> dict[str, Any]:
    """:func:`~rockroll.trainer.controller.train` over Ray actors: the same steps, run folder
    and checkpoints (one rollout state per env worker). Starts a local Ray on 127.0.0.1 when
    none is running and ``ray.address`` is null, and shuts down what it started."""
    import ray

    run_dir = Path(cfg.logging.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, run_dir / "tokenizer")
    owns_ray = not ray.is_initialized()
    if owns_ray and cfg.ray.address:
        from rockroll.sandbox.deployment.ray import connect

        connect(cfg.ray.address)
    elif owns_ray:
        init_local_ray()
    roles, log, history = None, None, []
    try:
        roles = start_roles(cfg, tokenizer, env_factory)

        # ---- resume: the trainer restores the policy, each env worker its rollout state
        state = ray.get(roles.trainer.restore.remote())
        start = state["step"] if state else 0
        worker_states = state["rollout"].get("workers") if state else [None] * len(roles.workers)
        if worker_states is None or len(worker_states) != len(roles.workers):
            raise RuntimeError(f"{state['path']}: its rollout state is not one per env worker "
                               f"(ray.num_env_workers={len(roles.workers)}); resume with the settings that wrote it")
        if state:
            print(f"rockroll: resumed from {state['path']} at step {start}")
        sync_weights(roles, start)
        ray.get([w.start.remote(start, s) for w, s in zip(roles.workers, worker_states)])

        log = RunLogger(run_dir, tensorboard=cfg.logging.tensorboard, plot=cfg.logging.plot,
                        transcripts=cfg.logging.transcripts, progress=cfg.logging.progress,
                        total_steps=cfg.steps, start_step=start, plot_every=cfg.logging.plot_every)
        for step in range(start, cfg.steps):
            if cfg.eval.every and step % cfg.eval.every == 0:  # the weights of version `step`
                log.log_eval(step, ray.get(roles.workers[0].evaluate.remote(cfg.eval.episodes, cfg.eval.seed)))
            t0 = time.perf_counter()
            results = ray.get([w.get_batch.remote(step) for w in roles.workers])  # 1. rollout
            t_roll = time.perf_counter() - t0
            groups = [g for gs, _ in results for g in gs]
            metrics = merge_rollout_metrics(results, step)
            metrics.update(ray.get(roles.trainer.update.remote(groups)))          # 2-4. advantages, loss, step
            log.transcripts(step, groups, tokenizer)
            if cfg.checkpoint.dir and cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                _save(roles, step + 1)
            sync_weights(roles, step + 1)                                         # 5. weight sync
            ray.get([w.advance.remote(step + 1) for w in roles.workers])          # 6. policy version += 1
            metrics.update({"time/rollout_wait_s": t_roll, "time/step_s": time.perf_counter() - t0,
                            "policy_version": step + 1})
            log.log(step, metrics)
            history.append({"step": step, **metrics})
        if cfg.eval.every and cfg.steps > start:  # the final weights, wherever the interval ends
            log.log_eval(cfg.steps, ray.get(roles.workers[0].evaluate.remote(cfg.eval.episodes, cfg.eval.seed)))
        if cfg.checkpoint.dir and cfg.steps > start and (not cfg.checkpoint.every or cfg.steps % cfg.checkpoint.every):
            _save(roles, cfg.steps)
    finally:
        try:
            if roles is not None:
                stop_roles(roles)
        finally:
            if log is not None:
                log.close()
            if owns_ray:
                ray.shutdown()
    return {"steps": cfg.steps, "start_step": start, "history": history, "run_dir": str(run_dir),
            "tokenizer": tokenizer}


def _save(roles: Roles, step: int) -> None:
    """A checkpoint of ``step``: in-flight groups finish on the old weights, then the trainer
    saves the policy with every env worker's rollout state."""
    import ray

    ray.get([w.pause.remote() for w in roles.workers])
    ray.get(roles.trainer.save.remote(step, ray.get([w.state_dict.remote() for w in roles.workers])))
