"""Types of the C extension kernels/_paged_prefill.c (built by ``make setup``)."""

def paged_prefill(
    out: int, q: int, k_pool: int, v_pool: int, tables: int, cu: int, lens: int,
    kv_start: int, q_stride_t: int, q_stride_h: int, table_stride: int, batch: int,
    heads: int, kv_heads: int, head_dim: int, block_tokens: int, window: int, dtype: int,
    index64: int, scale: float, threads: int, path: int, tiles_per_item: int, /,
) -> bool: ...
def bf16_path() -> bool: ...
