"""What a run leaves behind: metrics JSONL, TensorBoard events, a curve PNG, transcripts.

``<logging.dir>/metrics.jsonl`` (one line per step), ``eval.jsonl`` (one line per evaluation,
``step`` = the policy version evaluated), ``tb/`` (TensorBoard), ``curve.png`` (reward and
success per step, evaluations as points), ``transcripts/step_000042.jsonl`` (a few decoded
episodes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def eval_line(version: int, metrics: dict[str, float]) -> str:
    """The console line of one evaluation: success with its 95 % interval, over how many
    episodes, on which seed, and the episodes left out for infrastructure errors (a success
    over none is no number)."""
    m = metrics.get
    played, left_out = int(m("eval/episodes", 0)), int(m("eval/infra_errors", 0))
    errors = f", {left_out} left out for infrastructure errors" if left_out else ""
    if not played:
        return f"eval at version {version}: no episode played{errors}"
    interval = f" [{m('eval/success_lo'):.2f}, {m('eval/success_hi'):.2f}]" if "eval/success_lo" in metrics else ""
    seed = f", seed {int(m('eval/seed'))}" if "eval/seed" in metrics else ""
    return (f"eval at version {version}: success {m('eval/success'):.3f}{interval} ({played} episodes{seed}{errors}), "
            f"reward {m('eval/reward'):.3f}")


class RunLogger:
    def __init__(self, folder: str | Path, *, tensorboard: bool, plot: bool, transcripts: int,
                 progress: bool, total_steps: int, start_step: int, plot_every: int = 10,
                 reevaluate_start: bool = True, curve_keys: tuple[str, str] = ("rollout/reward", "rollout/success"),
                 desc: str = "train"):
        """``start_step``: the step a resumed run starts at (0: a fresh run, whose old logs are
        removed). ``reevaluate_start``: whether this run evaluates version ``start_step`` again
        (then an earlier row of that version is replaced; otherwise it is the checkpoint's own
        evaluation and stays, as when a finished run is started again). ``curve_keys``: the two
        metrics ``curve.png`` draws (their ``eval/`` namesakes as points) and the progress bar
        shows (``desc``: its label)."""
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.eval_path = self.dir / "eval.jsonl"
        self.n_transcripts, self.plot, self.plot_every, self.curve_keys = transcripts, plot, plot_every, curve_keys
        # A metrics row of step s is the update from version s to s + 1, redone from s =
        # start_step on; an eval row's step is the version evaluated, whose weights the
        # checkpoint of start_step holds up to and including start_step.
        last_kept = {self.metrics_path: start_step - 1, self.eval_path: start_step - reevaluate_start}
        for path, last in last_kept.items():
            if start_step == 0 and path.exists():
                path.unlink()  # a fresh run; a resumed one appends
            elif path.exists():  # drop lines of steps after the checkpoint we resumed from
                keep = [line for line in path.read_text().splitlines()
                        if line.strip() and json.loads(line).get("step", 0) <= last]
                path.write_text("".join(k + "\n" for k in keep))
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tb"), purge_step=start_step or None)
            except ImportError:
                print("rockroll: tensorboard not installed; skipping TensorBoard logs", file=sys.stderr)
        self.bar = None
        self.infra_total = self.crash_total = 0  # this run's, on the progress bar
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=max(total_steps, start_step), initial=start_step, desc=desc, file=sys.stderr,
                            dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **metrics}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.bar is not None:
            self.bar.update(1)
            self.infra_total += int(metrics.get("rollout/infra_samples_dropped", 0))
            self.crash_total += int(metrics.get("rollout/agent_crashes", 0))
            self.bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.2f}" for k in self.curve_keys if k in metrics},
                                 **({"infra_errors": self.infra_total} if self.infra_total else {}),
                                 **({"agent_crashes": self.crash_total} if self.crash_total else {}))
        if self.plot and (step + 1) % self.plot_every == 0:
            self.plot_curve()

    def log_eval(self, version: int, metrics: dict[str, float]) -> None:
        with self.eval_path.open("a") as f:
            f.write(json.dumps({"step": version, **metrics}) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, version)
        if self.bar is not None:
            self.bar.write(eval_line(version, metrics))

    def transcripts(self, step: int, groups: list, tokenizer: Any) -> None:
        if not self.n_transcripts:
            return
        folder = self.dir / "transcripts"
        folder.mkdir(exist_ok=True)
        samples = [s for g in groups for s in g.samples][: self.n_transcripts]
        with (folder / f"step_{step:06d}.jsonl").open("w") as f:
            for s in samples:
                f.write(json.dumps({
                    "env_id": s.env_id, "task_id": s.task_id, "group_id": s.group_id, "version": s.version,
                    "reward": s.reward, "success": s.success, "turns": s.num_turns, "transcript": s.transcript,
                    "text": tokenizer.decode(s.token_ids),
                }) + "\n")

    def rows(self, path: Path | None = None) -> list[dict]:
        path = path or self.metrics_path
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def plot_curve(self) -> Path | None:
        rows = self.rows()
        if not rows:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r["step"] for r in rows]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
        for i, key in enumerate(self.curve_keys):
            ys = [r.get(key, float("nan")) for r in rows]
            ax[i].plot(steps, ys, alpha=0.35, label="per step")
            k = max(1, len(ys) // 10)
            smooth = [sum(ys[max(0, j - k + 1): j + 1]) / len(ys[max(0, j - k + 1): j + 1]) for j in range(len(ys))]
            ax[i].plot(steps, smooth, label=f"mean of {k}")
            evals = [r for r in self.rows(self.eval_path) if key.replace("rollout/", "eval/") in r]
            if evals:  # fresh episodes from the start, fixed seeds: the number to compare runs by
                ax[i].plot([r["step"] for r in evals], [r[key.replace("rollout/", "eval/")] for r in evals],
                           "o-", color="black", label="eval")
            ax[i].set_xlabel("step")
            ax[i].set_title(key)
            ax[i].legend()
        fig.tight_layout()
        path = self.dir / "curve.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self.plot:
            self.plot_curve()
        if self.tb is not None:
            self.tb.close()
        if self.bar is not None:
            self.bar.close()
