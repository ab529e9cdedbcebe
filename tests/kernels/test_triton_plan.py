"""Launch planning of the Triton backend (host arithmetic; imports no Triton)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kernels.triton_backend.plan import MAX_GRID_YZ, TritonConfig, cdiv, plan_attention


def _plan(cfg: TritonConfig | None = None, **over: object):
    kw: dict[str, object] = dict(decode=True, batch=1, kv_heads=8, group=4, head_dim=128,
                                 elem_bytes=2, total_q=1, max_q_len=1, max_seq_len=32768,
                                 window=None, cores=132)
    kw.update(over)
    return plan_attention(cfg or TritonConfig(), **kw)  # type: ignore[arg-type]


def test_long_decode_at_small_batch_is_split_to_fill_the_device() -> None:
    plan = _plan()
    programs = plan.grid[0] * plan.grid[1] * plan.grid[2]
    assert plan.num_splits > 1
    assert programs >= 0.9 * 8 * 132  # about programs_per_core × cores (split rounding)
    assert plan.split_tokens >= 256


def test_large_batches_and_short_contexts_are_not_split() -> None:
    assert _plan(batch=256, max_seq_len=4096).num_splits == 1
    assert _plan(max_seq_len=200).num_splits == 1
    assert _plan(cores=0).num_splits == 1  # the interpreter: only when told
    assert _plan(TritonConfig(split_tokens=64), cores=0, max_seq_len=1000).num_splits > 1


def test_a_window_bounds_the_splits() -> None:
    plan = _plan(window=512)
    assert plan.num_splits * plan.split_tokens <= 512 + 64


def test_decode_rows_pad_small_groups_for_tl_dot() -> None:
    plan = _plan(group=1)
    assert (plan.block_q, plan.block_g) == (1, 16)
    plan = _plan(group=32)
    assert (plan.block_q, plan.block_g) == (1, 32)


@given(
    decode=st.booleans(),
    batch=st.integers(1, 5000),
    kv_heads=st.sampled_from([1, 2, 8, 64]),
    group=st.integers(1, 16),
    head_dim=st.sampled_from([8, 64, 80, 128, 256]),
    elem_bytes=st.sampled_from([2, 4]),
    q_len=st.integers(1, 8192),
    extra=st.integers(0, 200_000),
    window=st.one_of(st.none(), st.integers(1, 10_000)),
    cores=st.sampled_from([0, 1, 24, 132]),
    split=st.one_of(st.none(), st.sampled_from([16, 100, 4096])),
)
def test_every_key_is_covered_and_limits_hold(decode: bool, batch: int, kv_heads: int,
                                              group: int, head_dim: int, elem_bytes: int,
                                              q_len: int, extra: int, window: int | None,
                                              cores: int, split: int | None) -> None:
    q_len = 1 if decode else q_len
    seq = q_len + extra
    plan = _plan(TritonConfig(split_tokens=split), decode=decode, batch=batch,
                 kv_heads=kv_heads, group=group, head_dim=head_dim, elem_bytes=elem_bytes,
                 total_q=q_len * batch, max_q_len=q_len, max_seq_len=seq, window=window,
                 cores=cores)
    rows = plan.block_q * plan.block_g
    assert rows >= 16 and rows & (rows - 1) == 0 and plan.block_g >= group
    assert plan.block_d >= max(16, head_dim) and plan.block_d & (plan.block_d - 1) == 0
    assert plan.split_tokens % plan.block_n == 0
    # The keys each query tile visits (as the kernel computes them, from its first
    # visible key rounded down to block_n) fit in the splits.
    for tile in {0, plan.grid[0] // 2, plan.grid[0] - 1}:
        first = seq - q_len + tile * plan.block_q
        kv_end = min(first + plan.block_q, seq)
        kv_first = 0 if window is None else max(0, first - window + 1)
        lo = kv_first - kv_first % plan.block_n
        assert kv_end - lo <= plan.num_splits * plan.split_tokens
    assert plan.grid == (cdiv(q_len, plan.block_q), batch, kv_heads * plan.num_splits)
    assert plan.grid[2] <= MAX_GRID_YZ
    scratch = q_len * batch * group * kv_heads * (head_dim + 1) * 4 * plan.num_splits
    assert plan.num_splits == 1 or scratch <= TritonConfig().max_scratch_bytes
