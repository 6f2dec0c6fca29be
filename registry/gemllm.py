"""rockroll's ids in gem-llm's registry: ``rock/<Name>`` becomes ``gem.make("rock:<Name>")``.

gem-llm has no plugin mechanism, and ``import rockroll`` must not import gem-llm (a second of
imports and a ``logging.basicConfig``; and registering ids must not import the sandbox
engine). So :func:`install_registration` registers now if gem-llm is imported already, and
otherwise leaves a one-shot finder on ``sys.meta_path`` that waits for the first ``import gem``
and registers right after gem-llm's package has run (its registry is filled then). The ids are
:func:`rockroll.gem.gemllm_plugin.register_rock_envs`'s.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = ["install_registration"]


def _is_rockroll_folder(origin: str | None) -> bool:
    """Whether a top-level ``gem`` found at ``origin`` is rockroll's own source folder (a
    checkout's root on sys.path), not gem-llm. Finds rockroll.gem without importing it."""
    ours = importlib.util.find_spec("rockroll.gem")
    return (origin is not None and ours is not None and ours.origin is not None
            and Path(origin).resolve().parent == Path(ours.origin).resolve().parent)


def _register_quietly() -> None:
    try:
        from rockroll.gem.gemllm_plugin import register_rock_envs

        register_rock_envs()
    except Exception as e:  # noqa: BLE001  (an import of gem-llm must never fail because of rockroll)
        warnings.warn(f"rockroll: rock: ids not registered with gem-llm: {e}", RuntimeWarning, stacklevel=2)


class _ThenRegister(importlib.abc.Loader):
    """gem-llm's own loader, then rockroll's ids into its registry once its package has run."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _register_quietly()

    def __getattr__(self, name: str) -> Any:  # resource readers, get_data, ... of the real loader
        return getattr(self._loader, name)


class _OnGemLLMImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the first ``import gem`` it hooks the registration behind the
    loader the normal path search finds (unless that is rockroll's folder), then stays inert
    (it is not removed: the import system may be iterating over ``sys.meta_path``)."""

    def __init__(self) -> None:
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name != "gem" or self.done:
            return None
        self.done = True
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and not _is_rockroll_folder(spec.origin):
            spec.loader = _ThenRegister(spec.loader)
        return spec


def install_registration() -> None:
    """What ``import rockroll`` calls: register now if gem-llm is imported, else at its import."""
    module = sys.modules.get("gem")
    if module is not None:
        if "gem.envs.registration" in sys.modules and not _is_rockroll_folder(getattr(module, "__file__", None)):
            _register_quietly()
    elif not any(isinstance(f, _OnGemLLMImport) and not f.done for f in sys.meta_path):
        sys.meta_path.insert(0, _OnGemLLMImport())
