"""Importing gem-llm, whose top-level package ``gem`` this folder's name can shadow.

gem-llm and this folder (installed as ``rockroll.gem``) share the name ``gem``: from a source
checkout's root, ``python -m``/``-c`` and a REPL put the root first on ``sys.path`` and
``import gem`` finds this folder. :func:`load_gem_llm` says so instead of failing obscurely
(docs/gem.md), and :func:`is_gem_llm_env` recognises gem-llm's envs without importing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["GemLLMUnavailable", "is_gem_llm_env", "load_gem_llm"]

_HERE = Path(__file__).resolve().parent


class GemLLMUnavailable(RuntimeError):
    """gem-llm (or what one of its env families needs) is not available here; the message says what."""


# ---------------------------------------------------------------------------------------- loading
def _shadowed(origin: str | None) -> bool:
    return origin is not None and Path(origin).resolve().parent == _HERE


def _shadow_error() -> GemLLMUnavailable:
    return GemLLMUnavailable(
        f"`import gem` finds rockroll's own source folder {_HERE} instead of gem-llm: the source "
        "checkout's root is on sys.path (python -m, python -c or a REPL started there). Start Python "
        "from another folder, or with `python -P` (PYTHONSAFEPATH=1); the `rockroll` command is not affected")


def load_gem_llm():
    """gem-llm's package ``gem``, imported (its registry filled). Raises
    :class:`GemLLMUnavailable` if gem-llm is not installed or this folder shadows it.

    gem-llm's ``__init__`` calls ``logging.basicConfig(level=INFO)``; importing it on a user's
    behalf leaves the root logger as it was."""
    module = sys.modules.get("gem")
    if module is None:
        spec = importlib.util.find_spec("gem")
        if spec is None:
            raise GemLLMUnavailable("gem-llm is not installed: pip install 'rockroll[gem-llm]' (gem-llm==0.1.0)")
        if _shadowed(spec.origin):
            raise _shadow_error()
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        try:
            module = importlib.import_module("gem")
        finally:
            root.handlers[:], root.level = handlers, level
    elif _shadowed(getattr(module, "__file__", None)):
        raise _shadow_error()
    return module


def is_gem_llm_env(obj: Any) -> bool:
    """Whether ``obj`` is a gem-llm ``Env`` (instance or class), without importing gem-llm."""
    core = sys.modules.get("gem.core")
    base = getattr(core, "Env", None) if core is not None and not _shadowed(getattr(core, "__file__", None)) else None
    if base is None:
        return False
    return issubclass(obj, base) if isinstance(obj, type) else isinstance(obj, base)
