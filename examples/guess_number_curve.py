"""The learning curve of examples/guess_number_cpu.yaml against a random policy's baseline.

    python examples/guess_number_curve.py runs/guess_number_cpu [docs/guess_number_curve.png]

The baseline plays the run's evaluation episodes (the same four games, through the same
rockroll adapter of gem-llm's GuessTheNumber) with guesses drawn uniformly from the ten
answers the policy may give, many times over; the curve is the run's ``eval.jsonl`` (success
of fresh episodes at each evaluated policy version) and its training batches' success.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from rockroll.gem.factory import make_env

ENV_ID, TASK_IDS, MAX_TURNS = "gem:game:GuessTheNumber-v0-easy", [0, 1, 2, 3], 4
GUESSES = ["\\boxed{%d}" % n for n in range(1, 11)]


def random_baseline(episodes: int = 4000, seed: int = 0) -> float:
    """Success rate of uniformly random guesses on the run's games."""
    rng, env, wins = random.Random(seed), make_env(ENV_ID), 0
    for j in range(episodes):
        env.reset(options={"task_id": TASK_IDS[j % len(TASK_IDS)]})
        for _ in range(MAX_TURNS):
            _, _, terminated, truncated, info = env.step(rng.choice(GUESSES))
            if terminated or truncated:
                break
        wins += bool(info["success"])
    return wins / episodes


def main(run: str, out: str = "docs/guess_number_curve.png") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [json.loads(x) for x in (Path(run) / "eval.jsonl").read_text().splitlines()]
    train = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    base = random_baseline()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot([m["step"] for m in train], [m["rollout/success"] for m in train], color="0.75", lw=1,
            label="training batches")
    ax.plot([e["step"] for e in evals], [e["eval/success"] for e in evals], "o-", color="C0",
            label=f"evaluation ({int(evals[0]['eval/episodes'])} fresh episodes)")
    ax.axhline(base, color="C3", ls="--", label=f"random guesses ({base:.2f})")
    ax.set(xlabel="policy version (GRPO step)", ylabel="success", ylim=(0, 1),
           title="gem-llm GuessTheNumber-v0-easy, tiny Llama on CPU")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"random baseline {base:.3f}; evaluation " + ", ".join(f"{e['step']}: {e['eval/success']:.3f}" for e in evals))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
