"""The engine error hierarchy.

Bad input (a prompt longer than the model's context, a pool too small for one sequence, a
malformed session file, a checkpoint the engine cannot load) raises an
``EngineInputError``, which is also a ``ValueError``: the CLI prints it as one line and
exits 2. A broken internal invariant raises
``EngineIntegrityError`` from a ``check_integrity()``. Store trouble is never an engine
error: it is a miss (``engine.connector.store_link``).
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


class CheckpointError(EngineInputError):
    """A model directory the engine cannot load. The message is one line that names the
    file, tensor or config field at fault."""


class UnsupportedModel(CheckpointError):
    """A well-formed checkpoint using an architecture or config value the engine does not
    implement (rather than silently computing something else)."""


class ConfigError(CheckpointError):
    """``config.json`` (or a companion JSON file) is missing a field or holds a bad value."""


class WeightsError(CheckpointError):
    """A tensor is missing, has the wrong shape or dtype, or is not part of the model."""


class TokenizerError(CheckpointError):
    """``tokenizer.json``, ``tokenizer_config.json`` or the chat template is unusable."""
