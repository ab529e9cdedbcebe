"""The Python copiers' unit of work (kvstore/row_copy_task.py): how a call's rows are
grouped into units, each one copy. What the copies then hold is tested through the
copiers in test_row_copy.py."""

from __future__ import annotations

from kvstore.row_copy_task import UNIT_BYTES, row_units


def test_units_are_runs_of_adjacent_rows_capped_in_size() -> None:
    bb = UNIT_BYTES // 4
    offsets = [0, bb, 2 * bb, 3 * bb, 4 * bb, 9 * bb, 8 * bb, 10 * bb]
    assert row_units(offsets, bb) == [
        (0, 4, 0),  # capped at UNIT_BYTES
        (4, 1, 4 * bb),
        (5, 1, 9 * bb),  # descending: not adjacent in copy order
        (6, 1, 8 * bb),
        (7, 1, 10 * bb),
    ]
    assert row_units([0, 1 << 30], UNIT_BYTES * 2) == [(0, 1, 0), (1, 1, 1 << 30)]
