"""Launch planning for the Triton kernels: tile shapes, warps, split-KV count, grid.

Host-side arithmetic only (no Triton import). The defaults were checked by compiling for
SM80, SM90 and SM100 (``python -m kernels.triton_backend.compile_check``: registers, spills,
shared memory); they have not been timed on a device yet.

- A program's rows are query tokens × the query heads of one KV head; ``tl.dot`` needs at
  least 16 rows, so decode pads a small group up to 16 rows (masked; decode is bound by
  reading KV, not by the padded multiply).
- Key tiles (``BLOCK_N``) shrink with the element size and head_dim so the K/V tiles,
  the scores and the accumulator fit the register file without spilling (float32's exact
  ``tl.dot`` is the costly case).
- Split-KV: decode has one program per (sequence, KV head), far fewer than a GPU's cores at
  small batch, so each sequence's keys are cut into ``num_splits`` splits read by separate
  programs: enough for ``programs_per_core`` programs per core, none shorter than
  ``min_split_tokens`` (below that the merge costs more than the parallelism buys). The same
  rule serves prefill, where it only splits a short chunk over a long prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

#: CUDA's limit on grid axes 1 and 2.
MAX_GRID_YZ = 65535


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """Tunables of the Triton backend; ``None`` picks the per-shape default."""

    prefill_rows: int | None = None  # query rows (tokens × group heads) per prefill program
    decode_rows: int = 16  # query rows per decode program (tl.dot's minimum M)
    key_tile_tokens: int | None = None  # keys per inner-loop tile (BLOCK_N)
    split_tokens: int | None = None  # fixed split length; None plans it per launch
    min_split_tokens: int = 256
    programs_per_core: int = 8
    max_scratch_bytes: int = 256 << 20  # float32 partial outputs of split-KV
    num_stages: int | None = None


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    block_q: int  # query tokens per program
    block_g: int  # query heads per program (the group, padded to a power of two)
    block_n: int
    block_d: int
    num_splits: int
    split_tokens: int  # multiple of block_n
    grid: tuple[int, int, int]  # (query tiles, sequences, kv_heads × splits)
    num_warps: int
    num_stages: int


def plan_attention(
    cfg: TritonConfig,
    *,
    decode: bool,
    batch: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    elem_bytes: int,
    total_q: int,
    max_q_len: int,
    max_seq_len: int,
    window: int | None,
    cores: int,
) -> AttentionPlan:
    block_d = max(16, next_pow2(head_dim))
    wide = elem_bytes >= 4
    g2 = next_pow2(group)
    if decode:
        rows = cfg.decode_rows
    elif cfg.prefill_rows is not None:
        rows = cfg.prefill_rows
    else:
        rows = 32 if wide and block_d >= 256 else 64
    rows = max(16, g2, rows)
    block_q = 1 if decode else max(1, rows // g2)
    block_g = rows // block_q
    if cfg.key_tile_tokens is not None:
        block_n = cfg.key_tile_tokens
    elif wide:
        block_n = 32 if block_d <= 64 else 16
    else:
        block_n = 64 if block_d <= 128 else 32
    num_warps = 8 if rows >= 64 else 4
    if cfg.num_stages is not None:
        num_stages = cfg.num_stages
    else:
        num_stages = 1 if wide and block_d >= 256 else 2
    q_tiles = cdiv(max_q_len, block_q)
    # Key tiles a query tile visits: from its first visible key rounded down to block_n,
    # to its last query's position (a window's first key is rarely aligned: one more).
    tiles = cdiv(max_seq_len, block_n)
    if window is not None:
        tiles = min(tiles, cdiv(window + block_q - 1, block_n) + 1)
    if cfg.split_tokens is not None:
        split_tiles = cdiv(cfg.split_tokens, block_n)
    elif cores < 1:  # no device to fill (the interpreter): split only when told to
        split_tiles = tiles
    else:
        programs = max(1, q_tiles * batch * kv_heads)
        want = cdiv(cfg.programs_per_core * cores, programs)
        split_tiles = max(cdiv(tiles, want), cdiv(cfg.min_split_tokens, block_n))
    num_splits = cdiv(tiles, split_tiles)
    per_split = total_q * group * kv_heads * (head_dim + 1) * 4
    num_splits = max(1, min(num_splits, cfg.max_scratch_bytes // max(1, per_split),
                            MAX_GRID_YZ // kv_heads))
    split_tiles = cdiv(tiles, num_splits)
    return AttentionPlan(
        block_q=block_q, block_g=block_g, block_n=block_n, block_d=block_d,
        num_splits=num_splits, split_tokens=split_tiles * block_n,
        grid=(q_tiles, batch, kv_heads * num_splits), num_warps=num_warps,
        num_stages=num_stages,
    )
