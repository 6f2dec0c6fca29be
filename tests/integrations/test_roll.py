"""examples/roll/rockroll_envs.yaml played the way ROLL's agentic pipeline plays it, with the
real gem-llm and OmegaConf (ROLL's config library).

ROLL itself is not installed here (not on PyPI; its env manager imports ray, torch and
tensordict, which are here, and more_itertools and TransferQueue, which are not), so its
calls are reproduced, not its loop. Read at alibaba/ROLL @ 8eb27cc2dc34:

- roll/pipeline/agentic/agentic_config.py 314 (``custom_envs`` as a DictConfig), 379-425
  (``make_env_configs``: per env, the tag's entry without ``env_config``, plus tag, group_id,
  env_id, group_seed, ``env_class = env_type`` and ``config = {**env_config}``, as a DictConfig);
- roll/pipeline/agentic/environment_worker.py 94-103 (``env_manager_cls`` imported by path);
- roll/pipeline/agentic/env_manager/traj_env_manager.py 69-72 (a ``seed`` in ``config`` set to
  the group seed, then ``gem.make(env_id=env_type, **config)``), 76-78 (the tag's templates),
  165-183 (``reset(seed=group_seed + episode_id)``, a history entry ``{observation,
  actions_left, messages, **info}``), 190-216 (``step(action=reply)``, ``info.pop("suffix")``,
  ``max_steps`` ends the episode, ``history[-1].update(info)``), 257-280 (the prompt rendered
  from ``agent_template``), 318-319 (episode score = the sum of step rewards).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gem
import pytest
from omegaconf import DictConfig, OmegaConf
from rockroll.gem.core import GemEnv, InfraError
from rockroll.integrations import roll

YAML = Path(__file__).resolve().parents[2] / "examples" / "roll" / "rockroll_envs.yaml"
# What ROLL's history entries hold besides an env's info; an info key of these would overwrite them
ROLL_KEYS = {"observation", "actions_left", "messages", "reward", "llm_response", "prompt_ids", "response_ids",
             "infer_logprobs", "metrics", "metrics_agg_mode", "use_tool"}


@pytest.fixture(scope="module")
def custom_envs() -> DictConfig:
    # hydra resolves the whole pipeline config before AgenticConfig sees its custom_envs
    return DictConfig(OmegaConf.to_container(OmegaConf.load(YAML), resolve=True)["custom_envs"])


def env_config(custom_envs: DictConfig, tag: str, env_id: int = 0, group_seed: int = 1234) -> DictConfig:
    """One env's config as ROLL's make_env_configs builds it."""
    template = custom_envs[tag]
    entry = {k: v for k, v in template.items() if k != "env_config"}
    entry.update(tag=tag, group_id=0, env_id=env_id, group_seed=group_seed, env_class=template.env_type,
                 config={**template.get("env_config", {})},
                 env_manager_cls=template.get("env_manager_cls",
                                              "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager"))
    return DictConfig(entry)


class Episode:
    """The env calls of ROLL's TrajEnvManager for one env config, and the history it keeps."""

    def __init__(self, config: DictConfig, templates: DictConfig):
        if "seed" in config.config:
            config.config.seed = config.group_seed
        self.config, self.templates = config, templates
        self.env = gem.make(env_id=config.env_type, **config.config)
        self.history: list[dict[str, Any]] = []
        self.steps, self.terminated = 0, False

    def reset(self, episode_id: int = 0) -> str:
        observation, info = self.env.reset(seed=self.config.group_seed + episode_id)
        assert observation is not None and not (set(info) & ROLL_KEYS), set(info) & ROLL_KEYS
        self.history = [{"observation": observation, "actions_left": self.config.max_steps, "messages": None, **info}]
        return self.prompt()

    def prompt(self) -> str:
        """ROLL's user turn: the tag's agent_template filled with the fields it names."""
        last = self.history[-1]
        fields = {"observation": last["observation"], "turn_idx": self.steps + 1, "suffix": last.get("suffix", ""),
                  "actions_left": last["actions_left"], "max_response_length": self.config.max_tokens_per_step}
        template = self.templates.agent_template
        return template.format(**{k: v for k, v in fields.items() if "{" + k + "}" in template})

    def step(self, reply: str) -> str:
        observation, reward, terminated, truncated, info = self.env.step(action=reply)
        info.pop("suffix", None)
        assert not (set(info) & ROLL_KEYS), set(info) & ROLL_KEYS
        self.steps += 1
        self.terminated = terminated or self.steps >= self.config.max_steps
        self.history[-1].update(reward=reward, llm_response=reply, **info)
        self.history.append({"observation": observation, "actions_left": self.config.max_steps - self.steps,
                             "messages": None})
        return self.prompt()

    @property
    def score(self) -> float:
        return sum(entry["reward"] for entry in self.history[:-1])

    @property
    def rock_env(self):
        return self.env.env  # RockEnv's rockroll env


def test_every_tag_is_a_rockroll_env_roll_can_make(custom_envs):
    assert set(custom_envs) == {"RockMath", "RockFrozenLake", "RockTerminal", "RockTerminalHeldOut"}
    for tag, template in custom_envs.items():
        assert template.env_type.startswith("rock:") and template.env_type in gem.envs.registration.ENV_REGISTRY
        assert template.env_manager_cls == "rockroll.integrations.roll.TrajEnvManager"
        assert template.max_steps >= 1 and "{observation}" in template.agent_template
    # the held-out tasks are never trained on
    train = set(custom_envs.RockTerminal.env_config.task_ids)
    held_out = set(custom_envs.RockTerminalHeldOut.env_config.task_ids)
    assert train and held_out and not train & held_out
    from rockroll.gem.terminal import load_terminal_tasks

    assert train | held_out <= {task.id for task in load_terminal_tasks()}


def test_math_right_wrong_and_malformed(custom_envs):
    scores = {}
    for kind in ("right", "wrong", "malformed"):
        episode = Episode(env_config(custom_envs, "RockMath"), custom_envs.RockMath)
        prompt = episode.reset(episode_id=7)
        assert "\\boxed" in prompt and "1 actions left" in prompt
        answer = episode.rock_env.answer
        episode.step({"right": f"\\boxed{{{answer}}}", "wrong": "\\boxed{987654321}", "malformed": "no idea"}[kind])
        assert episode.terminated
        scores[kind] = episode.score
    assert scores == {"right": 1.0, "wrong": 0.0, "malformed": pytest.approx(-0.1)}


def test_frozenlake_group_seed_and_a_multi_turn_episode(custom_envs):
    config = env_config(custom_envs, "RockFrozenLake", group_seed=3)
    episode = Episode(config, custom_envs.RockFrozenLake)
    first = episode.reset(episode_id=0)
    # the same group seed and episode id: the same map, in another env of the group
    twin = Episode(env_config(custom_envs, "RockFrozenLake", env_id=1, group_seed=3), custom_envs.RockFrozenLake)
    assert twin.reset(episode_id=0) == first and "Turn 1," in first
    while not episode.terminated:
        episode.step(f"<answer>{episode.rock_env.expert_action()}</answer>")
    assert episode.steps > 1 and episode.score == 1.0 and episode.history[-2]["success"] is True


def test_terminal_task_in_a_sandbox_with_task_ids_from_the_yaml(custom_envs):
    episode = Episode(env_config(custom_envs, "RockTerminalHeldOut"), custom_envs.RockTerminalHeldOut)
    try:
        episode.reset()
        assert episode.rock_env.task.id in custom_envs.RockTerminalHeldOut.env_config.task_ids
        while not episode.terminated:
            episode.step(episode.rock_env.expert_action())
        assert episode.score == 1.0
    finally:
        episode.env.close()  # ROLL's TrajEnvManager never closes; the test does


class BrokenEnv(GemEnv):
    def _reset(self, task_id, options):
        return "go", {}

    def _step(self, action):
        raise InfraError("sandbox died")


def test_an_infra_failure_reaches_rolls_history_but_is_scored(custom_envs):
    import gymnasium
    from rockroll.gem.gemllm_plugin import register_rock_envs

    gymnasium.register("rock/RollTestBroken-v0", entry_point=BrokenEnv)
    try:
        register_rock_envs()
        config = env_config(custom_envs, "RockMath")
        config.env_type, config.config = "rock:RollTestBroken-v0", {}
        episode = Episode(config, custom_envs.RockMath)
        episode.reset()
        episode.step("anything")
        # what ROLL does with it: the flag is in its history, the episode scores 0.0 like a wrong answer
        assert "sandbox died" in episode.history[0]["infra_error"] and episode.score == 0.0
    finally:
        gymnasium.registry.pop("rock/RollTestBroken-v0", None)
        gem.envs.registration.ENV_REGISTRY.pop("rock:RollTestBroken-v0", None)


def test_env_manager_cls_registers_rock_ids_in_a_process_that_never_imported_rockroll(tmp_path):
    # ROLL's env worker: gem imported (roll.pipeline.agentic.env does), then env_manager_cls imported by path
    code = textwrap.dedent("""
        import importlib, gem
        from gem.envs.registration import ENV_REGISTRY
        assert "rock:Math-v0" not in ENV_REGISTRY
        module = importlib.import_module("rockroll.integrations.roll")  # safe_import_class's first half
        assert "rock:Math-v0" in ENV_REGISTRY and "rock:Terminal-v0" in ENV_REGISTRY
        try:
            module.TrajEnvManager  # its second half: ROLL's own class, here without ROLL
        except ImportError as e:
            print(type(e).__name__, e)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"MissingTrainer .*roll.*alibaba/ROLL", out.stdout), out.stdout
    with pytest.raises(AttributeError):
        roll.NoSuchEnvManager  # noqa: B018
