"""Training on a real multi-node Ray cluster on 127.0.0.1 (tests/sandbox/_raycluster.py: each
node its own `ray start`, killed by itself with SIGKILL) when a node dies mid-run:

- the node that holds an env worker and its sandboxes: the steps go on with the other
  worker's groups, each step counts what it lost (``rollout/env_workers_lost``,
  ``rollout/groups_lost``, ``rollout/env_workers_live``), the staleness bound holds; a node that
  joins gets the lost worker's replacement, whose groups carry ids of a block of its own; the
  dead node's sandboxes exit by themselves and the reaper removes its run;
- the learner's node, under ``rockroll train``: the run stops with one error line that names
  the lost role and the checkpoint to resume from; the same command, with a learner node back,
  resumes there and ends on the weights of a run that was never interrupted, bit for bit.

The roles are pinned with custom resources (``ray.roles.<role>.resources``), as a cluster
keeps env workers on CPU nodes and the learner on a GPU node.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import ray

from rockroll.sandbox.deployment import ray as raycluster
from rockroll.sandbox.deployment.reaper import list_runs, reap_dead_runs
from rockroll.sandbox.home import state_home
from rockroll.trainer.config import config_to_dict
from rockroll.trainer.roles.ray import RayRoles, first_group_id, worker_config

from _tensors import same_state
from _tiny import run_config

sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))  # the cluster helper lives with the sandbox tests
from _raycluster import LoopbackCluster, guests_of, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(900)

PINNED = {"trainer": {"resources": {"learner": 1}}, "generator": {"resources": {"learner": 1}},
          "env_worker": {"resources": {"envs": 1}}}


@pytest.fixture
def cluster(tmp_path):
    loop = LoopbackCluster(tmp_path / "ray")
    try:
        yield loop
    finally:
        ray.shutdown()
        loop.close()


def _config(tmp_path, address: str, **over):
    return run_config(tmp_path, **{"ray": {"enabled": True, "address": address, "roles": PINNED, **over.pop("ray", {})},
                                   "logging__tensorboard": False, **over})


def test_losing_an_env_worker_node_drops_its_groups_and_a_node_that_joins_gets_work(tmp_path, cluster):
    cluster.start_head({"learner": 2, "envs": 1})
    doomed = cluster.add_node({"envs": 1})
    raycluster.connect(cluster.address)
    wait_for(lambda: cluster.alive() == 2, 120, "two alive nodes")
    # Terminal tasks: every episode holds a sandbox of the local backend, in its env worker's process
    cfg = _config(tmp_path, cluster.address, ray={"num_env_workers": 2, "env_worker_wait_s": 120},
                  envs=[{"id": "rock/Terminal-v0", "kwargs": {"pool_size": 1, "step_timeout": 10}}],
                  rollout={"group_size": 2, "batch_groups": 2, "max_turns": 2, "batch_wait_ms": 10_000,
                           "async_ratio": 1},
                  generation={"max_new_tokens": 4})
    bound = cfg.rollout.async_ratio
    roles = RayRoles.open(cfg)
    try:
        where = ray.get([w.placement.remote() for w in roles.workers])
        lost = next(i for i, p in enumerate(where) if p["node_id"] == doomed.node_id())
        kept = 1 - lost
        doomed_run = lambda: next((r for r in list_runs() if r.pid == where[lost]["pid"]), None)  # noqa: E731
        roles.sync_weights(0)
        roles.rollout.start(0)
        history = []

        def step() -> tuple[list, dict]:
            n = len(history)
            groups, metrics = roles.rollout.get_batch(n)
            roles.update(groups)
            roles.sync_weights(n + 1)
            roles.rollout.advance(n + 1)
            history.append(metrics)
            assert metrics["rollout/staleness_max"] <= bound  # a loss never lets older samples in
            return groups, metrics

        for _ in range(2):
            _, m = step()
            assert (m["rollout/env_workers_live"], m["rollout/env_workers_lost"], m["rollout/groups_lost"]) == (2, 0, 0)
        run = wait_for(doomed_run, 60, "the doomed node's env worker to have sandboxes")
        assert run.alive and run.sandboxes

        doomed.kill()  # its raylet and workers; the sandbox agents are left to go by themselves
        share = worker_config(cfg, lost).rollout.batch_groups
        groups, m = step()
        assert (m["rollout/env_workers_live"], m["rollout/env_workers_lost"], m["rollout/groups_lost"]) == (1, 1, share)
        block = first_group_id(cfg, kept)
        assert groups and all(block <= g.group_id < block + (1 << 32) for g in groups)  # the survivor's alone
        _, m = step()  # no node offers the lost worker's resource: the run goes on without it
        assert (m["rollout/env_workers_live"], m["rollout/env_workers_lost"], m["rollout/groups_lost"]) == (1, 0, share)

        joined = cluster.add_node({"envs": 1})
        deadline = time.monotonic() + 120
        while (m := step()[1])["rollout/env_workers_live"] < 2:
            assert m["rollout/groups_lost"] == share and time.monotonic() < deadline, "the replacement never joined"
        groups = step()[0]
        # the replacement's groups carry ids of a block of its own, incarnation k of worker `lost`
        # (k > 1 when a replacement made before Ray saw the node dead went to its bundle there and
        # was lost too: every loss is counted)
        lost_total = sum(h["rollout/env_workers_lost"] for h in history)
        blocks = {first_group_id(cfg, lost, k) >> 32 for k in range(1, lost_total + 1)}
        made_by = {g.group_id >> 32 for g in groups}
        assert made_by & blocks and made_by <= {kept} | blocks, (made_by, blocks)
        assert ray.get(roles.workers[lost].placement.remote())["node_id"] == joined.node_id()
    finally:
        roles.close()

    # the dead node's sandboxes went with it: its agents exit, and the reaper (this one, or the
    # one a sandbox engine runs as it starts: the replacement's) removes its run
    wait_for(lambda: not guests_of(run.run_id), 60, "the dead node's sandbox agents to exit")
    reap_dead_runs()
    assert run.run_id not in {r.run_id for r in list_runs()}
    assert not (state_home() / "runs" / run.run_id).exists()


ROCKROLL = str(Path(sys.executable).with_name("rockroll"))  # the command a user runs


def _train(cluster, config: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([ROCKROLL, "train", str(config)], env=cluster.env, capture_output=True, text=True,
                          timeout=timeout)


def test_losing_the_learners_node_is_one_error_and_the_same_command_resumes_bit_exact(tmp_path, cluster):
    cluster.start_head({"envs": 1})
    learner = cluster.add_node({"learner": 2})
    over = dict(steps=30, rollout__async_ratio=0, checkpoint__every=2)

    def config(name: str) -> Path:
        cfg = _config(tmp_path / name, cluster.address, checkpoint__dir=str(tmp_path / name / "ckpt"), **over)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config_to_dict(cfg)))
        return path

    straight = _train(cluster, config("straight"))
    assert straight.returncode == 0, straight.stderr[-3000:]

    interrupted = config("interrupted")
    proc = subprocess.Popen([ROCKROLL, "train", str(interrupted)],
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "interrupted" / "ckpt"
    wait_for(lambda: (ckpt / "latest").is_file() or proc.poll() is not None, 300, "the first checkpoint")
    os.kill(proc.pid, signal.SIGSTOP)  # the run holds still while its learner's node goes (no race with its end)
    learner.kill()
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    saved = (ckpt / "latest").read_text().strip()
    assert len(errors) == 1, err[-3000:]
    # the learner's node held the generator too (as a GPU node would): both are named
    assert errors[0].startswith("error: the trainer (rank 0) and generator 0 are lost (process or node died"), errors[0]
    assert errors[0].endswith(f"run the same command again to resume from {ckpt / saved}"), errors[0]
    assert int(saved.removeprefix("step_")) < over["steps"]  # it stopped mid-run

    cluster.add_node({"learner": 2})  # the learner's machine is back (or another took its place)
    resumed = _train(cluster, interrupted)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {ckpt / saved}" in resumed.stdout
    last = f"step_{over['steps']:06d}"
    same_state(torch.load(tmp_path / "straight" / "ckpt" / last / "policy.pt", weights_only=False),
               torch.load(ckpt / last / "policy.pt", weights_only=False))  # weights and optimizer, bit for bit
    before = torch.load(ckpt / f"step_{over['steps'] - 2:06d}" / "policy.pt", weights_only=False)["module"]
    after = torch.load(ckpt / last / "policy.pt", weights_only=False)["module"]
    assert any(not torch.equal(before[k], after[k]) for k in after)  # and the steps in between did train
    rows = [json.loads(x) for x in (tmp_path / "interrupted" / "run" / "metrics.jsonl").read_text().splitlines()]
    straight_rows = [json.loads(x) for x in (tmp_path / "straight" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/reward"] for r in rows[-5:]] == [r["rollout/reward"] for r in straight_rows[-5:]]
