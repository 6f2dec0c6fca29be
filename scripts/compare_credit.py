"""IPA against GRPO and AsyPPO against PPO (one critic: its value head) on a multi-turn CPU task
with held-out evaluation tasks (issue #40, part 4): three seeds each, one PNG and one JSON.

    nice -n 10 .venv/bin/python scripts/compare_credit.py --out docs/img/credit_compare

The task is ``tests/trainer/_synthetic.py``'s TwoStepEnv with task ids ``"First-Second"``: two
turns, each asking for a direction named in its observation ("Say Left." then "Now say Up."),
0.5 a right turn, success = both. Training plays 8 of the 12 ordered pairs of distinct
directions (``envs[].task_ids``); every evaluation plays the other 4 (``eval.task_ids``, held
out: the policy never trains on them, and must read each turn's word off the observation
rather than remember a pair). Each point is the success rate pooled over the seeds' eval
episodes with its 95 % Wilson interval (``trainer/algorithms/stats.py``); the per-seed rates
are in the JSON. The policy is ``tests/trainer/test_learning.py``'s tiny Llama (one layer, 32
wide) with its replies constrained to the four directions (``generation.allowed_tokens``), lr
0.005.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))
sys.path.insert(0, str(ROOT / "scripts"))

from sft_rl_compare import band  # noqa: E402  (the curve and its Wilson band)
from test_learning import learning_config  # noqa: E402  (the learning tests' model and settings)

from rockroll.trainer.algorithms.stats import wilson_interval  # noqa: E402
from rockroll.trainer.controller import train  # noqa: E402

TASK = ("_synthetic:TwoStepEnv", {})
WORDS = ("Up", "Down", "Left", "Right")
# held out: a derangement, so each word still appears in both turns of the training pairs (twice)
HELD_OUT = ["Up-Left", "Down-Right", "Left-Down", "Right-Up"]
LR = 0.005  # the learning tests' 0.02 collapses this task to one fixed word on seed 0; 0.005 learns it
TRAIN = [f"{a}-{b}" for a in WORDS for b in WORDS if a != b and f"{a}-{b}" not in HELD_OUT]

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


def run(algorithm: dict, seed: int, steps: int, every: int, episodes: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        cfg = learning_config(Path(d), algorithm, {}, TASK, seed=seed, steps=steps)
        cfg["envs"][0]["task_ids"] = TRAIN
        cfg["engine"]["lr"] = LR
        cfg["generation"]["allowed_tokens"] = list(WORDS)  # replies are one of the four directions
        cfg["eval"].update(every=every, episodes=episodes, task_ids=HELD_OUT)
        train(cfg)
        return [json.loads(x) for x in (Path(d) / "run" / "eval.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--every", type=int, default=15)
    ap.add_argument("--episodes", type=int, default=128, help="eval episodes per evaluation (32 per held-out task)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only these names of RUNS, keeping the others' results already in PATH.json")
    ap.add_argument("--out", default="credit_compare", help="PATH: writes PATH.json and PATH.png")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"task": "TwoStepEnv, task ids First-Second (tests/trainer/_synthetic.py)", "train_task_ids": TRAIN,
            "eval_task_ids (held out)": HELD_OUT, "seeds": args.seeds, "steps": args.steps,
            "eval_every": args.every, "eval_episodes_per_seed": args.episodes, "lr": LR,
            "generation.allowed_tokens": list(WORDS)}
    old = json.loads(out.with_suffix(".json").read_text()) if args.only and out.with_suffix(".json").exists() else {}
    results = old.get("runs", {}) if old.get("meta") == meta else {}
    for name, algorithm in RUNS.items():
        if args.only is not None and name not in args.only:
            continue
        per_seed = {seed: run(algorithm, seed, args.steps, args.every, args.episodes) for seed in range(args.seeds)}
        steps = [r["step"] for r in per_seed[0]]
        points = []
        for i, step in enumerate(steps):
            rows = [per_seed[s][i] for s in per_seed]
            n = int(sum(r["eval/episodes"] for r in rows))
            k = sum(r["eval/success"] * r["eval/episodes"] for r in rows)
            lo, hi = wilson_interval(round(k), n)
            points.append({"step": step, "success": k / n, "wilson95": [lo, hi], "episodes": n,
                           "reward_per_seed": [r["eval/reward"] for r in rows],
                           "success_per_seed": [r["eval/success"] for r in rows]})
        results[name] = {"algorithm": algorithm, "points": points}
        print(name, [(p["step"], round(p["success"], 3)) for p in points], file=sys.stderr, flush=True)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))  # after each

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4), sharey=True)
    for ax, (title, names) in zip(axes, PANELS.items()):
        for name in (n for n in names if n in results):
            pts = results[name]["points"]
            x = [p["step"] for p in pts]
            color = band(ax, x, pts, name)
            for i in range(len(pts[0]["success_per_seed"])):  # each seed, thin: the spread the band does not show
                ax.plot(x, [p["success_per_seed"][i] for p in pts], lw=0.8, alpha=0.35, color=color)
        ax.set_title(f"{title}: held-out tasks, {args.seeds} seeds", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("eval success (both turns right): pooled, Wilson 95 %; thin: per seed", fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
