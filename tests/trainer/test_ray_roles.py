"""Ray roles on a real local Ray (127.0.0.1) and real torch.distributed (gloo):

- ``rockroll.trainer.train`` with ``ray.enabled`` runs the actor loop with two env workers:
  metrics summed over both, a KL reference, the run folder, checkpoints and a resume;
- the roles one step at a time with two env workers and two generators on collective weight
  sync: the workers' groups are distinct, their group ids disjoint, each group's samples made
  by both generators (prompt replication), and after a step both
  generators hold the trainer's exact weights at the next version, which new samples carry;
- ``ray.roles`` placement: every actor lands in the placement-group bundle asked for (read
  back from Ray: the actor's placement group, its resources, the bundles' free resources),
  colocated roles share one GPU (a GPU that Ray is told of: there is none here), a cluster
  too small is a ConfigError, and closing the roles frees the group;
- data parallel: two trainer actors as the ranks of one DeepSpeed ZeRO group (gloo) take the
  step one rank takes on the whole batch, and hold identical weights after it;
- the reward role: one actor (placed by ``ray.roles.reward``) scores the episodes of both env
  workers, which hold no judge of their own; the judge's API key reaches it from the driver;
- batch roles' checkpoint state and offloading: AsyPPO's critics saved by the trainer actor
  and restored into a fresh critics actor bit for bit, which then trains as the first one
  did; roles that share a device and offload take turns on it in the loop's order.
"""

import json
import os
import time

import pytest
import torch

from rockroll.trainer.config import ConfigError, load_config
from rockroll.trainer.models import load_tokenizer

from _tensors import same_state  # noqa: E402
from _tiny import multi_turn_groups, run_config  # noqa: E402
from test_reward import TEMPLATE, ScriptedJudge, _openai, judge_server  # noqa: E402,F401  (the judge fixture)


@pytest.mark.parametrize("ray, key", [
    ({"weight_sync": "nccl"}, "ray.weight_sync: must be object_store or collective"),
    ({"num_env_workers": 0}, "ray.num_env_workers: must be >= 1"),
    ({"num_env_workers": 1, "num_generators": 2}, "ray.num_generators: must be in [1, num_env_workers]"),
    ({"enabled": True, "num_env_workers": 3}, "ray.num_env_workers: must be <= rollout.batch_groups"),
    ({"workers": 2}, "ray.workers: unknown key"),
])
def test_ray_config_errors(ray, key):
    with pytest.raises(ConfigError) as e:
        load_config({"rollout": {"batch_groups": 2}, "ray": ray})
    assert str(e.value).startswith(key), str(e.value)


def test_worker_config_splits_the_batch_and_the_seed():
    from rockroll.trainer.roles.ray import worker_config

    cfg = load_config({"seed": 5, "rollout": {"batch_groups": 3}, "ray": {"enabled": True, "num_env_workers": 2}})
    w0, w1 = worker_config(cfg, 0), worker_config(cfg, 1)
    assert (w0.rollout.batch_groups, w1.rollout.batch_groups) == (2, 1)
    assert w0.seed == 5 and w1.seed != 5  # worker 0 draws what the local loop draws
    assert cfg.rollout.batch_groups == 3 and cfg.seed == 5  # the run's config is left as it was


@pytest.fixture(scope="module")
def local_ray():
    import ray
    from rockroll.trainer.roles.ray import init_local_ray

    had = os.environ.get("RAY_AUTH_MODE")
    init_local_ray(num_cpus=2, num_gpus=1)  # sets RAY_AUTH_MODE=token in this process: put back afterwards
    yield ray
    ray.shutdown()
    if had is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = had


def test_train_dispatches_to_ray_and_resumes(tmp_path, local_ray):
    from rockroll.trainer import train

    over = dict(ray={"enabled": True, "num_env_workers": 2}, algorithm__kl_coef=0.1,
                eval={"every": 2, "episodes": 2}, checkpoint={"dir": str(tmp_path / "ckpt")},
                logging__tensorboard=False)
    out = train(run_config(tmp_path, **over))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1] and hist[-1]["policy_version"] == 2
    for h in hist:  # one group from each worker: the metrics count both
        assert h["rollout/samples"] == 2 * 3 and h["rollout/groups_done"] == 2
        assert h["loss/kl"] >= 0  # the frozen reference in the trainer actor
    assert hist[0]["loss/kl"] == 0  # step 0: the policy is still the reference
    assert hist[1]["rollout/staleness_max"] == 0  # step 1 was generated with the synced weights

    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and evals[0]["eval/episodes"] == 2
    assert (run / "curve.png").is_file() and (run / "transcripts" / "step_000001.jsonl").is_file()
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest").read_text() == "step_000002"
    state = torch.load(ckpt / "step_000002" / "state.pt", weights_only=False)
    assert state["step"] == 2 and len(state["rollout"]["workers"]) == 2
    assert torch.load(ckpt / "step_000002" / "roles.pt", weights_only=False) == {"reference": {}}  # frozen: none

    out = train(run_config(tmp_path, steps=3, **over))  # resumes at step 2
    assert out["start_step"] == 2 and [h["step"] for h in out["history"]] == [2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_two_workers_two_generators_collective_sync(tmp_path, local_ray):
    ray = local_ray
    from rockroll.trainer.roles.ray import GROUP_ID_BLOCK, merge_rollout_metrics, start_roles, worker_config
    from rockroll.trainer.rollout.manager import mix_seeds

    cfg = run_config(tmp_path, ray={"enabled": True, "num_env_workers": 2, "num_generators": 2,
                                    "weight_sync": "collective"})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    roles = start_roles(cfg, tokenizer)
    try:
        assert roles.sync_address[0] == "127.0.0.1"
        roles.sync_weights(0)
        ray.get([w.start.remote(0) for w in roles.workers])
        results = ray.get([w.get_batch.remote(0) for w in roles.workers])

        # each worker: its own block of group ids, its own seeds; a group's samples are its own
        for i, (groups, _) in enumerate(results):
            assert len(groups) == 1
            for g in groups:
                assert g.group_id // GROUP_ID_BLOCK == i
                assert {s.group_id for s in g.samples} == {g.group_id} and len(g.samples) == 3
        (g0,), (g1,) = results[0][0], results[1][0]
        assert g0.seed != g1.seed
        # prompt replication: a group's samples are single requests spread over both generators
        served = [set(s) for s in ray.get([g.served.remote() for g in roles.generators])]
        for i, (groups, _) in enumerate(results):
            wseed = worker_config(cfg, i).seed
            for g in groups:
                first_turns = {mix_seeds(mix_seeds(wseed, g.group_id, k), 0) for k in range(3)}
                assert all(first_turns & s for s in served), (g.group_id, served)
        merged = merge_rollout_metrics(results, 0)
        assert merged["rollout/samples"] == 6 and merged["rollout/groups_done"] == 2

        before = roles.trainer.weights_checksum()
        roles.trainer.update(multi_turn_groups())  # rewards that differ: the weights move
        after = roles.trainer.weights_checksum()
        assert after != before
        assert ray.get([g.weights_checksum.remote() for g in roles.generators]) == [before, before]
        roles.sync_weights(1)  # broadcast from the trainer, rank 0
        assert ray.get([g.weights_checksum.remote() for g in roles.generators]) == [after, after]
        assert ray.get([g.version.remote() for g in roles.generators]) == [1, 1]

        ray.get([w.advance.remote(1) for w in roles.workers])
        results = ray.get([w.get_batch.remote(1) for w in roles.workers])
        samples = [s for gs, _ in results for g in gs for s in g.samples]
        assert len(samples) == 6 and all(s.version == 1 and set(s.versions) == {1} for s in samples)
    finally:
        roles.close()


@pytest.mark.parametrize("roles", [{}, {"trainer": {"num_gpus": 0.5, "offload": True},
                                        "attention": {"num_gpus": 0.5, "colocate": "trainer", "offload": True}}],
                         ids=["resident", "offloaded"])
def test_the_attention_role_runs_in_an_actor_of_its_own_and_follows_the_policy(tmp_path, local_ray, roles):
    """Rhythm credit under Ray: the attention copy (its own actor) annotates every step with the
    weights that sampled it, synced from the trainer after each step like a generator; also
    when it and the trainer share a GPU and offload between turns (the weights reach it in host
    memory, from a trainer in host memory)."""
    from rockroll.trainer import train

    out = train(run_config(tmp_path, ray={"enabled": True, "roles": roles},
                           algorithm__rhythm={"enabled": True, "fai_window_low": 1, "fai_window_high": 1000},
                           logging__tensorboard=False))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1]
    for h in hist:
        # FAI over the tokens 1-1000 later: a turn's one-token reply is ~200 tokens of map
        # before the next (the paper's H = [10, 100] would measure no reply's influence)
        assert h["rhythm/weights_version"] == h["step"] and h["rhythm/scale_mean"] > 1
        assert torch.isfinite(torch.tensor(h["loss/total"]))


def test_asyppo_critics_train_in_an_actor_of_their_own(tmp_path, local_ray):
    """algorithm asyppo on Ray: the CriticsRole runs in its own actor (a batch role), annotates
    the steps' values for the trainer actor and trains on its shards: both critics report."""
    from rockroll.trainer import train

    out = train(run_config(tmp_path, ray={"enabled": True, "num_env_workers": 2}, algorithm__name="asyppo",
                           algorithm__critics={"hidden_size": 16, "intermediate_size": 16},
                           logging__tensorboard=False, logging__plot=False))
    for h in out["history"]:
        assert h["critic/0/value_loss"] > 0 and h["critic/1/value_loss"] > 0
        assert 0 <= h["asyppo/adv_masked_frac"] < 1 and h["loss/entropy"] > 0


def test_roles_land_in_the_bundles_asked_for(tmp_path, local_ray):
    ray = local_ray
    from rockroll.trainer.roles.ray import start_roles

    roles_cfg = {"trainer": {"num_cpus": 0.5, "num_gpus": 0.5},
                 "reference": {"num_cpus": 0.25, "num_gpus": 0.5, "colocate": "trainer"},  # one GPU, by turns
                 "generator": {"num_cpus": 0.25},
                 "env_worker": {"colocate": "generator"}}
    cfg = run_config(tmp_path, algorithm__kl_coef=0.1, ray={"enabled": True, "roles": roles_cfg})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    roles = start_roles(cfg, tokenizer)
    try:
        pg = roles.placement.group
        assert ray.util.placement_group_table(pg)["bundles"] == {0: {"CPU": 0.75, "GPU": 1.0}, 1: {"CPU": 0.25}}
        where = {"trainer": roles.trainer.actor, "reference": roles.batch_actors[0],
                 "generator": roles.generators[0], "env_worker": roles.workers[0]}
        got = {role: ray.get(actor.placement.remote()) for role, actor in where.items()}
        for role, p in got.items():
            assert p["placement_group_id"] == pg.id.hex(), role
            asked = {k: v for k, v in (("CPU", roles_cfg[role].get("num_cpus", 0)),
                                       ("GPU", roles_cfg[role].get("num_gpus", 0))) if v}
            assert p["resources"] == asked, role
        assert got["trainer"]["gpu_ids"] == got["reference"]["gpu_ids"] == ["0"]  # the same device
        # what each bundle has left: its roles took all of it, so they are in it
        free = ray.available_resources()
        pid = pg.id.hex()
        assert free.get(f"GPU_group_0_{pid}", 0) == 0 and free.get(f"CPU_group_0_{pid}", 0) == 0
        assert free.get(f"CPU_group_1_{pid}", 0) == 0
        assert ray.available_resources().get("GPU", 0) == 0  # reserved by the group

        metrics = roles.update(multi_turn_groups())  # the colocated reference annotates, the trainer trains
        assert metrics["loss/kl"] == 0 and metrics["grad_norm"] > 0  # step 0: the policy is the reference
    finally:
        roles.close()
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"
    for _ in range(300):  # the GCS hands the reservation back asynchronously
        if ray.available_resources().get("GPU", 0) == 1:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0) == 1


def test_a_placement_the_cluster_cannot_hold_is_a_config_error(tmp_path, local_ray):
    ray = local_ray
    from rockroll.trainer.roles.ray import start_roles

    cfg = run_config(tmp_path, ray={"enabled": True, "roles": {"trainer": {"num_gpus": 1},
                                                               "generator": {"num_gpus": 1}}})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    groups_before = len(ray.util.placement_group_table())
    with pytest.raises(ConfigError, match="^ray.roles: the roles ask for 2 GPU in all, the cluster has 1"):
        start_roles(cfg, tokenizer)
    assert len(ray.util.placement_group_table()) == groups_before  # no group reserved
    # a custom resource no node offers (env workers pinned to `envs` nodes, none joined yet)
    pinned = run_config(tmp_path, ray={"enabled": True, "roles": {"env_worker": {"resources": {"envs": 1}}}})
    with pytest.raises(ConfigError, match="^ray.roles: the roles ask for 1 envs in all, the cluster has 0"):
        start_roles(pinned, tokenizer)
    assert len(ray.util.placement_group_table()) == groups_before
    bad = run_config(tmp_path, ray={"enabled": True, "roles": {"reference": {"num_gpus": 0.5}}})  # kl_coef 0
    with pytest.raises(ConfigError, match="^ray.roles.reference: no such role in this run"):
        start_roles(bad, tokenizer)


@pytest.mark.parametrize("stage", [1, 2])
def test_two_ranks_take_the_step_of_one(tmp_path, local_ray, stage):
    """ZeRO data parallel over two trainer actors (gloo): each trains on its share of every
    mini-batch (3 and 2 rows, of different token counts, in two micro-batches each), DeepSpeed
    reduces the gradients; both ranks then hold the weights that one torch trainer reaches on
    the whole batch, and save and restore them together."""
    from rockroll.trainer.models import build_model
    from rockroll.trainer.roles.ray import start_roles
    from rockroll.trainer.roles.local import PolicyTrainer
    from rockroll.trainer.engines.weight_sync import checksum

    over = {"engine": {"kind": "deepspeed", "zero_stage": stage, "lr": 0.01, "micro_batch_size": 2},
            "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    cfg = run_config(tmp_path, ray={"enabled": True, "num_trainers": 2}, **over)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    one = PolicyTrainer(run_config(tmp_path, engine={"lr": 0.01}), build_model(cfg.model, tokenizer, cfg.seed),
                        tokenizer)
    groups = multi_turn_groups()
    groups[1].samples = groups[1].samples[:2]  # 5 rows: 3 (12 reply tokens) on rank 0, 2 (7) on rank 1
    start = one.weights()
    ref_metrics = one.update(groups)
    ref = one.weights()
    roles = start_roles(cfg, tokenizer)
    try:
        ranks = roles.trainer.ranks
        assert len(ranks) == 2
        assert local_ray.get([r.weights_checksum.remote() for r in ranks]) == [checksum(start)] * 2
        metrics = roles.trainer.update(groups)
        sums = local_ray.get([r.weights_checksum.remote() for r in ranks])
        assert sums[0] == sums[1] != checksum(start)  # both ranks moved, identically
        got = roles.trainer.weights()
        roles.trainer.save(1, {"workers": []})  # every rank writes its partition, rank 0 the rest
        roles.trainer.update(groups)  # the weights move on ...
        assert local_ray.get([r.weights_checksum.remote() for r in ranks]) != sums
        assert roles.trainer.restore()["step"] == 1  # ... and every rank loads step 1's back
        assert local_ray.get([r.weights_checksum.remote() for r in ranks]) == sums
    finally:
        roles.close()
    assert metrics["loss/total"] == pytest.approx(ref_metrics["loss/total"], abs=1e-5)  # the ranks' shares add up
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-4)
    for k, v in ref.items():
        assert not torch.equal(v, start[k]) or "norm" in k
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-4)


def test_one_reward_actor_scores_both_workers_episodes_where_ray_roles_puts_it(tmp_path, local_ray, judge_server):
    """A judge behind an OpenAI-compatible server on 127.0.0.1 (its key set in the driver after
    Ray started: only the runtime env the roles pass carries it). Two env workers share the one
    reward actor: its counters account for every judge call the server saw, the workers score
    through RemoteReward, and it runs in its own process, in the generator's bundle as asked."""
    ray = local_ray
    from rockroll.trainer.roles.ray import start_roles

    mode = ScriptedJudge(left="3", delay_s=0.0)
    roles_cfg = {"generator": {"num_cpus": 0.25}, "reward": {"num_cpus": 0.25, "colocate": "generator"}}
    cfg = run_config(tmp_path, ray={"enabled": True, "num_env_workers": 2, "roles": roles_cfg},
                     reward={"judge": {"template": TEMPLATE, **_openai(judge_server(mode))}})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    roles = start_roles(cfg, tokenizer)
    try:
        (reward,) = roles.reward_actors
        roles.sync_weights(0)
        ray.get([w.start.remote(0) for w in roles.workers])
        # (workers judging on their own, without the key, would drop every episode: no batch)
        results = ray.get([w.get_batch.remote(0) for w in roles.workers], timeout=120)
        ray.get([w.pause.remote() for w in roles.workers])  # no episode finishes after this
        counters = ray.get(reward.__ray_call__.remote(lambda self: dict(self.counters)))
        kinds = ray.get([w.reward_kind.remote() for w in roles.workers])
        where = {"reward": ray.get(reward.placement.remote()),
                 **{f"worker{i}": ray.get(w.placement.remote()) for i, w in enumerate(roles.workers)}}
        pg = roles.placement.group
        table = ray.util.placement_group_table(pg)["bundles"]
    finally:
        roles.close()
    samples = [s for gs, _ in results for g in gs for s in g.samples]
    assert len(samples) == 6 and all(s.reward_parts == {"judge": pytest.approx(0.3)} for s in samples)
    assert {g.group_id // (1 << 32) for gs, _ in results for g in gs} == {0, 1}  # both workers' groups
    assert kinds == ["RemoteReward", "RemoteReward"]
    # every call the judge server answered came from the one actor, one per episode it scored
    assert counters["judge_calls"] == counters["episodes_scored"] == len(mode.prompts) >= 6
    assert where["reward"]["pid"] not in {where["worker0"]["pid"], where["worker1"]["pid"]}
    assert where["reward"]["placement_group_id"] == pg.id.hex() and where["reward"]["resources"] == {"CPU": 0.25}
    assert table[roles.placement.bundle["reward"][0]] == {"CPU": 0.5}  # generator's 0.25 + reward's 0.25
    assert roles.placement.bundle["reward"] == roles.placement.bundle["generator"]


def test_critics_state_and_offloading_roles_under_ray(tmp_path, local_ray):
    """AsyPPO with the KL reference, trainer, reference and critics on one (Ray-counted) GPU,
    each offloading between its turns. The driver's schedule puts one role on the device at a
    time, in the loop's order (the reference does not come back for its no-op train); the
    actors' own counts agree, and each rests in host memory after the step. Then the trainer
    actor saves the critics' state with its checkpoint; a fresh set of roles restores it, holds
    it bit for bit, and its critics take the step the first ones took."""
    ray = local_ray
    from rockroll.trainer.roles.ray import start_roles

    roles_cfg = {"trainer": {"num_gpus": 0.4, "offload": True},
                 "reference": {"num_gpus": 0.3, "colocate": "trainer", "offload": True},
                 "critics": {"num_gpus": 0.3, "colocate": "trainer", "offload": True}}
    cfg = run_config(tmp_path, algorithm__name="asyppo", algorithm__kl_coef=0.1,
                     algorithm__critics={"hidden_size": 16, "intermediate_size": 16},
                     checkpoint={"dir": str(tmp_path / "ckpt")}, ray={"enabled": True, "roles": roles_cfg})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path / "unused")
    groups = multi_turn_groups()
    roles = start_roles(cfg, tokenizer)
    try:
        actors = {"trainer": roles.trainer.actor, **dict(zip(roles.batch_names, roles.batch_actors))}
        assert {n: ray.get(a.where.remote())["residency"] for n, a in actors.items()} == dict.fromkeys(actors, "host")
        roles.update(groups)
        assert roles.schedule == [
            ("reference", "onload"), ("reference", "annotate"), ("reference", "offload"),
            ("critics", "onload"), ("critics", "annotate"), ("critics", "offload"),
            ("trainer", "onload"), ("trainer", "update"), ("trainer", "offload"),
            ("reference", "train"),
            ("critics", "onload"), ("critics", "train"), ("critics", "offload")]
        where = {n: ray.get(a.where.remote()) for n, a in actors.items()}
        assert {n: w["onloads"] for n, w in where.items()} == {"trainer": 1, "reference": 1, "critics": 2}
        assert all(w["residency"] == "host" and w["device"] == "cpu" for w in where.values())
        roles.update(groups)
        saved = roles.batch_state()
        roles.trainer.save(2, {"workers": [None]}, saved)
        third = roles.update(groups)
    finally:
        roles.close()
    assert set(saved) == {"reference", "critics"} and saved["reference"] == {}
    on_disk = torch.load(tmp_path / "ckpt" / "step_000002" / "roles.pt", weights_only=False)
    same_state(on_disk, saved)

    fresh = start_roles(cfg, tokenizer)
    try:
        state = fresh.trainer.restore()
        assert state["step"] == 2
        before = fresh.batch_state()["critics"]
        assert not torch.equal(before["critics"][0]["head.weight"], saved["critics"]["critics"][0]["head.weight"])
        fresh.load_batch_state(state["roles"])
        same_state(fresh.batch_state(), saved)
        again = fresh.update(groups)
    finally:
        fresh.close()
    critic_keys = [k for k in third if k.startswith("critic/")]
    assert critic_keys and {k: again[k] for k in critic_keys} == {k: third[k] for k in critic_keys}
