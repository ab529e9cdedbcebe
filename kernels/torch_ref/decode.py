"""Decode attention in plain torch, batched over the sequences of a step.

Decode reads every cached key once and does little arithmetic per byte, so what costs is
memory traffic and per-op overhead, not the attention itself. So, unlike prefill (one
sequence at a time, ``attention.py``), a decode step walks the keys of *all* its
sequences together in rounds of ``DECODE_CHUNK_TOKENS`` tokens per sequence:

- one ``index_select`` per round gathers the round's pool blocks of every sequence into a
  buffer allocated once per call, small enough to stay in cache (fresh large buffers cost
  page faults on the CPU, and the gathered copy is read back at once);
- one attention call per round covers every sequence, each KV head's query group folded
  into rows (one query per sequence sees the same keys from every row, so a mask, when a
  round is ragged, is per key and broadcasts over the rows);
- the rounds' partial results merge at the end through their log-sum-exp.

A sequence leaves the rounds once its keys are done, so a ragged batch costs the sum of
its lengths (rounded up to blocks), not its longest times the batch.

Every layer of a step passes the same metadata, so the rounds, block ids and masks are
derived once per step (``_plan``: reused while a layer's metadata equals the last one's) and
each layer only gathers and attends. A lone sequence whose blocks are consecutive in the pool
(a fresh pool's usual layout) is read in place, with no copy at all; one round (every
sequence's keys within ``DECODE_CHUNK_TOKENS``) needs no merge.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from kernels.torch_ref.chunk import attend_keys_biased

#: Keys per sequence per round (rounded down to whole blocks, at least one block).
DECODE_CHUNK_TOKENS = 1024

_scratch = threading.local()


def _workspace(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer kept per thread, dtype, device and inference mode across calls: a fresh
    multi-MiB allocation each step would be a fresh mapping on the CPU, paid in page
    faults. (A tensor made under ``torch.inference_mode`` cannot be written outside it.)"""
    pool: dict[tuple[torch.dtype, torch.device, bool], torch.Tensor] = (
        _scratch.__dict__.setdefault("buffers", {}))
    key = (dtype, device, torch.is_inference_mode_enabled())
    buf = pool.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        pool[key] = buf
    return buf[:numel]


@dataclass(frozen=True, slots=True)
class _Round:
    """One round of a step's decode: which sequences, which blocks, which keys masked."""

    act: torch.Tensor | None  # rows still reading keys (None: every row)
    rows: int
    blocks: int  # per sequence
    ids: torch.Tensor | None  # flat block ids [rows × blocks]; None: ``first`` onwards
    first: int  # the one run of consecutive blocks read in place when ``ids`` is None
    bias: torch.Tensor | None  # additive mask [rows, 1, 1, blocks × bt] in q's dtype
    empty: torch.Tensor | None  # rows with no visible key this round (bool [rows])


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every layer of a step derives alike from its metadata, derived once."""

    inputs: tuple[torch.Tensor, ...]  # copies of the metadata it was derived from
    window: int | None
    dtype: torch.dtype
    block_tokens: int
    per_round: int
    rounds: tuple[_Round, ...]


def _plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, kv_start: torch.Tensor | None,
          window: int | None, bt: int, dtype: torch.dtype) -> _Plan:
    """The step's plan: the last one again when this layer's metadata equals it (every
    layer of a step passes the same; sliding and full layers differ by ``window``)."""
    cache: list[_Plan] = _scratch.__dict__.setdefault("plans", [])
    inputs = (block_tables, seq_lens) if kv_start is None else (block_tables, seq_lens,
                                                                 kv_start)
    for p in cache:
        if (p.window == window and p.dtype == dtype and p.block_tokens == bt
                and p.per_round == _per_round(bt) and len(p.inputs) == len(inputs)
                and all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                        for a, b in zip(p.inputs, inputs, strict=True))):
            return p
    plan = _make_plan(block_tables, seq_lens, kv_start, window, bt, dtype)
    cache.insert(0, plan)
    del cache[_PLANS_KEPT:]
    return plan


#: Plans kept per thread: a step has at most two (full and sliding layers).
_PLANS_KEPT = 2


def _make_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor,
               kv_start: torch.Tensor | None, window: int | None, bt: int,
               dtype: torch.dtype) -> _Plan:
    device = block_tables.device
    batch = seq_lens.shape[0]
    lens = seq_lens.to(torch.int64)
    lo = kv_start.to(torch.int64) if kv_start is not None else torch.zeros_like(lens)
    if window is not None:
        lo = torch.maximum(lo, lens - window)
    first_block = lo // bt
    n_blocks = (lens + bt - 1) // bt - first_block
    # The host needs the loop bounds to size rounds and buffers: one sync per step.
    lo_h, lens_h, first_h, nblk_h = torch.stack([lo, lens, first_block, n_blocks]).tolist()
    per_round = _per_round(bt)
    rounds = -(-max(nblk_h) // per_round)
    # Every block id the step reads, [batch, rounds × per_round]; columns past a
    # sequence's last block repeat that block and are masked out.
    cols = first_block[:, None] + torch.arange(rounds * per_round, device=device)
    last = first_block + n_blocks - 1
    ids = block_tables.to(torch.int64).gather(1, torch.minimum(cols, last[:, None]).clamp(
        max=block_tables.shape[1] - 1))
    out = []
    for r in range(rounds):
        b0 = r * per_round
        active = [b for b in range(batch) if nblk_h[b] > b0]
        act = torch.tensor(active, device=device) if len(active) < batch else None
        sel: slice | torch.Tensor = slice(None) if act is None else act
        nr = min(per_round, max(nblk_h[b] for b in active) - b0)
        round_ids = ids[sel, b0 : b0 + nr].flatten()
        bias = empty = None
        if any(_ragged(first_h[b], lo_h[b], lens_h[b], b0, nr, bt) for b in active):
            pos = (cols[sel, b0 : b0 + nr, None] * bt
                   + torch.arange(bt, device=device)).flatten(1)
            valid = (pos >= lo[sel][:, None]) & (pos < lens[sel][:, None])
            bias = torch.zeros(valid.shape, dtype=dtype, device=device).masked_fill_(
                ~valid, float("-inf"))[:, None, None, :]
            none_seen = ~valid.any(dim=1)
            empty = none_seen if bool(none_seen.any()) else None
        host_ids = round_ids.tolist()
        run = len(active) == 1 and host_ids == list(range(host_ids[0],
                                                          host_ids[0] + len(host_ids)))
        out.append(_Round(act, len(active), nr, None if run else round_ids, host_ids[0],
                          bias, empty))
    inputs = tuple(t.clone() for t in ((block_tables, seq_lens) if kv_start is None
                                       else (block_tables, seq_lens, kv_start)))
    return _Plan(inputs, window, dtype, bt, per_round, tuple(out))


def _per_round(bt: int) -> int:
    return max(1, DECODE_CHUNK_TOKENS // bt)


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    kv_start: torch.Tensor | None,
) -> torch.Tensor:
    batch, heads, head_dim = q.shape
    _, bt, kv_heads, _ = k_pool.shape
    device = q.device
    if batch == 0:
        return torch.empty_like(q)
    plan = _plan(block_tables, seq_lens, kv_start, window, bt, q.dtype)
    per_round = plan.per_round
    qf = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    scratch: torch.Tensor | None = None
    outs, lses = [], []
    for rnd in plan.rounds:
        count = rnd.rows * rnd.blocks
        if rnd.ids is None:  # one run of consecutive blocks: read the pool in place
            k = k_pool[rnd.first : rnd.first + count]
            v = v_pool[rnd.first : rnd.first + count]
        else:
            if scratch is None:
                shape = (batch * per_round, bt, kv_heads, head_dim)
                scratch = _workspace(2 * batch * per_round * bt * kv_heads * head_dim,
                                     k_pool.dtype, device).view(2, *shape)
            k = torch.index_select(k_pool, 0, rnd.ids, out=scratch[0, :count])
            v = torch.index_select(v_pool, 0, rnd.ids, out=scratch[1, :count])
        k = k.view(rnd.rows, rnd.blocks * bt, kv_heads, head_dim)
        v = v.view(rnd.rows, rnd.blocks * bt, kv_heads, head_dim)
        q_round = qf if rnd.act is None else qf[rnd.act]
        out, lse = attend_keys_biased(q_round, k, v, scale, rnd.bias, rnd.empty)
        if len(plan.rounds) == 1:  # every sequence's keys in one round: nothing to merge
            return out.reshape(batch, heads, head_dim).to(q.dtype)
        if rnd.act is not None:  # sequences done with their keys take no weight here
            out = torch.zeros(qf.shape, dtype=torch.float32, device=device).index_copy_(
                0, rnd.act, out)
            lse = torch.full(qf.shape[:3], float("-inf"), device=device).index_copy_(
                0, rnd.act, lse)
        outs.append(out)
        lses.append(lse)
    # Merge every round at once through the log-sum-exp (each sequence saw some key).
    lse_all = torch.stack(lses)
    weights = torch.exp(lse_all - torch.logsumexp(lse_all, dim=0))
    merged = (torch.stack(outs) * weights[..., None]).sum(dim=0)
    return merged.reshape(batch, heads, head_dim).to(q.dtype)


def _ragged(first_block: int, lo: int, length: int, b0: int, nr: int, bt: int) -> bool:
    """Whether a round's gathered tokens include some the sequence must not see."""
    start = (first_block + b0) * bt
    return start < lo or start + nr * bt > length

