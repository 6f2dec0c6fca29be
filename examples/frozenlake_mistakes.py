"""Where a FrozenLake policy loses: each of its greedy moves on the held-out maps, by kind.

    python examples/frozenlake_mistakes.py runs/frozenlake_read_cpu/sft/model
    python examples/frozenlake_mistakes.py MODEL --config examples/frozenlake_read_cpu.yaml --maps 256

Plays the model folder (``model.init_from``: what ``rockroll sft`` and ``rockroll train`` write)
on the first ``--maps`` of the config's ``eval.task_ids`` with the config's first env, one
greedy move a turn among ``generation.allowed_tokens`` (the trainer's ``eval.temperature: 0``),
and names every move with ``move_kind`` (``rockroll.gem.grid``): ``shortest``, ``hole``,
``dead end`` (nearer the goal but off every shortest path: planning) or ``away``. A move into a
hole where a safe move toward the goal was open is a failure to read the board; a dead end is a
failure to look further ahead. For scale, each turn's row also gives the hole rate of a policy
that reads only the offset line ("The goal is 2 down and 1 left.") and picks uniformly among the
moves toward the goal, blind to the holes, and of one that takes the first of them in the
expert's tie order (its greedy imitation without the board), in the states the model reached.

``--fresh-prompt`` plays each turn as a chat of its own (the intro with the current board and
the turns left), for a model trained on such one-turn chats.

Prints a table per turn and the kind of each lost episode's first mistake; writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from rockroll.gem.grid import DIRECTIONS, MOVE_KINDS, move_kind
from rockroll.trainer.config import load_config
from rockroll.trainer.envs import make_env


def blind_hole_rates(grid: list[str], cell: tuple[int, int], goal: tuple[int, int]) -> tuple[float, float]:
    """Whether policies that read only where the goal lies, blind to the holes, step into one
    here: (a uniform move toward the goal, the first such move in the expert's tie order Up,
    Down, Left, Right, which is what imitating the expert without the board converges to)."""
    toward = [m for m, (dy, dx) in DIRECTIONS.items()
              if abs(goal[0] - cell[0] - dy) + abs(goal[1] - cell[1] - dx) < abs(goal[0] - cell[0]) + abs(goal[1] - cell[1])]
    holes = [move_kind(grid, cell, goal, m) == "hole" for m in toward]
    return sum(holes) / len(holes), float(holes[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a model folder (with its tokenizer), e.g. runs/frozenlake_read_cpu/sft/model")
    ap.add_argument("--config", default="examples/frozenlake_read_cpu.yaml")
    ap.add_argument("--maps", type=int, default=256, help="the first N of the config's eval.task_ids")
    ap.add_argument("--fresh-prompt", action="store_true",
                    help="each turn a new one-turn chat (the intro with the current board and the turns left), "
                         "for a model trained on such chats, instead of the whole conversation")
    ap.add_argument("--out", default="runs/frozenlake_mistakes.json")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(args.config)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    words = list(cfg.generation.allowed_tokens or DIRECTIONS)
    ids = [tok.convert_tokens_to_ids(w) for w in words]
    env = make_env(cfg.envs[0])
    per_turn: dict[int, Counter] = {}
    blind: dict[int, list[float]] = {}
    first_mistakes: Counter = Counter()
    wins = 0
    for task in (cfg.eval.task_ids or [])[:args.maps]:
        obs, _ = env.reset(options={"task_id": task})
        lake, messages, first, turn = env.unwrapped, [{"role": "user", "content": obs}], None, 0
        budget = lake.max_turns
        while True:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                move = words[int(model(x).logits[0, -1, ids].argmax())]
            cell = tuple(lake.player)
            kind = move_kind(lake.grid, cell, lake.goal, move)
            per_turn.setdefault(turn, Counter())[kind] += 1
            rates = blind_hole_rates(lake.grid, cell, lake.goal)
            blind[turn] = [a + b for a, b in zip(blind.get(turn, [0.0, 0.0]), rates)]
            first = first or (kind if kind != "shortest" else None)
            obs, reward, terminated, truncated, _ = env.step(move)
            turn += 1
            if args.fresh_prompt:
                messages = [{"role": "user", "content": f"{lake._intro()}\nYou have {budget - turn} turns."}]
            else:
                messages += [{"role": "assistant", "content": move}, {"role": "user", "content": obs}]
            if terminated or truncated:
                break
        wins += reward > 0
        if reward <= 0:
            first_mistakes[first or "none"] += 1
    maps = min(args.maps, len(cfg.eval.task_ids or []))
    rows = [{"turn": t + 1, "moves": sum(c.values()), **{k: c[k] for k in MOVE_KINDS},
             "blind_uniform_hole_rate": blind[t][0] / sum(c.values()),
             "blind_tie_order_hole_rate": blind[t][1] / sum(c.values())} for t, c in sorted(per_turn.items())]
    print(f"{'turn':>4} {'moves':>6} " + " ".join(f"{k:>9}" for k in MOVE_KINDS)
          + f" {'hole rate':>10} {'blind: uniform':>15} {'tie order':>10}")
    for r in rows:
        print(f"{r['turn']:>4} {r['moves']:>6} " + " ".join(f"{r[k]:>9}" for k in MOVE_KINDS)
              + f" {r['hole'] / r['moves']:>10.3f} {r['blind_uniform_hole_rate']:>15.3f} {r['blind_tie_order_hole_rate']:>10.3f}")
    print(f"success {wins}/{maps} = {wins / maps:.3f}; first mistake of each lost episode: "
          + ", ".join(f"{k} {v}" for k, v in first_mistakes.most_common()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": args.model, "config": args.config, "maps": maps,
                                          "fresh_prompt": args.fresh_prompt,
                                          "success": wins / maps, "turns": rows,
                                          "first_mistakes": dict(first_mistakes)}, indent=1))


if __name__ == "__main__":
    main()
