"""ROLL (alibaba/ROLL) on rockroll's envs: its agentic pipeline makes every env with
``gem.make(env_type, **env_config)``, and rockroll's ids are in gem-llm's registry as
``rock:<Name>`` -- but only in a process that imported rockroll, and ROLL's env workers never
do. Point a ``custom_envs`` entry's ``env_manager_cls`` here (``examples/roll/rockroll_envs.yaml``):

    env_manager_cls: rockroll.integrations.roll.TrajEnvManager

ROLL's env worker imports that path (``safe_import_class``); importing this module imports
``rockroll``, which registers the ``rock:`` ids with gem-llm (now, or at its import), and the
name resolves to ROLL's own class of that name, unchanged. Nothing of ROLL is subclassed.

What ROLL does not do with rockroll's contract: it passes seeds, never ``options`` (no task
ids: restrict an env's tasks with its kwargs, e.g. ``rock/Terminal-v0``'s ``task_ids``); it
sums the rewards of an episode whatever ``info["infra_error"]`` says (the flag reaches its
rollout history, no filter reads it); its ``TrajEnvManager`` never calls ``env.close()`` (a
sandbox env's sandbox goes back to its pool when the env is collected, or at exit).
"""

from __future__ import annotations

from typing import Any

from .episodes import require

__all__ = ["ENV_MANAGERS"]

#: ROLL's env managers by class name: the module of roll.pipeline.agentic.env_manager holding each.
ENV_MANAGERS = {
    "TrajEnvManager": "traj_env_manager",
    "StepEnvManager": "step_env_manager",
    "StepConcatEnvManager": "step_concat_env_manager",
    "VLTrajEnvManager": "vl_traj_env_manager",
    "AgentNativeStepEnvManager": "agent_native_env_manager",
}


def __getattr__(name: str) -> Any:
    if name in ENV_MANAGERS:
        module = require(f"roll.pipeline.agentic.env_manager.{ENV_MANAGERS[name]}", None,
                         "ROLL is not on the package index (its name there is another project's): install "
                         "it from its source, github.com/alibaba/ROLL, with its requirements")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
