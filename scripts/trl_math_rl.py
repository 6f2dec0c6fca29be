"""TRL's ``GRPOTrainer`` on rockroll's ``rock/Math-v0``, with the settings of
examples/smollm2_math_rl_cpu.yaml, judged by rockroll's own evaluation (docs/integrations.md,
"TRL beside rockroll train").

    python scripts/trl_math_rl.py OUT [--seed 0] [--steps 20] [--save-every 10]

SmolLM2-135M-Instruct (the packaged model) with new LoRA adapters (rank 16, alpha 32, every
projection), groups of 8 completions, 2 groups a step, at most 128 tokens, temperature 0.5,
lr 1e-4 (constant), clip 0.2/0.28, token-mean loss (TRL's ``dapo``), no KL: the example's
settings, except dynamic sampling, which TRL has no counterpart of. Rewards are the env's own
(:func:`rockroll.integrations.trl.step_reward`: 1 right, 0 wrong, -0.1 no answer it reads).
Training problems are task ids 0-4999, as in the example.

Writes ``OUT/trl`` (TRL's checkpoints), ``OUT/model-<step>`` (the adapters merged), then
evaluates each greedily on the 64 held-out problems (100000-100063) with ``rockroll train`` at
``eval.every: 1`` (its step-0 evaluation is of the model it starts from; the one training step
after it is not used; the start model's evaluation is the example's own step 0), and writes
``OUT/result.json``: TRL's log per step, its training seconds, and ``eval`` by step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2_math_rl_cpu.yaml"
ENV = {"id": "rock/Math-v0", "kwargs": {"difficulty": 1, "problem_types": ["arithmetic"]}}


def train_trl(out: Path, seed: int, steps: int, save_every: int) -> dict:
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rockroll.integrations.trl import episode_dataset, step_reward
    from rockroll.trainer.config import LoRAConfig
    from rockroll.trainer.model_store import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    data = episode_dataset(ENV["id"], list(range(5000)), env_kwargs=ENV["kwargs"])
    args = GRPOConfig(output_dir=str(out / "trl"), use_cpu=True, bf16=False, seed=seed, max_steps=steps,
                      per_device_train_batch_size=16, num_generations=8, max_completion_length=128,
                      temperature=0.5, learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0,
                      epsilon=0.2, epsilon_high=0.28, loss_type="dapo", logging_steps=1,
                      save_strategy="steps", save_steps=save_every, report_to=[])
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args,
                          processing_class=AutoTokenizer.from_pretrained(path, padding_side="left"),
                          train_dataset=data, reward_funcs=step_reward,
                          peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                                                 target_modules=LoRAConfig().target_modules))
    t = time.time()
    trainer.train()
    return {"train_s": time.time() - t, "log": trainer.state.log_history, "model": str(path)}


def merged(base: str, adapter: Path, dest: Path) -> Path:
    """``base`` with the LoRA adapter of a TRL checkpoint merged in, saved with its tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload().save_pretrained(dest)
    AutoTokenizer.from_pretrained(base).save_pretrained(dest)
    return dest


def evaluate(model: str, run: Path) -> dict:
    """rockroll's greedy evaluation of ``model`` on the example's held-out problems."""
    subprocess.run([str(Path(sys.executable).with_name("rockroll")), "train", str(EXAMPLE), "--fresh", "--set", "steps=1",
                    "--set", "eval.every=1", "--set", f"model.init_from={model}",
                    "--set", f"logging.dir={run}", "--set", f"checkpoint.dir={run}/ckpt"], check=True)
    return json.loads((run / "eval.jsonl").read_text().splitlines()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=10)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"seed": a.seed, "steps": a.steps, **train_trl(a.out, a.seed, a.steps, a.save_every), "eval": {}}
    (a.out / "result.json").write_text(json.dumps(result, indent=1))
    for step in range(a.save_every, a.steps + 1, a.save_every):
        model = merged(result["model"], a.out / "trl" / f"checkpoint-{step}", a.out / f"model-{step}")
        result["eval"][step] = evaluate(str(model), a.out / f"eval-{step}")
        (a.out / "result.json").write_text(json.dumps(result, indent=1))
    for step, row in result["eval"].items():
        print(f"step {step}: held-out success {row['eval/success']:.3f}, format errors {row.get('eval/format_errors')}")


if __name__ == "__main__":
    main()
