"""The README's picture: a demo run's held-out success, SFT then RL, drawn from its logs.

    python scripts/readme_picture.py runs/demo                 # writes docs/img/demo_heldout.png

Reads what ``make demo`` (``scripts/demo.sh``) logs into its run folder: ``<run>/sft/eval.jsonl``
(the SFT stage's evaluations) and ``<run>/eval.jsonl`` (GRPO's, from the SFT model), each row a
held-out success rate with its 95 % Wilson interval. RL's steps are drawn after SFT's last. With
``--config`` naming a FrozenLake run, the board-blind baselines of its held-out maps are drawn
too, computed exactly (``rockroll.gem.grid.board_blind_baselines``); the demo's Math-v0 config
has none (its base model is the curve's first point). Nothing on the picture is typed in by
hand, so a new demo run makes a new picture with one command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "demo_heldout.png"


def evals(path: Path) -> list[dict]:
    """The evaluation rows of one stage (none when the stage did not run)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def baselines(config: str) -> dict[str, float]:
    """Exact board-blind baselines on the held-out FrozenLake maps of ``config`` (empty for
    another env): the best single fixed route and uniform moves."""
    from rockroll.gem.grid import FrozenLakeEnv, board_blind_baselines
    from rockroll.trainer import load_config

    cfg = load_config(config)
    env = cfg.envs[0]
    if env.id != "rock/FrozenLake-v0" or not cfg.eval.task_ids:
        return {}
    maps = []
    for task in cfg.eval.task_ids:
        m = FrozenLakeEnv(**env.kwargs)
        m.reset(options={"task_id": task})
        maps.append(m)
    b = board_blind_baselines(maps)
    return {"best fixed route (ignores the board)": b["best_fixed_route"], "uniform moves": b["random"]}


def subject(config: str) -> str:
    """ ", MODEL on ENV" for the title, from ``config`` (empty without one)."""
    if not config:
        return ""
    from rockroll.trainer import load_config

    cfg = load_config(config)
    model = cfg.model.name_or_path or "a model from scratch"
    return f", {model} on {cfg.envs[0].id}"


def draw(run: Path, out: Path, lines: dict[str, float], what: str = "") -> Path:
    sft, rl = evals(run / "sft" / "eval.jsonl"), evals(run / "eval.jsonl")
    if not sft and not rl:
        raise SystemExit(f"no evaluations in {run}/sft/eval.jsonl or {run}/eval.jsonl: is it a demo run's folder?")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    offset, episodes = 0, int((sft or rl)[0]["eval/episodes"])
    for name, rows, colour in (("SFT", sft, "tab:blue"), ("then GRPO", rl, "tab:orange")):
        if not rows:
            continue
        x = [offset + r["step"] for r in rows]
        ax.plot(x, [r["eval/success"] for r in rows], "o-", color=colour, label=name)
        ax.fill_between(x, [r["eval/success_lo"] for r in rows], [r["eval/success_hi"] for r in rows],
                        color=colour, alpha=0.2)
        offset = x[-1]
    for (name, value), style in zip(lines.items(), ("--", ":")):
        ax.axhline(value, color="grey", linestyle=style, linewidth=1)
        ax.text(offset, value + 0.015, f"{name}: {value:.2f}", color="grey", fontsize=8, ha="right")
    ax.set_xlabel("step (SFT, then GRPO from the SFT model)")
    ax.set_ylabel("held-out success")
    ax.set_title(f"make demo{what}\nheld-out success on {episodes} tasks never trained on (95 % intervals)", fontsize=9)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path, help="a demo run's folder (make demo: runs/demo)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the picture (default: {OUT.relative_to(ROOT)})")
    ap.add_argument("--config", default=str(ROOT / "examples" / "smollm2_math_cpu.yaml"),
                    help="the run's config, for the baselines of its held-out FrozenLake maps ('' for none)")
    args = ap.parse_args()
    print(draw(args.run_dir, args.out, baselines(args.config) if args.config else {}, subject(args.config)))


if __name__ == "__main__":
    main()
