"""Chapter 8's row counts: the gemm kernel's row blocks, and the products timed at each count."""

import pytest

import specdec.transformer as tt


@pytest.mark.parametrize(
    "rows, blocks",
    [
        (1, ()),
        (2, (2,)),
        (3, (2, 1)),
        (4, (4,)),
        (5, (4, 1)),
        (6, (4, 2)),
        (7, (4, 2, 1)),
        (8, (8,)),
        (12, (12,)),
        (15, (12, 2, 1)),
        (31, (12, 12, 4, 2, 1)),
    ],
)
def test_kernel_blocks_follow_openblas_haswell_loop(rows, blocks):
    assert tt.kernel_blocks(rows) == blocks


def test_kernel_blocks_cover_every_row_once_largest_first():
    for rows in range(2, 60):
        blocks = tt.kernel_blocks(rows)
        assert sum(blocks) == rows and list(blocks) == sorted(blocks, reverse=True)
    assert tt.kernel_blocks(7, blocks=(8, 1)) == (1,) * 7  # the control: other blocks, other split


@pytest.mark.parametrize("rows", [0, -1, 2.0, True])
def test_kernel_blocks_refuse_a_count_that_is_not_positive(rows):
    with pytest.raises(ValueError, match="rows"):
        tt.kernel_blocks(rows)


def test_product_times_times_each_matrix_at_each_count():
    times = tt.product_times(tt.Config(d_model=32, n_layers=1, n_heads=4), [1, 2, 3], repeats=2)
    assert sorted(times) == ["w_down", "w_o", "w_qkv", "w_up"]
    assert all(t.shape == (3,) and (t >= 0).all() for t in times.values())


def test_machine_names_the_kernels_openblas_chose():
    assert isinstance(tt.machine()["architecture"], str)
