"""KV copies: token slots, and pool blocks to and from the store's payload layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels


def _pools(
    layers: int,
    blocks: int,
    bt: int = 8,
    kvh: int = 2,
    hd: int = 4,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(layers * 1000 + blocks)
    ks = [torch.randn(blocks, bt, kvh, hd, generator=gen).to(dtype) for _ in range(layers)]
    vs = [torch.randn(blocks, bt, kvh, hd, generator=gen).to(dtype) for _ in range(layers)]
    return ks, vs


def test_write_kv_slots_places_each_token_and_skips_negative() -> None:
    k_pool = torch.zeros(4, 8, 2, 4)
    v_pool = torch.zeros(4, 8, 2, 4)
    k = torch.randn(5, 2, 4)
    v = torch.randn(5, 2, 4)
    slots = torch.tensor([3, 8, 31, -1, 17], dtype=torch.int64)
    kernels.write_kv_slots(k, v, k_pool, v_pool, slots)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        assert torch.equal(k_pool[s // 8, s % 8], k[t])
        assert torch.equal(v_pool[s // 8, s % 8], v[t])
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(32) if s not in written]
    assert k_pool.view(32, 2, 4)[untouched].abs().sum() == 0


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 4),
    blocks=st.integers(1, 12),
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_read_then_write_blocks_round_trips(
    layers: int, blocks: int, data: st.DataObject, dtype: torch.dtype
) -> None:
    ks, vs = _pools(layers, blocks, dtype=dtype)
    ids = data.draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=blocks, unique=True))
    chosen = data.draw(
        st.lists(st.integers(0, layers - 1), min_size=1, max_size=layers, unique=True)
    )
    block_ids = torch.tensor(ids, dtype=torch.int32)
    out = torch.empty(len(ids), len(chosen), 2, 8, 2, 4, dtype=dtype)
    kernels.read_kv_blocks(ks, vs, block_ids, chosen, out)
    for i, b in enumerate(ids):
        for li, layer in enumerate(chosen):
            assert torch.equal(out[i, li, 0], ks[layer][b])
            assert torch.equal(out[i, li, 1], vs[layer][b])
    ks2, vs2 = _pools(layers, blocks, dtype=dtype)
    ks2 = [torch.zeros_like(k) for k in ks2]
    vs2 = [torch.zeros_like(v) for v in vs2]
    kernels.write_kv_blocks(ks2, vs2, block_ids, chosen, out)
    for layer in chosen:
        assert torch.equal(ks2[layer][ids], ks[layer][ids])
        assert torch.equal(vs2[layer][ids], vs[layer][ids])
    others = [b for b in range(blocks) if b not in ids]
    for layer in range(layers):
        assert ks2[layer][others].abs().sum() == 0


def test_payload_bytes_are_the_store_layout() -> None:
    """Block i's bytes are [layer][K then V][token][head][dim], as DESIGN §4 lays out."""
    ks, vs = _pools(2, 3)
    out = torch.empty(1, 2, 2, 8, 2, 4)
    kernels.read_kv_blocks(ks, vs, torch.tensor([2]), [0, 1], out)
    flat = out.reshape(-1)
    per = 8 * 2 * 4
    assert torch.equal(flat[:per], ks[0][2].reshape(-1))
    assert torch.equal(flat[per : 2 * per], vs[0][2].reshape(-1))
    assert torch.equal(flat[3 * per :], vs[1][2].reshape(-1))


def test_copy_refuses_bad_ids_and_shapes() -> None:
    ks, vs = _pools(2, 3)
    out = torch.empty(1, 2, 2, 8, 2, 4)
    with pytest.raises(kernels.BlockTableError):
        kernels.read_kv_blocks(ks, vs, torch.tensor([3]), [0, 1], out)
    with pytest.raises(kernels.KernelArgumentError, match="shape"):
        kernels.read_kv_blocks(ks, vs, torch.tensor([0, 1]), [0, 1], out)
    with pytest.raises(kernels.KernelArgumentError, match="layers"):
        kernels.write_kv_blocks(ks, vs, torch.tensor([0]), [2], out)
    with pytest.raises(kernels.KernelArgumentError, match="dtype"):
        kernels.write_kv_blocks(ks, vs, torch.tensor([0]), [0, 1], out.half())
    with pytest.raises(kernels.KernelArgumentError, match="slot_mapping"):
        kernels.write_kv_slots(
            torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), ks[0], vs[0], torch.tensor([24])
        )
