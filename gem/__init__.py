"""GEM environments: text in, text out, on :class:`gymnasium.Env`.

``GemEnv`` and ``TextSpace`` are the core; ``parse_action`` is the one action parser every
tool env shares; ``MathEnv``, ``SokobanEnv`` and ``FrozenLakeEnv`` are procedural envs.
``SandboxToolEnv`` is the base of envs driven with bash in a sandbox: ``TerminalEnv``
(``rock/Terminal-v0``) and ``CodeEnv`` (``rock/Code-v0``); ``make_vec`` steps many envs
concurrently.
"""

from .actions import Action, format_error_message, parse_action
from .code import CodeEnv, CodeProblem
from .core import GemEnv, InfraError, TextSpace, truncate_observation
from .grid import FrozenLakeEnv, SokobanEnv
from .mathenv import MathEnv, check_answer
from .terminal import TerminalEnv, TerminalTask
from .tools import Evaluation, SandboxToolEnv
from .vector import GemVectorEnv, make_vec

__all__ = [
    "Action",
    "CodeEnv",
    "CodeProblem",
    "Evaluation",
    "FrozenLakeEnv",
    "GemEnv",
    "GemVectorEnv",
    "InfraError",
    "MathEnv",
    "SandboxToolEnv",
    "SokobanEnv",
    "TerminalEnv",
    "TerminalTask",
    "TextSpace",
    "check_answer",
    "format_error_message",
    "make_vec",
    "parse_action",
    "truncate_observation",
]
