"""Ray roles on a real local Ray (127.0.0.1) and real torch.distributed (gloo):

- ``rockroll.trainer.train`` with ``ray.enabled`` runs the actor loop with two env workers:
  metrics summed over both, a KL reference, the run folder, checkpoints and a resume;
- the roles one step at a time with two env workers and two generators on collective weight
  sync: the workers' groups are distinct, their group ids disjoint, each group's samples made
  by both generators (prompt replication), and after a step both
  generators hold the trainer's exact weights at the next version, which new samples carry.
"""

import json
import os

import pytest
import torch

from rockroll.trainer.config import ConfigError, load_config
from rockroll.trainer.models import load_tokenizer

from _tiny import multi_turn_groups, run_config  # noqa: E402


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
    from rockroll.trainer.ray_roles import worker_config

    cfg = load_config({"seed": 5, "rollout": {"batch_groups": 3}, "ray": {"enabled": True, "num_env_workers": 2}})
    w0, w1 = worker_config(cfg, 0), worker_config(cfg, 1)
    assert (w0.rollout.batch_groups, w1.rollout.batch_groups) == (2, 1)
    assert w0.seed == 5 and w1.seed != 5  # worker 0 draws what the local loop draws
    assert cfg.rollout.batch_groups == 3 and cfg.seed == 5  # the run's config is left as it was


@pytest.fixture(scope="module")
def local_ray():
    import ray
    from rockroll.trainer.ray_roles import init_local_ray

    had = os.environ.get("RAY_AUTH_MODE")
    init_local_ray(num_cpus=2)  # sets RAY_AUTH_MODE=token in this process: put back afterwards
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

    out = train(run_config(tmp_path, steps=3, **over))  # resumes at step 2
    assert out["start_step"] == 2 and [h["step"] for h in out["history"]] == [2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_two_workers_two_generators_collective_sync(tmp_path, local_ray):
    ray = local_ray
    from rockroll.trainer.ray_roles import GROUP_ID_BLOCK, merge_rollout_metrics, start_roles, worker_config
    from rockroll.trainer.rollout import _mix

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
                first_turns = {_mix(_mix(wseed, g.group_id, k), 0) for k in range(3)}
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


def test_the_attention_role_runs_in_an_actor_of_its_own_and_follows_the_policy(tmp_path, local_ray):
    """Rhythm credit under Ray: the attention copy (its own actor) annotates every step with the
    weights that sampled it, synced from the trainer after each step like a generator."""
    from rockroll.trainer import train

    out = train(run_config(tmp_path, ray={"enabled": True}, algorithm__rhythm={"enabled": True},
                           logging__tensorboard=False))
    hist = out["history"]
    assert [h["step"] for h in hist] == [0, 1]
    for h in hist:
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
