"""Confidence intervals and paired tests for success rates.

Wilson score interval for a proportion (never outside [0, 1], honest at small n); the exact
McNemar test for two policies evaluated on the same mazes (a two-sided binomial test on the
discordant pairs); and a Newcombe-style interval for the paired difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    if n <= 0:
        raise ValueError("a proportion needs n >= 1")
    if not 0 <= successes <= n:
        raise ValueError(f"successes = {successes} must be within 0..{n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, no rounding dust
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact p-value that A and B succeed equally often, from the discordant counts
    (mazes only A solved, mazes only B solved)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedComparison:
    n: int
    base_rate: float
    new_rate: float
    diff: float
    diff_low: float
    diff_high: float
    only_base: int
    only_new: int
    p_value: float


def paired_comparison(base: list[bool], new: list[bool], z: float = Z95) -> PairedComparison:
    """New minus base success on the same mazes, with Newcombe's (1998, method 10) interval for a
    paired difference built from Wilson intervals, and the exact McNemar p-value."""
    if len(base) != len(new) or not base:
        raise ValueError(f"paired comparison needs two equal, non-empty lists (got {len(base)} and {len(new)})")
    n = len(base)
    a = sum(1 for x, y in zip(base, new) if x and y)
    only_base = sum(1 for x, y in zip(base, new) if x and not y)
    only_new = sum(1 for x, y in zip(base, new) if y and not x)
    d = n - a - only_base - only_new
    p1, p2 = (a + only_new) / n, (a + only_base) / n  # new, base
    l1, u1 = wilson_interval(a + only_new, n, z)
    l2, u2 = wilson_interval(a + only_base, n, z)
    diff = p1 - p2
    # Correlation correction (phi) between the paired outcomes.
    marg = (a + only_new) * (d + only_base) * (a + only_base) * (d + only_new)
    phi = 0.0
    if marg > 0:
        phi = (a * d - only_new * only_base) / math.sqrt(marg)  # no continuity correction
    dl = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    du = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return PairedComparison(
        n=n, base_rate=p2, new_rate=p1, diff=diff, diff_low=max(-1.0, diff - dl), diff_high=min(1.0, diff + du),
        only_base=only_base, only_new=only_new, p_value=mcnemar_exact(only_base, only_new),
    )
