"""SFT-only, RL from scratch, and SFT then RL on one task over seeds (0, 1, 2 by default), held-out evaluation
(issue #33, part 5): one PNG and one JSON per task, and a table on stdout.

    nice -n 10 .venv/bin/python scripts/sft_rl_compare.py examples/corridor_sft_rl_cpu.yaml \\
        --set eval.every=4 --name "two-goal corridor (rock/Agent-v0)" --seeds 0 1 \\
        --sft-only-steps 1000 --sft-eval-every 250 --rl-steps 8 --warm-steps 100 --rl-after-steps 4 \\
        --out docs/img/corridor_sft_rl

The task is a training config (``CONFIG`` with ``--set KEY=VALUE`` overrides, as ``rockroll
train`` takes them) that has an ``sft`` section (the imperfect expert data: ``epsilon``) and
held-out ``eval.task_ids`` (disjoint from ``envs[].task_ids``: the config refuses an overlap).
For each seed (``seed`` set to it), three arms:

- **sft-only**: ``rockroll sft`` for ``--sft-only-steps`` steps, evaluated every
  ``--sft-eval-every``;
- **rl-scratch**: ``rockroll train`` from random weights for ``--rl-steps`` steps;
- **sft-rl**: ``rockroll sft`` for ``--warm-steps``, then ``rockroll train`` from its model
  (``model.init_from``) for ``--rl-after-steps`` steps.

The budget is wall-clock time, matched by the step counts: an SFT step and an RL step cost
very different times (an RL step plays ``rollout.group_size`` x ``rollout.batch_groups``
episodes), so the counts are chosen, per task, for the arms to take about the same seconds,
and the x axis is the measured seconds since the arm started (each evaluation's point when
its line was written, evaluations included: every arm pays for its own). Each arm's seconds
per seed are in the JSON. Each point is the held-out success pooled over the seeds' episodes
with its 95 % Wilson interval (``trainer/algorithms/stats.py``); per-seed rates and seconds are
in the JSON; thin lines in the PNG are the seeds. Results are saved after each seed; a rerun
keeps the seeds of every arm whose step counts are unchanged (``--seeds`` adds seeds,
``--fresh`` reruns all).

One process runs its arms and seeds one after another. To use more cores, run one process per
arm or seed, each with its own ``--out``, then join them (same config, overrides and step
counts; ``--merge`` runs nothing, unless ``--only ARM...`` names arms whose missing seeds to run):

    scripts/sft_rl_compare.py CONFIG ... --only sft-rl --seeds 0 --out /tmp/a      # and so on, at once
    scripts/sft_rl_compare.py CONFIG ... --merge /tmp/a.json /tmp/b.json --out docs/img/task
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import yaml

from rockroll.trainer.algorithms.stats import wilson_interval
from rockroll.trainer.config import load_config
from rockroll.trainer.controller import train
from rockroll.trainer.envs import resolve_envs
from rockroll.trainer.sft import sft

ARMS = ("sft-rl", "rl-scratch", "sft-only")  # run in this order: the one the issue asks about first
LABELS = {"sft-rl": "SFT then RL", "rl-scratch": "RL from scratch", "sft-only": "SFT-only"}


class EvalWatch:
    """The rows of an ``eval.jsonl`` as they are written, each with the seconds since ``t0``
    at which it appeared (polled every 0.2 s)."""

    def __init__(self, path: Path, t0: float):
        self.path, self.t0, self.rows = path, t0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        if not self.path.exists():
            return
        lines = [x for x in self.path.read_text().splitlines() if x.strip()]
        now = time.monotonic() - self.t0
        for line in lines[len(self.rows):]:
            try:
                self.rows.append({**json.loads(line), "seconds": now})
            except json.JSONDecodeError:
                return  # a line being written: read it next time

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            self._read()

    def close(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        self._read()
        return self.rows


def config(path: str, overrides: dict, seed: int, run_dir: Path, extra: dict):
    cfg = load_config(path, {**overrides, "seed": seed, "logging.dir": str(run_dir),
                             "checkpoint.dir": str(run_dir / "ckpt"), "logging.progress": False, **extra})
    resolve_envs(cfg)
    return cfg


def stage(fn, cfg, eval_path: Path, t0: float) -> tuple[list[dict], dict]:
    watch = EvalWatch(eval_path, t0)
    try:
        out = fn(cfg)
    finally:
        rows = watch.close()
    return rows, out


def point(row: dict, seconds_offset: float = 0.0, phase: str = "") -> dict:
    return {"step": row["step"], "phase": phase, "seconds": round(row["seconds"] + seconds_offset, 2),
            "success": row["eval/success"], "episodes": int(row.get("eval/episodes", 0))}


def run_arm(arm: str, args, overrides: dict, seed: int, work: Path) -> dict:
    # the runs' folders are in ``work``, a temporary folder removed when the script ends
    root = work / f"{arm}-{seed}"
    t0 = time.monotonic()
    if arm == "rl-scratch":
        cfg = config(args.config, overrides, seed, root / "rl", {"steps": args.rl_steps})
        rows, _ = stage(train, cfg, root / "rl" / "eval.jsonl", t0)
        points = [point(r, phase="rl") for r in rows]
    else:
        steps = args.sft_only_steps if arm == "sft-only" else args.warm_steps
        every = args.sft_eval_every if arm == "sft-only" else steps
        cfg = config(args.config, overrides, seed, root / "sft",
                     {"sft.steps": steps, "eval.every": every, "sft.output_dir": str(root / "model")})
        rows, _ = stage(sft, cfg, root / "sft" / "sft" / "eval.jsonl", t0)
        points = [point(r, phase="sft") for r in rows]
        if arm == "sft-rl":
            t1 = time.monotonic()
            cfg = config(args.config, overrides, seed, root / "rl",
                         {"steps": args.rl_after_steps, "model.init_from": str(root / "model")})
            rows, _ = stage(train, cfg, root / "rl" / "eval.jsonl", t1)
            offset = t1 - t0
            points += [{**point(r, offset, "rl"), "step": steps + r["step"]} for r in rows[1:]]  # rows[0]: the warm start again
    return {"seconds": round(time.monotonic() - t0, 1), "points": points}


def pooled(per_seed: list[dict]) -> list[dict]:
    out = []
    for i in range(min(len(r["points"]) for r in per_seed)):
        ps = [r["points"][i] for r in per_seed]
        n = sum(p["episodes"] for p in ps)
        k = round(sum(p["success"] * p["episodes"] for p in ps))
        lo, hi = wilson_interval(k, n)
        out.append({"step": ps[0]["step"], "phase": ps[0]["phase"],
                    "seconds": round(sum(p["seconds"] for p in ps) / len(ps), 1), "success": k / n,
                    "wilson95": [lo, hi], "episodes": n, "success_per_seed": [p["success"] for p in ps],
                    "seconds_per_seed": [p["seconds"] for p in ps]})
    return out


def band(ax, x: list, points: list[dict], label: str) -> str:
    """A curve of pooled ``success`` with its ``wilson95`` band; returns its colour (for the
    per-seed lines). Shared with ``scripts/compare_credit.py``."""
    line, = ax.plot(x, [p["success"] for p in points], marker="o", label=label)
    ax.fill_between(x, [p["wilson95"][0] for p in points], [p["wilson95"][1] for p in points], alpha=0.2,
                    color=line.get_color())
    return line.get_color()


def plot(results: dict, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm in (a for a in ARMS if a in results):
        pts = results[arm]["pooled"]
        x = [p["seconds"] for p in pts]
        color = band(ax, x, pts, arm)
        for seed_run in results[arm]["per_seed"].values():
            ax.plot([p["seconds"] for p in seed_run["points"]], [p["success"] for p in seed_run["points"]],
                    lw=0.8, alpha=0.35, color=color)
        if arm == "sft-rl" and any(p["phase"] == "rl" for p in pts):  # where RL took over: SFT's last point
            ax.axvline([p["seconds"] for p in pts if p["phase"] == "sft"][-1], ls=":", color=color, lw=0.8)
    finish(fig, ax, title, "wall seconds since the arm started (mean over seeds; evaluations included)", out)


def finish(fig, ax, title: str, xlabel: str, out: Path, legend: str = "lower right") -> None:
    """Title, axes and legend (at ``legend``) of a held-out success plot, saved as ``out``.png.
    Shared with ``scripts/smollm2_guess_study.py`` and ``scripts/smollm2_math_rl_study.py``."""
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out success: pooled, Wilson 95 %; thin: per seed", fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc=legend)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def table(results: dict) -> str:
    lines = ["| arm | start | end [95 %] | per seed (end) | seconds per seed |", "|---|---:|---|---|---|"]
    for arm in (a for a in ARMS if a in results):
        pts = results[arm]["pooled"]
        a, b = pts[0], pts[-1]
        secs = ", ".join(f"{r['seconds']:.0f}" for r in results[arm]["per_seed"].values())
        lines.append(f"| {arm} | {a['success']:.2f} | {b['success']:.2f} [{b['wilson95'][0]:.2f}, "
                     f"{b['wilson95'][1]:.2f}] | {', '.join(f'{s:.2f}' for s in b['success_per_seed'])} | {secs} |")
    return "\n".join(lines)


def merge(docs: list[dict], meta: dict, knobs: dict) -> dict:
    """The arms of several runs' JSONs as one ``arms`` mapping: each arm's seeds joined and its
    pooled points recomputed. A run made with another config, overrides or step counts cannot be
    pooled with this one: ``ValueError`` names what differs, and nothing is written."""
    arms: dict = {}
    for doc in docs:
        if doc.get("meta") != meta:
            diff = sorted(k for k in {*meta, *doc.get("meta", {})} if meta.get(k) != doc.get("meta", {}).get(k))
            raise ValueError(f"--merge: a run with other settings ({', '.join(diff)}) cannot be pooled with this one")
        for arm, r in doc["arms"].items():
            if r["knobs"] != knobs[arm]:
                raise ValueError(f"--merge: {arm} ran with {r['knobs']}, this run's step counts are {knobs[arm]}")
            seeds = arms.setdefault(arm, {"knobs": r["knobs"], "per_seed": {}})["per_seed"]
            if twice := set(seeds) & set(r["per_seed"]):
                raise ValueError(f"--merge: {arm} seed {', '.join(sorted(twice))} is in two of the files")
            seeds.update(r["per_seed"])
    for r in arms.values():
        r["per_seed"] = dict(sorted(r["per_seed"].items(), key=lambda kv: int(kv[0])))
        r["pooled"] = pooled(list(r["per_seed"].values()))
    return arms


def compact_ids(ids: list) -> list | dict:
    """Task ids as the config writes them: ``{range: [start, stop]}`` for consecutive integers
    (20 000 training maps are one line of the JSON, not 20 000), else the list."""
    ids = list(ids)
    if len(ids) > 2 and all(isinstance(i, int) for i in ids) and ids == list(range(ids[0], ids[0] + len(ids))):
        return {"range": [ids[0], ids[0] + len(ids)]}
    return ids


def describe(name: str, config_path: str, overrides: dict, cfg) -> dict:
    """What makes two runs the same comparison: the task, its config and overrides, the task
    sets and the SFT data (``merge`` and a rerun compare it)."""
    return {"task": name, "config": config_path, "overrides": overrides,
            "train_task_ids": [compact_ids(e.task_ids or []) for e in cfg.envs],
            "eval_task_ids (held out)": compact_ids(cfg.eval.task_ids),
            "eval_episodes_per_seed": cfg.eval.episodes, "rl_eval_every": cfg.eval.every,
            "sft_sources": [{"kind": s.kind, "episodes": s.episodes, "epsilon": s.epsilon,
                             **({"habit": s.habit, "habit_rate": s.habit_rate} if s.habit_rate else {}),
                             **({"habit": s.habit, "habit_episodes": s.habit_episodes} if s.habit_episodes else {})}
                            for s in cfg.sft.sources],
            "budget": "wall clock, matched by the step counts; x = measured seconds"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="the task's training config (YAML), with an sft section and eval.task_ids")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (YAML value; repeatable)")
    ap.add_argument("--name", required=True, help="the task's name, for the plot's title and the JSON")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sft-only-steps", type=int, required=True)
    ap.add_argument("--sft-eval-every", type=int, default=10)
    ap.add_argument("--rl-steps", type=int, required=True, help="RL from scratch: steps (eval.every from the config)")
    ap.add_argument("--warm-steps", type=int, required=True, help="sft-rl: SFT steps before RL")
    ap.add_argument("--rl-after-steps", type=int, required=True, help="sft-rl: RL steps after SFT")
    ap.add_argument("--only", nargs="*", default=None, choices=ARMS,
                    help="run only these arms (with --merge: none unless named here)")
    ap.add_argument("--fresh", action="store_true",
                    help="rerun every arm and seed (else those already in OUT.json, with the same meta, are kept)")
    ap.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                    help="join the seeds of these runs' JSONs (same config, overrides and step counts) into OUT")
    ap.add_argument("--out", required=True, help="OUT: writes OUT.json and OUT.png")
    args = ap.parse_args()
    overrides = {}
    for item in args.overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            ap.error(f"--set: expected KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(raw)
    cfg = config(args.config, overrides, args.seeds[0], Path(tempfile.gettempdir()) / "unused", {})
    if not cfg.eval.task_ids:
        ap.error("the config has no eval.task_ids: the comparison is on held-out tasks")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = describe(args.name, args.config, overrides, cfg)
    knobs = {"sft-only": {"sft_steps": args.sft_only_steps, "sft_eval_every": args.sft_eval_every},
             "rl-scratch": {"rl_steps": args.rl_steps},
             "sft-rl": {"sft_steps": args.warm_steps, "rl_steps": args.rl_after_steps}}
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    results = {} if old.get("meta") != meta or args.fresh else {  # an arm's seeds are kept when its knobs are the same
        arm: r for arm, r in old.get("arms", {}).items() if r.get("knobs") == knobs.get(arm)}
    if args.merge:
        try:
            results = merge([json.loads(Path(p).read_text()) for p in args.merge], meta, knobs)
        except (OSError, ValueError) as e:
            ap.error(str(e))
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "arms": results}, indent=1))
    only = [] if args.merge and args.only is None else args.only  # a merge joins; it runs only what is named
    work = Path(tempfile.mkdtemp(prefix="sft_rl_compare-"))
    try:
        for arm in ARMS:
            if only is not None and arm not in only:
                continue
            per_seed = results.get(arm, {}).get("per_seed", {})
            for seed in args.seeds:
                if str(seed) in per_seed:
                    continue
                per_seed[str(seed)] = r = run_arm(arm, args, overrides, seed, work)
                print(f"{arm} seed {seed}: {r['seconds']:.0f} s,",
                      [(p["step"], round(p["success"], 2)) for p in r["points"]], file=sys.stderr, flush=True)
                results[arm] = {"knobs": knobs[arm], "per_seed": per_seed, "pooled": pooled(list(per_seed.values()))}
                out.with_suffix(".json").write_text(json.dumps({"meta": meta, "arms": results}, indent=1))  # each seed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seeds = ", ".join(f"{a}: {len(r['per_seed'])}" for a, r in results.items())
    arms = " / ".join(LABELS[a] for a in ARMS if a in results)
    plot(results, f"{args.name}: held-out eval, {arms} (seeds: {seeds})", out)
    print(table(results))


if __name__ == "__main__":
    main()
