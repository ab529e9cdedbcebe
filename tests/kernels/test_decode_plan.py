"""The torch decode's per-step plan and the validate-once calls: reused plans never go
stale, a lone sequence on consecutive blocks is read in place with the same numbers, and
``validated=True`` skips only what ``check_step_metadata`` checked (``KERNELS_DEBUG_CHECKS=1``
checks again)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.torch_ref import decode
from tests.kernels.paged_case import TOLERANCE, PagedCase, decode_view, dense_reference, make_case


def _decode(case: PagedCase, validated: bool = False) -> torch.Tensor:
    return kernels.paged_decode_attention(
        case.q, case.k_pool, case.v_pool, case.block_tables, case.seq_lens, case.scale,
        case.window, case.kv_start, backend="torch", validated=validated)


def _assert_dense(got: torch.Tensor, case: PagedCase) -> None:
    torch.testing.assert_close(got.double(), dense_reference(case), atol=TOLERANCE[got.dtype],
                               rtol=TOLERANCE[got.dtype])


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 200), first=st.integers(0, 4), window=st.sampled_from([None, 7, 40]),
       seed=st.integers(0, 999))
def test_consecutive_blocks_read_in_place_match_dense(length: int, first: int,
                                                      window: int | None, seed: int) -> None:
    case = decode_view(make_case([length], [length], window=window, seed=seed))
    n = -(-length // 16)
    ids = torch.arange(first, first + n)
    # Lay the sequence's blocks out consecutively from block ``first``.
    k_pool = torch.randn(first + n + 2, *case.k_pool.shape[1:])
    v_pool = torch.randn(first + n + 2, *case.v_pool.shape[1:])
    k_pool[ids] = torch.cat([case.k_seqs[0], torch.zeros(n * 16 - length, *k_pool.shape[2:])]
                            ).view(n, 16, *k_pool.shape[2:])
    v_pool[ids] = torch.cat([case.v_seqs[0], torch.zeros(n * 16 - length, *v_pool.shape[2:])]
                            ).view(n, 16, *v_pool.shape[2:])
    tables = torch.full_like(case.block_tables, -1)
    tables[0, :n] = ids.to(torch.int32)
    case.k_pool, case.v_pool, case.block_tables = k_pool, v_pool, tables
    _assert_dense(_decode(case), case)
    plan = decode._scratch.plans[0]
    assert all(r.ids is None for r in plan.rounds)  # no gather: read where the blocks lie


def test_plan_follows_metadata_changed_in_place() -> None:
    case = decode_view(make_case([100, 37], [100, 37], seed=3))
    _assert_dense(_decode(case), case)
    # The same tensors, rewritten: the second sequence now reads the first one's blocks.
    case.block_tables[1] = case.block_tables[0]
    case.seq_lens[1] = case.seq_lens[0]
    case.k_seqs[1], case.v_seqs[1] = case.k_seqs[0], case.v_seqs[0]
    _assert_dense(_decode(case), case)


def test_plan_follows_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    case = decode_view(make_case([300, 90], [300, 90], seed=5))
    _assert_dense(_decode(case), case)
    monkeypatch.setattr(decode, "DECODE_CHUNK_TOKENS", 32)
    _assert_dense(_decode(case), case)


def test_validated_calls_skip_value_checks_unless_debugging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    case = decode_view(make_case([40], [40], seed=1))
    bad = case.block_tables.clone()
    bad[0, 0] = case.k_pool.shape[0] + 5  # outside the pool
    with pytest.raises(kernels.BlockTableError):
        kernels.check_step_metadata(case.k_pool, case.v_pool, 1,
                                    torch.zeros(1, dtype=torch.int64), None,
                                    (bad, case.seq_lens, None))
    case.block_tables = bad
    with pytest.raises(kernels.BlockTableError):
        _decode(case)
    monkeypatch.setenv("KERNELS_DEBUG_CHECKS", "1")
    with pytest.raises(kernels.BlockTableError):
        _decode(case, validated=True)


def test_step_check_refuses_slots_beyond_the_pool() -> None:
    case = decode_view(make_case([40], [40], seed=2))
    slots = torch.tensor([case.k_pool.shape[0] * case.k_pool.shape[1]])
    with pytest.raises(kernels.KernelArgumentError, match="slot_mapping"):
        kernels.check_step_metadata(case.k_pool, case.v_pool, 1, slots, None,
                                    (case.block_tables, case.seq_lens, None))
