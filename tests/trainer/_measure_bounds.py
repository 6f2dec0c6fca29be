"""Measures the spread of test_learning.py's asserted numbers over seeds and settings (not a
test: docs/testing.md, "Learning bounds", says how its output set the bounds).

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m tests.trainer._measure_bounds algorithms \\
        --threads 1 --seeds 0 1 2 3 4 [--algos grpo ppo] [--nondeterministic] [--out rows.jsonl]
    OMP_NUM_THREADS=2 nice -n 5 .venv/bin/python -m tests.trainer._measure_bounds frozenlake --threads 2 \
        [--set eval.episodes=32]

Each run appends one JSON row (kind, algorithm, seed, threads, deterministic, the asserted
numbers) to ``--out`` and prints it.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # the _synthetic envs, as conftest.py puts them

from tests.trainer.test_learning import (ALGORITHMS, FROZENLAKE_STEPS, FROZENLAKE_SETS, STEPS, eval_rewards,
                                         learning_config, train_example)
from rockroll.trainer import train


def algorithm_row(algo: str, seed: int, deterministic: bool) -> dict:
    algorithm, rollout, env = ALGORITHMS[algo]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = learning_config(Path(tmp), algorithm, rollout, env, seed=seed)
        cfg["deterministic"] = deterministic
        train(cfg)
        curve = eval_rewards(Path(tmp) / "run")
    return {"start": curve[0], "end": curve[STEPS]}


def frozenlake_row(seed: int, deterministic: bool, sets: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rows = train_example("frozenlake_cpu.yaml", FROZENLAKE_STEPS, Path(tmp),
                             {**FROZENLAKE_SETS, "seed": str(seed), "deterministic": str(deterministic).lower(), **sets})
    end = rows[FROZENLAKE_STEPS]
    return {"start": rows[0]["eval/success"], "end": end["eval/success"], "end_lo": end.get("eval/success_lo"),
            "end_hi": end.get("eval/success_hi"), "format_errors": end["eval/format_errors"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["algorithms", "frozenlake"])
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--algos", nargs="+", default=list(ALGORITHMS))
    p.add_argument("--nondeterministic", action="store_true")
    p.add_argument("--set", nargs="*", default=[], help="frozenlake: more KEY=VALUE overrides")
    p.add_argument("--out", default="measure_bounds.jsonl")
    a = p.parse_args()
    assert os.environ.get("OMP_NUM_THREADS") == str(a.threads), "set OMP_NUM_THREADS to --threads"
    torch.set_num_threads(a.threads)
    det = not a.nondeterministic
    sets = dict(kv.split("=", 1) for kv in a.set)
    for seed in a.seeds:
        for algo in a.algos if a.kind == "algorithms" else ["frozenlake"]:
            nums = algorithm_row(algo, seed, det) if a.kind == "algorithms" else frozenlake_row(seed, det, sets)
            row = {"kind": a.kind, "algorithm": algo, "seed": seed, "threads": a.threads, "deterministic": det,
                   **({"sets": sets} if sets else {}), **nums}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
