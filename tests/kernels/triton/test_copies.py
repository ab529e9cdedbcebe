"""``write_kv_slots`` in Triton, and the block copies the backend shares with torch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.triton_backend.backend import TritonBackend
from tests.kernels.triton.conftest import DEVICE


@settings(max_examples=20, deadline=None)
@given(
    block_tokens=st.sampled_from([16, 32, 64]),
    blocks=st.integers(1, 6),
    kv_heads=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([8, 24, 64]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    data=st.data(),
)
def test_write_kv_slots_matches_torch(block_tokens: int, blocks: int, kv_heads: int,
                                      head_dim: int, dtype: torch.dtype,
                                      data: st.DataObject) -> None:
    """Each token lands in its slot, negative slots are skipped, nothing else changes;
    K and V may be strided views (slices of a fused QKV projection)."""
    slots_total = blocks * block_tokens
    slots = data.draw(st.lists(st.integers(0, slots_total - 1), min_size=1,
                               max_size=min(40, slots_total), unique=True))
    skip = data.draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    slots = [-1 if s else slot for slot, s in zip(slots, skip, strict=True)]
    gen = torch.Generator().manual_seed(len(slots) * 7 + blocks)
    qkv = torch.randn(len(slots), 3 * kv_heads, head_dim, generator=gen).to(dtype)
    k, v = qkv[:, kv_heads : 2 * kv_heads], qkv[:, 2 * kv_heads :]
    shape = (blocks, block_tokens, kv_heads, head_dim)
    base = torch.randn(*shape, generator=gen).to(dtype)
    mapping = torch.tensor(slots, dtype=data.draw(st.sampled_from([torch.int32, torch.int64])))
    want_k, want_v = base.clone(), base.clone() + 1
    kernels.write_kv_slots(k, v, want_k, want_v, mapping, backend="torch")
    got_k, got_v = base.clone().to(DEVICE), (base.clone() + 1).to(DEVICE)
    kernels.write_kv_slots(k.to(DEVICE), v.to(DEVICE), got_k, got_v, mapping.to(DEVICE),
                           backend=TritonBackend())
    assert torch.equal(got_k.cpu(), want_k)
    assert torch.equal(got_v.cpu(), want_v)


def test_write_kv_slots_refuses_slots_beyond_the_pool() -> None:
    pool = torch.zeros(2, 16, 1, 8, device=DEVICE)
    kv = torch.zeros(1, 1, 8, device=DEVICE)
    with pytest.raises(kernels.KernelArgumentError, match="slot_mapping"):
        kernels.write_kv_slots(kv, kv, pool, pool, torch.tensor([32], device=DEVICE),
                               backend="triton")


def test_block_copies_round_trip(backend: TritonBackend) -> None:
    gen = torch.Generator().manual_seed(5)
    ks = [torch.randn(6, 16, 2, 8, generator=gen).to(DEVICE) for _ in range(3)]
    vs = [torch.randn(6, 16, 2, 8, generator=gen).to(DEVICE) for _ in range(3)]
    ids = torch.tensor([4, 0, 2], device=DEVICE)
    out = torch.empty(3, 2, 2, 16, 2, 8)  # host payload, layers 2 and 0
    kernels.read_kv_blocks(ks, vs, ids, [2, 0], out, backend=backend)
    assert torch.equal(out[1, 0, 1], vs[2][0].cpu())
    assert torch.equal(out[2, 1, 0], ks[0][2].cpu())
    ks2 = [torch.zeros_like(k) for k in ks]
    vs2 = [torch.zeros_like(v) for v in vs]
    kernels.write_kv_blocks(ks2, vs2, ids, [2, 0], out, backend=backend)
    for layer in (0, 2):
        assert torch.equal(ks2[layer][ids], ks[layer][ids])
        assert torch.equal(vs2[layer][ids], vs[layer][ids])
    assert ks2[1].abs().sum() == 0
    with pytest.raises(kernels.BlockTableError):
        kernels.read_kv_blocks(ks, vs, torch.tensor([6], device=DEVICE), [0], out[:1, :1],
                               backend=backend)
