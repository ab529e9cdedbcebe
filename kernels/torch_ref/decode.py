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
"""

from __future__ import annotations

import threading

import torch

from kernels.torch_ref.chunk import attend_keys

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
    lens = seq_lens.to(torch.int64)
    lo = kv_start.to(torch.int64) if kv_start is not None else torch.zeros_like(lens)
    if window is not None:
        lo = torch.maximum(lo, lens - window)
    first_block = lo // bt
    n_blocks = (lens + bt - 1) // bt - first_block
    # One sync for the loop bounds: the host needs them to size rounds and buffers.
    lo_h, lens_h, first_h, nblk_h = torch.stack([lo, lens, first_block, n_blocks]).tolist()
    per_round = max(1, DECODE_CHUNK_TOKENS // bt)
    rounds = -(-max(nblk_h) // per_round)
    qf = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    shape = (batch * per_round, bt, kv_heads, head_dim)
    scratch = _workspace(2 * batch * per_round * bt * kv_heads * head_dim, k_pool.dtype,
                         device).view(2, *shape)
    # Every block id the step reads, [batch, rounds × per_round]; columns past a
    # sequence's last block repeat that block and are masked out.
    cols = first_block[:, None] + torch.arange(rounds * per_round, device=device)
    last = first_block + n_blocks - 1
    ids = block_tables.to(torch.int64).gather(1, torch.minimum(cols, last[:, None]).clamp(
        max=block_tables.shape[1] - 1))
    outs, lses = [], []
    for r in range(rounds):
        b0 = r * per_round
        active = [b for b in range(batch) if nblk_h[b] > b0]
        act = torch.tensor(active, device=device) if len(active) < batch else None
        sel: slice | torch.Tensor = slice(None) if act is None else act
        nr = min(per_round, max(nblk_h[b] for b in active) - b0)
        count = len(active) * nr
        round_ids = ids[sel, b0 : b0 + nr].flatten()
        k = torch.index_select(k_pool, 0, round_ids, out=scratch[0, :count])
        v = torch.index_select(v_pool, 0, round_ids, out=scratch[1, :count])
        k = k.view(len(active), nr * bt, kv_heads, head_dim)
        v = v.view(len(active), nr * bt, kv_heads, head_dim)
        valid = None
        if any(_ragged(first_h[b], lo_h[b], lens_h[b], b0, nr, bt) for b in active):
            pos = (cols[sel, b0 : b0 + nr, None] * bt
                   + torch.arange(bt, device=device)).flatten(1)
            valid = (pos >= lo[sel][:, None]) & (pos < lens[sel][:, None])
        out, lse = attend_keys(qf[sel], k, v, scale, valid)
        if act is not None:  # sequences done with their keys take no weight here
            out = torch.zeros(qf.shape, dtype=torch.float32, device=device).index_copy_(
                0, act, out)
            lse = torch.full(qf.shape[:3], float("-inf"), device=device).index_copy_(
                0, act, lse)
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

