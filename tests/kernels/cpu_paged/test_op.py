"""The kernel as a custom op: same numbers as the plain function, and torch's own checks of
the registration (its schema, its fake implementation) pass."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_paged import decode
from kernels.cpu_paged.op import decode_op
from tests.kernels.paged_case import decode_view, make_case

pytestmark = pytest.mark.skipif(decode._ext is None, reason="kernels._paged_decode not built")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_equals_the_function_and_passes_opcheck(dtype: torch.dtype) -> None:
    case = decode_view(make_case([70, 1, 33], [1, 1, 1], heads=9, kv_heads=3, head_dim=64,
                                 kv_starts=[2, 0, 0], window=50, dtype=dtype, seed=7))
    args = (case.q, case.k_pool, case.v_pool, case.block_tables, case.seq_lens, case.scale,
            case.window, case.kv_start)
    op = decode_op()
    assert decode_op() is op  # registered once
    assert torch.equal(op(*args), decode.paged_decode(*args))
    torch.library.opcheck(op, args,  # type: ignore[arg-type]
                          test_utils=("test_schema", "test_faketensor"))
