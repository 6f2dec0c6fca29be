"""Print a training run's success/reward curve in the terminal (the PNG is beside it).

    python examples/show_curve.py runs/demo

When the run started from an SFT stage logged in the same folder (``<run>/sft``, as
``make demo`` does), the held-out evaluations of both stages are printed in order with their
95 % intervals and drawn into ``<run>/heldout.png``: SFT's steps, then RL's.
"""

import json
import sys
from pathlib import Path

BARS = " ▁▂▃▄▅▆▇█"


def main(run_dir: str, buckets: int = 10) -> None:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    if not rows:
        sys.exit(f"no metrics in {run_dir}")
    size = max(1, len(rows) // buckets)
    print(f"{'steps':>11}  {'success':>7}  {'reward':>7}")
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]
        success = sum(r["rollout/success"] for r in chunk) / len(chunk)
        reward = sum(r["rollout/reward"] for r in chunk) / len(chunk)
        bar = BARS[min(len(BARS) - 1, round(success * (len(BARS) - 1)))] * 20
        print(f"{start:>4}-{start + len(chunk) - 1:<6} {success:>7.2f}  {reward:>7.2f}  {bar}")
    sft, rl = _evals(Path(run_dir) / "sft" / "eval.jsonl"), _evals(Path(run_dir) / "eval.jsonl")
    stages = [("SFT step", sft), ("RL version", rl)] if sft else [("version", rl)]
    if rl or sft:  # the same fresh episodes at each evaluated policy version
        first = (sft or rl)[0]
        print(f"{'evaluated':>14}  {'success':>7}  {'95 % interval':>13}   ({int(first['eval/episodes'])} fresh episodes)")
        for name, evals in stages:
            for e in evals:
                lo, hi = e.get("eval/success_lo", 0.0), e.get("eval/success_hi", 1.0)
                print(f"{name + ' ' + str(e['step']):>14}  {e['eval/success']:>7.2f}  [{lo:.2f}, {hi:.2f}]")
    print(f"curve: {Path(run_dir) / 'curve.png'}")
    if sft:
        print(f"held-out success, SFT then RL: {_plot(stages, Path(run_dir) / 'heldout.png')}")


def _evals(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _plot(stages: list[tuple[str, list[dict]]], out: Path) -> Path:
    """Held-out success against steps, SFT's then RL's (RL's steps after SFT's last)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    offset = 0
    for (name, evals), colour in zip(stages, ("tab:blue", "tab:orange")):
        if not evals:
            continue
        x = [offset + e["step"] for e in evals]
        ax.plot(x, [e["eval/success"] for e in evals], "o-", color=colour, label=name.split()[0])
        ax.fill_between(x, [e.get("eval/success_lo", 0) for e in evals], [e.get("eval/success_hi", 1) for e in evals],
                        color=colour, alpha=0.2)
        offset = x[-1]
    ax.set_xlabel("step (SFT, then RL)")
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print a training run's success/reward curve in the terminal.")
    parser.add_argument("run_dir", nargs="?", default="runs/demo", help="the run's logging.dir (default: runs/demo)")
    parser.add_argument("--buckets", type=int, default=10, help="rows of the table (default: 10)")
    args = parser.parse_args()
    main(args.run_dir, args.buckets)
