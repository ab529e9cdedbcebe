"""The group encoder: every new row lands behind its own header, whatever rows are new."""

from __future__ import annotations

import mmap

import numpy as np
import xxhash

from kvstore.block import HEADER_BYTES
from storage_nodes.ssd.encoder import Encoder
from tests.storage_nodes.ssd.helpers import chain, rows, small_ns


def test_scattered_new_rows_are_encoded_exactly(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 23)
    present = keys[1::3]
    t.put(ns, present, rows(ns, present))
    r = t.put(ns, keys, rows(ns, keys))  # the new rows come in runs of two
    assert (r.inserted, r.present) == (23 - len(present), len(present))
    dst = bytearray(23 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 23
    assert bytes(dst) == rows(ns, keys)
    t.check_integrity()


def test_encoder_copies_and_hashes_any_rows() -> None:
    bb, sb, n = 8192, 12288, 11
    data = np.random.default_rng(3).integers(0, 256, 20 * bb, dtype=np.uint8)
    picks = [0, 1, 2, 7, 9, 10, 11, 12, 19, 4, 3]  # runs, gaps and a step backwards
    stage = mmap.mmap(-1, n * sb)
    enc = Encoder()
    try:
        job = enc.start(memoryview(stage), sb, memoryview(data), bb, picks, 4, True)
        sums = [s for j in range(0, n, 4) for s in job.ready(j)]
        job.finish()
    finally:
        enc.close()
    for j, i in enumerate(picks):
        row = data[i * bb : (i + 1) * bb].tobytes()
        assert stage[j * sb + HEADER_BYTES : j * sb + HEADER_BYTES + bb] == row
        assert sums[j] == xxhash.xxh3_64_intdigest(row)
