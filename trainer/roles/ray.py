"""The Ray implementation of :mod:`.local`: the loop of :mod:`rockroll.trainer.loop` with each role in its own actor.

- the policy trainer: :class:`~.local.PolicyTrainer` in an actor, which builds its own
  model, and joins the weight group for ``collective`` sync; with ``ray.num_trainers`` > 1,
  that many actors, the ranks of one DeepSpeed ZeRO process group (gloo on CPU, NCCL on
  GPU), each training on its slice of every mini-batch (:class:`RayTrainer`);
- generators (``ray.num_generators``), each owning a generation engine (Transformers here,
  vLLM on GPU);
- batch roles (:class:`~.base.BatchRole`: the KL reference...), each in an actor of its own
  (:class:`_BatchRole`) that builds its own model, asked concurrently on each step's groups;
- the reward role (:class:`~rockroll.trainer.rollout.reward.RewardRole`: verifiers and an LLM judge), when the config
  has one: ``ray.num_reward_actors`` async actors (``reward`` in ``ray.roles``) that the env
  workers share through :class:`~rockroll.trainer.rollout.reward.RemoteReward` (worker i asks actor i % n), so a
  local judge model is loaded once, not once per worker;
- env workers (``ray.num_env_workers``): :class:`~.local.EnvWorker` in an actor, whose
  requests go to every generator through :class:`RemoteEngine`, one request at a time to the
  least loaded (prompt replication: the n samples of a group are n requests spread over all
  generators, not one generator's batch). Each worker fills its share of
  ``rollout.batch_groups`` from a seed stream of its own and numbers its groups in a block of
  its own, so groups of two workers never merge in GRPO; :class:`RayRollout` is them all as
  one :class:`~.base.Rollout`.

The loop calls a role in an actor as it calls the in-process one (:class:`Remote`).
``ray.roles`` places the actors in one placement group (:mod:`.placement`). Roles that share
a device and say ``offload: true`` take turns on it (:mod:`rockroll.trainer.engines.offload`): the driver onloads
such a role before each of its phases of a step and offloads it after, one role at a time
(:meth:`RayRoles.update`; ``RayRoles.schedule`` records the last step's order).

Weight sync after each step (``ray.weight_sync``): ``object_store``, the trainer's state dict
is one object in Ray's object store that every generator loads; ``collective``, the trainer
broadcasts it over torch.distributed (:mod:`rockroll.trainer.engines.weight_sync`: gloo on CPU, NCCL on GPU). Every
sample carries the version of the generator weights that produced it.

``ray.init`` is local and on 127.0.0.1 (:func:`init_local_ray`) unless ``ray.address`` names
a cluster to join.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from pathlib import Path
from typing import Any, Callable

from ..config import ConfigError, EnvConfig, RoleResources, TrainConfig
from ..engines.offload import Offloadable
from ..engines.sampling import SamplingParams
from ..engines.weight_sync import Manifest, WeightGroup, checksum, manifest
from ..models import build_model, load_tokenizer, model_folder
from ..rollout.curriculum import initialized_metrics
from ..rollout.manager import mix_seeds, batch_metrics
from ..rollout.reward import RemoteReward, RewardRole
from ..rollout.types import Group
from .base import RoleLost, Roles
from .local import EnvWorker, PolicyTrainer, batch_role_classes, make_generator, seed_everything
from .placement import Placement, plan, role_name

__all__ = ["GROUP_ID_BLOCK", "RayRoles", "RayRollout", "RayTrainer", "Remote", "actor_lost_errors", "first_group_id",
           "init_local_ray", "merge_rank_metrics", "merge_rollout_metrics", "role_counts", "start_roles",
           "worker_config"]

GROUP_ID_BLOCK = 1 << 32  # env worker i numbers its groups from i * GROUP_ID_BLOCK
GENERATOR_CONCURRENCY = 256  # calls a generator actor serves at once (they share its running batch)
LOST_PROBE_S = 30.0  # how long an actor may take to say where it is before it counts as lost


def init_local_ray(num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """A local Ray on 127.0.0.1 only (no dashboard), as the rest of rockroll does. ``num_gpus``:
    what Ray counts (on a machine without one, GPUs for placement tests)."""
    import ray

    from rockroll.sandbox.deployment.ray import keep_loopback

    if ray.is_initialized():
        return
    keep_loopback()
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus, num_gpus=num_gpus,
             ignore_reinit_error=True, log_to_driver=False)


def _node_ip() -> str:
    """This process's node address as Ray knows it (127.0.0.1 under :func:`init_local_ray`)."""
    import ray

    return ray.util.get_node_ip_address()


def worker_config(cfg: TrainConfig, index: int, incarnation: int = 0) -> TrainConfig:
    """Env worker ``index``'s config: an even share of ``rollout.batch_groups`` (a step still
    trains on ``batch_groups`` groups) and a seed of its own, which draws its tasks, env seeds
    and sampling seeds. Worker 0 keeps ``cfg.seed``: one worker draws what the local loop does.
    ``incarnation`` k > 0: the k-th replacement of a lost worker, on a seed stream of its own."""
    n, bg = cfg.ray.num_env_workers, cfg.rollout.batch_groups
    share = bg // n + (index < bg % n)
    if incarnation:
        seed = mix_seeds(cfg.seed, index, incarnation)
    else:
        seed = cfg.seed if index == 0 else mix_seeds(cfg.seed, index)
    return dataclasses.replace(cfg, seed=seed, rollout=dataclasses.replace(cfg.rollout, batch_groups=share))


def first_group_id(cfg: TrainConfig, index: int, incarnation: int = 0) -> int:
    """Where worker ``index`` (its ``incarnation``-th replacement) numbers its groups from: a
    block of its own, so the groups of two workers, or of a lost one and its replacement, never
    share an id."""
    return (index + incarnation * cfg.ray.num_env_workers) * GROUP_ID_BLOCK


# ----------------------------------------------------------------------------- actors


class _Placed:
    """Where an actor runs, as Ray says: for checking a placement and for a run's report."""

    def placement(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "placement_group_id": ctx.get_placement_group_id(),
                "resources": ctx.get_assigned_resources(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def _master_address() -> tuple[str, int]:
    """A free port on this node: rank 0's rendezvous for a data-parallel trainer."""
    from ..engines.policy import free_port

    return _node_ip(), free_port()


class _Generator(_Placed):
    """A generation engine in a threaded actor (``max_concurrency``): concurrent calls from
    every env worker join the engine's one running batch (continuous batching)."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any):
        self.engine = make_generator(cfg, build_model(cfg.model, tokenizer, cfg.seed), tokenizer)
        self.group: WeightGroup | None = None
        self.seeds_served: list[int] = []  # each request's seed: which samples this generator made

    def generate(self, prompts, sampling: SamplingParams):
        self.seeds_served += list(sampling.seeds or [])
        outs = self.engine.generate(prompts, sampling)
        return outs, min([self.engine.version, *(o.version for o in outs if o.version is not None)])

    def served(self) -> list[int]:
        return list(self.seeds_served)

    def version(self) -> int:
        return self.engine.version

    def load_weights(self, state_dict, version: int) -> None:
        self.engine.load_weights(state_dict, version)  # an actor runs one call at a time: never mid-generate

    def join_weight_group(self, address: tuple[str, int], rank: int, world_size: int) -> None:
        self.group = WeightGroup(rank, world_size)
        self.group.connect(_node_ip(), address)

    def receive_weights(self, spec: Manifest, version: int) -> None:
        # NCCL leaves CUDA tensors here, which an in-process vLLM engine loads as they are
        self.engine.load_weights(self.group.receive(spec), version)

    def weights_checksum(self) -> str:  # Transformers engine: its model is in this process
        return checksum(self.engine.model.state_dict())


class RemoteEngine:
    """The generating half of :class:`GenerationEngine` over generator actors (weights reach
    them from the trainer, never through an env worker).

    Prompt replication: every request goes on its own to the generator with the fewest
    requests in flight from here (ties: round-robin), so a group's samples spread over all
    generators. :meth:`submit` (continuous batching) sends one request and returns a future;
    :meth:`generate` spreads a batch's prompts the same way. Each output carries the version
    of the generator that made it. ``whole_batches`` (``deterministic: true``): :meth:`generate`
    sends generator i the i-th slice of the batch in one call, which it runs as one batch, so
    what a row is batched with never depends on timing."""

    def __init__(self, actors: Any, whole_batches: bool = False):
        import ray

        self.whole_batches = whole_batches
        self.actors = list(actors) if isinstance(actors, (list, tuple)) else [actors]
        self._ray = ray
        self._load = [0] * len(self.actors)
        self._next = 0
        self._lock = threading.Lock()
        self.version = min(ray.get([a.version.remote() for a in self.actors]))

    def _pick(self) -> int:
        with self._lock:
            n = len(self.actors)
            i = min(range(n), key=lambda k: (self._load[k], (k - self._next) % n))
            self._load[i] += 1
            self._next = (i + 1) % n
            return i

    def _done(self, i: int) -> None:
        with self._lock:
            self._load[i] -= 1

    def _send(self, prompt, sampling, seed) -> tuple[int, Any]:
        i = self._pick()
        one = dataclasses.replace(sampling, seeds=None if seed is None else [seed])
        return i, self.actors[i].generate.remote([list(prompt)], one)

    def submit(self, prompt, sampling) -> concurrent.futures.Future:
        i, ref = self._send(prompt, sampling, sampling.seeds[0] if sampling.seeds else None)
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def finish(f):
            self._done(i)
            try:
                outs, version = f.result()
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
                return
            self.version = version
            fut.set_result(dataclasses.replace(outs[0], version=version))

        ref.future().add_done_callback(finish)
        return fut

    def generate(self, prompts, sampling):
        if self.whole_batches:
            return self._generate_slices(prompts, sampling)
        seeds = sampling.seeds or [None] * len(prompts)
        sent = [self._send(p, sampling, s) for p, s in zip(prompts, seeds)]
        try:
            results = self._ray.get([ref for _, ref in sent])
        finally:
            for i, _ in sent:
                self._done(i)
        self.version = min(v for _, v in results)
        return [dataclasses.replace(outs[0], version=v) for outs, v in results]

    def _generate_slices(self, prompts, sampling):
        n = len(self.actors)
        bounds = [len(prompts) * i // n for i in range(n + 1)]
        calls = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        refs = [self.actors[i].generate.remote(
                    [list(p) for p in prompts[a:b]],
                    dataclasses.replace(sampling, seeds=None if sampling.seeds is None else list(sampling.seeds[a:b])))
                for i, (a, b) in enumerate(calls)]
        results = self._ray.get(refs)
        self.version = min(v for _, v in results)
        return [dataclasses.replace(o, version=v) for outs, v in results for o in outs]


class _EnvWorker(EnvWorker, _Placed):
    """``reward``: the shared reward actor's handle (None: no reward role)."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any, generator: Any, first_group_id: int,
                 env_factory: Callable[[EnvConfig], Any] | None = None, reward: Any = None):
        engine = RemoteEngine(generator, whole_batches=cfg.deterministic)
        super().__init__(cfg, tokenizer, engine, first_group_id, env_factory,
                         reward=None if reward is None else RemoteReward(reward))

    def reward_kind(self) -> str:
        """What scores this worker's episodes (a RemoteReward under Ray)."""
        return type(self.mgr.reward).__name__


class _RewardRole(RewardRole, _Placed):
    """The reward role in an async actor (its ``ascore`` calls run concurrently on the actor's
    event loop), shared by the env workers."""


class _PolicyTrainer(PolicyTrainer, _Placed):
    """Rank ``rank`` of ``world_size`` (data parallel): torch.distributed's variables for
    DeepSpeed's ``init_distributed`` (the deepspeed launcher's, set here), rendezvous at
    ``master``; ``LOCAL_RANK`` 0, as Ray shows each actor only its own GPUs."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any, rank: int = 0, world_size: int = 1,
                 master: tuple[str, int] | None = None):
        if world_size > 1:
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                              MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        seed_everything(cfg.seed, cfg.deterministic)
        super().__init__(cfg, build_model(cfg.model, tokenizer, cfg.seed), tokenizer)
        self.shard = (rank, world_size)
        self.group: WeightGroup | None = None

    def weights(self) -> dict[str, Any]:
        state = self.policy.sync_state_dict()  # every rank takes part (ZeRO-3 gathers); on the CPU: it leaves the actor
        return state if self.shard[0] == 0 else {}

    def weights_checksum(self) -> str:
        return checksum(self.policy.sync_state_dict())

    def open_weight_group(self, world_size: int) -> tuple[tuple[str, int], Manifest]:
        """Rank 0 of the weight group: its store's address, and what the generators receive."""
        self.group = WeightGroup(0, world_size)
        return self.group.host_store(_node_ip()), manifest(self.policy.sync_state_dict())

    def join_weight_group(self) -> None:
        self.group.connect(_node_ip())

    def send_weights(self) -> None:
        state = self.policy.sync_state_dict()  # on every rank (ZeRO-3); rank 0 alone is in the weight group
        if self.group is not None:
            self.group.send(state)


class _BatchRole(_Placed):
    """Any :class:`~.base.BatchRole` in an actor: ``cls(cfg, lm, tokenizer)`` over a model of
    its own built as the trainer builds its start (same config, same seed)."""

    def __init__(self, cls: type, cfg: TrainConfig, tokenizer: Any):
        self.role = cls(cfg, build_model(cfg.model, tokenizer, cfg.seed), tokenizer)

    def annotate(self, groups: list[Group]) -> dict[str, Any]:
        return self.role.annotate(groups)

    def train(self, groups: list[Group], aux: dict[str, Any]) -> dict[str, float]:
        return self.role.train(groups, aux)

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.role.load_weights(state_dict, version)

    def state_dict(self) -> dict[str, Any]:
        return self.role.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.role.load_state_dict(state)

    def offload(self) -> None:
        self.role.offload()

    def onload(self) -> None:
        self.role.onload()

    def where(self) -> dict[str, Any]:
        return self.role.where()


def make_actor_classes(num_gpus: float = 0.0):
    """The Ray actor classes (built lazily: ``ray`` is an optional extra). ``num_cpus=0``: CPU
    smoke runs share cores; ``num_gpus`` goes to the trainer, each generator and each batch role
    (the reward role asks for none unless ``ray.roles.reward`` says: a judge behind an endpoint
    needs no device)."""
    import ray

    return (ray.remote(num_cpus=0, num_gpus=num_gpus)(_PolicyTrainer),
            ray.remote(num_cpus=0, num_gpus=num_gpus, max_concurrency=GENERATOR_CONCURRENCY)(_Generator),
            ray.remote(num_cpus=0)(_EnvWorker),
            ray.remote(num_cpus=0, num_gpus=num_gpus)(_BatchRole),
            ray.remote(num_cpus=0)(_RewardRole))


# ----------------------------------------------------------------------------- the roles


class RayTrainer:
    """The trainer's ranks (actors) as one :class:`~.base.Trainer`: every call goes to every
    rank at once (their collectives need all of them), the answer is rank 0's; a step's
    metrics merge the ranks' (:func:`merge_rank_metrics`). ``actor``: rank 0."""

    def __init__(self, ranks: list[Any]):
        import ray

        self.ranks, self.actor, self._ray = list(ranks), ranks[0], ray

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    def update(self, groups: list[Group], aux: dict[str, Any] | None = None) -> dict[str, float]:
        groups_ref, aux_ref = self._ray.put(groups), self._ray.put(aux)  # one copy in the store for all ranks
        return merge_rank_metrics(self._all("update", groups_ref, aux_ref))

    def weights_refs(self, method: str = "weights") -> list[Any]:
        """``method`` started on every rank: rank 0's object ref first (its state dict), then the others'."""
        return [getattr(r, method).remote() for r in self.ranks]

    def weights(self) -> dict[str, Any]:
        return self._all("weights")[0]

    def restore(self) -> dict[str, Any] | None:
        return self._all("restore")[0]

    def save(self, step: int, rollout_state: dict[str, Any], roles_state: dict[str, Any] | None = None) -> None:
        # every rank saves its share of the policy; rank 0 writes the rest (one copy in the store)
        self._all("save", step, rollout_state, self._ray.put(roles_state))

    def __getattr__(self, name: str) -> Callable[..., Any]:  # anything else: on every rank, rank 0's answer
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args: self._all(name, *args)[0]


def merge_rank_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics over the data-parallel ranks: the losses are each rank's share of
    the batch's (summed), the rest (grad norm, ratios' statistics) averaged."""
    from .update import ADDITIVE_METRICS, combine_metrics

    return combine_metrics(parts, ADDITIVE_METRICS)


class Remote:
    """A role in an actor, called like the in-process one: ``remote.update(groups)`` runs the
    actor's ``update`` and waits for its result. ``actor`` is the handle, for concurrent calls."""

    def __init__(self, actor: Any):
        self.actor = actor

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import ray

        method = getattr(self.actor, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


class RayRollout:
    """Every env worker as one :class:`~.base.Rollout`: a step's groups are all of theirs, the
    rollout state one per worker, evaluation on the first live worker.

    An env worker lost with its node (or its process) is dropped, not fatal: a step trains on
    the groups of the others and counts what it is short of (``rollout/env_workers_lost``,
    ``rollout/groups_lost``, ``rollout/env_workers_live``). A replacement is created at once
    (``spawn(index, incarnation)``: a seed stream and a block of group ids of its own, so it
    neither replays the lost worker's tasks nor reuses its group ids) and joins the first step
    after Ray has placed it: at once where the cluster has room, else on a node that returns or
    joins (in its placement-group bundle, which Ray reschedules). With no worker left, the run
    waits ``wait_s`` for one, then stops with :class:`~.base.RoleLost`. ``shares[i]``: the groups
    worker i gives a step."""

    def __init__(self, workers: list[Any], spawn: Callable[[int, int], Any] | None = None,
                 shares: list[int] | None = None, wait_s: float = 300.0):
        import ray

        self.workers: list[Any | None] = list(workers)  # None: lost, its replacement not yet placed
        self._spawn, self._wait_s, self._ray = spawn, wait_s, ray
        self._shares = list(shares) if shares else [1] * len(self.workers)
        self._incarnation = [0] * len(self.workers)
        self._pending: dict[int, tuple[Any, Any]] = {}  # index -> (replacement, its placement() ref)
        self._version = 0
        self._lost = 0  # workers lost since the last batch reported them

    def _live(self) -> list[tuple[int, Any]]:
        return [(i, w) for i, w in enumerate(self.workers) if w is not None]

    def _each(self, refs: dict[int, Any]) -> dict[int, Any]:
        """The answers of ``refs`` (worker index -> ref), by index; a worker found lost is
        replaced and has no answer."""
        out = {}
        for i, ref in refs.items():
            try:
                out[i] = self._ray.get(ref)
            except actor_lost_errors() as e:
                if isinstance(e, self._ray.exceptions.RayTaskError):
                    raise  # the worker is alive; what it called is not (a generator): the loop's to say
                self._lose(i)
        return out

    def _all(self, method: str, *args: Any) -> dict[int, Any]:
        self._admit()
        return self._each({i: getattr(w, method).remote(*args) for i, w in self._live()})

    def _lose(self, i: int) -> None:
        actor, self.workers[i] = self.workers[i], None
        self._lost += 1
        self._ray.kill(actor)  # an actor only unreachable for now must not come back beside its replacement
        if self._spawn is not None:
            self._incarnation[i] += 1
            new = self._spawn(i, self._incarnation[i])
            self._pending[i] = (new, new.placement.remote())

    def _admit(self, wait_s: float = 0.0) -> None:
        """Replacements that Ray has placed become workers, started at the current version
        (``wait_s``: wait that long for the first of them)."""
        if not self._pending:
            return
        refs = {ref: i for i, (_, ref) in self._pending.items()}
        if wait_s:
            self._ray.wait(list(refs), num_returns=1, timeout=wait_s)
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            i = refs[ref]
            self.workers[i], _ = self._pending.pop(i)
            self._each({i: self.workers[i].start.remote(self._version, None)})

    def _await_worker(self) -> None:
        self._admit(self._wait_s)
        if not self._live():
            raise RoleLost(f"every env worker is lost and no replacement was placed within "
                           f"ray.env_worker_wait_s={self._wait_s:g} s: a node that offers the env workers' "
                           "resources must return or join")

    def start(self, version: int, state: dict[str, Any] | None = None) -> None:
        states = state.get("workers") if state else [None] * len(self.workers)
        if states is None or len(states) != len(self.workers):
            raise RuntimeError(f"the checkpoint's rollout state is not one per env worker (ray.num_env_workers="
                               f"{len(self.workers)}); resume with the settings that wrote it")
        self._version = version
        self._each({i: w.start.remote(version, states[i]) for i, w in self._live()})

    def get_batch(self, step: int) -> tuple[list[Group], dict[str, float]]:
        while True:  # until one live worker answers
            self._admit()
            if not self._live():
                self._await_worker()
            results = self._all("get_batch", step)
            if results:
                break
        metrics = merge_rollout_metrics(list(results.values()), step)
        metrics.update({"rollout/env_workers_lost": self._lost, "rollout/env_workers_live": len(results),
                        "rollout/groups_lost": sum(n for i, n in enumerate(self._shares) if i not in results)})
        self._lost = 0
        return [g for gs, _ in results.values() for g in gs], metrics

    def evaluate(self, episodes: int, seed: int) -> dict[str, float]:
        while True:
            self._admit()
            if not self._live():
                self._await_worker()
            i, w = self._live()[0]
            if (out := self._each({i: w.evaluate.remote(episodes, seed)})):
                return out[i]

    def advance(self, version: int) -> None:
        self._version = version
        self._all("advance", version)

    def pause(self) -> None:
        self._all("pause")

    def state_dict(self) -> dict[str, Any]:
        """One state per worker (None for a lost one: its replacement starts afresh on resume)."""
        states = self._all("state_dict")
        return {"workers": [states.get(i) for i in range(len(self.workers))]}

    def actors(self) -> list[Any]:
        """Every env worker's actor, replacements not yet placed included."""
        return [w for _, w in self._live()] + [a for a, _ in self._pending.values()]

    def close(self) -> None:
        refs = [w.close.remote() for _, w in self._live()]
        for ref in refs:
            try:
                self._ray.get(ref, timeout=60)
            except actor_lost_errors():
                pass  # gone already: nothing of it to close


def actor_lost_errors() -> tuple[type[BaseException], ...]:
    """What ``ray.get`` raises when the actor that owes the answer is gone (its process or its
    node died): the actor's error, or the loss of the object it left on its node."""
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


class RayRoles(Roles):
    """The roles in Ray actors (:func:`start_roles`); ``generators`` and ``rollout.workers``
    are actor handles, every env worker asking every generator (:class:`RemoteEngine`)."""

    def __init__(self, trainer: Any, generators: list[Any], rollout: RayRollout, tokenizer: Any,
                 owns_ray: bool = False, batch_actors: list[Any] = (), trainers: list[Any] = (),
                 placement: Placement | None = None, batch_classes: list[type] = (),
                 reward_actors: list[Any] = (), offload: set[str] = frozenset()):
        self.trainer = RayTrainer(list(trainers) or [trainer])
        self.generators, self.rollout = generators, rollout
        self.batch_actors = list(batch_actors)
        self.batch_roles = [Remote(a) for a in self.batch_actors]
        self.batch_names = [role_name(cls) for cls in batch_classes]
        self._trains = [getattr(cls, "trains", True) for cls in batch_classes]  # unknown: assume it does
        self.reward_actors = list(reward_actors)
        self.offload = set(offload)  # names of the roles that leave their device between turns
        self.schedule: list[tuple[str, str]] = []  # the last update's (role, onload | phase | offload)
        self.tokenizer, self.owns_ray = tokenizer, owns_ray
        self.manifest: Manifest | None = None        # set when weights go by collective broadcast
        self.sync_address: tuple[str, int] | None = None
        self.placement = placement
        self._closed = False

    @classmethod
    def open(cls, cfg: TrainConfig, env_factory: Callable[[EnvConfig], Any] | None = None) -> "RayRoles":
        """The roles of a run: starts a local Ray on 127.0.0.1 when none is running and
        ``ray.address`` is null (or joins that cluster); :meth:`close` shuts down what it started."""
        import ray

        tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, Path(cfg.logging.dir) / "tokenizer",
                                   model_folder(cfg.model))
        owns_ray = not ray.is_initialized()
        if owns_ray and cfg.ray.address:
            from rockroll.sandbox.deployment.ray import connect

            connect(cfg.ray.address)
        elif owns_ray:
            init_local_ray()
        try:
            roles = start_roles(cfg, tokenizer, env_factory)
        except BaseException:
            if owns_ray:
                ray.shutdown()
            raise
        roles.owns_ray = owns_ray
        return roles

    @property
    def workers(self) -> list[Any]:
        return self.rollout.workers

    def lost(self, error: BaseException) -> list[str]:
        """The roles gone with their process or node when ``error`` comes from Ray: each actor
        of the run is asked where it is, and those that cannot answer are named (the error
        alone may name only what failed because of them: an env worker whose generator died)."""
        import ray

        if not isinstance(error, ray.exceptions.RayError):
            return []
        asked = [(name, actor.placement.remote()) for name, actor in self._named_actors()]
        dead = []
        for name, ref in asked:
            try:
                ray.get(ref, timeout=LOST_PROBE_S)
            except actor_lost_errors():
                dead.append(name)
            except ray.exceptions.GetTimeoutError:
                dead.append(f"{name} (not answering)")
        if not dead and isinstance(error, actor_lost_errors()):
            return ["an actor of the run"]
        return dead

    def _named_actors(self):
        yield from ((f"the trainer (rank {i})", a) for i, a in enumerate(self.trainer.ranks))
        yield from ((f"generator {i}", a) for i, a in enumerate(self.generators))
        yield from ((f"the reward actor {i}", a) for i, a in enumerate(self.reward_actors))
        yield from ((f"the {name} role", a) for name, a in zip(self.batch_names, self.batch_actors))

    def update(self, groups: list[Group]) -> dict[str, float]:
        """:meth:`Roles.update` with the batch roles asked at once (each in its actor), but
        the roles that offload: each of those in turn, on its device only for its phase."""
        import ray

        self.schedule = []
        groups_ref = ray.put(groups)
        aux: dict[str, Any] = {}
        for part in self._batch_phase("annotate", groups_ref):
            aux.update(part)
        metrics = self._turn("trainer", self.trainer.ranks, "update", lambda: self.trainer.update(groups, aux))
        for part in self._batch_phase("train", groups_ref, ray.put(aux)):
            metrics.update(part)
        return metrics

    def _turn(self, name: str, actors: list[Any], phase: str, call: Callable[[], Any], onload: bool = True) -> Any:
        """``call()``, the phase of role ``name``; between its actors' onload and offload when it
        offloads (and ``onload``: the phase uses its models)."""
        import ray

        if not (onload and name in self.offload):
            self.schedule.append((name, phase))
            return call()
        ray.get([a.onload.remote() for a in actors])
        self.schedule.append((name, "onload"))
        try:
            out = call()
            self.schedule.append((name, phase))
        finally:
            ray.get([a.offload.remote() for a in actors])
            self.schedule.append((name, "offload"))
        return out

    def _batch_phase(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every batch role: those on a device of their own at once, then each
        offloading one in turn (two on one device are never both onloaded)."""
        import ray

        roles = list(zip(self.batch_actors, self.batch_names, self._trains))
        alone = {i: getattr(a, method).remote(*args)
                 for i, (a, name, _) in enumerate(roles) if name not in self.offload}
        self.schedule += [(self.batch_names[i], method) for i in alone]
        out = {}
        for i, (a, name, trains) in enumerate(roles):
            if i not in alone:  # a train() that does not touch the role's models needs no onload
                out[i] = self._turn(name, [a], method, lambda a=a: ray.get(getattr(a, method).remote(*args)),
                                    onload=method != "train" or trains)
        out.update(zip(alone, ray.get(list(alone.values()))))
        return [out[i] for i in range(len(self.batch_actors))]

    def sync_weights(self, version: int) -> None:
        import ray

        followers = [a.load_weights for a in self.batch_actors]
        if self.manifest is None:  # one object in the store (rank 0's); each generator fetches it
            state, *rest = self.trainer.weights_refs()
            ray.get([*rest, *[m.remote(state, version) for m in [g.load_weights for g in self.generators] + followers]])
        else:
            state, *rest = self.trainer.weights_refs() if followers else [None]
            ray.get([*self.trainer.weights_refs("send_weights"), *rest,
                     *[g.receive_weights.remote(self.manifest, version) for g in self.generators],
                     *[m.remote(state, version) for m in followers]])

    def close(self) -> None:
        import ray

        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.rollout.close()
            finally:
                for actor in [*self.rollout.actors(), *self.reward_actors, *self.generators, *self.batch_actors,
                              *self.trainer.ranks]:
                    ray.kill(actor)
                if self.placement is not None:
                    self.placement.remove()
        finally:
            if self.owns_ray:
                self.owns_ray = False
                ray.shutdown()


def start_roles(cfg: TrainConfig, tokenizer: Any, env_factory: Callable[[EnvConfig], Any] | None = None) -> RayRoles:
    """Create the actors (env workers built, not started) and, for ``collective`` weight
    sync, the trainer + generators process group."""
    import ray

    Trainer, Generator, EnvWorker, BatchRole, Reward = make_actor_classes(cfg.ray.num_gpus)
    classes = batch_role_classes(cfg)
    for cls in classes:
        if cfg.ray.roles.get(role_name(cls), RoleResources()).offload and not issubclass(cls, Offloadable):
            raise ConfigError(f"ray.roles.{role_name(cls)}.offload",
                              f"{cls.__name__} does not say what it moves (it is no offload.Offloadable)")
    placement = plan(cfg.ray, role_counts(cfg, classes))
    if placement is not None:
        placement.create()

    def opts(role: str, i: int = 0) -> dict[str, Any]:
        return {} if placement is None else placement.options(role, i)

    try:
        n = cfg.ray.num_trainers
        master = None
        if n > 1:  # rank 0's node picks the rendezvous port
            master = ray.get(ray.remote(num_cpus=0)(_master_address).options(**opts("trainer", 0)).remote())
        trainers = [Trainer.options(**opts("trainer", r)).remote(cfg, tokenizer, r, n, master) for r in range(n)]
        batch_actors = [BatchRole.options(**opts(role_name(cls))).remote(cls, cfg, tokenizer) for cls in classes]
        generators = [Generator.options(**opts("generator", i)).remote(cfg, tokenizer)
                      for i in range(cfg.ray.num_generators)]
        rewards = [Reward.options(**opts("reward", i), runtime_env=_judge_env(cfg)).remote(cfg, tokenizer)
                   for i in range(cfg.ray.num_reward_actors if cfg.reward.active else 0)]

        def spawn(i: int, incarnation: int = 0) -> Any:  # env worker i (a lost one's replacement: incarnation > 0)
            return EnvWorker.options(**opts("env_worker", i)).remote(
                worker_config(cfg, i, incarnation), tokenizer, generators, first_group_id(cfg, i, incarnation),
                env_factory, rewards[i % len(rewards)] if rewards else None)

        workers = [spawn(i) for i in range(cfg.ray.num_env_workers)]
    except BaseException:
        if placement is not None:
            placement.remove()
        raise
    trainer = trainers[0]
    offload = {name for name, r in cfg.ray.roles.items() if r.offload}
    rollout = RayRollout(workers, spawn, [worker_config(cfg, i).rollout.batch_groups for i in range(len(workers))],
                         cfg.ray.env_worker_wait_s)
    roles = RayRoles(trainer, generators, rollout, tokenizer, batch_actors=batch_actors, trainers=trainers,
                     placement=placement, batch_classes=classes, reward_actors=rewards, offload=offload)
    # built on their device: the offloading roles leave it until their first turn
    resting = (trainers if "trainer" in offload else []) + \
        [a for name, a in zip(roles.batch_names, batch_actors) if name in offload]
    ray.get([a.offload.remote() for a in resting])
    if cfg.ray.weight_sync == "collective":
        world = 1 + len(generators)
        opened = trainer.open_weight_group.remote(world)
        ray.get([r.weights.remote() for r in trainers[1:]])  # the manifest gathers ZeRO-3's weights: every rank
        roles.sync_address, roles.manifest = ray.get(opened)
        ray.get([trainer.join_weight_group.remote(),  # all members at once: the rendezvous waits for each
                 *[g.join_weight_group.remote(roles.sync_address, i + 1, world) for i, g in enumerate(generators)]])
    return roles


def _judge_env(cfg: TrainConfig) -> dict[str, Any]:
    """The reward actor's runtime env: the judge's API key from the driver's environment (a
    Ray started earlier, or a cluster joined, does not have it)."""
    key = cfg.reward.judge.api_key_env
    return {"env_vars": {key: os.environ[key]}} if key and key in os.environ else {}


def role_counts(cfg: TrainConfig, batch_classes: list[type]) -> dict[str, int]:
    """The actors of each role of a run, by the role's name in ``ray.roles`` (bundle order)."""
    counts = {"trainer": cfg.ray.num_trainers, "generator": cfg.ray.num_generators,
              "env_worker": cfg.ray.num_env_workers}
    if cfg.reward.active:
        counts["reward"] = cfg.ray.num_reward_actors
    for cls in batch_classes:
        name = role_name(cls)
        if name in counts:
            raise ValueError(f"two roles are named {name!r}: give {cls.__name__} a `name` of its own")
        counts[name] = 1
    return counts


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
