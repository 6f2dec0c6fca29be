"""The study of GRPO straight from SmolLM2-135M-Instruct on Math-v0 (docs/results/smollm2-math-rl-from-instruct.md):
held-out success and format errors by RL step, pooled over the seeds of ``rockroll train``
(Wilson 95 %), each seed a thin line, and TRL's ``GRPOTrainer`` on the same settings beside it.

    python scripts/smollm2_math_rl_study.py OUT_PREFIX TRL_RESULT RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is the ``logging.dir`` of one ``rockroll train examples/smollm2_math_rl_cpu.yaml
--set seed=S``; ``TRL_RESULT`` the ``result.json`` of ``scripts/trl_math_rl.py`` (its evaluations
are of the same 64 problems; its step 0 is the start model's, every run's step 0). Writes
``OUT_PREFIX.json`` and ``OUT_PREFIX.png``, and prints the table in Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_rl_compare import band, finish  # noqa: E402
from smollm2_guess_study import evals, pool  # noqa: E402

from rockroll.trainer.algorithms.stats import wilson_interval  # noqa: E402


def trl_points(result: dict, start: dict) -> list[dict]:
    """TRL's evaluations as points, its step 0 the start model's (``start``: a run's step-0 row)."""
    rows = [(0, start), *sorted(((int(k), v) for k, v in result["eval"].items()))]
    pts = [{"step": step, "success": row["eval/success"], "episodes": int(row["eval/episodes"]),
            "format_errors": row["eval/format_errors"]} for step, row in rows]
    for p in pts:
        p["wilson95"] = list(wilson_interval(round(p["success"] * p["episodes"]), p["episodes"]))
    return pts


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, trl_result, dirs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), [Path(d) for d in sys.argv[3:]]
    runs = {d.name: evals(d) for d in dirs}
    pooled = pool(runs)
    trl = trl_points(trl_result, next(iter(runs.values()))[0])
    per_seed = {name: [{"step": s, "success": r[s]["eval/success"], "format_errors": r[s]["eval/format_errors"]}
                       for s in sorted(r)] for name, r in runs.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"pooled": pooled, "per_seed": per_seed, "trl": trl, "trl_train_s": trl_result["train_s"]}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = [p["step"] for p in pooled]
    color = band(ax, steps, pooled, f"rockroll train, success, pooled over {len(runs)} seeds")
    for pts in per_seed.values():
        ax.plot([p["step"] for p in pts], [p["success"] for p in pts], lw=0.8, alpha=0.4, color=color)
    ax.plot(steps, [p["format_errors"] for p in pooled], ls="--", color=color, label="rockroll train, format errors")
    t = [p["step"] for p in trl]
    ax.errorbar(t, [p["success"] for p in trl], yerr=[[p["success"] - p["wilson95"][0] for p in trl],
                                                      [p["wilson95"][1] - p["success"] for p in trl]],
                marker="s", capsize=3, color="tab:red", label="TRL GRPOTrainer (seed 0), success")
    ax.plot(t, [p["format_errors"] for p in trl], ls="--", marker="s", color="tab:red", label="TRL, format errors")
    finish(fig, ax, "GRPO straight from SmolLM2-135M-Instruct (LoRA) on Math-v0 arithmetic: 64 held-out problems, "
           "greedy", "GRPO step (16 completions a step)", out)
    print("| step | rockroll train: success, pooled [Wilson 95 %] | per seed | format errors | "
          "TRL GRPOTrainer, seed 0 [95 %] | TRL format errors |\n|---:|---|---|---|---|---|")
    by_step = {p["step"]: p for p in trl}
    for p in pooled:
        lo, hi = p["wilson95"]
        q = by_step.get(p["step"])
        trl_cells = (f"{q['success']:.3f} [{q['wilson95'][0]:.2f}, {q['wilson95'][1]:.2f}] | {q['format_errors']:.2f}"
                     if q else "— | —")
        print(f"| {p['step']} | {p['success']:.3f} [{lo:.2f}, {hi:.2f}] ({p['episodes']}) | "
              f"{', '.join(f'{s:.3f}' for s in p['success_per_seed'])} | {p['format_errors']:.2f} | {trl_cells} |")


if __name__ == "__main__":
    main()
