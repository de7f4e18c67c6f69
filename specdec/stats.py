"""Chapters 1–4: how far a sample is from a law, and how far noise alone would put it.

Distances (total variation), Pearson's chi-square, and reference bands from multinomial draws
of the exact law itself.
"""

from typing import NamedTuple

import numpy as np
from scipy import stats

from .checks import _as_real_array, _check_count, _check_memory, _check_positive_count, _check_rng
from .models import TOKEN_INDEX, V, _check_token_rows


class Comparison(NamedTuple):
    """Observed counts of outcomes beside their exact probabilities."""

    labels: list
    exact: np.ndarray  # (K,) probabilities
    counts: np.ndarray  # (K,) observed counts

    @property
    def n(self):
        """Number of draws."""
        return int(self.counts.sum())

    @property
    def empirical(self):
        """Observed frequencies."""
        return self.counts / self.n

    @property
    def max_gap(self):
        """max |p̂ − p|."""
        return float(np.abs(self.empirical - self.exact).max())

    @property
    def tv(self):
        """Total variation ½·Σ|p̂ − p|."""
        return total_variation(self.empirical, self.exact)

    @property
    def p_value(self):
        """Chi-square goodness-of-fit p-value of the counts against the exact law."""
        return chi_square_p_value(self.counts, self.exact)

    @property
    def sigma(self):
        """Standard error of each frequency under the exact law, √(p(1 − p)/n)."""
        return np.sqrt(self.exact * (1 - self.exact) / self.n)

    @property
    def pearson_residuals(self):
        """(count − n·p)/√(n·p) per outcome; their squares sum to Pearson's statistic."""
        expected = self.n * self.exact
        return (self.counts - expected) / np.sqrt(expected)

    @property
    def chi_square(self):
        """Pearson's statistic Σ (count − n·p)² / (n·p), on len(counts) − 1 degrees of freedom."""
        return float(stats.chisquare(self.counts, self.exact * self.n).statistic)


def total_variation(a, b):
    """½·Σ|a − b|."""
    a, b = _as_real_array(a, "a"), _as_real_array(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {a.shape} and {b.shape}")
    return 0.5 * float(np.abs(a - b).sum())


def chi_square_p_value(counts, probs):
    """p-value of Pearson's chi-square test of counts against probs (scipy)."""
    counts, probs = _as_real_array(counts, "counts"), _as_real_array(probs, "probs")
    if counts.shape != probs.shape or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("counts and probs must have one shape and probs must sum to 1")
    if np.any(counts < 0) or np.any(probs <= 0) or counts.sum() == 0:
        raise ValueError(
            "counts must be >= 0, not all 0, and probs > 0 (drop outcomes of probability 0)"
        )
    return float(stats.chisquare(counts, probs * counts.sum()).pvalue)


def compare(tokens, law):
    """Comparison of sampled token rows (N, k) against {k-string: probability}."""
    tokens, k = _check_token_rows(tokens, law)
    labels = sorted(law)
    exact = np.array([float(law[s]) for s in labels])
    codes = np.zeros(len(tokens), dtype=np.int64)
    for column in tokens.T:  # each row read as a base-V number
        codes = codes * V + column
    order = np.array(  # ascending, as VOCAB is sorted
        [sum(TOKEN_INDEX[ch] * V ** (k - 1 - i) for i, ch in enumerate(s)) for s in labels]
    )
    slot = np.minimum(np.searchsorted(order, codes), len(order) - 1)  # (N,) each row's label
    if np.any(order[slot] != codes):
        raise ValueError("tokens contain an outcome that law does not list (probability 0)")
    return Comparison(labels, exact, np.bincount(slot, minlength=len(labels)))


def noise_reference(probs, n, rng, reps=2000):
    """Mean and 95th percentile of max-gap and TV for n exact draws from probs (multinomial)."""
    probs = _as_real_array(probs, "probs")
    if probs.ndim != 1 or np.any(probs < 0) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be a 1-D array of non-negative probabilities summing to 1")
    _check_positive_count(n, "n", 2**62, "numpy's multinomial counts in int64")
    _check_positive_count(reps, "reps")
    _check_memory(reps * probs.size * 8 * 4, f"noise_reference with reps={reps:,}")
    _check_rng(rng)
    freq = rng.multinomial(n, probs, size=reps) / n  # (reps, K)
    gap = np.abs(freq - probs)
    max_gap, tv = gap.max(axis=1), 0.5 * gap.sum(axis=1)
    return {
        "mean_max_gap": float(max_gap.mean()),
        "q95_max_gap": float(np.quantile(max_gap, 0.95)),
        "mean_tv": float(tv.mean()),
        "q95_tv": float(np.quantile(tv, 0.95)),
    }


def noise_bands(probs, n, rng, reps=2000):
    """Under n exact draws from probs: 95th percentile of max |p̂ − p|/σ; mean, sd of the TV."""
    probs = np.asarray(probs, float)
    if probs.ndim != 1 or np.any(probs <= 0) or np.any(probs >= 1) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be a 1-D array of probabilities in (0, 1) summing to 1")
    _check_count(n, "n")
    if n == 0:
        raise ValueError("n must be at least 1")
    _check_count(reps, "reps")
    _check_rng(rng)
    freq = rng.multinomial(n, probs, size=reps) / n  # (reps, K)
    gap = np.abs(freq - probs)
    z = gap / np.sqrt(probs * (1 - probs) / n)
    tv = 0.5 * gap.sum(axis=1)
    return {
        "q95_max_z": float(np.quantile(z.max(axis=1), 0.95)),
        "mean_tv": float(tv.mean()),
        "sd_tv": float(tv.std()),
    }


def law_tv(law, reference):
    """Total variation ½·Σ|law − reference| between two laws over strings."""
    keys = sorted(set(law) | set(reference))  # one summation order, whatever the hash seed
    return sum(abs(law.get(s, 0) - reference.get(s, 0)) for s in keys) / 2


def clopper_pearson(k, n, confidence=0.95):
    """Clopper–Pearson's exact interval (low, high) for a binomial proportion from k of n:
    the beta quantiles (1 − confidence)/2 and (1 + confidence)/2, with 0 at k = 0 and 1 at
    k = n. It covers the proportion with probability at least `confidence` at every n."""
    _check_count(k, "k")
    _check_positive_count(n, "n")
    if k > n:
        raise ValueError(f"k must be at most n = {n}, got {k}")
    if isinstance(confidence, bool) or not isinstance(confidence, float | int):
        raise TypeError(f"confidence must be a number, got {type(confidence).__name__}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    tail = (1 - confidence) / 2
    low = float(stats.beta.ppf(tail, k, n - k + 1)) if k else 0.0
    high = float(stats.beta.ppf(1 - tail, k + 1, n - k)) if k < n else 1.0
    return low, high
