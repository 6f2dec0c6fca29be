"""GEM environments: text in, text out, on :class:`gymnasium.Env`.

``GemEnv`` and ``TextSpace`` are the core; ``parse_action`` is the one action parser every
tool env shares; ``MathEnv``, ``SokobanEnv`` and ``FrozenLakeEnv`` are procedural envs.
"""

from .actions import Action, format_error_message, parse_action
from .core import GemEnv, InfraError, TextSpace, truncate_observation
from .grid import FrozenLakeEnv, SokobanEnv
from .mathenv import MathEnv, check_answer

__all__ = [
    "Action",
    "FrozenLakeEnv",
    "GemEnv",
    "InfraError",
    "MathEnv",
    "SokobanEnv",
    "TextSpace",
    "check_answer",
    "format_error_message",
    "parse_action",
    "truncate_observation",
]
