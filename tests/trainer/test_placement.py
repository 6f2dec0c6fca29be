"""The role placement plan (``ray.roles`` -> one placement group's bundles), without Ray:
which bundle each role's actors land in, what each bundle asks for, and every bad config as
a ConfigError naming its key. Ray honouring the plan is in test_ray_roles.py."""

import pytest

from rockroll.trainer.config import ConfigError, load_config
from rockroll.trainer.roles.placement import MIN_BUNDLE_CPUS, plan, role_name
from rockroll.trainer.roles.local import ReferenceRole


def _ray(**ray):
    return load_config({"ray": ray}).ray


COUNTS = {"trainer": 2, "generator": 2, "env_worker": 2, "reference": 1}


def test_no_roles_no_placement_group():
    assert plan(_ray(num_gpus=1), COUNTS) is None


def test_colocated_roles_share_their_anchors_bundles():
    ray = _ray(num_gpus=1, roles={
        "trainer": {"num_gpus": 0.5, "num_cpus": 1},
        "reference": {"num_gpus": 0.25, "colocate": "trainer"},
        "generator": {"num_gpus": 0.25, "colocate": "trainer"},
        "env_worker": {"num_cpus": 0.5},
    }, placement_strategy="STRICT_PACK")
    p = plan(ray, COUNTS)
    # bundles of the roles placed on their own: trainer ranks 0, 1, then env workers 2, 3
    assert p.bundle == {"trainer": [0, 1], "env_worker": [2, 3], "reference": [0], "generator": [0, 1]}
    assert p.bundles == [{"CPU": 1.0, "GPU": 1.0},   # trainer rank 0 + reference + generator 0: one GPU
                         {"CPU": 1.0, "GPU": 0.75},  # trainer rank 1 + generator 1
                         {"CPU": 0.5}, {"CPU": 0.5}]
    assert p.strategy == "STRICT_PACK"
    assert p.resources["reference"].num_gpus == 0.25


def test_unlisted_roles_ask_for_ray_num_gpus_and_empty_bundles_reserve_a_little_cpu():
    p = plan(_ray(num_gpus=1, roles={"reference": {"num_gpus": 0.5}}), COUNTS)
    assert p.bundle == {"trainer": [0, 1], "generator": [2, 3], "env_worker": [4, 5], "reference": [6]}
    assert p.bundles[:4] == [{"GPU": 1.0}] * 4 and p.bundles[6] == {"GPU": 0.5}
    assert p.bundles[4] == p.bundles[5] == {"CPU": MIN_BUNDLE_CPUS}  # env workers ask for nothing


def test_custom_resources_go_into_the_bundles_and_the_actors_options():
    """``resources`` pins a role to the nodes that offer them (the learner on a GPU node, env
    workers on CPU nodes): each bundle asks for its actors' sum, and each actor for its own."""
    p = plan(_ray(roles={"trainer": {"resources": {"learner": 1}}, "reference": {"colocate": "trainer",
                                                                                 "resources": {"learner": 0.5}},
                         "env_worker": {"num_cpus": 1, "resources": {"envs": 1, "ssd": 2}}}), COUNTS)
    assert p.bundles[:2] == [{"learner": 1.5}, {"learner": 1.0}]  # rank 0's bundle holds the reference too
    assert p.bundles[4:6] == [{"CPU": 1.0, "envs": 1.0, "ssd": 2.0}] * 2
    assert p.resources["env_worker"].resources == {"envs": 1.0, "ssd": 2.0}


@pytest.mark.parametrize("roles, key", [
    ({"critics": {}}, "ray.roles.critics: no such role in this run"),
    ({"reference": {"colocate": "judge"}}, "ray.roles.reference.colocate: judge is no role of this run"),
])
def test_plan_errors_name_the_key(roles, key):
    with pytest.raises(ConfigError) as e:
        plan(_ray(roles=roles), COUNTS)
    assert str(e.value).startswith(key), str(e.value)


@pytest.mark.parametrize("ray, key", [
    ({"roles": {"trainer": {"num_gpus": -1}}}, "ray.roles.trainer.num_gpus: must be >= 0"),
    ({"roles": {"trainer": {"num_gpus": 1.5}}}, "ray.roles.trainer.num_gpus: must be a fraction of one GPU"),
    ({"roles": {"trainer": {"num_cpus": -0.5}}}, "ray.roles.trainer.num_cpus: must be >= 0"),
    ({"roles": {"trainer": {"gpus": 1}}}, "ray.roles.trainer.gpus: unknown key"),
    ({"roles": {"trainer": 1}}, "ray.roles.trainer: must be a mapping"),
    ({"roles": {"reference": {"colocate": "reference"}}}, "ray.roles.reference.colocate: a role cannot be"),
    ({"roles": {"reference": {"colocate": "critics"}, "critics": {"colocate": "trainer"}}},
     "ray.roles.reference.colocate: critics is itself colocated with trainer"),
    ({"roles": {"env_worker": {"resources": {"CPU": 1}}}},
     "ray.roles.env_worker.resources.CPU: is one of Ray's own resources: use num_cpus / num_gpus"),
    ({"roles": {"env_worker": {"resources": {"envs": 0}}}}, "ray.roles.env_worker.resources.envs: must be > 0"),
    ({"roles": {"env_worker": {"resources": {"envs": "one"}}}}, "ray.roles.env_worker.resources.envs: must be a number"),
    ({"env_worker_wait_s": 0}, "ray.env_worker_wait_s: must be > 0"),
    ({"placement_strategy": "pack"}, "ray.placement_strategy: must be one of PACK"),
    ({"num_trainers": 0}, "ray.num_trainers: must be >= 1"),
    ({"num_trainers": 2}, "ray.num_trainers: data-parallel ranks are Ray actors: needs ray.enabled"),
    ({"enabled": True, "num_trainers": 2}, "ray.num_trainers: data-parallel training needs engine.kind: deepspeed"),
    ({"num_reward_actors": 2}, "ray.num_reward_actors: must be in [1, num_env_workers]"),
    # offloading is taking turns on a shared device: alone on one, or on a whole one, it is refused
    ({"roles": {"trainer": {"num_gpus": 0.5, "offload": True}}},
     "ray.roles.trainer.offload: needs a GPU shared with another role"),
    ({"roles": {"trainer": {"num_gpus": 1, "offload": True}, "reference": {"num_gpus": 0, "colocate": "trainer"}}},
     "ray.roles.trainer.offload: needs a GPU shared"),
    ({"roles": {"trainer": {"num_gpus": 0.5}, "reference": {"num_cpus": 1, "colocate": "trainer", "offload": True}}},
     "ray.roles.reference.offload: needs a GPU shared"),
    ({"roles": {"trainer": {"num_gpus": 0.5}, "reference": {"num_gpus": 0.5, "offload": True}}},
     "ray.roles.reference.offload: needs a GPU shared"),  # fractions of two bundles: maybe two devices
    ({"roles": {"generator": {"num_gpus": 0.5, "offload": True},
                "trainer": {"num_gpus": 0.5, "colocate": "generator"}}},
     "ray.roles.generator.offload: the generator role has no turn to end"),
])
def test_config_errors_name_the_key(ray, key):
    with pytest.raises(ConfigError) as e:
        load_config({"ray": ray})
    assert str(e.value).startswith(key), str(e.value)


def test_offload_config():
    """Colocated fractions, both ways round (the anchor or the colocated role offloads); the
    trainer's offload is the torch engine's (DeepSpeed keeps its own state)."""
    both = {"trainer": {"num_gpus": 0.5, "offload": True},
            "critics": {"num_gpus": 0.5, "colocate": "trainer", "offload": True}}
    roles = load_config({"ray": {"roles": both}}).ray.roles
    assert {n for n, r in roles.items() if r.offload} == {"trainer", "critics"}
    with pytest.raises(ConfigError, match="^ray.roles.trainer.offload: needs engine.kind: torch"):
        load_config({"engine": {"kind": "deepspeed"}, "ray": {"roles": both}})


def test_data_parallel_config_limits():
    base = {"engine": {"kind": "deepspeed"}, "rollout": {"batch_groups": 1, "group_size": 2}}
    assert load_config({**base, "ray": {"enabled": True, "num_trainers": 2}}).ray.num_trainers == 2
    with pytest.raises(ConfigError, match="^ray.num_trainers: every rank needs a share"):
        load_config({**base, "ray": {"enabled": True, "num_trainers": 3}})


def test_role_names():
    assert role_name(ReferenceRole) == "reference"

    class CriticsRole:  # no `name`: the class name says it
        pass

    class RhythmAttentionRole:
        pass

    assert role_name(CriticsRole) == "critics" and role_name(RhythmAttentionRole) == "rhythm_attention"
