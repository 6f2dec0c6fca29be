"""IPA against GRPO and AsyPPO against PPO (one critic: its value head) on a multi-turn CPU task
(issue #40, part 4): three seeds each, eval on 64 episodes of the eval seeds (``eval.seed``,
never trained on) every ``--every`` steps, one PNG and one JSON.

    .venv/bin/python scripts/compare_credit.py --out docs/img/credit_compare

The task is ``tests/trainer/test_learning.py``'s TwoStepEnv (say "Up", then "Down"; 0.5 a
turn, success = both) with its tiny Llama over a 12-word vocabulary. The interval at each
point is Wilson's 95 % interval of the success rate pooled over the seeds' eval episodes
(a stand-in until the learning issue's eval machinery is merged).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))

from test_learning import TWO_STEP, learning_config  # noqa: E402  (the learning tests' task and model)

from rockroll.trainer.controller import train  # noqa: E402

RUNS = {  # name -> algorithm section
    "grpo": {"name": "grpo"},
    "ipa (paper: absolute returns)": {"name": "grpo", "ipa": {"enabled": True, "gamma": 0.9}},
    "ipa (returns: group_normalized)": {"name": "grpo", "ipa": {"enabled": True, "gamma": 0.9,
                                                                 "returns": "group_normalized"}},
    "ppo (one critic: value head)": {"name": "ppo"},
    "asyppo (2 mini-critics)": {"name": "asyppo", "critics": {"hidden_size": 16, "intermediate_size": 32,
                                                                "lr": 0.01}},
}
PANELS = {"IPA vs GRPO": ("grpo", "ipa (paper: absolute returns)", "ipa (returns: group_normalized)"),
          "AsyPPO vs PPO": ("ppo (one critic: value head)", "asyppo (2 mini-critics)")}


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval of a binomial rate."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run(algorithm: dict, seed: int, steps: int, every: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        cfg = learning_config(Path(d), algorithm, {}, TWO_STEP, seed=seed, steps=steps)
        cfg["eval"]["every"] = every
        train(cfg)
        return [json.loads(x) for x in (Path(d) / "run" / "eval.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--out", default="credit_compare", help="PATH: writes PATH.json and PATH.png")
    args = ap.parse_args()
    results = {}
    for name, algorithm in RUNS.items():
        per_seed = {seed: run(algorithm, seed, args.steps, args.every) for seed in range(args.seeds)}
        steps = [r["step"] for r in per_seed[0]]
        points = []
        for i, step in enumerate(steps):
            rows = [per_seed[s][i] for s in per_seed]
            n = int(sum(r["eval/episodes"] for r in rows))
            k = sum(r["eval/success"] * r["eval/episodes"] for r in rows)
            lo, hi = wilson(k, n)
            points.append({"step": step, "success": k / n, "wilson95": [lo, hi], "episodes": n,
                           "reward_per_seed": [r["eval/reward"] for r in rows],
                           "success_per_seed": [r["eval/success"] for r in rows]})
        results[name] = {"algorithm": algorithm, "points": points}
        print(name, [(p["step"], round(p["success"], 3)) for p in points], file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"task": "TwoStepEnv (tests/trainer/test_learning.py)", "seeds": args.seeds, "steps": args.steps,
            "eval_every": args.every, "eval_episodes_per_seed": 64}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4), sharey=True)
    for ax, (title, names) in zip(axes, PANELS.items()):
        for name in names:
            pts = results[name]["points"]
            x = [p["step"] for p in pts]
            ax.plot(x, [p["success"] for p in pts], marker="o", label=name)
            ax.fill_between(x, [p["wilson95"][0] for p in pts], [p["wilson95"][1] for p in pts], alpha=0.2)
        ax.set_title(f"{title} ({args.seeds} seeds, eval success, Wilson 95 %)")
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("eval success rate (both turns right)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
