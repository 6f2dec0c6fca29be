"""Board-blind baselines of FrozenLake maps: how often a policy that never reads the board wins.

    python examples/frozenlake_baselines.py --size 4 --p 0.8 --goal random --maps 256

For each setting, over the maps of task ids ``first .. first + maps - 1`` (the eval ids of the
examples start at 1000), with the turn budget of each map (``turn_budget=0``: its shortest path):

- ``random``: a policy that says Up, Down, Left, Right uniformly, exact (a sum over all move
  sequences up to the map's budget, each of probability 4^-k);
- ``best fixed route``: the best open-loop sequence of moves, searched over every sequence up to
  ``--depth`` moves; every policy that ignores what it sees is a mixture of such sequences, so
  none wins more often than the best one does;
- ``local reader``: a policy that reads its four neighbours and the goal's direction perfectly
  and steps onto a safe cell toward the goal (``local_reader_success``, exact): the ceiling of
  one-step reading, short of 1 where a shortest path first goes around a dead end.

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import itertools

from rockroll.gem.grid import FrozenLakeEnv, board_blind_baselines, local_reader_success


def maps(size: int, p: float, goal: str, first: int, count: int) -> list[FrozenLakeEnv]:
    out = []
    for task in range(first, first + count):
        env = FrozenLakeEnv(size=size, p=p, goal=goal, max_actions_per_turn=1, turn_budget=0)
        env.reset(options={"task_id": task})
        out.append(env)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, nargs="+", default=[4])
    ap.add_argument("--p", type=float, nargs="+", default=[0.8])
    ap.add_argument("--goal", nargs="+", default=["corner", "random"])
    ap.add_argument("--maps", type=int, default=256)
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=None, help="default: the longest budget (exact)")
    ap.add_argument("--out", default="runs/frozenlake_baselines.json")
    args = ap.parse_args()
    rows = []
    for size, p, goal in itertools.product(args.size, args.p, args.goal):
        envs = maps(size, p, goal, args.first, args.maps)
        depth = args.depth or max(env.max_turns for env in envs)
        rows.append({"size": size, "p": p, "goal": goal, "maps": args.maps, "depth": depth,
                     **board_blind_baselines(envs, depth), "local_reader": local_reader_success(envs)})
    print(f"{'size':>4} {'p':>4} {'goal':>7} {'maps':>5} {'random':>7} {'best fixed route':>17} {'local reader':>13} "
          f"{'budget (mean, max)':>19}")
    for r in rows:
        print(f"{r['size']:>4} {r['p']:>4} {r['goal']:>7} {r['maps']:>5} {r['random']:>7.3f} "
              f"{r['best_fixed_route']:>17.3f} {r['local_reader']:>13.3f} {r['mean_budget']:>12.2f}, {r['max_budget']}")
    from pathlib import Path
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
