"""The Triton backend: one kernel source for NVIDIA (SM80/SM90/SM100) and Ascend
(``triton-ascend`` with ``torch_npu``: tensors on device ``npu``).

- ``attention_kernels``/``copy_kernels``: the Triton source (plain functions);
- ``plan``: tile shapes, warps and the split-KV count of a launch (no Triton import);
- ``launch``: the arguments of each launch, shared with ``compile_check``;
- ``backend``: ``TritonBackend``, registered as ``triton`` by import path, so neither
  ``import kernels`` nor this package imports Triton; the registry imports ``backend``
  on first use (``BackendUnavailable`` where Triton is absent).

Compiler or interpreter: with ``TRITON_INTERPRET=1`` set when Triton is *first imported*,
the same kernels run in Triton's interpreter on CPU tensors (how the tests run without a
GPU). The mode is process-wide and fixed at that import, because Triton wraps its own
library functions (``tl.max``, ``tl.sum`` …) then and later imports of Triton assert it;
``backend.interpreting()`` reads it from those functions and ``backend.build`` wraps our
kernels to match.

``read_kv_blocks``/``write_kv_blocks`` reuse the reference's indexed copies: they move
whole blocks between the pool and the store's payload (often pinned host memory), one
gather or scatter per layer and K/V, bound by PCIe or HBM bandwidth with no arithmetic; a
kernel would only fuse those launches (microseconds against milliseconds of transfer).
"""
