"""Tiny things the trainer tests share: a tokenizer stand-in, hand-made multi-turn batches,
the config of a tiny FrozenLake run, and a way to hold a generation loop inside one step."""

import random
import threading

from rockroll.trainer.config import TrainConfig, load_config
from rockroll.trainer.rollout.types import Group, Sample


class TinyTok:
    """What build_model needs of a tokenizer, for a 32-token vocabulary."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __len__(self):
        return 32


def multi_turn_groups(vocab: int = 32, seed: int = 0) -> list[Group]:
    """Two groups of three samples: two observation runs (mask 0) and two replies (mask 1),
    the second reply 1-3 tokens long; in group g sample g wins."""
    rng = random.Random(seed)
    groups = []
    for gid in range(2):
        samples = []
        for i in range(3):
            mask = [0] * 5 + [1] * 2 + [0] * 3 + [1] * (1 + i)
            samples.append(Sample(token_ids=[rng.randrange(3, vocab) for _ in mask], mask=mask,
                                  behav_logp=[-3.0 * m for m in mask], reward=float(i == gid),
                                  group_id=gid, version=0))
        groups.append(Group(gid, "e", None, 0, samples))
    return groups


def run_config(tmp_path, **over) -> TrainConfig:
    """Two steps of GRPO on two FrozenLake maps with a one-layer Llama; ``over`` sets keys
    with ``__`` for dots (``engine__kind="deepspeed"``)."""
    data = {
        "steps": 2, "seed": 3, "deterministic": True,
        "model": {"hidden_size": 64, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
        "tokenizer": {"build_dir": str(tmp_path.parent / "tok")},
        "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0, 1]}],
        "rollout": {"group_size": 3, "batch_groups": 2, "max_turns": 3, "batch_wait_ms": 10_000},
        "algorithm": {"name": "grpo", "format_penalty": -0.1},
        "engine": {"lr": 0.01},
        "generation": {"max_new_tokens": 1},
        "logging": {"dir": str(tmp_path / "run"), "progress": False, "plot_every": 1},
    }
    return load_config(with_overrides(data, over))


def with_overrides(data: dict, over: dict) -> dict:
    """``data`` with ``over``'s keys set, ``__`` for dots (``engine__kind="deepspeed"``)."""
    for dotted, v in over.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return data


class Held:
    """Holds a generation loop inside its ``n``-th call of ``obj.name`` (a decode or engine
    step: the loop's step lock held, the batch mid-generation) while the ``with`` block runs,
    so what a test does there happens between two steps however the threads are scheduled.
    ``calls``: the arguments of every call; :meth:`undo` puts the method back."""

    def __init__(self, obj, name, n):
        self.obj, self.name, self.n, self.calls = obj, name, n, []
        self._there, self._go = threading.Event(), threading.Event()
        method = getattr(obj, name)

        def held(*args):
            self.calls.append(args)
            if len(self.calls) == n:
                self._there.set()
                self._go.wait(60)
            return method(*args)

        setattr(obj, name, held)

    def __enter__(self):
        assert self._there.wait(60), f"the loop never made {self.n} calls of {self.name}"
        return self

    def __exit__(self, *exc):
        self._go.set()

    def undo(self):
        self._go.set()
        delattr(self.obj, self.name)
