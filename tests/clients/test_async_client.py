"""``AsyncGrpcStore`` against a real daemon, natively in asyncio."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients.async_client import AsyncGrpcStore
from clients.breaker import BreakerConfig
from clients.config import ClientConfig
from clients.errors import CircuitOpen
from kvstore.errors import BufferSizeError, StoreUnavailable, UnknownNamespace
from kvstore.testing.daemon_process import DaemonProcess
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import make_chain, payloads

NS = small_ns(model_id="async-client")


@pytest.mark.parametrize("shm", ["off", "auto"])
def test_every_rpc_concurrently(shared_daemon: DaemonProcess, shm: str) -> None:
    async def main() -> None:
        s = AsyncGrpcStore(ClientConfig(target=shared_daemon.target, shm=shm))
        try:
            assert await s.uses_shm() == (shm == "auto")
            await s.register(NS)

            async def one(seed: int) -> None:
                keys = make_chain(NS, 4, seed=seed)
                res = await s.commit(NS, keys, payloads(NS, keys, idx=[0, 1, 2]))
                assert res.inserted == 3
                assert (await s.lookup(NS, keys)).hit_blocks == 3
                dst = np.zeros(4 * NS.block_bytes, np.uint8)
                assert await s.get_into(NS, keys, dst) == 3
                assert dst[: 3 * NS.block_bytes].tobytes() == b"".join(
                    payloads(NS, keys, idx=[0, 1, 2]).values()
                )
                assert await s.prefetch(NS, keys) == 3

            await asyncio.gather(*(one(100 * (shm == "auto") + i) for i in range(16)))
            with pytest.raises(BufferSizeError):
                await s.get_into(NS, make_chain(NS, 2, seed=1), bytearray(3))
            with pytest.raises(UnknownNamespace):
                await s.lookup(small_ns(model_id="never"), make_chain(NS, 1, seed=1))
            await s.flush()
            st = await s.stats()
            # Bounds by nature: the module's daemon is shared with the other tests.
            assert st.tiers[0].used_bytes >= 16 * 3 * NS.block_bytes
            assert await s.delete_namespace(NS) >= 16 * 3
        finally:
            await s.close()
        with pytest.raises(StoreUnavailable):
            await s.lookup(NS, [])

    asyncio.run(main())


def test_unreachable_daemon_opens_the_breaker() -> None:
    async def main() -> None:
        cfg = ClientConfig(
            target="127.0.0.1:1",
            default_timeout_s=0.5,
            # One failure opens it: how many retries fit in the deadline depends on the load.
            breaker=BreakerConfig(failure_threshold=1, cooldown_s=60),
        )
        s = AsyncGrpcStore(cfg)
        try:
            with pytest.raises(StoreUnavailable) as first:
                await s.register(NS)
            assert not isinstance(first.value, CircuitOpen)  # the real cause is reported
            with pytest.raises(CircuitOpen):
                await s.register(NS)
        finally:
            await s.close()

    asyncio.run(main())
