"""Rollout throughput: synchronous vs asynchronous (alpha = 1, 2) and redundant envs.

The env (``LatencyEnv`` of ``tests/trainer/_synthetic.py``) has long-tailed step latency: each step
sleeps a lognormal time (median 50 ms, sigma 1.5, so a few steps take seconds), like tool
calls and sandboxes do. Generation is a scripted engine that costs a fixed time per batched
call plus a little per prompt (an accelerator's profile), and a training step costs a fixed
time, so every configuration gets the same compute; only the scheduling differs. All
configurations run in this one process run, so compare the ratios.

Then the cost of rhythm credit's extra attention pass (:func:`attention_cost`): a training
step on one multi-turn batch with and without the attention role, alternated in this process.

Queue scheduling (continuous batching) on/off: the same engine (the continuous-batching loop
over ``SimStepper`` of ``tests/trainer/_scripted.py``, heavy-tailed reply lengths and a fixed cost per
decode step) asked through one blocking batch call at a time (off: a batch answers when its
longest reply is done) or request by request, each joining the running batch (on).

    python bench/rollout.py [--quick] [--steps N] [--groups N] [--only queue|attention]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the scripted engine and the synthetic envs are test helpers, not part of the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))
from _common import print_table, progress, write_json  # noqa: E402
from _scripted import CharTok, ScriptEngine  # noqa: E402

from rockroll.trainer.config import load_config  # noqa: E402
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager  # noqa: E402

LAT = "_synthetic:LatencyEnv"
# What bench/results/rollout.json holds (tests/test_bench_smoke.py checks every run against it):
# a list's rows by their first column, in order (a row's label starts with its name); a
# dict's keys, each measured (not None); "" is the top level.
PROMISED = {
    "rows": ("sync", "async a=1", "async a=2", "sync", "async a=2"),  # redundant 0, 0, 0, 2, 2
    "speedup": ("alpha=0,r=0", "alpha=1,r=0", "alpha=2,r=0", "alpha=0,r=2", "alpha=2,r=2"),
    "attention_pass": ("update_s", "attention_pass_s", "update_with_rhythm_s", "ratio"),
    "queue_scheduling.rows": ("blocking batch", "continuous"),
    "queue_scheduling": ("speedup",),
}


def drive(mgr, steps: int, desc: str, train_s: float, advance) -> dict:
    """Start ``mgr`` and take ``steps`` batches from it, each followed by ``train_s`` of
    "training" and ``advance(step + 1)`` (the weight sync; the rollout keeps going meanwhile
    when alpha > 0); close it. Samples, response tokens, each batch's wait, the drop and cancel
    counts summed, the wall time."""
    mgr.start()
    out = {"samples": 0, "tokens": 0, "waits": [], "dropped": {}}
    try:
        t0 = time.perf_counter()
        for step in progress(range(steps), desc=desc):
            w0 = time.perf_counter()
            groups, m = mgr.get_batch(step, timeout=600)
            out["waits"].append(time.perf_counter() - w0)
            out["samples"] += sum(len(g.samples) for g in groups)
            out["tokens"] += sum(sum(s.mask) for g in groups for s in g.samples)
            for k, v in m.items():
                if k.endswith("dropped") or k.endswith("cancelled"):
                    out["dropped"][k] = out["dropped"].get(k, 0) + v
            time.sleep(train_s)
            advance(step + 1)
        out["wall_s"] = time.perf_counter() - t0
    finally:
        mgr.close()
    return out


def run(alpha: int, redundant: int, steps: int, *, group: int, batch_groups: int, train_s: float,
        call_s: float, per_prompt_s: float, median_s: float, sigma: float) -> dict:
    cfg = load_config({
        "seed": 0,
        "envs": [{"id": LAT, "kwargs": {"latency_median_s": median_s, "latency_sigma": sigma, "max_turns": 4}}],
        "rollout": {"group_size": group, "redundant": redundant, "async_ratio": alpha,
                    "batch_groups": batch_groups, "max_turns": 4, "max_batch_size": 256, "batch_wait_ms": 5},
        "generation": {"max_new_tokens": 8},
        "tokenizer": {"template": "prefixes"},  # the stand-in tokenizer has no chat template
    })
    tok = CharTok()
    template = PromptTemplate(tok, cfg.tokenizer)
    engine = ScriptEngine(None, ["Right", "Left"], stop_id=0, call_s=call_s, per_prompt_s=per_prompt_s)
    mgr = RolloutManager(cfg, engine, template)

    def advance(version: int) -> None:  # the weight sync
        engine.load_weights({}, version)
        mgr.set_version(version)

    d = drive(mgr, steps, f"alpha={alpha} r={redundant}", train_s, advance)
    samples, wall, waits, dropped = d["samples"], d["wall_s"], d["waits"], d["dropped"]
    return {"mode": "sync" if alpha == 0 else f"async a={alpha}", "alpha": alpha, "redundant": redundant,
            "steps": steps, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
            "mean_wait_s": sum(waits) / len(waits), "gen_calls": engine_calls(engine),
            "stale_dropped": dropped.get("rollout/stale_samples_dropped", 0),
            "redundant_cancelled": dropped.get("rollout/redundant_cancelled", 0)}


def run_queue(continuous: bool, steps: int, *, group: int, batch_groups: int, alpha: int, max_new_tokens: int,
              train_s: float, env_s: float, step_s: float) -> dict:
    """One configuration of the queue-scheduling comparison (see the module docstring)."""
    from rockroll.trainer.engines.generation import ContinuousEngine
    from _scripted import SimStepper

    cfg = load_config({
        "seed": 0,
        "envs": [{"id": LAT, "kwargs": {"fixed_latency_s": env_s, "max_turns": 4}}],
        "rollout": {"group_size": group, "async_ratio": alpha, "batch_groups": batch_groups, "max_turns": 4,
                    "max_batch_size": 256, "batch_wait_ms": 5},
        "generation": {"max_new_tokens": max_new_tokens, "continuous": continuous},
        "tokenizer": {"template": "prefixes"},  # the stand-in tokenizer has no chat template
    })
    template = PromptTemplate(CharTok(), cfg.tokenizer)
    engine = ContinuousEngine(SimStepper(stop_id=0, word_id=ord("R"), step_s=step_s))
    mgr = RolloutManager(cfg, engine, template)
    try:
        d = drive(mgr, steps, f"continuous={continuous}", train_s, lambda version: mgr.load_weights({}, version))
    finally:
        engine.close()
    samples, tokens, wall, waits = d["samples"], d["tokens"], d["wall_s"], d["waits"]
    b = engine.batcher
    return {"mode": "continuous" if continuous else "blocking batch", "samples": samples, "wall_s": wall,
            "samples_per_s": samples / wall, "tokens_per_sample": tokens / max(samples, 1),
            "mean_wait_s": sum(waits) / len(waits), "decode_steps": b.steps, "joins": b.joins,
            "gen_calls": mgr.gen.calls}


def queue_scheduling(steps: int, groups: int = 4) -> dict:
    """Queue scheduling on/off in one process run: the samples/s ratio, table and JSON rows."""
    params = dict(group=8, batch_groups=groups, alpha=1, max_new_tokens=128, train_s=0.3, env_s=0.02, step_s=0.005)
    rows = [run_queue(c, steps, **params) for c in (False, True)]
    ratio = rows[1]["samples_per_s"] / rows[0]["samples_per_s"]
    for row in rows:
        row["speedup"] = row["samples_per_s"] / rows[0]["samples_per_s"]
    print_table("Queue scheduling: continuous batching vs one blocking batch call (heavy-tailed reply lengths)",
                rows, ["mode", "samples", "wall_s", "samples_per_s", "speedup", "tokens_per_sample", "mean_wait_s",
                       "decode_steps", "joins", "gen_calls"])
    print(f"\ncontinuous vs blocking batch: {ratio:.2f}x samples/s")
    return {"params": {**params, "steps": steps}, "rows": rows, "speedup": ratio}


def engine_calls(engine) -> int:
    return len(engine.calls)


class _VocabTok:
    """What the trainer's model and roles need of a tokenizer: a vocabulary size and special ids."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __len__(self):
        return 256


def attention_cost(steps: int, *, groups: int = 4, group: int = 8, turns: int = 4, obs_len: int = 48,
                   reply_len: int = 16) -> dict:
    """The extra attention pass of rhythm credit (``algorithm.rhythm``): one training step on the
    same multi-turn batch (``turns`` x (observation + reply) tokens per episode), the policy's
    update alone vs the attention role's annotate + the update with its credit, alternated."""
    import random

    import torch

    from rockroll.trainer.models import build_model
    from rockroll.trainer.roles.local import AttentionRole, PolicyTrainer
    from rockroll.trainer.rollout.types import Group, Sample

    cfg = load_config({"model": {"hidden_size": 128, "num_layers": 4, "num_heads": 2, "intermediate_size": 256},
                       "rollout": {"group_size": group, "batch_groups": groups},
                       "algorithm": {"rhythm": {"enabled": True}}})
    tok, rng = _VocabTok(), random.Random(0)
    batch = []
    for g in range(groups):
        samples = []
        for i in range(group):
            mask = ([0] * obs_len + [1] * reply_len) * turns
            samples.append(Sample(token_ids=[rng.randrange(3, len(tok)) for _ in mask], mask=mask,
                                  behav_logp=[-5.0 * m for m in mask], reward=float(i % 2), group_id=g, version=0))
        batch.append(Group(g, "e", None, 0, samples))
    lm = build_model(cfg.model, tok, 0)
    role = AttentionRole(cfg, build_model(cfg.model, tok, 0), tok)
    trainer = PolicyTrainer(cfg, lm, tok)
    plain, rhythm, attn = [], [], []
    for _ in progress(range(steps + 1), desc="attention pass"):  # the first of each: warm-up
        t0 = time.perf_counter()
        trainer.update(batch)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        aux = role.annotate(batch)
        attn.append(time.perf_counter() - t0)
        trainer.update(batch, aux)
        rhythm.append(time.perf_counter() - t0)
        role.load_weights(trainer.weights(), 0)  # the sync the loop does after each step
    def mean(xs):  # the warm-up step left out
        return sum(xs[1:]) / steps

    return {"sequences": groups * group, "tokens_per_sequence": turns * (obs_len + reply_len),
            "layers": cfg.model.num_layers, "threads": torch.get_num_threads(), "steps": steps,
            "update_s": mean(plain), "attention_pass_s": mean(attn), "update_with_rhythm_s": mean(rhythm),
            "ratio": mean(rhythm) / mean(plain)}


def attention_table(steps: int, groups: int = 4) -> dict:
    attn = attention_cost(steps, groups=groups)
    print_table("Rhythm credit: a training step without / with the attention pass (same batch, alternated)",
                [attn], ["sequences", "tokens_per_sequence", "layers", "update_s", "attention_pass_s",
                         "update_with_rhythm_s", "ratio"])
    print(f"\nwrote {write_json('rollout_attention', attn)}")
    return attn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (CI smoke run)")
    ap.add_argument("--steps", type=int,
                    help="steps of every comparison (default 24 a rollout mode, 8 attention, 12 a queue mode; "
                         "--quick 4, 2, 3)")
    ap.add_argument("--groups", type=int, default=4,
                    help="groups (of 8 samples) in a batch, in every comparison (default 4; 1: a CI smoke run)")
    ap.add_argument("--only", choices=["queue", "attention"],
                    help="run only this comparison (queue scheduling, or rhythm credit's attention-pass cost)")
    args = ap.parse_args()
    # long-tailed latencies: enough steps for stable ratios
    steps, attn_steps, queue_steps = (args.steps,) * 3 if args.steps else (4, 2, 3) if args.quick else (24, 8, 12)
    if args.only == "attention":
        attention_table(attn_steps, args.groups)
        return
    if args.only == "queue":
        print(f"\nwrote {write_json('rollout_queue', queue_scheduling(queue_steps, args.groups))}")
        return
    params = dict(group=8, batch_groups=args.groups, train_s=0.3, call_s=0.02, per_prompt_s=0.0002, median_s=0.05, sigma=1.5)
    configs = [(0, 0), (1, 0), (2, 0), (0, 2), (2, 2)]
    rows = [run(a, r, steps, **params) for a, r in configs]
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["speedup"] = row["samples_per_s"] / base
    print_table("Rollout throughput (same env, engine and train cost; lognormal env latency)", rows,
                ["mode", "redundant", "samples", "wall_s", "samples_per_s", "speedup", "mean_wait_s",
                 "gen_calls", "stale_dropped", "redundant_cancelled"])
    speedup = {f"alpha={r['alpha']},r={r['redundant']}": r["speedup"] for r in rows}
    # the target is asynchrony alone: alpha = 2 without redundant envs, against sync
    met = speedup["alpha=2,r=0"] >= 2.5
    print(f"\nasync (alpha=2, no redundant envs) vs sync: {speedup['alpha=2,r=0']:.2f}x, target >= 2.5x: "
          f"{'met' if met else 'NOT met'}")
    attn = attention_table(attn_steps, args.groups)
    queue = queue_scheduling(queue_steps, args.groups)
    path = write_json("rollout", {"params": {**params, "steps": steps}, "rows": rows, "speedup": speedup,
                                  "target_async_speedup": 2.5, "met": met, "attention_pass": attn,
                                  "queue_scheduling": queue})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
