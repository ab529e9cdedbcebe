"""The bounded-replay error hierarchy.

Every error here is a ``ValueError`` as well: it is bad input (a flag combination, a keep
the model cannot use safely, a hit that does not fit the prompt), which the command lines
print as one line and exit 2 on.
"""

from __future__ import annotations


class ReplayError(ValueError):
    """Base of every error raised by ``bounded_replay``."""


class ReplayRefused(ReplayError):
    """A replay setting that is unsafe or meaningless for this model; the message says why
    and what to pass instead."""


class KeepTooSmall(ReplayRefused):
    """``keep`` below the largest sliding window + the margin, without ``force``."""


class NoFullAttentionLayer(ReplayRefused):
    """Bounded mode asked of a model whose layers all slide: there is nothing to store."""


class PlanInputError(ReplayError):
    """A hit or prompt length the plan cannot describe (a bug in the caller)."""
