"""Statistics of evaluation results: how sure a success rate is."""

from __future__ import annotations

import math

__all__ = ["wilson_interval"]


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a success rate ``successes / n`` (``z``: the normal
    quantile, 1.96 for 95 %). Unlike the normal approximation it stays inside [0, 1] and is
    not empty at 0 or n successes: two evaluations whose intervals do not overlap differ.
    ``n == 0``: (0, 1), nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 or n successes one bound is exactly 0 or 1 (rounding leaves 1e-17 off)
    return (0.0 if successes == 0 else max(0.0, centre - half)), (1.0 if successes == n else min(1.0, centre + half))
