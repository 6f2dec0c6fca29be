"""The study of GRPO straight from SmolLM2-135M-Instruct on Math-v0 (docs/results/smollm2-math-rl-from-instruct.md):
held-out success and format errors by RL step, pooled over the seeds of ``rockroll train``
(Wilson 95 %), each seed a thin line.

    python scripts/smollm2_math_rl_study.py OUT_PREFIX RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is the ``logging.dir`` of one ``rockroll train examples/smollm2_math_rl_cpu.yaml
--set seed=S``: its ``eval.jsonl`` is read. Writes ``OUT_PREFIX.json`` and ``OUT_PREFIX.png``,
and prints the table in Markdown.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2_guess_study import study  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)

    def format_errors(ax, pooled: list[dict]) -> None:
        ax.plot([p["step"] for p in pooled], [p["format_errors"] for p in pooled], ls="--", marker="s",
                color="tab:grey", label="format errors (no answer the env reads), pooled")

    study(Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]], label="success", extra=format_errors,
          step_name="step", legend="upper right", format_column=True,
          title="GRPO straight from SmolLM2-135M-Instruct (LoRA) on Math-v0 arithmetic: 64 held-out problems, greedy",
          xlabel="GRPO step (16 completions a step)")


if __name__ == "__main__":
    main()
