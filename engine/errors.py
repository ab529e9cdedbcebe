"""The engine error hierarchy.

Bad input (a prompt longer than the model's context, a pool too small for one sequence, a
malformed session file) raises an ``EngineInputError``, which is also a ``ValueError``: the
CLI prints it as one line and exits 2. A broken internal invariant raises
``EngineIntegrityError`` from a ``check_integrity()``. Store trouble is never an engine
error: it is a miss (``engine.kv.store_link``).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error raised by the engine package."""


class EngineInputError(EngineError, ValueError):
    """Input the engine cannot serve; the message says what and why."""


class ContextTooLong(EngineInputError):
    """A prompt that does not fit the model's context window."""


class PoolTooSmall(EngineInputError):
    """A sequence that could never fit in the KV pool, even alone."""


class EngineIntegrityError(EngineError):
    """An internal invariant does not hold; raised by ``check_integrity()``."""
