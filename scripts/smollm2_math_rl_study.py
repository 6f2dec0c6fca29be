"""The study of GRPO straight from SmolLM2-135M-Instruct on Math-v0 (docs/results/smollm2-math-rl-from-instruct.md):
held-out success and format errors by RL step, pooled over the seeds of ``rockroll train``
(Wilson 95 %), each seed a thin line.

    python scripts/smollm2_math_rl_study.py OUT_PREFIX RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is the ``logging.dir`` of one ``rockroll train examples/smollm2_math_rl_cpu.yaml
--set seed=S``: its ``eval.jsonl`` is read. Writes ``OUT_PREFIX.json`` and ``OUT_PREFIX.png``,
and prints the table in Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_rl_compare import band, finish  # noqa: E402
from smollm2_guess_study import evals, pool  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, dirs = Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]]
    runs = {d.name: evals(d) for d in dirs}
    pooled = pool(runs)
    per_seed = {name: [{"step": s, "success": r[s]["eval/success"], "format_errors": r[s]["eval/format_errors"]}
                       for s in sorted(r)] for name, r in runs.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"pooled": pooled, "per_seed": per_seed}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = [p["step"] for p in pooled]
    color = band(ax, steps, pooled, f"success, pooled over {len(runs)} seeds")
    for pts in per_seed.values():
        ax.plot([p["step"] for p in pts], [p["success"] for p in pts], lw=0.8, alpha=0.4, color=color)
    ax.plot(steps, [p["format_errors"] for p in pooled], ls="--", marker="s", color="tab:grey",
            label="format errors (no answer the env reads), pooled")
    finish(fig, ax, "GRPO straight from SmolLM2-135M-Instruct (LoRA) on Math-v0 arithmetic: 64 held-out problems, "
           "greedy", "GRPO step (16 completions a step)", out, legend="upper right")
    print("| step | held-out success, pooled [Wilson 95 %] | per seed | format errors, pooled |\n|---:|---|---|---|")
    for p in pooled:
        lo, hi = p["wilson95"]
        print(f"| {p['step']} | {p['success']:.3f} [{lo:.2f}, {hi:.2f}] ({p['episodes']}) | "
              f"{', '.join(f'{s:.3f}' for s in p['success_per_seed'])} | {p['format_errors']:.2f} |")


if __name__ == "__main__":
    main()
