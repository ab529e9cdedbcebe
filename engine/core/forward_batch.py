"""What one engine step hands the model: the contract between the runner and the model.

A step packs prefill chunks first and decode tokens after them (as vLLM v1 does), so one
forward pass serves both; every attention layer reads its metadata from here and calls the
kernels with it (``kernels.paged_prefill_attention`` for rows ``[0, num_prefill_tokens)``,
``kernels.paged_decode_attention`` for the rest) after writing the step's K/V to
``slot_mapping``.

A bounded replay's step may carry a ``RowCut``: its replayed rows stop at the model's last
sliding layer (their logits are never read, and the full-attention layers above keep the
cached KV), so the layers above it run only the other rows, described by ``RowCut.tail``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels import AttentionBackend


@dataclass(frozen=True, slots=True)
class PrefillMeta:
    """Ragged prefill chunks: chunk ``b`` is rows ``cu_seqlens_q[b] … cu_seqlens_q[b+1]``,
    the last tokens of a sequence now ``seq_lens[b]`` tokens long."""

    cu_seqlens_q: torch.Tensor  # [P + 1] int32
    block_tables: torch.Tensor  # [P, width] int32, −1 padded
    seq_lens: torch.Tensor  # [P] int32, KV length including this chunk
    # Positions before which the sliding-window layers hold no KV (bounded replay); the
    # full-attention layers always see the whole sequence. None: every layer has all KV.
    sliding_kv_start: torch.Tensor | None = None  # [P] int32
    # Hybrid pool: per sliding KV group, its block table (the null page where the group
    # holds no page). Empty: every layer reads ``block_tables``.
    group_tables: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True, slots=True)
class DecodeMeta:
    """One new token per sequence, at position ``seq_lens[b] − 1``."""

    block_tables: torch.Tensor  # [D, width] int32
    seq_lens: torch.Tensor  # [D] int32
    sliding_kv_start: torch.Tensor | None = None  # [D] int32
    group_tables: tuple[torch.Tensor, ...] = ()  # as ``PrefillMeta.group_tables``


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute positions (RoPE)
    slot_mapping: torch.Tensor  # [T] int64 flat pool slot of each token's K/V
    num_prefill_tokens: int
    prefill: PrefillMeta | None
    decode: DecodeMeta | None
    logits_indices: torch.Tensor  # [N] int64 rows whose next-token logits are needed
    backend: AttentionBackend
    # Slots of the full-attention layers' K/V when they differ from ``slot_mapping``: a
    # bounded replay keeps the cached full-layer KV of the hit (−1: not written) while its
    # sliding layers write theirs. None: every layer writes at ``slot_mapping``.
    full_slot_mapping: torch.Tensor | None = None  # [T] int64
    # Hybrid pool (``engine.kv.kv_groups``): per layer its KV group (0: full attention),
    # and per sliding group the slots its layers write. Empty: one group.
    layer_groups: tuple[int, ...] = ()
    group_slot_mappings: tuple[torch.Tensor, ...] = ()
    # Replayed rows that stop at a layer (bounded replay, ``engine.core.row_cut``); None:
    # every row runs every layer. ``logits_indices`` then number the tail's rows.
    row_cut: RowCut | None = None

    def kv_group(self, layer: int) -> int:
        return self.layer_groups[layer] if self.layer_groups else 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def validate(self, k_pool: torch.Tensor, v_pool: torch.Tensor) -> None:
        """Check the step's metadata against a layer's pools (every layer's are alike),
        once per step: each layer then calls the kernels with ``validated=True``."""
        pre, dec = self.prefill, self.decode
        kernels.check_step_metadata(
            k_pool, v_pool, self.num_tokens, self.slot_mapping,
            None if pre is None else (pre.cu_seqlens_q, pre.block_tables, pre.seq_lens,
                                      pre.sliding_kv_start),
            None if dec is None else (dec.block_tables, dec.seq_lens, dec.sliding_kv_start),
            self.full_slot_mapping)
        for g, slots in enumerate(self.group_slot_mappings):
            kernels.check_step_metadata(
                k_pool, v_pool, self.num_tokens, slots,
                None if pre is None else (pre.cu_seqlens_q, pre.group_tables[g], pre.seq_lens,
                                          pre.sliding_kv_start),
                None if dec is None else (dec.group_tables[g], dec.seq_lens,
                                          dec.sliding_kv_start))
        if self.row_cut is not None:
            self.row_cut.tail.validate(k_pool, v_pool)

    def write_batch(self, layer: int) -> ForwardBatch:
        """The rows whose K/V ``layer`` writes: every row up to the cut layer, then the
        tail's."""
        cut = self.row_cut
        return self if cut is None or layer <= cut.layer else cut.tail

    def read_batch(self, layer: int) -> ForwardBatch:
        """The rows whose queries ``layer`` attends for: every row below the cut layer,
        from it on the tail's (the cut layer writes every row's K/V, attends for the
        tail's)."""
        cut = self.row_cut
        return self if cut is None or layer < cut.layer else cut.tail


@dataclass(frozen=True, slots=True)
class RowCut:
    """Rows ``rows`` of a step (ascending) run every layer; the others stop at ``layer``,
    of which they need only the K/V (its attention, output projection and MLP, and every
    layer above, run ``rows`` only). ``tail`` is the metadata of ``rows`` alone, in their
    order: the attention of ``layer`` and above reads it (``ForwardBatch.read_batch``)."""

    layer: int
    rows: torch.Tensor  # [K] int64, indices into the step's rows
    tail: ForwardBatch
