"""fp8rl.verl_ext.layout: with W data-parallel ranks, each global PPO mini-batch holds the
rows it holds with one rank (verl dispatches contiguous 1/W shares; each rank cuts its share
into the step's mini-batches in order)."""

from __future__ import annotations

import pytest

from fp8rl.verl_ext.layout import rank_layout


def global_mini_batches(layout: list[int], ranks: int, mini_batches: int) -> list[set[int]]:
    """What verl's dispatch and each rank's mini-batching make of a laid-out batch."""
    share = len(layout) // ranks
    out: list[set[int]] = [set() for _ in range(mini_batches)]
    for r in range(ranks):
        mine = layout[r * share : (r + 1) * share]
        size = share // mini_batches
        for m in range(mini_batches):
            out[m] |= set(mine[m * size : (m + 1) * size])
    return out


@pytest.mark.parametrize(("rows", "ranks", "mini_batches"), [(16, 1, 2), (16, 2, 2), (64, 4, 4)])
def test_every_mini_batch_holds_the_one_rank_rows(rows: int, ranks: int, mini_batches: int):
    layout = rank_layout(rows, ranks, mini_batches)
    assert sorted(layout) == list(range(rows))  # a permutation
    one_rank = global_mini_batches(list(range(rows)), 1, mini_batches)
    assert global_mini_batches(layout, ranks, mini_batches) == one_rank


def test_two_ranks_two_mini_batches_concretely_and_one_rank_is_the_identity():
    assert rank_layout(8, 2, 2) == [0, 1, 4, 5, 2, 3, 6, 7]
    assert rank_layout(8, 1, 2) == list(range(8))


def test_a_batch_that_does_not_split_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="a multiple of 4"):
        rank_layout(10, 2, 2)
