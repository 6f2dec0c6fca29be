"""rockroll: sandboxes, env hub, GEM environments and a trainer for agentic RL.

``import rockroll`` registers the built-in Gymnasium ids (``rock/...``), so
``gymnasium.make("rock/FrozenLake-v0")`` works. The sandbox API lives in
``rockroll.sandbox``; heavy parts are imported only when used.
"""

from rockroll.registry.builtin import register_builtin

__version__ = "0.1.0"

register_builtin()
