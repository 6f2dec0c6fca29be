"""The trainer's engines on a GPU: generation, the policy update and the weight sync.

A model with Qwen2.5-0.5B's shapes (24 layers, hidden 896, 14 query and 2 key-value heads,
MLP 4864, vocabulary 151936, tied embeddings), built from its config with random weights in
bf16: nothing is downloaded. Token ids are random, so no tokenizer is needed and every
reply runs its full length (no stop token).

- **generation**: the trainer's :class:`~rockroll.trainer.engines.generation.TransformersEngine`
  (continuous batching over the KV cache, a log-prob for every token) against Hugging Face's
  own ``model.generate`` (sampling, no log-probs), the same batch in this one process:
  ``--batch`` prompts of ``--prompt`` tokens, ``--new`` new tokens each; tokens/s and the ratio.
- **train**: one GRPO update (:func:`~rockroll.trainer.roles.update.update_policy`) on
  ``--train-batch`` sequences of ``--train-len`` tokens, half of them the assistant's, with the
  plain torch engine and DeepSpeed ZeRO-1 and ZeRO-2; tokens/s and peak device memory.
- **weight sync**: the trained weights into the generator on the same device, as the
  trainer's local roles sync them (a copy on the policy's device, then ``load_weights``)
  against a copy through host memory (what crosses to another process); median ms.

``--quick``: a tiny Llama on whatever device there is (CPU here: the smoke test's settings;
the numbers then say nothing about a GPU). The JSON names the device.

    python bench/gpu.py            # on a machine with a CUDA GPU (scripts/gpu_check.sh runs it)
    python bench/gpu.py --quick    # the tiny model, anywhere
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json  # noqa: E402

import torch  # noqa: E402

from rockroll.trainer.config import AlgorithmConfig, EngineConfig  # noqa: E402
from rockroll.trainer.engines.generation import TransformersEngine  # noqa: E402
from rockroll.trainer.engines.policy import ActorModule, make_policy  # noqa: E402
from rockroll.trainer.engines.sampling import SamplingParams  # noqa: E402
from rockroll.trainer.roles.update import collate, update_policy  # noqa: E402
from rockroll.trainer.rollout.types import Group, Sample  # noqa: E402

# What bench/results/gpu.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {
    "generation.rows": ("rockroll TransformersEngine", "transformers generate"),
    "generation": ("ratio",),
    "train.rows": ("torch", "deepspeed ZeRO-1", "deepspeed ZeRO-2"),
    "weight_sync.rows": ("on the device", "through host memory"),
    "weight_sync": ("ratio",),
}

QWEN05 = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
            num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True)


def build(shapes: dict, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**shapes, pad_token_id=0, bos_token_id=1, eos_token_id=2)).to(dtype)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def generation(model, batch: int, prompt: int, new: int) -> dict:
    rng = random.Random(0)
    V = model.config.vocab_size
    prompts = [[rng.randrange(3, V) for _ in range(prompt)] for _ in range(batch)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=new, stop_token_ids=[])
    engine = TransformersEngine(model, pad_token_id=0, max_batch=batch)
    try:
        engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4))  # warm-up
        sync()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sp)
        sync()
        ours = time.perf_counter() - t0
    finally:
        engine.close()
    tokens = sum(len(o.token_ids) for o in outs)
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync()
        t0 = time.perf_counter()
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        sync()
        theirs = time.perf_counter() - t0
    hf_tokens = (hf.shape[1] - prompt) * batch
    rows = [{"engine": "rockroll TransformersEngine", "tokens": tokens, "s": ours, "tokens/s": tokens / ours,
             "log-probs": "yes"},
            {"engine": "transformers generate", "tokens": hf_tokens, "s": theirs, "tokens/s": hf_tokens / theirs,
             "log-probs": "no"}]
    return {"rows": rows, "ratio": rows[0]["tokens/s"] / rows[1]["tokens/s"],
            "settings": {"batch": batch, "prompt_tokens": prompt, "new_tokens": new}}


def groups(batch: int, length: int, vocab: int) -> list[Group]:
    """``batch`` sequences in groups of 8: the first half of each the prompt (mask 0), the rest the
    reply (mask 1); rewards vary inside a group, so every reply has an advantage."""
    rng = random.Random(1)
    out = []
    for g in range(-(-batch // 8)):
        samples = [Sample(token_ids=[rng.randrange(3, vocab) for _ in range(length)],
                          mask=[0] * (length // 2) + [1] * (length - length // 2),
                          behav_logp=[0.0] * (length // 2) + [-5.0] * (length - length // 2),
                          reward=float(i % 2), group_id=g, version=0)
                   for i in range(min(8, batch - 8 * g))]
        out.append(Group(g, "bench", None, 0, samples))
    return out


def train(model, kind: str, stage: int, batch: int, length: int, micro: int, steps: int) -> tuple[dict, object]:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    policy = make_policy(ActorModule(model, with_value=False),
                         EngineConfig(kind=kind, zero_stage=stage, lr=1e-5, micro_batch_size=micro), batch_size=batch)
    data = collate(groups(batch, length, model.config.vocab_size), 0)
    times = []
    for _ in range(steps + 1):  # the first step warms up (allocator, kernels, DeepSpeed's buffers)
        sync()
        t0 = time.perf_counter()
        metrics = update_policy(policy, AlgorithmConfig(), data, 1.0)
        sync()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[1:])
    label = "torch" if kind == "torch" else f"deepspeed ZeRO-{stage}"
    return {"engine": label, "step_s": step_s, "tokens/s": batch * length / step_s, "peak_GiB": peak_gib(),
            "loss": metrics["loss/total"]}, policy


def weight_sync(policy, generator_model, times: int) -> dict:
    engine = TransformersEngine(generator_model, pad_token_id=0)
    rows = []
    try:
        for label, device in (("on the device", policy.device), ("through host memory", None)):
            samples = []
            for v in range(times):
                sync()
                t0 = time.perf_counter()
                engine.load_weights(policy.sync_state_dict(device), v + 1)
                sync()
                samples.append(time.perf_counter() - t0)
            rows.append({"path": label, "median_ms": statistics.median(samples) * 1e3, "n": times})
        live = policy.sync_state_dict(policy.device)
        same = all(torch.equal(v, engine.model.state_dict()[k]) for k, v in live.items())
    finally:
        engine.close()
    return {"rows": rows, "ratio": rows[1]["median_ms"] / rows[0]["median_ms"], "weights_equal": same,
            "generator_device": str(next(engine.model.parameters()).device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model on any device (the smoke test)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--train-len", type=int, default=512)
    ap.add_argument("--micro", type=int, default=8, help="sequences per micro-batch of the update")
    ap.add_argument("--steps", type=int, default=3, help="timed update steps per engine")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.prompt, args.new, args.train_batch, args.train_len, args.micro, args.steps = 4, 8, 8, 8, 32, 4, 1
    gpu = torch.cuda.is_available()
    shapes, dtype = (TINY, torch.float32) if args.quick or not gpu else (QWEN05, torch.bfloat16)
    device = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"device: {device}; model: {'Qwen2.5-0.5B shapes' if shapes is QWEN05 else 'tiny'}, {dtype}", file=sys.stderr)

    # each part is printed and saved as soon as it is measured: a later one that fails loses nothing
    out = {"device": device, "model": "qwen2.5-0.5b shapes" if shapes is QWEN05 else "tiny", "dtype": str(dtype),
           "torch": torch.__version__}
    out["generation"] = gen = generation(build(shapes, dtype), args.batch, args.prompt, args.new)
    print_table(f"Generation on {device} ({args.batch} prompts x {args.prompt} tokens, {args.new} new each)",
                gen["rows"], ["engine", "tokens", "s", "tokens/s", "log-probs"])
    print(f"\nrockroll / transformers: {gen['ratio']:.2f}x")
    write_json("gpu", out)

    out["train"] = {"rows": [], "settings": {"batch": args.train_batch, "length": args.train_len, "micro": args.micro}}
    policy = None
    for kind, stage in (("torch", 0), ("deepspeed", 1), ("deepspeed", 2)):
        row, policy = train(build(shapes, dtype), kind, stage, args.train_batch, args.train_len, args.micro, args.steps)
        out["train"]["rows"].append(row)
        write_json("gpu", out)
    print_table(f"One GRPO update on {device} ({args.train_batch} x {args.train_len} tokens, micro-batches of "
                f"{args.micro})", out["train"]["rows"], ["engine", "step_s", "tokens/s", "peak_GiB", "loss"])

    out["weight_sync"] = ws = weight_sync(policy, build(shapes, dtype), 5)
    print_table(f"Weight sync into the generator on {device} (median of 5; weights equal after it: "
                f"{ws['weights_equal']})", ws["rows"], ["path", "median_ms"])
    print(f"\nthrough host memory / on the device: {ws['ratio']:.2f}x")
    print(f"\nwrote {write_json('gpu', out)}")

if __name__ == "__main__":
    main()
