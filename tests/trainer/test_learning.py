"""Training learns: every algorithm, run through ``train()`` from a random tiny policy, raises
the mean eval reward of a task it can learn in seconds from <= 0.3 to >= 0.8.

The tasks (``_synthetic.py`` beside this file): a one-turn env rewarding one word of the
policy's dozen-token vocabulary (``LatencyEnv``, "Say Up."), and a two-turn env asking for a
different word each turn (``TwoStepEnv``), for the multi-turn credit (the per-turn credit's
run is bistable: bounded over its three seeds together, test_turn_credit_learns_both_turns).
The bounds come from spreads measured with ``_measure_bounds.py`` (docs/testing.md). A trainer whose
advantage has the wrong sign, whose response mask is off by a token or whose KL term pushes
away from the reference passes the mechanical tests of test_train.py; it fails these.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rockroll.trainer import train
from rockroll.trainer.models import save_word_tokenizer

ONE_TURN = ("_synthetic:LatencyEnv", {"target": "Up", "max_turns": 1})
TWO_STEP = ("_synthetic:TwoStepEnv", {"first": "Up", "second": "Down"})
# everything the envs print, and the policy's whole action space (with the special tokens)
WORDS = [" ", ".", "Say", "Now", "say", "Done", "Correct", "No", "Up", "Down", "Left", "Right"]

ALGORITHMS = {
    "grpo": ({"name": "grpo"}, {}, ONE_TURN),
    "ppo": ({"name": "ppo"}, {}, ONE_TURN),  # its critic: a value head trained beside the policy
    "reinforce_pp": ({"name": "reinforce_pp"}, {}, ONE_TURN),
    "topr": ({"name": "topr"}, {}, ONE_TURN),
    "cispo": ({"name": "cispo"}, {}, ONE_TURN),
    # GAE on two mini-critics of their own (a batch role), advantages masked where they agree
    "asyppo": ({"name": "asyppo", "critics": {"hidden_size": 16, "intermediate_size": 32, "lr": 0.01}}, {}, ONE_TURN),
    # maximum likelihood on the best sample of each group, if it won
    "raft": ({"name": "raft", "raft": {"top_k": 1, "min_reward": 0.5}}, {}, ONE_TURN),
    # decoupled PPO: rollouts one version stale (behaviour != proximal), two epochs of two
    # mini-batches (proximal != current), clip to the proximal policy, weight pi_prox / mu
    "decoupled_ppo": ({"name": "grpo", "ppo_epochs": 2, "mini_batches": 2, "tis_cap": 2.0}, {"async_ratio": 1},
                      ONE_TURN),
    # IPA's loss (the ROME paper's Eq 9) with the group-normalised returns, the named option: the
    # paper's absolute returns (Eq 7) never push a wrong turn down when no reward is negative,
    # and both turns are predicted at the same token: seeds 0 and 2 stalled at eval 0.5 with
    # them (turn 2 collapsed to "Up"), seed 1 reached 1.0; group_normalized reached 1.0 on all 3
    "ipa": ({"name": "grpo", "ipa": {"enabled": True, "gamma": 0.9, "returns": "group_normalized"}}, {}, TWO_STEP),
    # per-turn credit: turn k's tokens get the group-normalised return-to-go of the per-turn
    # rewards. Groups of 16, two per step (the same 32 episodes a step): a turn's advantage is 0
    # in a group where no episode got that turn right, and in groups of 8 the "Up" learned first
    # on turn 1 spreads to turn 2 (both turns are predicted at the same <|assistant|> token)
    # before enough groups hold a right second answer: turn 2 collapsed to "Up" (eval 0.5).
    # Even so the run is bistable (docs/testing.md, "Learning bounds"): with gamma 0.9, 6 of
    # seeds 0-9 reached 1.0 and 4 stopped at 0.5; with gamma 0.5 (less of turn 2's reward
    # credited to turn 1's "Up") 8 of 10. test_turn_credit_learns_both_turns bounds it.
    "turn_credit": ({"name": "grpo", "turn_credit": "discounted", "gamma": 0.5},
                    {"group_size": 16, "batch_groups": 2}, TWO_STEP),
}
BISTABLE = {"turn_credit"}  # bounded over its seeds together, not seed by seed
STEPS = 30  # the one-turn task is learned by step 10, the two-step one by step 20-30
KL_COEF = 1.0  # holds the GRPO run of the one-turn task near 0.5


def learning_config(tmp_path, algorithm: dict, rollout: dict, env, *, seed: int = 0, steps: int = STEPS) -> dict:
    """A tiny Llama over a tiny vocabulary playing ``env``; eval (64 episodes) before the first
    step and after the last."""
    tok = tmp_path / "tok"
    if not (tok / "tokenizer.json").exists():
        save_word_tokenizer(WORDS, tok)
    env_id, kwargs = env
    return {
        "steps": steps, "seed": seed, "deterministic": True,
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
        "tokenizer": {"name_or_path": str(tok)},
        "envs": [{"id": env_id, "kwargs": kwargs}],
        "rollout": {"group_size": 8, "batch_groups": 4, "max_turns": 2, "batch_wait_ms": 10_000, **rollout},
        "algorithm": algorithm,
        "engine": {"lr": 0.02},
        "generation": {"max_new_tokens": 1},
        "eval": {"every": steps, "episodes": 64},
        "logging": {"dir": str(tmp_path / "run"), "tensorboard": False, "plot": False, "progress": False,
                    "transcripts": 0},
    }


def eval_rewards(run_dir) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/reward"] for r in rows}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("algo", [a for a in ALGORITHMS if a not in BISTABLE])
def test_algorithm_learns(tmp_path, algo, seed):
    """Bounds from a measured spread (docs/testing.md, "Learning bounds"): over seeds 0-4, on 1
    and 2 torch threads and with ``deterministic: false``, every algorithm here started at
    0.03-0.06 and ended at 1.0 (64 episodes)."""
    algorithm, rollout, env = ALGORITHMS[algo]
    train(learning_config(tmp_path, algorithm, rollout, env, seed=seed))
    curve = eval_rewards(tmp_path / "run")
    assert curve[0] <= 0.3, curve  # the random policy rarely says the word
    assert curve[STEPS] >= 0.8, curve


def test_turn_credit_learns_both_turns(tmp_path):
    """Per-turn credit on the two-turn task, seeds 0, 1, 2. Its end is bistable: 1.0 (both
    turns learned) or 0.5 (turn 1 learned, turn 2 collapsed to turn 1's word, after which every
    turn-2 group ties and its advantage is 0 for good). Which seeds collapse is a matter of
    floats, so a per-seed ">= 0.8" holds on the machine that picked the seeds, not on every
    machine. Measured (docs/testing.md, "Learning bounds"), gamma 0.5: 8 of seeds 0-9 reached
    1.0, the others 0.5; no run ended below 0.5. So every seed must learn turn 1 (>= 0.45)
    and at least one of the three must learn both turns (>= 0.8): if a seed collapses with
    probability 0.2, all three do with 0.008."""
    algorithm, rollout, env = ALGORITHMS["turn_credit"]
    ends = {}
    for seed in (0, 1, 2):
        train(learning_config(tmp_path / str(seed), algorithm, rollout, env, seed=seed))
        curve = eval_rewards(tmp_path / str(seed) / "run")
        assert curve[0] <= 0.3, (seed, curve)
        ends[seed] = curve[STEPS]
    assert min(ends.values()) >= 0.45, ends  # turn 1's word, in every seed
    assert max(ends.values()) >= 0.8, ends  # both turns, in at least one


def test_kl_penalty_holds_the_policy_near_its_reference(tmp_path):
    """The same GRPO run as test_algorithm_learns[grpo] (which reaches >= 0.8 without it) with a
    strong KL penalty to the initial policy: the policy still learns, but stays near the
    reference, so it says the word far less often. A KL term with the wrong sign would push the
    policy away from the reference, and it would say the word always."""
    algorithm = {"name": "grpo", "kl_coef": KL_COEF}
    cfg = learning_config(tmp_path, algorithm, {}, ONE_TURN)
    cfg["eval"]["episodes"] = 256  # an interval of about +-0.06 around 0.5, not +-0.12
    out = train(cfg)
    curve = eval_rewards(tmp_path / "run")
    # Bounds from a measured spread (docs/testing.md, "Learning bounds"): seeds 0-4 on 1 and 2
    # torch threads ended at 0.48-0.58 (256 episodes; the same on both thread counts), a
    # fresh machine's seed 0 at 0.28 (64 episodes), without the KL term 1.0 (seeds 0, 1).
    assert curve[0] <= 0.3 and 0.15 <= curve[STEPS] <= 0.8, curve
    assert out["history"][-1]["loss/kl"] > 0


FROZENLAKE_STEPS = 40
FROZENLAKE_SETS = {"envs.0.task_ids": "[0]", "rollout.batch_groups": "2", "eval.episodes": "64",
                   "rollout.async_ratio": "0", "deterministic": "true"}


def train_example(name: str, steps: int, tmp_path: Path, sets: dict[str, str]) -> dict[int, dict]:
    """``rockroll train examples/<name> --steps N --set ...`` as a user runs it, evaluating at
    step 0 and ``steps``; its eval rows by step."""
    sets = {**sets, "eval.every": str(steps), "logging.dir": str(tmp_path / "run"),
            "checkpoint.dir": str(tmp_path / "ckpt"), "logging.progress": "false", "logging.tensorboard": "false"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    example = Path(__file__).resolve().parents[2] / "examples" / name
    r = subprocess.run([sys.executable, "-m", "rockroll.cli", "train", str(example), "--steps", str(steps), *args],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return {x["step"]: x for x in map(json.loads, (tmp_path / "run" / "eval.jsonl").read_text().splitlines())}


def test_rockroll_train_learns_frozenlake_end_to_end(tmp_path):
    """The shipped example through the ``rockroll train`` CLI on the real GEM FrozenLake, on
    one of its maps (4x4, no holes: three Right and three Down in 8 turns), its replies
    constrained to the four directions as the example says (``generation.allowed_tokens``: a
    policy trained from scratch has no prior for the format). The untrained policy almost
    never reaches the goal; the trained one does in most fresh evaluation episodes. (Why this
    stops near 0.7 rather than 0.9: docs/results/frozenlake-grpo-cpu.md.)

    Synchronous and deterministic (``async_ratio: 0``, ``deterministic: true``): which samples
    an asynchronous run takes one version stale depends on the machine's load, and on this
    sparse reward that moves the step-40 result (0.25-0.75 over seeds 0-3 under load; 0.66-0.75
    idle). The synchronous run gives the same numbers, step for step, idle or loaded, so a
    failure here means the code changed, not the machine. (The asynchronous path learns in
    test_algorithm_learns[decoupled_ppo] and the model-service test below.)"""
    rows = train_example("frozenlake_cpu.yaml", FROZENLAKE_STEPS, tmp_path, FROZENLAKE_SETS)
    # Bounds from a measured spread (docs/testing.md, "Learning bounds"): seeds 0-4 on 1 and 2
    # torch threads (and 0-2 with deterministic: false) started at 0.0 and ended at 0.69-0.75
    # on 32 episodes, the same on every setting, with no format error; on the test's 64
    # episodes 0.64-0.70 (a policy at 0.64 falls below 0.5 on 64 with 0.008, on 32 with 0.035)
    assert rows[0]["eval/success"] <= 0.1, rows[0]
    assert rows[FROZENLAKE_STEPS]["eval/success"] >= 0.5, rows[FROZENLAKE_STEPS]
    assert rows[FROZENLAKE_STEPS]["eval/format_errors"] == 0.0  # every reply was a direction


AGENT_STEPS = 10


def test_rockroll_train_learns_through_the_model_service(tmp_path):
    """Agent-native RL (issue #13): the shipped example through ``rockroll train``. An
    unmodified agent program on the official ``openai`` client (``openai-chat-agent``) plays the
    corridor game (goal on the right, from each inner cell) in sandboxes without network;
    every call it makes is answered by the policy being trained, and the trainer learns from
    the merged token-in/token-out samples. The untrained policy, a coin over Left/Right, wins
    about a third of the games; the trained one nearly all. The client is copied into a
    snapshot rather than pip-installed into an image (the example's ``image``), which is faster."""
    from _openai_client import snapshot_with_agent

    from rockroll.gem.agents import AGENTS
    from rockroll.sandbox import SandboxSpec

    snapshot = snapshot_with_agent(SandboxSpec(), AGENTS["openai-chat-agent"], tmp_path / "pylib")
    rows = train_example("agent_corridor_cpu.yaml", AGENT_STEPS, tmp_path, {
        "envs.0.kwargs.snapshot": snapshot, "envs.0.kwargs.image": "null", "eval.episodes": "24"})
    assert rows[0]["eval/success"] <= 0.6, rows[0]
    assert rows[AGENT_STEPS]["eval/success"] >= 0.9, rows[AGENT_STEPS]
    assert rows[AGENT_STEPS]["eval/infra_errors"] == 0.0
