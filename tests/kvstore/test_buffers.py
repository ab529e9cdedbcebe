"""Views over caller buffers (kvstore/buffers.py): a CPU tensor destination is given by
its address, with the same checks as a buffer view."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore.buffers import AddressedRows, as_view, buffer_address, io_buffer, writable_rows
from kvstore.errors import BufferSizeError, InvalidArgument
from tests.huge_pages import huge_kib, thp_advised


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
def test_a_cpu_tensor_is_given_by_its_address_and_views_back_onto_its_memory(
    dtype: torch.dtype,
) -> None:
    t = torch.zeros(64 // dtype.itemsize, dtype=dtype)
    rows = writable_rows(t, 4, 16)
    assert isinstance(rows, AddressedRows)
    assert rows.address == t.data_ptr() and rows.nbytes == 64 and rows.owner is t
    view = as_view(rows)
    view[5] = 0xAB  # the tensor's own memory
    assert t.view(torch.uint8)[5].item() == 0xAB
    # A slice at an offset: its own first byte, not its storage's.
    part = t.view(torch.uint8)[16:48]
    sub = writable_rows(part, 2, 16)
    assert isinstance(sub, AddressedRows) and sub.address == t.data_ptr() + 16


def test_a_tensor_that_does_not_fit_or_is_not_contiguous_is_refused() -> None:
    t = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(BufferSizeError):
        writable_rows(t, 3, 16)
    with pytest.raises(InvalidArgument):
        writable_rows(t.view(8, 8)[:, :4], 2, 16)  # 32 bytes, strided


def test_other_buffers_are_plain_writable_views() -> None:
    arr = np.zeros(32, dtype=np.uint8)
    v = writable_rows(arr, 2, 16)
    assert isinstance(v, memoryview) and not v.readonly and as_view(v) is v
    with pytest.raises(InvalidArgument):
        writable_rows(bytes(32), 2, 16)  # read-only
    # A tensor subclass goes through its buffer view, not the address path.
    p = torch.nn.Parameter(torch.zeros(8), requires_grad=False)
    assert isinstance(writable_rows(p, 2, 16), memoryview)
    assert len(as_view(AddressedRows(0, 0, None))) == 0


def test_an_io_buffer_is_zeroed_page_aligned_writable_memory() -> None:
    for n in (1, 4096, 5000, 3 << 20):
        m = io_buffer(n)
        view = memoryview(m)
        assert len(view) >= n and buffer_address(view) % 4096 == 0
        assert not any(view[: min(n, 1 << 16)])
        view[n - 1] = 7
        assert m[n - 1] == 7
        view.release()
        m.close()


@pytest.mark.skipif(not thp_advised(), reason="transparent huge pages are off on this kernel")
def test_a_large_io_buffer_lies_on_huge_pages() -> None:
    """The property the SSD tier's reads depend on (one contiguous segment per block, see
    ``io_buffer``). Shared anonymous memory, what ``mmap.mmap(-1, n)`` gives and what the
    SSD staging used to be, is shmem: on huge pages only where ``shmem_enabled`` says so."""
    for n in (8 << 20, (3 << 20) + 4096):  # whole huge pages; odd sizes too
        m = io_buffer(n)
        m[:] = b"\1" * len(m)
        assert len(m) % (2 << 20) == 0
        # most of it at least (a fragmented machine may not find every huge page)
        assert huge_kib(buffer_address(memoryview(m)), len(m)) >= len(m) >> 11
