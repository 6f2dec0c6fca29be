"""Where an env id comes from, found before anything is built: ``rockroll train`` checks every
id of a config when it loads, so a typo or a hub nobody named fails in one line that says
what was searched and what to do, instead of deep inside the first ``gymnasium.make``.

:func:`find_env` resolves one id of any form :func:`rockroll.gem.factory.make_env` takes:

- a gymnasium id (built in, or of a hub already registered: ``$ROCKROLL_HUB`` and the
  default hub at ``import rockroll``); otherwise the ``hubs`` named are registered in order
  and the first that holds the id is returned (a worker process registers it again before it
  makes the env: :func:`ensure_hub`);
- ``module:Class``: the module must import and hold the class;
- ``gem:<id>``: an id of gem-llm's registry (only checked when gem-llm is installed; making
  the env says which extra is missing otherwise).
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Sequence

__all__ = ["EnvIdNotFound", "ensure_hub", "find_env"]


class EnvIdNotFound(LookupError):
    """An env id that no registry, hub or module holds; the message says where it looked."""


@functools.lru_cache(maxsize=None)
def ensure_hub(url: str) -> tuple[str, ...]:
    """Register the envs of the hub at ``url`` in this process, once; their ids."""
    from .hub import register_hub

    return tuple(register_hub(url))


def find_env(env_id: str, hubs: Sequence[str] = ()) -> str | None:
    """Check that ``env_id`` can be made. Returns the URL of the hub in ``hubs`` it was found
    on (registered now), or None when it needed no hub of those. Raises
    :class:`EnvIdNotFound` naming the id, what was searched and how to add a hub."""
    from rockroll.gem.factory import is_entry_point
    from rockroll.gem.gemllm import GEM_PREFIX

    if env_id.startswith(GEM_PREFIX):
        _check_gem_llm_id(env_id[len(GEM_PREFIX):])
        return None
    if is_entry_point(env_id):
        _check_entry_point(env_id)
        return None
    import gymnasium

    if env_id in gymnasium.registry:
        return None
    for url in hubs:
        if env_id in ensure_hub(url):
            return url
    raise EnvIdNotFound(_not_found(env_id, hubs))


def _not_found(env_id: str, hubs: Sequence[str]) -> str:
    import gymnasium

    from rockroll.envhub.store import default_hub_url, normalize_url

    searched = [f"{normalize_url(default_hub_url())} ($ROCKROLL_HUB, else the default hub)",
                *(f"{normalize_url(url)} (hubs)" for url in hubs)]
    known = [k for k in gymnasium.registry if k.startswith("rock/")]
    hint = ""
    if "/" not in env_id and f"rock/{env_id}" in gymnasium.registry:
        hint = f" Did you mean 'rock/{env_id}'? rockroll's envs are in the rock/ namespace."
    elif close := difflib.get_close_matches(env_id, known, n=3, cutoff=0.8):
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?"
    return (f"env id {env_id!r} is not registered: neither built in nor on the hubs searched: "
            f"{'; '.join(searched)}.{hint} Name the hub it was published to in the config "
            "(hubs: [URL], a folder or s3://bucket/prefix) or in ROCKROLL_HUB; `rockroll envs` lists what "
            "is registered.")


def _check_entry_point(entry: str) -> None:
    module, _, name = entry.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise EnvIdNotFound(f"env entry point {entry!r} does not import: {type(e).__name__}: {e} (a module:Class "
                            "id must be importable here: installed, or on PYTHONPATH)") from None


def _check_gem_llm_id(gem_id: str) -> None:
    from gymnasium.error import NameNotFound

    from rockroll.gem.gemllm import GemLLMUnavailable, check_gem_llm_id

    try:
        check_gem_llm_id(gem_id)
    except GemLLMUnavailable:
        return  # not installed: making the env names the missing extra
    except NameNotFound as e:
        raise EnvIdNotFound(f"env id 'gem:{gem_id}': {e}") from None
