from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_nodes.ssd import SSDTier
from storage_nodes.ssd.backends import make_backend
from storage_nodes.ssd.io_backend import IOBackend
from tests.io_backends import skip_without_uring
from tests.storage_nodes.ssd.helpers import FakeClock, make_config

BACKENDS = ["uring", "pread"]
#: every backend, the test-only wrappers included (``storage_nodes.testing.ssd_backends``)
ALL_BACKENDS = ["uring", "pread", "crashsim", "faulty"]


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


@pytest.fixture(params=ALL_BACKENDS)
def any_backend(request: pytest.FixtureRequest) -> Iterator[IOBackend]:
    """A backend of each kind, with a queue of 4 (batches deeper than it are the norm)."""
    if request.param == "uring":
        skip_without_uring()
    b = make_backend(request.param, 4)
    yield b
    b.close()
