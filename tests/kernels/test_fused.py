"""The fused C ops against the torch forms they replace (``kernels.fused``).

Bitwise where the module promises it (the residual add, RoPE and the K/V write without a
per-head norm: the same roundings); elsewhere within one step of the dtype (the norm's
sum of squares and the activations' exp are computed otherwise at the float32 level).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.rope import RopeConfig, RotaryEmbedding
from kernels import fused
from kernels.fused import TORCH_OPS, CompiledFusedOps, FusedOps

pytestmark = pytest.mark.skipif("c" not in fused.FUSED_OPS,
                                reason=f"kernels._fused is not built: {fused.IMPORT_ERROR}")

DTYPES = st.sampled_from([torch.bfloat16, torch.float32])
ROPES = [RopeConfig("default", 10_000.0), RopeConfig("linear", 10_000.0, factor=4.0),
         RopeConfig("llama3", 500_000.0, 8.0, 1.0, 4.0, 64)]


def _c() -> FusedOps:
    return fused.FUSED_OPS["c"]


def _close(got: torch.Tensor, want: torch.Tensor, atol: float = 0.0) -> None:
    """Within one step of the dtype, relative to each element (float32: four ulps)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    eps = torch.finfo(want.dtype).eps * (1 if want.dtype == torch.bfloat16 else 4)
    g, w = got.double(), want.double()
    bad = (g - w).abs() > eps * w.abs() + atol
    assert not bad.any(), f"{int(bad.sum())} elements off, e.g. {g[bad][:4]} vs {w[bad][:4]}"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 1100), dtype=DTYPES,
       one_plus=st.booleans(), residual=st.booleans(), strided=st.booleans(),
       seed=st.integers(0, 2**16))
def test_norm_matches_torch(rows: int, cols: int, dtype: torch.dtype, one_plus: bool,
                            residual: bool, strided: bool, seed: int) -> None:
    g = _gen(seed)
    wide = torch.randn(rows, cols + (7 if strided else 0), generator=g).mul(3).to(dtype)
    x = wide[:, :cols]  # rows not adjacent when strided (a split of a wider product)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype)
    if not residual:
        _close(_c().rms_norm(x, w, 1e-6, one_plus), TORCH_OPS.rms_norm(x, w, 1e-6, one_plus))
        return
    r = torch.randn(rows, cols, generator=g).to(dtype)
    got, got_h = _c().add_rms_norm(x, r, w, 1e-6, one_plus)
    want, want_h = TORCH_OPS.add_rms_norm(x, r, w, 1e-6, one_plus)
    assert torch.equal(got_h, want_h)  # the add rounds once, as torch's
    _close(got, want)
    assert torch.equal(x, wide[:, :cols]) and r.shape == (rows, cols)  # inputs untouched


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), inter=st.integers(1, 1300), dtype=DTYPES, gelu=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gated_act_matches_torch(rows: int, inter: int, dtype: torch.dtype, gelu: bool,
                                 seed: int) -> None:
    gate_up = torch.randn(rows, 2 * inter, generator=_gen(seed)).mul(4).to(dtype)
    want = TORCH_OPS.gated_act(gate_up, gelu)
    # gelu-tanh's 1 + tanh cancels for very negative inputs in torch's float32 form too:
    # there both are a few float32 ulps of 1 times the input, not the value's own ulp.
    atol = 4e-7 * float(gate_up.float().abs().max()) ** 2 if gelu else 0.0
    _close(fused.c_gated_act(gate_up, gelu), want, atol)
    # The ops object takes the C form for gelu-tanh only (SiLU measured faster in torch).
    assert torch.equal(_c().gated_act(gate_up, gelu), fused.c_gated_act(gate_up, gelu)
                       if gelu else want)


def _pools(dtype: torch.dtype, kv_heads: int, dim: int, gen: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(5, 4, kv_heads, dim, generator=gen).to(dtype),
            torch.randn(5, 4, kv_heads, dim, generator=gen).to(dtype))


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 8), kv_heads=st.integers(1, 3), group=st.integers(1, 4),
       dim=st.sampled_from([2, 8, 64, 128, 256]), dtype=DTYPES, rope=st.sampled_from(ROPES),
       qk_norm=st.booleans(), one_plus=st.booleans(), data=st.data(),
       seed=st.integers(0, 2**16))
def test_rope_write_matches_torch(tokens: int, kv_heads: int, group: int, dim: int,
                                  dtype: torch.dtype, rope: RopeConfig, qk_norm: bool,
                                  one_plus: bool, data: st.DataObject, seed: int) -> None:
    g = _gen(seed)
    heads = group * kv_heads
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    positions = torch.tensor(data.draw(st.lists(st.integers(0, 70_000), min_size=tokens,
                                                max_size=tokens)))
    cos, sin = RotaryEmbedding(rope, dim)(positions, dtype)
    # Distinct slots of the 20, some −1 (not written: a replay's kept full-layer KV).
    picked = data.draw(st.permutations(range(20)))[:tokens]
    skip = data.draw(st.lists(st.booleans(), min_size=tokens, max_size=tokens))
    slots = torch.tensor([-1 if s else p for p, s in zip(picked, skip, strict=True)])
    q_w = k_w = None
    if qk_norm:
        q_w, k_w = (torch.rand(dim, generator=g) + 0.5).to(dtype), torch.rand(dim).to(dtype)
    k1, v1 = _pools(dtype, kv_heads, dim, _gen(seed))
    k2, v2 = k1.clone(), v1.clone()
    got = _c().rope_write(qkv, heads, kv_heads, dim, cos, sin, q_w, k_w, 1e-6, one_plus,
                          k1, v1, slots, "torch")
    want = TORCH_OPS.rope_write(qkv, heads, kv_heads, dim, cos, sin, q_w, k_w, 1e-6,
                                one_plus, k2, v2, slots, "torch")
    assert torch.equal(v1, v2)  # v is copied as is; skipped slots keep their old rows
    if qk_norm:
        # A norm's one-step difference goes through the rotation's sum, which can cancel:
        # off by a step of the head's scale, not of the element.
        step = 2 * torch.finfo(dtype).eps
        _close(got, want, step * float(want.abs().max()))
        _close(k1, k2, step * float(k2.abs().max()))
    else:
        assert torch.equal(got, want) and torch.equal(k1, k2)


def test_rows_do_not_depend_on_the_batch_or_the_team() -> None:
    """Batch-invariant, as ``--deterministic`` needs: a row alone, in a batch, and on an
    OpenMP team (every call parallel) gives the same bits."""
    g = _gen(1)
    x, r = torch.randn(64, 576, generator=g).bfloat16(), torch.randn(64, 576).bfloat16()
    w = torch.rand(576, generator=g).bfloat16()
    gu = torch.randn(64, 3072, generator=g).bfloat16()
    c = _c()
    batch = c.add_rms_norm(x, r, w, 1e-5, False)[0], c.gated_act(gu, True)
    before = fused.set_parallel_min_elements(0)
    try:
        team = c.add_rms_norm(x, r, w, 1e-5, False)[0], c.gated_act(gu, True)
    finally:
        fused.set_parallel_min_elements(before)
    for i in (0, 17, 63):
        alone = c.add_rms_norm(x[i:i + 1], r[i:i + 1], w, 1e-5, False)[0]
        assert torch.equal(alone[0], batch[0][i])
        assert torch.equal(c.gated_act(gu[i:i + 1], True)[0], batch[1][i])
    assert torch.equal(team[0], batch[0]) and torch.equal(team[1], batch[1])


def test_what_the_c_ops_do_not_take_runs_the_torch_forms() -> None:
    c = CompiledFusedOps()
    x16 = torch.randn(3, 40).half()
    w16 = torch.rand(40).half()
    assert torch.equal(c.rms_norm(x16, w16, 1e-6, False), TORCH_OPS.rms_norm(x16, w16, 1e-6,
                                                                             False))
    x = torch.randn(3, 40).bfloat16()
    w32 = torch.rand(40)  # a weight in another dtype: torch's promotion, not the C op
    assert torch.equal(c.rms_norm(x, w32, 1e-6, False), TORCH_OPS.rms_norm(x, w32, 1e-6,
                                                                           False))
    gu = torch.randn(2, 3, 8).bfloat16()  # 3-D
    assert torch.equal(c.gated_act(gu, True), TORCH_OPS.gated_act(gu, True))
    # A float32 pool under bfloat16 activations: the write casts, as write_kv_slots.
    qkv = torch.randn(2, 4 * 8).bfloat16()
    cos, sin = RotaryEmbedding(ROPES[0], 8)(torch.tensor([3, 4]), torch.bfloat16)
    k1, v1 = torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8)
    k2, v2 = k1.clone(), v1.clone()
    slots = torch.tensor([0, 3])
    got = c.rope_write(qkv, 2, 1, 8, cos, sin, None, None, 1e-6, False, k1, v1, slots, "torch")
    want = TORCH_OPS.rope_write(qkv, 2, 1, 8, cos, sin, None, None, 1e-6, False, k2, v2,
                                slots, "torch")
    assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(v1, v2)


def test_kernels_fused_torch_forces_the_torch_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fused.fused_ops() is fused.FUSED_OPS["c"]
    monkeypatch.setenv("KERNELS_FUSED", "torch")
    assert fused.fused_ops() is TORCH_OPS
