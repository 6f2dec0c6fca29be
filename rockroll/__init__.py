"""rockroll: sandboxes, env hub, GEM environments and a trainer for agentic RL.

``import rockroll`` registers the built-in Gymnasium ids (``rock/...``), so
``gymnasium.make("rock/FrozenLake-v0")`` works, then the envs of the default hub
(``$ROCKROLL_HUB``, else a folder in the state home; see ``rockroll.registry.hub``), and
the hub's image schemes (``SandboxSpec(image="hub:name@1.0.0")``); with gem-llm installed,
every ``rock/`` id is also ``gem.make("rock:...")``-able (docs/gem.md). The sandbox API lives
in ``rockroll.sandbox``; heavy parts are imported only when used.
"""

import warnings as _warnings

from rockroll.registry.builtin import register_builtin

__version__ = "0.1.0"

register_builtin()  # first: a hub env never shadows a built-in id


def _install_hub() -> None:
    # Never fail `import rockroll` because of the hub: a broken hub folder or a missing
    # optional dependency only costs the hub's ids, with a warning saying why.
    try:
        from rockroll.envhub.hooks import install
        from rockroll.registry.hub import register_default_hub

        install()
        register_default_hub()
    except Exception as e:  # noqa: BLE001
        _warnings.warn(f"rockroll: env hub unavailable: {e}", RuntimeWarning, stacklevel=2)


_install_hub()


def _install_gem_llm() -> None:
    # rock/ ids as gem-llm's rock: ids (gem.make), once gem-llm is imported; never imports it here
    from rockroll.registry.gemllm import install_registration

    install_registration()


_install_gem_llm()
