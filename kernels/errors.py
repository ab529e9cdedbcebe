"""The kernels error hierarchy.

Misuse (a shape, dtype, stride or block id the kernels cannot accept) raises
``KernelArgumentError``, which is also a ``ValueError``, before anything is launched: a bad
block table must never turn into an out-of-bounds read on a device. A backend that cannot
run here (no Triton, no device) raises ``BackendUnavailable``.
"""

from __future__ import annotations


class KernelError(Exception):
    """Base of every error raised by the kernels package."""


class KernelArgumentError(KernelError, ValueError):
    """An argument the kernels cannot accept; the message names it."""


class BlockTableError(KernelArgumentError):
    """A block table entry that a sequence uses points outside the pool."""


class BackendUnavailable(KernelError, RuntimeError):
    """The requested backend cannot run on this machine or device."""
