"""Algorithms and credit: the policy-gradient maths as pure functions of tensors (torch only).

- :mod:`.pg`: advantages, losses, off-policy weights, aggregation;
- :mod:`.credit`: chunk-level IPA credit and per-turn discounted credit;
- :mod:`.rhythm`: attention-rhythm credit (where the policy plans and anchors);
- :mod:`.table`: the one table, ``algorithm.name`` -> the estimator and loss that run.

The lowest room of the trainer: it imports nothing of the others (the config reads the table).
"""
