"""Bounded replay's rows stop at the last sliding layer (``RowCut``).

A replayed token (positions ``[s, h·B)`` of ``bounded_replay.plan``) exists to rebuild the
sliding layers' KV of the last window: its logits are never read and its full-attention KV
is the cached one (the full layers do not write it). So above the model's **last sliding
layer** its hidden state feeds nothing, and in that layer only its K/V does (what the new
tokens and every later decode step read). A step's replayed rows therefore run layers
``0 … cut − 1`` whole and the cut layer's norm, projection and RoPE up to the KV write;
the cut layer's attention, output projection and MLP, every layer above and the final norm
run the remaining rows only. Layers below the cut stay whole, full-attention ones included:
their outputs feed sliding layers above them.

The remaining rows are described by a ``ForwardBatch`` of their own (``RowCut.tail``): a
chunk's replayed rows come before its new rows (replay start, then the hit's end, then the
prompt's tail), so each prefill chunk keeps its **last** rows, which is what the kernels'
``cu_seqlens_q`` / ``seq_lens`` already describe (a chunk is the last tokens of its
sequence); a chunk left with none leaves the tail's prefill metadata, and decode rows are
never cut. Nothing else changes for the rows kept: under batch-invariant numerics their
logits are bitwise those without the cut (``tests/engine/core/test_row_cut.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from engine.core.forward_batch import ForwardBatch, PrefillMeta, RowCut
from engine.errors import EngineIntegrityError


def last_sliding_layer(layer_windows: Sequence[int | None]) -> int | None:
    """Where a replayed row stops: the last layer with a window (None: no sliding layer,
    so nothing is ever replayed)."""
    sliding = [i for i, w in enumerate(layer_windows) if w is not None]
    return sliding[-1] if sliding else None


def cut_rows(batch: ForwardBatch, keep: Sequence[bool], layer: int) -> RowCut:
    """``batch`` with the rows where ``keep`` is False stopping at ``layer``. Raises
    ``EngineIntegrityError`` where a cut row is one the kernels or the sampler still need
    (a chunk's kept rows not its last ones, a decode row, a logits row)."""
    n = batch.num_tokens
    if len(keep) != n:
        raise EngineIntegrityError(f"the cut names {len(keep)} rows of a {n}-row step")
    dev = batch.input_ids.device
    n_pre = batch.num_prefill_tokens
    if not all(keep[n_pre:]):
        raise EngineIntegrityError("a decode row cannot stop below the last layer")
    rows = torch.tensor([i for i, k in enumerate(keep) if k], dtype=torch.int64, device=dev)
    remap = torch.full((n,), -1, dtype=torch.int64, device=dev)
    remap[rows] = torch.arange(rows.shape[0], dtype=torch.int64, device=dev)
    logits = remap[batch.logits_indices] if n else batch.logits_indices
    if bool((logits < 0).any()):
        raise EngineIntegrityError("a row whose logits are read cannot stop below the last "
                                   "layer")

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, rows)

    tail = ForwardBatch(
        input_ids=take(batch.input_ids), positions=take(batch.positions),
        slot_mapping=take(batch.slot_mapping),
        num_prefill_tokens=sum(1 for k in keep[:n_pre] if k),
        prefill=_prefill_tail(batch.prefill, keep), decode=batch.decode,
        logits_indices=logits, backend=batch.backend,
        full_slot_mapping=(None if batch.full_slot_mapping is None
                           else take(batch.full_slot_mapping)),
        layer_groups=batch.layer_groups,
        group_slot_mappings=tuple(take(s) for s in batch.group_slot_mappings),
    )
    return RowCut(layer=layer, rows=rows, tail=tail)


def _prefill_tail(pre: PrefillMeta | None, keep: Sequence[bool]) -> PrefillMeta | None:
    if pre is None:
        return None
    cu = pre.cu_seqlens_q.tolist()
    kept_q: list[int] = []
    chunks: list[int] = []
    for b in range(len(cu) - 1):
        chunk = keep[cu[b]:cu[b + 1]]
        k = sum(1 for x in chunk if x)
        if not all(chunk[len(chunk) - k:]):
            raise EngineIntegrityError(
                f"prefill chunk {b}: the rows kept past the cut must be its last ones "
                f"(a chunk is the last tokens of its sequence)")
        if k:
            chunks.append(b)
            kept_q.append(k)
    if not chunks:
        return None
    dev = pre.cu_seqlens_q.device
    sel = torch.tensor(chunks, dtype=torch.int64, device=dev)
    offsets = [0]
    for k in kept_q:
        offsets.append(offsets[-1] + k)

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, sel)

    return replace(
        pre, cu_seqlens_q=torch.tensor(offsets, dtype=pre.cu_seqlens_q.dtype, device=dev),
        block_tables=take(pre.block_tables), seq_lens=take(pre.seq_lens),
        sliding_kv_start=None if pre.sliding_kv_start is None else take(pre.sliding_kv_start),
        group_tables=tuple(take(t) for t in pre.group_tables))
