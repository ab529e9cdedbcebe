"""Types of the C extension kernels/_paged_decode.c (built by ``make setup``)."""

def paged_decode(
    out: int, q: int, k_pool: int, v_pool: int, tables: int, lens: int, kv_start: int,
    q_stride_b: int, q_stride_h: int, table_stride: int, batch: int, heads: int,
    kv_heads: int, head_dim: int, block_tokens: int, window: int, dtype: int, index64: int,
    scale: float, threads: int, splits: int, path: int, /,
) -> bool: ...
def limits() -> dict[str, int]: ...
def bf16_path() -> bool: ...
