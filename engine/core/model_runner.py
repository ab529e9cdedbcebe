"""One step on the model: the scheduler's batch as a ``ForwardBatch``, the forward pass,
the sampled tokens.

A sequence admitted with a bounded replay (``seq.plan``) runs its replayed tokens like any
prefill, except that its full-attention layers do not write K/V below the hit's end (they
keep the cached KV: ``full_slot_mapping``) and its sliding layers see no key before the
replay start (``sliding_kv_start``), in the prefill and in every decode step after it.
Its replayed rows (those full layers do not write) stop at the model's last sliding layer
(``engine.core.row_cut``) unless the engine is told otherwise (``row_cut=False``: the A/B
of ``bench/bench_replay.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import torch

from engine.core.forward_batch import DecodeMeta, ForwardBatch, PrefillMeta
from engine.core.row_cut import cut_rows, last_sliding_layer
from engine.core.sampler import sample
from engine.core.scheduled_batch import ScheduledBatch
from engine.core.sequence import Sequence
from engine.kv.cache import KVCache
from engine.kv.kv_manager import KVManager
from engine.model.base import CausalLM
from kernels import AttentionBackend


class ModelRunner:
    def __init__(
        self, model: CausalLM, cache: KVCache, blocks: KVManager, backend: AttentionBackend,
        *, row_cut: bool = True,
    ) -> None:
        self.model = model
        self.cache = cache
        self.blocks = blocks
        self.backend = backend
        self.device = cache.device
        # Observers of every step's logits (rows in the order of the sampled sequences):
        # how tests compare runs by logits, as the near-tie rule needs.
        self.logits_observers: list[Callable[[list[Sequence], torch.Tensor], None]] = []
        # Tokens run through the model, counted here (tests check the replay's size on it).
        self.counters: Counter[str] = Counter()
        layout = blocks.layout
        self._layer_groups = (tuple(layout.group_of(i) for i in range(layout.num_layers))
                              if layout.is_hybrid else ())
        # Where a replayed row stops (None: it runs every layer).
        self.cut_layer = last_sliding_layer(model.spec.layer_windows) if row_cut else None

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> dict[int, int]:
        """Forward ``batch``; returns the sampled token of every sequence that reached the
        end of its tokens this step (seq_id -> token)."""
        fb, sampled_seqs = self.prepare(batch)
        logits = self.model(fb, self.cache)
        self.counters["forward_tokens_total"] += fb.num_tokens
        self.counters["forward_steps_total"] += 1
        if fb.row_cut is not None:
            self.counters["cut_rows_total"] += fb.num_tokens - int(fb.row_cut.rows.shape[0])
        for observe in self.logits_observers:
            observe(sampled_seqs, logits)
        tokens = sample(logits, sampled_seqs)
        return {seq.seq_id: tok for seq, tok in zip(sampled_seqs, tokens, strict=True)}

    def prepare(self, batch: ScheduledBatch) -> tuple[ForwardBatch, list[Sequence]]:
        bt = self.blocks.block_tokens
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        full_slots: list[int] = []
        kv_starts: list[int] = []
        logits_rows: list[int] = []
        sampled: list[Sequence] = []
        tables: list[list[int]] = []
        lens: list[int] = []
        cu = [0]
        # A hybrid pool's sliding groups: per group, per sequence its table and the slots.
        layout = self.blocks.layout
        n_groups = layout.num_sliding_groups
        g_tables: list[list[list[int]]] = [[] for _ in range(n_groups)]
        g_slots: list[list[int]] = [[] for _ in range(n_groups)]

        def add(seq: Sequence, n: int) -> None:
            a = seq.num_computed_tokens
            table = self.blocks.block_ids(seq)
            ids.extend(seq.token_ids[a : a + n])
            positions.extend(range(a, a + n))
            mine = [table[p // bt] * bt + p % bt for p in range(a, a + n)]
            slots.extend(mine)
            plan = seq.plan
            keep_below = plan.full_write_start_tokens if plan is not None else 0
            full_slots.extend(s if p >= keep_below else -1
                              for p, s in zip(range(a, a + n), mine, strict=True))
            kv_starts.append(plan.sliding_kv_start_tokens if plan is not None else 0)
            tables.append(table)
            lens.append(a + n)
            if n_groups:
                pages = self.blocks.sliding.pages_of(seq.seq_id, range(len(table)))
                for g in range(n_groups):
                    row = [pg[g] for pg in pages]
                    g_tables[g].append(row)
                    g_slots[g].extend(row[p // bt] * bt + p % bt for p in range(a, a + n))
            if a + n == seq.num_tokens:
                logits_rows.append(len(ids) - 1)
                sampled.append(seq)

        for seq, n in batch.prefills:
            add(seq, n)
            cu.append(len(ids))
        num_prefill = len(ids)
        for seq in batch.decodes:
            add(seq, 1)
        p = len(batch.prefills)
        prefill = (
            PrefillMeta(
                cu_seqlens_q=self._i32(cu),
                block_tables=self._table(tables[:p]),
                seq_lens=self._i32(lens[:p]),
                sliding_kv_start=self._starts(kv_starts[:p]),
                group_tables=tuple(self._table(t[:p]) for t in g_tables),
            )
            if p
            else None
        )
        decode = (
            DecodeMeta(block_tables=self._table(tables[p:]), seq_lens=self._i32(lens[p:]),
                       sliding_kv_start=self._starts(kv_starts[p:]),
                       group_tables=tuple(self._table(t[p:]) for t in g_tables))
            if batch.decodes
            else None
        )
        fb = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            num_prefill_tokens=num_prefill,
            prefill=prefill,
            decode=decode,
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=self.device),
            backend=self.backend,
            full_slot_mapping=(None if full_slots == slots else
                               torch.tensor(full_slots, dtype=torch.int64, device=self.device)),
            layer_groups=self._layer_groups,
            group_slot_mappings=tuple(torch.tensor(sl, dtype=torch.int64, device=self.device)
                                      for sl in g_slots),
        )
        # Replayed rows: those whose full-layer KV is the cached one (slot −1).
        if self.cut_layer is not None and fb.full_slot_mapping is not None:
            fb = replace(fb, row_cut=cut_rows(fb, [s >= 0 for s in full_slots],
                                              self.cut_layer))
        return fb, sampled

    def _starts(self, starts: list[int]) -> torch.Tensor | None:
        # None when no sequence has a kv_start: the kernels' plain path.
        return self._i32(starts) if any(starts) else None

    def _i32(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def _table(self, tables: list[list[int]]) -> torch.Tensor:
        width = max(len(t) for t in tables)
        out = torch.full((len(tables), width), -1, dtype=torch.int32)
        for row, t in enumerate(tables):
            out[row, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return out.to(self.device)
