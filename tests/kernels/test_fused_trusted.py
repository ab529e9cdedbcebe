"""``TrustedFusedOps`` (the C ops without per-call checks) gives the checked C ops' bits on
what ``step_fits`` accepts, overwrites only the residual it is given (``add_rms_norm_``),
refuses rows that do not line up, and ``step_fits`` refuses what the C ops do not take."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import fused

pytestmark = pytest.mark.skipif(fused.TRUSTED_OPS is None,
                                reason=f"kernels._fused is not built: {fused.IMPORT_ERROR}")

DTYPES = st.sampled_from([torch.bfloat16, torch.float32])


def _ops() -> tuple[fused.FusedOps, fused.FusedOps]:
    assert fused.TRUSTED_OPS is not None
    return fused.TRUSTED_OPS, fused.FUSED_OPS["c"]


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 700), dtype=DTYPES,
       one_plus=st.booleans(), seed=st.integers(0, 2**16))
def test_norms_and_act_give_the_checked_ops_bits(rows: int, cols: int, dtype: torch.dtype,
                                                 one_plus: bool, seed: int) -> None:
    trusted, checked = _ops()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g).mul(3).to(dtype)
    r = torch.randn(rows, cols, generator=g).to(dtype)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype)
    assert torch.equal(trusted.rms_norm(x, w, 1e-6, one_plus),
                       checked.rms_norm(x, w, 1e-6, one_plus))
    want, want_h = checked.add_rms_norm(x, r, w, 1e-6, one_plus)
    x_before, r_given = x.clone(), r.clone()
    got, got_h = trusted.add_rms_norm_(x, r_given, w, 1e-6, one_plus)
    assert got_h is r_given  # written over the residual it was given, nothing else
    assert torch.equal(got, want) and torch.equal(got_h, want_h) and torch.equal(x, x_before)
    gu = torch.randn(rows, 2 * cols, generator=g).mul(4).to(dtype)
    for gelu in (False, True):
        assert torch.equal(trusted.gated_act(gu, gelu), checked.gated_act(gu, gelu))


def _rope_case(dtype: torch.dtype, tokens: int, qk_norm: bool, seed: int
               ) -> tuple[list[object], torch.Tensor, torch.Tensor]:
    heads, kv_heads, dim = 4, 2, 16
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    cos = torch.rand(tokens, 1, dim, generator=g).to(dtype)
    sin = torch.rand(tokens, 1, dim, generator=g).to(dtype)
    w = (torch.rand(dim, generator=g) + 0.5).to(dtype) if qk_norm else None
    k_pool = torch.zeros(4, 8, kv_heads, dim, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    slots = torch.randperm(32, generator=g)[:tokens]
    slots[0] = -1  # skipped
    return ([qkv, heads, kv_heads, dim, cos, sin, w, w, 1e-6, False, k_pool, v_pool, slots],
            k_pool, v_pool)


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 8), dtype=DTYPES, qk_norm=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rope_write_gives_the_checked_ops_bits(tokens: int, dtype: torch.dtype,
                                               qk_norm: bool, seed: int) -> None:
    trusted, checked = _ops()
    args, k_t, v_t = _rope_case(dtype, tokens, qk_norm, seed)
    q_t = trusted.rope_write(*args)  # type: ignore[arg-type]
    args_c, k_c, v_c = _rope_case(dtype, tokens, qk_norm, seed)
    q_c = checked.rope_write(*args_c)  # type: ignore[arg-type]
    assert torch.equal(q_t, q_c) and torch.equal(k_t, k_c) and torch.equal(v_t, v_c)


def test_rows_that_do_not_line_up_are_refused() -> None:
    trusted, _ = _ops()
    args, k_pool, _ = _rope_case(torch.bfloat16, 4, False, 0)
    args[12] = args[12][:3]  # type: ignore[index]  # three slots for four tokens
    with pytest.raises(ValueError, match="rope_write"):
        trusted.rope_write(*args)  # type: ignore[arg-type]
    assert not k_pool.any()  # nothing written
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="residual"):
        trusted.add_rms_norm_(x, torch.zeros(2, 8, dtype=torch.bfloat16),
                              torch.ones(8, dtype=torch.bfloat16), 1e-6, False)


def test_step_fits_refuses_what_the_c_ops_do_not_take() -> None:
    bf = torch.bfloat16
    pool = torch.zeros(4, 8, 2, 16, dtype=bf)
    table = torch.zeros(3, 1, 16, dtype=bf)
    w = torch.ones(32, dtype=bf)
    slots = torch.zeros(3, dtype=torch.int64)

    def fits(**kw: object) -> bool:
        args: dict[str, object] = {"dtype": bf, "head_dim": 16, "kv_heads": 2,
                                   "weights": [w], "pools": [pool, pool], "tables": [table],
                                   "slots": [slots]}
        args.update(kw)
        return fused.step_fits(**args)  # type: ignore[arg-type]

    assert fits()
    assert not fits(dtype=torch.float16)
    assert not fits(head_dim=15)
    assert not fits(weights=[w.float()])
    assert not fits(weights=[torch.ones(64, dtype=bf)[::2]])  # not contiguous
    assert not fits(pools=[pool, pool.float()])
    assert not fits(pools=[pool.transpose(1, 2)])
    assert not fits(kv_heads=1)
    assert not fits(tables=[table.float()])
    assert not fits(slots=[slots.int()])
    assert not fits(slots=[torch.zeros(6, dtype=torch.int64)[::2]])
