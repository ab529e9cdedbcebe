from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_nodes.ssd import SSDTier
from tests.io_backends import skip_without_uring
from tests.storage_nodes.ssd.helpers import FakeClock, make_config

BACKENDS = ["uring", "pread"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "uring":
        skip_without_uring()
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_tier(tmp_path: Path, backend: str, clock: FakeClock) -> Iterator[Callable[..., SSDTier]]:
    """Opens tiers on ``tmp_path/ssd`` (same dir on every call); closes them at the end."""
    opened: list[SSDTier] = []

    def make(**kw: Any) -> SSDTier:
        kw.setdefault("io_backend", backend)
        kw.setdefault("clock", clock)
        tier = SSDTier(make_config(tmp_path / "ssd", **kw))
        opened.append(tier)
        return tier

    yield make
    for t in opened:
        t.close()
