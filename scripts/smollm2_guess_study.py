"""The SmolLM2 GuessTheNumber-hard study's table and plot (docs/results/smollm2-guess.md) from its
run folders: held-out success by SFT step, pooled over the seeds at the steps every seed
evaluated (Wilson 95 %), each seed a thin line.

    python scripts/smollm2_guess_study.py OUT_PREFIX RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is the ``logging.dir`` of one ``rockroll sft examples/smollm2_guess_cpu.yaml
--set seed=S --set logging.dir=RUN_DIR``: its ``sft/eval.jsonl`` is read. Writes
``OUT_PREFIX.json`` (every point, per seed and pooled) and ``OUT_PREFIX.png``, and prints the
table in Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_rl_compare import band, finish  # noqa: E402  (the curve, its Wilson band, the axes)

from rockroll.trainer.algorithms.stats import wilson_interval  # noqa: E402


def evals(run_dir: Path) -> dict[int, dict]:
    """Step -> the evaluation's row, from an SFT run's ``sft/eval.jsonl`` or else an RL run's
    ``eval.jsonl``; a step evaluated twice (a resumed run re-evaluates its start) keeps its first
    row, which greedy decoding of the same weights repeats anyway."""
    out: dict[int, dict] = {}
    path = run_dir / "sft" / "eval.jsonl"
    for line in (path if path.exists() else run_dir / "eval.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row["step"]), row)
    return out


def pool(runs: dict[str, dict[int, dict]]) -> list[dict]:
    """The steps every run evaluated, each with the successes of all their episodes pooled."""
    steps = sorted(set.intersection(*(set(r) for r in runs.values())))
    out = []
    for step in steps:
        rows = [r[step] for r in runs.values()]
        n = sum(int(x["eval/episodes"]) for x in rows)
        k = round(sum(x["eval/success"] * x["eval/episodes"] for x in rows))
        out.append({"step": step, "success": k / n, "wilson95": list(wilson_interval(k, n)), "episodes": n,
                    "success_per_seed": [x["eval/success"] for x in rows],
                    "format_errors": sum(x.get("eval/format_errors", 0.0) * x["eval/episodes"] for x in rows) / n})
    return out


def study(out: Path, dirs: list[Path], *, label: str, title: str, xlabel: str, step_name: str, unit: str = "",
          extra=None, legend: str = "lower right", format_column: bool = False) -> None:
    """Pool the runs in ``dirs``, write ``out``.json and ``out``.png (the pooled curve ``label``
    with its band, each seed a thin line, and what ``extra(ax, pooled)`` draws), print the table;
    ``format_column``: with the pooled format errors. Shared with ``smollm2_math_rl_study.py``."""
    runs = {d.name: evals(d) for d in dirs}
    pooled = pool(runs)
    per_seed = {name: [{"step": s, "success": r[s]["eval/success"], "episodes": int(r[s]["eval/episodes"]),
                        "format_errors": r[s].get("eval/format_errors")} for s in sorted(r)]
                for name, r in runs.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"pooled": pooled, "per_seed": per_seed}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    color = band(ax, [p["step"] for p in pooled], pooled, f"{label}, pooled over {len(runs)} seeds")
    for pts in per_seed.values():
        ax.plot([p["step"] for p in pts], [p["success"] for p in pts], lw=0.8, alpha=0.4, color=color)
    if extra is not None:
        extra(ax, pooled)
    finish(fig, ax, title, xlabel, out, legend=legend)
    fmt = " format errors, pooled |" if format_column else ""
    print(f"| {step_name} | held-out success, pooled [Wilson 95 %] | per seed |{fmt}\n|---:|---|---|"
          + ("---|" if format_column else ""))
    for p in pooled:
        lo, hi = p["wilson95"]
        print(f"| {p['step']} | {p['success']:.3f} [{lo:.2f}, {hi:.2f}] ({p['episodes']}{unit}) | "
              f"{', '.join(f'{s:.3f}' for s in p['success_per_seed'])} |"
              + (f" {p['format_errors']:.2f} |" if format_column else ""))


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)

    def blind(ax, pooled: list[dict]) -> None:
        ax.axhline(7 / 50, ls=":", color="grey", lw=0.8, label="best policy blind to the hints (7/50)")

    study(Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]], label="SFT", extra=blind, step_name="SFT step",
          unit=" games", title="SmolLM2-135M-Instruct (LoRA) on gem-llm's GuessTheNumber-v0-hard: 64 held-out games, "
          "greedy", xlabel="SFT step (8 bisection games a step)")


if __name__ == "__main__":
    main()
