"""The SmolLM2 Math-v0 study's table and plot (docs/results/smollm2-math.md) from its run folders.

    python scripts/smollm2_math_study.py RUNS_ROOT EVALTIMES OUT_PREFIX

``RUNS_ROOT`` holds the runs of examples/smollm2_math_cpu.yaml: ``smollm2_math_cpu/sft`` (SFT
from the packaged model), and the arms started from its 60-step model: ``smollm2_math_cpu``
(GRPO, the example's settings), ``rl_v2`` (GRPO, lr 5e-5, temperature 0.5, dynamic sampling)
and ``sft_alone/sft`` (SFT resumed from step 60). ``EVALTIMES`` is the log of a watcher that
wrote ``<epoch seconds> <eval.jsonl path> <lines>`` each time an evaluation was appended, and
``<epoch> START ...`` lines when arms started: the x axis of the plot is the wall-clock
seconds since an arm started (the arms ran two at a time on the 2 cores). Writes
``OUT_PREFIX.json`` (every point) and ``OUT_PREFIX.png``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ARMS = {  # label -> (eval file under RUNS_ROOT, the START line that began it)
    "SFT from the base model": ("smollm2_math_cpu/sft/eval.jsonl", None),
    "GRPO lr 3e-4, T 0.7": ("smollm2_math_cpu/eval.jsonl", "both"),
    "GRPO lr 5e-5, T 0.5": ("rl_v2/eval.jsonl", "rl_v2"),
    "SFT alone, from step 60": ("sft_alone/sft/eval.jsonl", "both"),
}


def _times(log: Path) -> tuple[dict[tuple[str, int], float], dict[str, float]]:
    """(eval file, its line count) -> when the file first had that many lines; START -> when."""
    seen: dict[tuple[str, int], float] = {}
    starts: dict[str, float] = {}
    for line in log.read_text().splitlines():
        t, what, *rest = line.split()
        if what == "START":
            starts[rest[0]] = float(t)
        else:  # a restarted watcher logs the counts it finds again: the first time counts
            seen.setdefault((what.removeprefix("runs/"), int(rest[0])), float(t))
    return seen, starts


def main(root: str, evaltimes: str, out: str) -> None:
    seen, starts = _times(Path(evaltimes))
    points = {}
    for label, (rel, start) in ARMS.items():
        path = Path(root) / rel
        rows = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
        t0 = starts.get(start) if start else None
        points[label] = [{"step": r["step"], "success": r["eval/success"], "lo": r["eval/success_lo"],
                          "hi": r["eval/success_hi"], "episodes": r["eval/episodes"],
                          "seconds": seen[(rel, i + 1)] - t0 if t0 is not None and (rel, i + 1) in seen else None}
                         for i, r in enumerate(rows)]
    Path(f"{out}.json").write_text(json.dumps(points, indent=1) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    sft = points["SFT from the base model"]
    left.errorbar([p["step"] for p in sft], [p["success"] for p in sft],
                  yerr=[[p["success"] - p["lo"] for p in sft], [p["hi"] - p["success"] for p in sft]],
                  marker="o", capsize=3)
    left.set(title="SFT from SmolLM2-135M-Instruct (LoRA r=16)", xlabel="SFT step",
             ylabel="held-out success (64 problems, greedy)", ylim=(0, 1))
    for label, pts in points.items():
        pts = [p for p in pts if p["seconds"] is not None]
        if label == "SFT from the base model" or not pts:
            continue
        right.errorbar([p["seconds"] for p in pts], [p["success"] for p in pts],
                       yerr=[[p["success"] - p["lo"] for p in pts], [p["hi"] - p["success"] for p in pts]],
                       marker="o", capsize=3, label=label)
    right.set(title="from the 60-step SFT model", xlabel="wall-clock seconds (two runs at a time, 2 cores)")
    right.legend(loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=110)
    print(f"{out}.json, {out}.png")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
