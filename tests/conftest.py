"""Shared fixtures and helpers for the test suite."""

import os

# One BLAS thread in every test process and the processes it starts, set before numpy loads:
# with `-n 2` two workers share the 2 cores, and OpenBLAS's idle threads spin while they wait.
# Timings pin their own threads (`transformer.BLAS_THREADS`); no test measures speed.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

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


@pytest.fixture(scope="module")
def pair():
    """The shipped trained pair (chapter 9), loaded once a module."""
    import specdec_core as sc

    return sc.load_pair()


@pytest.fixture(scope="module")
def twin(pair):
    """The same pair run by ONNX Runtime (chapter 9's clock)."""
    from specdec import race

    return race.on_runtime(pair)


# The longest test, about two minutes of which most is spent waiting on its kernels.
LONGEST = "test_the_archive_runs_in_a_fresh_venv_outside_the_repository"


def pytest_collection_modifyitems(items):
    """Put the longest test first, so that with `-n 2` one worker starts it while the other
    runs the rest (the sort is stable: every other test keeps its place)."""
    items.sort(key=lambda item: item.name != LONGEST)


@pytest.fixture(scope="session")
def records(tmp_path_factory):
    """A folder every worker of this test session shares: under xdist, the parent of each
    worker's own temporary folder."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "site-loads"
    folder.mkdir(exist_ok=True)
    return folder
