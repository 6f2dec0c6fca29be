"""Learning curves of several training runs in one PNG, and their evaluations as a table.

    python examples/compare_runs.py docs/img/compare.png GRPO=runs/a AsyPPO=runs/b "rhythm credit=runs/c"

Each run is ``LABEL=RUN_DIR`` (a ``logging.dir``): its evaluations (``eval.jsonl``: the same
fresh episodes at each evaluated policy version) as points and lines, its training batches'
success (``metrics.jsonl``, smoothed) as a thin line of the same colour. Compare runs of the
same env, seed and step budget: that is what makes the curves comparable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def main(out: str, runs: list[tuple[str, str]], title: str, window: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    table = []
    for i, (label, run) in enumerate(runs):
        train, evals = _rows(Path(run) / "metrics.jsonl"), _rows(Path(run) / "eval.jsonl")
        if not train and not evals:
            raise SystemExit(f"{run}: no metrics.jsonl or eval.jsonl (is it a run's logging.dir?)")
        color = f"C{i}"
        if train:
            ax.plot([m["step"] for m in train], smooth([m["rollout/success"] for m in train], window),
                    color=color, lw=0.8, alpha=0.5)
        if evals:
            ax.plot([e["step"] for e in evals], [e["eval/success"] for e in evals], "o-", color=color, label=label)
        table.append((label, evals))
    ax.set(xlabel="policy version (training step)", ylabel="success", ylim=(0, 1), title=title)
    ax.legend(loc="upper left", fontsize=8, title=f"evaluation; thin: training batches ({window}-step mean)",
              title_fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    steps = sorted({e["step"] for _, evals in table for e in evals})
    print("| run | " + " | ".join(f"v{s}" for s in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for label, evals in table:
        by = {e["step"]: e["eval/success"] for e in evals}
        print(f"| {label} | " + " | ".join(f"{by[s]:.2f}" if s in by else "" for s in steps) + " |")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Plot several training runs' learning curves in one PNG.")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR", help="a label and a run's logging.dir")
    parser.add_argument("--title", default="", help="the plot's title")
    parser.add_argument("--window", type=int, default=10, help="training-success smoothing, in steps (default 10)")
    args = parser.parse_args()
    pairs = []
    for item in args.runs:
        label, sep, run = item.partition("=")
        if not sep or not label or not run:
            parser.error(f"{item!r}: expected LABEL=RUN_DIR")
        pairs.append((label, run))
    main(args.out, pairs, args.title, args.window)
