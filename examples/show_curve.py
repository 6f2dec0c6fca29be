"""Print a training run's success/reward curve in the terminal (the PNG is beside it).

    python examples/show_curve.py runs/demo
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
    eval_path = Path(run_dir) / "eval.jsonl"
    evals = [json.loads(line) for line in eval_path.read_text().splitlines() if line] if eval_path.exists() else []
    if evals:  # the same fresh episodes at each evaluated policy version
        print(f"{'evaluated':>11}  {'success':>7}  {'reward':>7}   ({int(evals[0]['eval/episodes'])} fresh episodes)")
        for e in evals:
            print(f"{'version ' + str(e['step']):>11}  {e['eval/success']:>7.2f}  {e['eval/reward']:>7.2f}")
    print(f"curve: {Path(run_dir) / 'curve.png'}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print a training run's success/reward curve in the terminal.")
    parser.add_argument("run_dir", nargs="?", default="runs/demo", help="the run's logging.dir (default: runs/demo)")
    parser.add_argument("--buckets", type=int, default=10, help="rows of the table (default: 10)")
    args = parser.parse_args()
    main(args.run_dir, args.buckets)
