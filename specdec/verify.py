"""Chapter 3: `verify`, the vectorised rule for a batch of B drafts of γ tokens over V tokens.

It checks and verifies the batch in blocks of about BLOCK_BYTES of one input, so each input is
read from memory once; rows are summed in float64 or wider; long rows draw their final token a
chunk at a time.
"""

import functools
import itertools
import math

import numpy as np

from .checks import _check_rng
from .rule import EXACT_RULE


def _accepted_count(accept_x, u):
    """Leading ratio tests passed (B,), from acceptance probs and uniforms, both (B, gamma)."""
    batch, gamma = accept_x.shape
    passed = np.zeros((batch, gamma + 1), dtype=bool)  # a failed sentinel test at the end
    np.less(u, accept_x, out=passed[:, :gamma])  # r < min(1, p/q)
    return passed.argmin(axis=1)  # the first failed test


def _test_uniforms(rng, batch, gamma, rule):
    """The uniforms of the gamma ratio tests, (B, gamma): one per test, or one shared by all."""
    if not rule.shared_uniform:
        return rng.random((batch, gamma))
    return np.broadcast_to(rng.random((batch, 1)), (batch, gamma))


def _at_least_float64(dtype):
    """dtype promoted to float64 or wider: float32 sums drift, integer differences wrap."""
    return np.promote_types(dtype, np.float64)


CHUNK = 1024  # rows of at least LONG_ROW tokens draw a chunk, then a token within it
LONG_ROW = 4 * CHUNK
GEMV_BELOW = 4096  # shorter rows summed by BLAS gemv, measured faster for 8 to 8,192 tokens


def _row_sums(weights):
    """Σ over the last axis in float64 or wider, (...,): BLAS for short rows, einsum for long."""
    dtype, vocab = _at_least_float64(weights.dtype), weights.shape[-1]
    if vocab >= GEMV_BELOW:  # a few long rows (6 of 32,000): einsum's own loop is faster
        return np.einsum("...v->...", weights, dtype=dtype)
    rows = weights.reshape(math.prod(weights.shape[:-1]), vocab)  # (N, V)
    return (rows @ np.ones(vocab, dtype)).reshape(weights.shape[:-1])  # many short rows: gemv


def _below(u, total):
    """u·total, kept below total: u·total rounds up to a subnormal total of a few ulps."""
    scaled = u * total
    if (scaled < total).all():  # true unless a total is subnormal, as u <= 1 - 2**-53
        return scaled
    return np.minimum(scaled, np.nextafter(total, 0))


def _sample_rows(weights, rng):
    """One inverse-CDF draw from each row of non-negative weights (N, V) with a positive sum."""
    cumulative = weights.cumsum(axis=1)
    scaled = _below(rng.random(len(weights)), cumulative[:, -1])
    return (cumulative <= scaled[:, None]).sum(axis=1)  # first sum above u·total


def _cumsum_columns(columns):
    """In place, columns (V, N) become their running sums down axis 0, in index order."""
    if len(columns) > columns.shape[1]:  # tall and narrow: numpy's own loop
        return np.cumsum(columns, axis=0, out=columns)
    for above, row in itertools.pairwise(columns):  # short and wide: V vector additions
        np.add(above, row, out=row)
    return columns


def _column_draw(weights, p_n, from_p, u):
    """Inverse-CDF draws (b,) from rows of weights (b, V), or of p_n where from_p or no mass."""
    columns = np.empty(weights.shape[::-1], np.result_type(weights, p_n))  # (V, b), C-ordered
    np.copyto(columns, weights.T)
    np.copyto(columns, p_n.T, where=from_p)  # a bonus row draws from p
    cumulative = _cumsum_columns(columns)  # sums in index order, as cumsum along a row
    empty = cumulative[-1] <= 0
    if empty.any():
        cumulative[:, empty] = _cumsum_columns(np.array(p_n[empty].T, order="C"))
    return (cumulative <= _below(u, cumulative[-1])).sum(axis=0)  # first sum above


def _chunked_draw(weights, p_n, from_p, u):
    """_column_draw's draws for long rows (b, V), by _draw_in_chunks one row at a time."""
    from_p = from_p | ~(_row_sums(weights) > 0)  # bonus, or a correction without mass: p
    starts = np.arange(0, weights.shape[1], CHUNK)
    draws = [
        _draw_in_chunks(p if bonus else w, starts, r)
        for w, p, bonus, r in zip(weights, p_n, from_p, u)
    ]
    return np.array(draws, dtype=np.int64)


def _draw_in_chunks(row, starts, u):
    """A token of row (V,) with mass: a chunk by its mass, then a token by the rest of u."""
    masses = np.add.reduceat(row, starts)  # (chunks,)
    ends = np.cumsum(masses)
    scaled = _below(u, ends[-1])
    chunk = np.searchsorted(ends, scaled, side="right")  # the chunk whose mass holds it
    before = ends[chunk - 1] if chunk else 0
    rest = min((scaled - before) / masses[chunk], np.nextafter(1, 0))  # uniform on [0, 1)
    cumulative = np.cumsum(row[starts[chunk] : starts[chunk] + CHUNK])
    return starts[chunk] + np.searchsorted(cumulative, rest * cumulative[-1], side="right")


def _draw_final(weights, p_n, from_p, u):
    """Inverse-CDF draws (b,) from weights (b, V), or from p_n where from_p or no mass."""
    draw = _chunked_draw if p_n.shape[1] >= LONG_ROW else _column_draw
    return draw(weights, p_n, from_p, u)


def _final_token(p_n, q_n, is_bonus, u, rule):
    """The token after the accepted ones (b,): from p for a bonus, else the rule's correction."""
    return _draw_final(rule.correction(p_n, q_n), p_n, is_bonus, u)


def _emitted(draft_tokens, accepted, final):
    """(B, gamma + 1) signed tokens: the accepted draft, the final token, then -1 padding."""
    batch, gamma = draft_tokens.shape
    tokens = np.empty((batch, gamma + 1), dtype=np.int64)
    tokens[:, :gamma] = draft_tokens  # as signed int64: uint8 padding is -1, never 255
    np.copyto(tokens, -1, where=np.arange(gamma + 1) > accepted[:, None])
    tokens[np.arange(batch), accepted] = final
    return tokens


# The checks and the verifier walk the batch in blocks of about BLOCK_BYTES of one input:
# numpy's temporaries stay block-sized, and verify() checks a block just before it verifies it.
BLOCK_BYTES = 2**20


def _blocks(probs):
    """Slices of the batch axis of probs (B, ...), each about BLOCK_BYTES, at least one row."""
    batch = len(probs)
    step = max(1, BLOCK_BYTES // max(1, probs[:1].nbytes))
    return [slice(start, start + step) for start in range(0, batch, step)]


_REAL_KINDS = "fiu"  # float, signed and unsigned integer dtypes; not bool, complex or object


def _is_law(part):
    """True iff every row of part (b, L, V) is >= 0 and sums to 1 ± 1e-6."""
    if part.size and not part.min() >= 0:  # a negative entry or a NaN
        return False
    sums = _row_sums(part)  # an inf entry shows in its row's sum
    return not sums.size or (sums.max() - 1 <= 1e-6 and 1 - sums.min() <= 1e-6)


def _rows_sum_to_one(probs):
    """True iff every row of probs (B, L, V) is >= 0 and sums to 1 ± 1e-6, in one read."""
    return all(_is_law(probs[block]) for block in _blocks(probs))


def _check_probs(probs, name):
    """Raise unless the real rows of probs (B, L, V) are finite, >= 0 and sum to 1."""
    if _rows_sum_to_one(probs):
        return
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"{name} contains NaN or inf")
    if np.any(probs < 0):
        raise ValueError(f"{name} has negative entries")
    raise ValueError(f"{name} has rows that do not sum to 1 (tolerance 1e-6)")


def _check_layout(target_probs, draft_probs, draft_tokens):
    """Raise unless the shapes match, the dtypes are real and every draft token is in range."""
    if target_probs.ndim != 3 or draft_probs.ndim != 3 or draft_tokens.ndim != 2:
        raise ValueError(
            "need target_probs (B, gamma+1, V), draft_probs (B, gamma, V), draft_tokens (B, gamma)"
        )
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]
    if target_probs.shape != (batch, gamma + 1, vocab) or draft_probs.shape != (
        batch,
        gamma,
        vocab,
    ):
        raise ValueError(
            f"shapes do not match: target_probs {target_probs.shape}, draft_probs "
            f"{draft_probs.shape}, draft_tokens {draft_tokens.shape}"
        )
    for probs, name in ((target_probs, "target_probs"), (draft_probs, "draft_probs")):
        if probs.dtype.kind not in _REAL_KINDS:
            raise TypeError(f"{name} must hold real numbers (float or int), got {probs.dtype}")
    if draft_tokens.dtype.kind not in "iu":
        raise ValueError(f"draft_tokens must be integers, got dtype {draft_tokens.dtype}")
    if draft_tokens.size and (draft_tokens.min() < 0 or draft_tokens.max() >= vocab):
        raise ValueError(f"draft_tokens must lie in [0, {vocab})")


def _check_laws(target_probs, draft_probs):
    """Raise unless every row of both inputs is a distribution over the vocabulary."""
    _check_probs(target_probs, "target_probs")
    _check_probs(draft_probs, "draft_probs")


def _check_batch(target_probs, draft_probs, draft_tokens):
    """Raise unless the three arrays are a well-formed batch of distributions and drafts."""
    _check_layout(target_probs, draft_probs, draft_tokens)
    _check_laws(target_probs, draft_probs)


def _checked_batch(target_probs, draft_probs, draft_tokens, rng):
    """The three batch arguments as arrays, after every check of _check_batch and of rng."""
    arrays = np.asarray(target_probs), np.asarray(draft_probs), np.asarray(draft_tokens)
    _check_batch(*arrays)
    _check_rng(rng)
    return arrays


def verify(target_probs, draft_probs, draft_tokens, rng):
    """Speculative verification of a batch: returns accepted (B,) and tokens (B, gamma + 1)."""
    arrays = np.asarray(target_probs), np.asarray(draft_probs), np.asarray(draft_tokens)
    _check_layout(*arrays)
    _check_rng(rng)
    return _verify(*arrays, rng, EXACT_RULE, check_rows=True)  # rows checked block by block


def _rows_at(probs, positions):
    """probs[b, positions[b]] for every b, (B, V): one flat take when probs is contiguous."""
    batch, length, vocab = probs.shape
    if batch == 1:  # a block of one long request: a view of its row, not a copy
        return probs[0, positions[0]][None]
    rows = np.arange(batch)
    if not probs.flags.c_contiguous:  # e.g. a broadcast view: index it in place, no copy
        return probs[rows, positions]
    flat = probs.reshape(batch * length, vocab)
    index = rows * length + positions  # positions are accepted counts in [0, length)
    return np.take(flat, index, axis=0, mode="clip")  # never clips; skips "raise"'s slow path


@functools.lru_cache(maxsize=64)  # a loop asks for the same few shapes at every step
def _cell_offsets(batch, gamma, length, vocab):
    """Flat index of probs[b, i, 0] in a C-contiguous (batch, length, vocab) array, (B, gamma),
    read-only (it is shared between calls)."""
    offsets = (np.arange(batch)[:, None] * length + np.arange(gamma)) * vocab
    offsets.flags.writeable = False
    return offsets


def _entries(probs, draft_tokens, offsets):
    """probs[b, i, draft_tokens[b, i]] for i < gamma, (B, gamma), given probs' _cell_offsets."""
    batch, gamma = draft_tokens.shape
    if not probs.flags.c_contiguous:
        return probs[np.arange(batch)[:, None], np.arange(gamma), draft_tokens]
    return np.take(probs.reshape(-1), offsets[:batch] + draft_tokens)


def _verify(target_probs, draft_probs, draft_tokens, rng, rule, check_rows=False):
    """verify() for any Rule, a cache-sized block at a time; check_rows: each block's rows first."""
    batch, gamma = draft_tokens.shape
    state = rng.bit_generator.state if check_rows else None  # restored if a block is refused
    u_tests = _test_uniforms(rng, batch, gamma, rule)  # (B, gamma)
    u_final = rng.random(batch)  # (B,)
    accepted, final = np.empty(batch, dtype=np.int64), np.empty(batch, dtype=np.int64)
    blocks = _blocks(target_probs)
    size, vocab = min(batch, blocks[0].stop) if blocks else 0, target_probs.shape[2]
    offsets = _cell_offsets(size, gamma, gamma + 1, vocab), _cell_offsets(size, gamma, gamma, vocab)
    for block in blocks:
        target, draft = (
            probs[block].astype(_at_least_float64(probs.dtype), copy=False)
            for probs in (target_probs, draft_probs)
        )  # (b, gamma+1, V), (b, gamma, V)
        if check_rows and not (_is_law(target) and _is_law(draft)):
            rng.bit_generator.state = state
            _check_laws(target, draft)  # raises, naming the input and its fault
        probs = target, rule.seen_q(draft)
        accepted[block], final[block] = _verify_block(
            probs, draft_tokens[block], offsets, u_tests[block], u_final[block], rule
        )
    return accepted, _emitted(draft_tokens, accepted, final)


def _verify_block(probs, draft_tokens, offsets, u_tests, u_final, rule):
    """(accepted (b,), final token (b,)) of one block, given its uniforms (b, gamma) and (b,)."""
    (target, seen), gamma = probs, draft_tokens.shape[1]
    p_x, q_x = (_entries(a, draft_tokens, o) for a, o in zip(probs, offsets))  # (b, gamma)
    accepted = _accepted_count(rule.accept(p_x, q_x), u_tests)
    p_n = _rows_at(target, accepted)  # (b, V): the target where the step ends
    q_n = _rows_at(seen, np.minimum(accepted, gamma - 1)) if gamma else p_n
    return accepted, _final_token(p_n, q_n, accepted == gamma, u_final, rule)
