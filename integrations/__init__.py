"""Adapters that let other trainers train on rockroll's envs and use its sandboxes.

One module per trainer (``rockroll.integrations.trl``, ``.skyrl``, ``.verl``, ...), each
importing its trainer lazily behind the extra of the same name. They stand beside
``rockroll.trainer``, never on it: they import ``gem``, ``registry``, ``envhub`` and
``sandbox``, and nothing in rockroll imports them (tests/test_imports.py). What they share --
an env from any id, episodes on a task, the train/held-out split, infrastructure failures told
apart from rewards -- is in :mod:`rockroll.integrations.episodes`. docs/integrations.md has the
config a user copies for each trainer.
"""
