"""Paired comparison statistics (``agl.core.stats``) on cases whose answers are known by hand."""

from __future__ import annotations

import math

import pytest

from agl.core.stats import compare_paired, mcnemar_exact, paired_bootstrap, wilson_interval


def test_wilson_interval_brackets_the_rate_and_stays_in_0_1() -> None:
    low, high = wilson_interval(30, 60)
    assert low < 0.5 < high
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    # 4 of 120: the interval quoted in the issue that motivated the generator-independent test group.
    low, high = wilson_interval(4, 120)
    assert (round(low, 3), round(high, 3)) == (0.013, 0.083)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)


def test_mcnemar_exact_matches_the_binomial_tail_computed_by_hand() -> None:
    # 2 vs 8 discordant pairs: P(X <= 2), X ~ Bin(10, 1/2) = (1 + 10 + 45) / 1024; two-sided doubles it.
    assert mcnemar_exact(2, 8) == pytest.approx(112 / 1024)
    assert mcnemar_exact(8, 2) == mcnemar_exact(2, 8)
    # 0 vs 6: 2 / 64.
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def test_paired_bootstrap_interval_is_seeded_and_exact_on_degenerate_cases() -> None:
    same = [True, False] * 20
    assert paired_bootstrap(same, same) == (0.0, 0.0), "identical answers: no difference in any resample"
    assert paired_bootstrap([False] * 10, [True] * 10) == (1.0, 1.0)
    a = [True] * 10 + [False] * 30
    b = [True] * 10 + [True] * 8 + [False] * 22
    first = paired_bootstrap(a, b, seed=3)
    assert first == paired_bootstrap(a, b, seed=3)
    low, high = first
    assert 0.0 < low < 8 / 40 < high, "only B ever wins: the interval excludes 0 and holds the observed 20 points"
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap(a, b[:-1])


def test_compare_paired_counts_discordant_pairs_and_describes_them() -> None:
    a = [True, True, False, False, True, False]
    b = [True, False, True, True, True, True]
    result = compare_paired(a, b, seed=0)
    assert (result.only_a, result.only_b, result.n) == (1, 3, 6)
    assert result.difference == pytest.approx(2 / 6)
    assert result.p_value == pytest.approx(mcnemar_exact(1, 3)) == pytest.approx(10 / 16)
    assert result.ci95[0] <= result.difference <= result.ci95[1]
    assert "+33.3 points" in result.describe() and "p = 0.625" in result.describe()
    assert "only base right 1, only SFT right 3" in result.describe("base", "SFT")
    assert result.to_dict()["ci95"] == list(result.ci95)
