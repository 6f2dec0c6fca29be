"""Importing gem-llm, whose top-level package ``gem`` this folder's name can shadow.

gem-llm and this folder (installed as ``rockroll.gem``) share the name ``gem``: from a source
checkout's root, ``python -m``/``-c``, a REPL (and Ray's workers of a driver started there) put
the root first on ``sys.path`` and ``import gem`` finds this folder. :func:`load_gem_llm`
imports gem-llm past it, and says so clearly if this folder was imported as ``gem`` already
(docs/gem.md); :func:`is_gem_llm_env` recognises gem-llm's envs without importing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
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
        f"`gem` is imported from rockroll's own source folder {_HERE}, not from gem-llm: `import gem` ran "
        "with the source checkout's root on sys.path (python -m, python -c or a REPL started there). "
        "Start Python from another folder, or with `python -P` (PYTHONSAFEPATH=1), or let rockroll import "
        "gem-llm first (rockroll.gem.gemllm_load.load_gem_llm)")


def load_gem_llm():
    """gem-llm's package ``gem``, imported (its registry filled). Raises
    :class:`GemLLMUnavailable` if gem-llm is not installed, or if this folder was already
    imported as ``gem``.

    A checkout's root on ``sys.path`` (``python -m`` there, or a Ray worker of a driver started
    there) would make ``import gem`` find this folder: gem-llm is imported with that entry left
    out, and once it is in ``sys.modules`` every ``import gem...`` of the process gets gem-llm.
    gem-llm's ``__init__`` calls ``logging.basicConfig(level=INFO)``; importing it on a user's
    behalf leaves the root logger as it was."""
    module = sys.modules.get("gem")
    if module is not None:
        if _shadowed(getattr(module, "__file__", None)):
            raise _shadow_error()
        return module
    saved, root = list(sys.path), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sys.path[:] = [p for p in saved if Path(p or os.curdir).resolve() != _HERE.parent]
    try:
        if importlib.util.find_spec("gem") is None:
            raise GemLLMUnavailable("gem-llm is not installed: pip install 'rockroll[gem-llm]' (gem-llm==0.1.0)")
        return importlib.import_module("gem")
    finally:
        sys.path[:] = saved
        root.handlers[:], root.level = handlers, level


def is_gem_llm_env(obj: Any) -> bool:
    """Whether ``obj`` is a gem-llm ``Env`` (instance or class), without importing gem-llm."""
    core = sys.modules.get("gem.core")
    base = getattr(core, "Env", None) if core is not None and not _shadowed(getattr(core, "__file__", None)) else None
    if base is None:
        return False
    return issubclass(obj, base) if isinstance(obj, type) else isinstance(obj, base)
