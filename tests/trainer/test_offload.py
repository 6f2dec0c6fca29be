"""Offloading a role between its turns (``trainer/offload.py``), in this process.

Without a GPU a role's home is the CPU and offload/onload move nothing, so what is tested
here is what must hold on any machine: the round trip leaves parameters and optimizer state
bit-identical and still connected (the next training step is the one a role never offloaded
takes), and the role records where it is. The schedule under Ray and the config rules are in
test_ray_roles.py and test_placement.py; the device really emptied is the `gpu` test below.
"""

import pytest
import torch

from rockroll.trainer.roles.critics import CriticsRole
from rockroll.trainer.models import build_model
from rockroll.trainer.engines.offload import cpu_copy
from rockroll.trainer.roles.local import PolicyTrainer

from _tiny import TinyTok, multi_turn_groups, run_config  # noqa: E402


def _policy(tmp_path):
    cfg = run_config(tmp_path, engine__lr=0.05)
    return PolicyTrainer(cfg, build_model(cfg.model, TinyTok(), cfg.seed), TinyTok())


def _critics(tmp_path):
    cfg = run_config(tmp_path, algorithm__name="asyppo",
                     algorithm__critics={"hidden_size": 16, "intermediate_size": 16, "lr": 0.05})
    return CriticsRole(cfg, None, TinyTok())


def _step(role, groups):
    if isinstance(role, PolicyTrainer):
        return role.update(groups)
    return role.train(groups, role.annotate(groups))


def _tensors(role):
    """Every tensor that moves, by name: parameters, buffers, optimizer state (with ``step``)."""
    modules, optimizers = role.resident_state()
    out = {}
    for i, m in enumerate(modules):
        out.update({f"m{i}/{k}": v for k, v in m.state_dict().items()})
    for i, o in enumerate(optimizers):
        for p, st in o.state_dict()["state"].items():
            out.update({f"o{i}/{p}/{k}": v for k, v in st.items() if torch.is_tensor(v)})
    return out


@pytest.mark.parametrize("make", [_policy, _critics], ids=["policy", "critics"])
def test_a_role_round_trips_offload_onload_and_trains_on_as_if_it_never_left(tmp_path, make):
    groups = multi_turn_groups()
    moved, stayed = make(tmp_path), make(tmp_path)
    assert _step(moved, groups) == _step(stayed, groups)  # Adam's moments exist now
    before = cpu_copy(_tensors(moved))
    assert any("exp_avg" in k for k in before)
    moved.offload()
    assert moved.where() == {"residency": "host", "device": "cpu", "onloads": 0}
    moved.onload()
    assert moved.where()["residency"] == "device" and moved.where()["onloads"] == 1
    after = _tensors(moved)
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k].cpu()), k
    for _ in range(2):  # the optimizer still owns the parameters it moved with
        assert _step(moved, groups) == _step(stayed, groups)
    for k, v in _tensors(stayed).items():
        assert torch.equal(v, _tensors(moved)[k]), k


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("make", [_policy, _critics], ids=["policy", "critics"])
def test_offload_empties_the_device_and_onload_brings_the_state_back(tmp_path, make):
    """On a GPU: after offload every parameter and optimizer moment is in host memory and the
    device's allocation fell by at least their size; onload brings them back bit for bit."""
    groups = multi_turn_groups()
    role, twin = make(tmp_path), make(tmp_path)
    _step(role, groups), _step(twin, groups)
    before = cpu_copy(_tensors(role))
    # by storage: tied weights (the embedding and the output layer) are two names of one tensor
    size = sum({v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
                for v in _tensors(role).values() if v.is_cuda}.values())
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated()
    role.offload()
    torch.cuda.synchronize()
    assert all(not v.is_cuda for v in _tensors(role).values())
    assert torch.cuda.memory_allocated() <= used - size
    role.onload()
    assert all(v.is_cuda for k, v in _tensors(role).items() if not k.endswith("/step"))
    for k, v in _tensors(role).items():
        assert torch.equal(before[k], v.cpu()), k
    assert _step(role, groups) == _step(twin, groups)
