"""Shared fixtures and helpers for the test suite."""

import numpy as np
import pytest

# Thresholds for chi-square tests at fixed seeds. Under the null hypothesis (the sample comes from
# the law we test against) the p-value is uniform on [0, 1], so a correct sampler falls below
# P_PASS with probability 0.001 at a random seed; a broken one must fall below P_REJECT. With the
# seeds fixed, every run of the suite computes the same p-values.
P_PASS = 1e-3
P_REJECT = 1e-6


@pytest.fixture
def rng():
    """A fresh generator with a fixed seed."""
    return np.random.default_rng(20231)
