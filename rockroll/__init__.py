"""rockroll: sandboxes, env hub, GEM environments and a trainer for agentic RL."""

__version__ = "0.1.0"
