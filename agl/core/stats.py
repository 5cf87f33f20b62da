"""Small-sample statistics for comparing evaluations: a success rate's interval, and two methods compared on the
same questions (paired: McNemar's exact test and a seeded paired bootstrap of the accuracy difference).

Standard library only (no numpy), pure functions, deterministic for a given seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate (95% for the default ``z``); (nan, nan) when ``n`` is 0."""
    if successes < 0 or successes > n:
        raise ValueError(f"successes: must be in [0, n={n}], got {successes}")
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: ``only_a`` questions only method A got right,
    ``only_b`` questions only method B got right. Under "no difference" each discordant pair is a fair coin, so
    p = 2 · P(X ≤ min(only_a, only_b)) for X ~ Binomial(only_a + only_b, 1/2), capped at 1 (1 when no pair differs)."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_a} and {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(
    a: Sequence[bool], b: Sequence[bool], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of accuracy(b) - accuracy(a) from resampling the *questions* with replacement (both
    methods keep their answers to the same resampled questions). Seeded: the same inputs give the same interval."""
    _check_paired(a, b)
    if resamples < 1:
        raise ValueError(f"resamples: must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")
    diffs = [int(y) - int(x) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[max(0, math.ceil(tail * resamples) - 1)]
    high = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return (low, high)


@dataclass(frozen=True)
class PairedComparison:
    """Method B against method A on the same ``n`` questions (B − A): accuracies, the difference with its paired
    bootstrap interval, the discordant pairs and McNemar's exact p-value."""

    n: int
    accuracy_a: float
    accuracy_b: float
    difference: float
    ci95: tuple[float, float]
    only_a: int
    only_b: int
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return {**asdict(self), "ci95": list(self.ci95)}

    def describe(self, a: str = "A", b: str = "B") -> str:
        """One line: difference in points with its interval, discordant pairs and p-value; ``a``/``b`` name the
        methods."""
        low, high = self.ci95
        return (
            f"{self.difference * 100:+.1f} points [95% CI {low * 100:+.1f}, {high * 100:+.1f}] "
            f"(only {a} right {self.only_a}, only {b} right {self.only_b}; McNemar exact p = {self.p_value:.3g})"
        )


def compare_paired(a: Sequence[bool], b: Sequence[bool], *, seed: int = 0, resamples: int = 10_000) -> PairedComparison:
    """Compare two methods' per-question correctness (same questions, same order)."""
    _check_paired(a, b)
    n = len(a)
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    acc_a, acc_b = sum(map(bool, a)) / n, sum(map(bool, b)) / n
    return PairedComparison(
        n=n,
        accuracy_a=acc_a,
        accuracy_b=acc_b,
        difference=acc_b - acc_a,
        ci95=paired_bootstrap(a, b, resamples=resamples, seed=seed),
        only_a=only_a,
        only_b=only_b,
        p_value=mcnemar_exact(only_a, only_b),
    )


def _check_paired(a: Sequence[bool], b: Sequence[bool]) -> None:
    if len(a) != len(b):
        raise ValueError(f"paired results must cover the same questions: {len(a)} vs {len(b)}")
    if not a:
        raise ValueError("paired results: no questions")
