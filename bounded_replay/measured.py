"""The measurement the default-mode rule was applied to (bounded_replay/README.md), as data:
``kvengine generate --help`` and ``kvengine serve --help`` print it next to
``--replay-keep``, so whoever opts into bounded replay sees what it costs.

Gemma 3 270M (15 sliding layers of a 512-token window, 3 full), a coding agent's session of
real text, the 64 positions after the prompt teacher-forced on the cold continuation, on 2
shared, loaded vCPUs (``kvengine replay-fidelity --contexts …``). KL is the mean
per-position KL(cold ‖ run) in nats; the floor is a cold prefill chunked 512 instead of
2,048 tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MeasuredKeep:
    dtype: str
    context_tokens: int
    keep_tokens: int
    kl_mean: float
    chunk_floor_kl_mean: float

    @property
    def times_floor(self) -> float:
        return self.kl_mean / self.chunk_floor_kl_mean


MODEL = "gemma-3-270m"
MEASURED_FIDELITY: tuple[MeasuredKeep, ...] = (
    MeasuredKeep("bfloat16", 2048, 140, 0.0471, 0.000595),
    MeasuredKeep("bfloat16", 2048, 524, 0.00294, 0.000595),
    MeasuredKeep("bfloat16", 2048, 1036, 0.000847, 0.000595),
    MeasuredKeep("bfloat16", 8192, 140, 0.0247, 0.000395),
    MeasuredKeep("bfloat16", 8192, 524, 0.00378, 0.000395),
    MeasuredKeep("bfloat16", 8192, 1036, 0.000554, 0.000395),
    MeasuredKeep("bfloat16", 16384, 140, 0.0212, 0.000552),
    MeasuredKeep("bfloat16", 16384, 524, 0.00404, 0.000552),
    MeasuredKeep("bfloat16", 16384, 1036, 0.000674, 0.000552),
    MeasuredKeep("bfloat16", 32704, 140, 0.0184, 0.000512),
    MeasuredKeep("bfloat16", 32704, 524, 0.00300, 0.000512),
    MeasuredKeep("bfloat16", 32704, 1036, 0.000852, 0.000512),
    MeasuredKeep("float32", 2048, 524, 0.00238, 2.56e-12),
    MeasuredKeep("float32", 8192, 524, 0.00293, 2.28e-12),
    MeasuredKeep("float32", 8192, 140, 0.0250, 2.28e-12),
    MeasuredKeep("float32", 8192, 1036, 0.000140, 2.28e-12),
    MeasuredKeep("float32", 16384, 140, 0.0361, 6.22e-12),
    MeasuredKeep("float32", 16384, 524, 0.00434, 6.22e-12),
    MeasuredKeep("float32", 16384, 1036, 0.000106, 6.22e-12),
)


def help_summary() -> str:
    """One paragraph for ``--help``: each measured keep's KL and its multiple of the floor."""
    parts = [f"keep {m.keep_tokens} at {m.context_tokens} tokens ({m.dtype}): KL "
             f"{m.kl_mean:.2g} = {m.times_floor:.1f}x the floor"
             for m in MEASURED_FIDELITY if m.dtype == "bfloat16"]
    exact = [f"keep {m.keep_tokens} at {m.context_tokens} in {m.dtype}: KL {m.kl_mean:.2g} (floor "
             f"{m.chunk_floor_kl_mean:.0e})" for m in MEASURED_FIDELITY if m.dtype != "bfloat16"]
    return (f"Measured on {MODEL}, real text, 64 positions teacher-forced, mean KL against "
            f"a cold prefill; floor = cold chunked 512 vs 2048: " + "; ".join(parts) +
            (f"; {'; '.join(exact)}: the replay's own drift, not rounding" if exact else "") +
            ". The rule (within 2x the floor at every context) failed: exact is the default")
