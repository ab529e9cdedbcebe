"""A minimal runner for model tests: builds ``ForwardBatch``/``KVCache`` by hand.

Sequences get pool blocks from a shuffled free list (so a model that ignores block tables
reads someone else's keys), and any mix of prefill chunks and decode tokens can run in one
step, packed as the contract says (prefill rows first, decode rows after). It stands in
for the scheduler, which these tests do not need.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.core.forward_batch import DecodeMeta, ForwardBatch, PrefillMeta
from engine.kv.cache import KVCache, KVCacheShape
from engine.model.base import CausalLM
from kernels import get_backend


@dataclass
class Seq:
    tokens: list[int]
    computed: int = 0
    blocks: list[int] = field(default_factory=list)


class PagedHarness:
    def __init__(self, model: CausalLM, num_blocks: int = 64, block_tokens: int = 16,
                 seed: int = 0) -> None:
        spec = model.spec
        self.model = model
        self.block_tokens = block_tokens
        device = next(model.parameters()).device
        self.device = device
        self.kv = KVCache(KVCacheShape(spec.num_layers, num_blocks, block_tokens,
                                       spec.num_kv_heads, spec.head_dim, spec.dtype), device)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.seqs: dict[str, Seq] = {}
        self.backend = get_backend("torch")

    def add(self, name: str, tokens: list[int]) -> None:
        self.seqs[name] = Seq(list(tokens))

    def append(self, name: str, token: int) -> None:
        self.seqs[name].tokens.append(int(token))

    def _reserve(self, seq: Seq, length: int) -> None:
        while len(seq.blocks) * self.block_tokens < length:
            seq.blocks.append(self.free.pop())

    def _table(self, seqs: list[Seq], width: int) -> torch.Tensor:
        table = torch.full((len(seqs), width), -1, dtype=torch.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.blocks)] = torch.tensor(s.blocks, dtype=torch.int32)
        return table.to(self.device)

    def step(
        self,
        prefill: Sequence[tuple[str, int]] = (),
        decode: Sequence[str] = (),
        all_rows: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Run prefill chunks ``(name, n_tokens)`` and one decode token per ``decode`` name;
        returns each sequence's logits: the chunk's last row (every row if ``all_rows``)."""
        ids: list[int] = []
        pos: list[int] = []
        cu = [0]
        rows: dict[str, list[int]] = {}
        pre_seqs, dec_seqs = [], []
        for name, n in prefill:
            s = self.seqs[name]
            lo, hi = s.computed, s.computed + n
            if hi > len(s.tokens) or n < 1:
                raise ValueError(f"{name}: chunk {lo}..{hi} beyond {len(s.tokens)} tokens")
            self._reserve(s, hi)
            first = len(ids)
            ids += s.tokens[lo:hi]
            pos += range(lo, hi)
            cu.append(len(ids))
            rows[name] = list(range(first, len(ids))) if all_rows else [len(ids) - 1]
            pre_seqs.append(s)
        n_pre = len(ids)
        for name in decode:
            s = self.seqs[name]
            if s.computed + 1 != len(s.tokens):
                raise ValueError(f"{name}: decode needs exactly one new token")
            self._reserve(s, s.computed + 1)
            ids.append(s.tokens[-1])
            pos.append(s.computed)
            rows[name] = [len(ids) - 1]
            dec_seqs.append(s)
        bt = self.block_tokens
        all_seqs = pre_seqs + dec_seqs
        slot: list[int] = []
        for s, (_, n) in zip(pre_seqs, prefill, strict=True):
            slot += [s.blocks[p // bt] * bt + p % bt for p in range(s.computed, s.computed + n)]
        for s in dec_seqs:
            slot.append(s.blocks[s.computed // bt] * bt + s.computed % bt)
        width = max(len(s.blocks) for s in all_seqs) + 1
        dev = self.device

        def i32(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int32, device=dev)

        pre_meta = dec_meta = None
        if pre_seqs:
            pre_meta = PrefillMeta(
                cu_seqlens_q=i32(cu),
                block_tables=self._table(pre_seqs, width),
                seq_lens=i32([s.computed + n for s, (_, n) in zip(pre_seqs, prefill,
                                                                   strict=True)]),
            )
        if dec_seqs:
            dec_meta = DecodeMeta(block_tables=self._table(dec_seqs, width),
                                  seq_lens=i32([s.computed + 1 for s in dec_seqs]))
        order = [r for name in [n for n, _ in prefill] + list(decode) for r in rows[name]]
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slot, dtype=torch.int64, device=dev),
            num_prefill_tokens=n_pre,
            prefill=pre_meta,
            decode=dec_meta,
            logits_indices=torch.tensor(order, dtype=torch.int64, device=dev),
            backend=self.backend,
        )
        logits = self.model(batch, self.kv)
        out: dict[str, torch.Tensor] = {}
        at = 0
        for name in [n for n, _ in prefill] + list(decode):
            k = len(rows[name])
            out[name] = logits[at: at + k]
            at += k
        for name, n in prefill:
            self.seqs[name].computed += n
        for s in dec_seqs:
            s.computed += 1
        return out

    def prefill(self, name: str, chunks: list[int], all_rows: bool = True) -> torch.Tensor:
        """Prefill ``name`` in chunks of the given sizes; every row's logits, concatenated."""
        return torch.cat([self.step(prefill=[(name, n)], all_rows=all_rows)[name]
                          for n in chunks])

    def greedy(self, name: str, first_logits: torch.Tensor, steps: int
               ) -> tuple[list[int], torch.Tensor]:
        """``steps`` greedy tokens after a prefill whose last logits are ``first_logits``;
        returns the tokens and the logits each was chosen from."""
        tokens, logits = [], [first_logits]
        for i in range(steps):
            tok = int(logits[-1].argmax())
            tokens.append(tok)
            self.append(name, tok)
            if i + 1 < steps:
                logits.append(self.step(decode=[name])[name][0])
        return tokens, torch.stack(logits)
