"""All chapters: argument checks and size limits.

Every public function of the book refuses bad input at once with a ValueError (or TypeError)
that names the argument, and refuses a size past one of the limits below with one that says the
limit and why (CONTRIBUTING.md, "Limits").
"""

from numbers import Integral, Real

import numpy as np

# Size limits (CONTRIBUTING.md, "Limits"): past one, a call fails at once with a ValueError
# saying why.
MAX_BYTES = 2**30  # working memory one call may allocate: 1 GiB
MAX_LOOP = 10**6  # iterations of a literal loop, 5 to 15 µs each in make bench: seconds
MAX_STEPS = 10**5  # iterations of a loop of array steps or of Theorem 3.8: tens of µs each
MAX_GAMMA = 2**53  # past it γ + 1 is not exact as a float: Eq. (1) and Theorems 3.8, 3.11
MAX_OUTCOMES = 10**6  # outcomes an exact law may list (a dict entry each)
MAX_DRAWS = 10**9  # tokens one Monte Carlo call may draw: about a minute at make bench speed
DRAW_BYTES = 48  # peak working memory of sample_tokens per draw, measured
STEP_BYTES = 64  # working memory of the toy engine per chain and draft position, measured


def _check_unit_interval(x, name):
    """Raise unless x is a real number in [0, 1] (NaN is not)."""
    if isinstance(x, bool) or not isinstance(x, Real) or not 0 <= x <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")


def _check_count(n, name, limit=None, why=""):
    """Raise unless n is a non-negative integer, and at most limit (for the reason why) if given."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    if limit is not None and n > limit:
        raise ValueError(f"{name} must be at most {limit:,} ({why}), got {n:,}")


def _check_positive_count(n, name, limit=None, why=""):
    """Raise unless n is an integer >= 1, and at most limit (for the reason why) if given."""
    _check_count(n, name, limit, why)
    if n == 0:
        raise ValueError(f"{name} must be at least 1, got 0")


def _check_memory(n_bytes, what):
    """Raise if a call would allocate more than MAX_BYTES of working memory for what."""
    if n_bytes > MAX_BYTES:
        raise ValueError(
            f"{what} would need about {n_bytes / 2**30:,.1f} GiB of working memory, above the "
            f"limit of {MAX_BYTES / 2**30:g} GiB (MAX_BYTES)"
        )


def _as_real_array(x, name):
    """x as a float array of at least one dimension with finite entries, else a ValueError."""
    try:
        array = np.asarray(x)
    except ValueError:  # a ragged nesting of lists
        raise ValueError(f"{name} must be an array of real numbers") from None
    real = array.dtype.kind in "iuf" or (  # integers, floats, or objects such as Fractions
        array.dtype.kind == "O"
        and all(isinstance(v, Real) and not isinstance(v, bool) for v in array.flat)
    )
    if not real:
        raise ValueError(f"{name} must be an array of real numbers, got dtype {array.dtype}")
    array = array.astype(float)
    if array.ndim == 0 or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be a 1-D or larger array of finite numbers, got {x!r}")
    return array


def _check_nonnegative(x, name):
    """Raise unless x is a finite real number >= 0."""
    if isinstance(x, bool) or not isinstance(x, Real) or not 0 <= x < float("inf"):
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")


def _check_rng(rng):
    """Raise unless rng is a numpy Generator (seed it: np.random.default_rng(seed))."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
