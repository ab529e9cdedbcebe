"""Trace readers: each yields ``Request``s in replay order, streaming where the format allows."""

from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.readers.detect import FORMATS, open_inputs

__all__ = ["FORMATS", "TraceReader", "open_inputs"]
