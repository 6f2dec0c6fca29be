"""Roles: what the loop drives, and the update step they run.

- :mod:`.base`: the protocols the loop sees (``Roles``, ``Trainer``, ``Rollout``, ``BatchRole``);
- :mod:`.local`: the roles in this process (policy trainer, env worker, reference, attention);
- :mod:`.ray`: the same roles in Ray actors; :mod:`.placement`: where they go;
- :mod:`.update`: groups -> batch -> log-probs -> advantages -> loss -> optimizer steps;
- :mod:`.critics`: AsyPPO's mini-critics; :mod:`.checkpoint`, :mod:`.runlog`.

Imports every room below it; only :mod:`rockroll.trainer.loop` and ``controller`` import it.
"""
