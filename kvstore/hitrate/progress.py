"""The progress bar of a one-pass run: block accesses replayed, with an ETA.

The total is known once it can be: a kv-cache-tester run loads every session before the
first request (sessions are merged by time), so the total is exact from the first batch;
streaming formats (JSONL, Parquet, Arrow) give the share of their bytes read, and the
total is extrapolated from the accesses per byte so far.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvstore.hitrate.batches import AccessBatch
from kvstore.hitrate.readers import TraceReader


def batch_progress(reader: TraceReader):  # type: ignore[no-untyped-def]
    def wrap(batches: Iterator[AccessBatch]) -> Iterator[AccessBatch]:
        from tqdm import tqdm

        bar = tqdm(unit=" accesses", unit_scale=True, mininterval=0.5, leave=False)
        done = 0
        try:
            for batch in batches:
                done += batch.accesses
                total = reader.total_accesses
                if total is None and reader.bytes_done > 0:
                    total = round(done * reader.total_bytes / reader.bytes_done)
                if total is not None:
                    bar.total = max(total, done)
                bar.update(batch.accesses)
                yield batch
        finally:
            bar.close()

    return wrap
