"""The scheduler's answer for one step (``engine.core.scheduler``): which sequences run and how
many tokens each, in the order the model runner packs them (``engine.core.model_runner``).

It stands alone because it is the one type the scheduler and the model runner share: the
runner needs what a step holds, not the scheduler that chose it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import Sequence


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step's work: prefill chunks (sequence, tokens this step) first, then decodes
    (one token each), as the model's ``ForwardBatch`` packs them."""

    prefills: tuple[tuple[Sequence, int], ...]
    decodes: tuple[Sequence, ...]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.prefills) + len(self.decodes)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes
