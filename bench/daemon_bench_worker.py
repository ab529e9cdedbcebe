"""One benchmark client process for ``bench/bench_daemon.py`` (not collected by pytest).

Runs in whichever interpreter owns the system under test (the project's venv for the
kvstore daemon, Redis and memcpy; Mooncake's own venv for Mooncake), so it imports
only the standard library and numpy at the top. The parent drives it over stdin/stdout
with one JSON line per step: ``ready`` → (go) → ``put`` → (go) → ``get`` → (exit).
Times are ``time.monotonic_ns`` (CLOCK_MONOTONIC), comparable across processes.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


def make_data(n: int, size: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(16) for _ in range(n)]
    pool = rng.integers(0, 256, size + 64 * 1024, dtype=np.uint8)
    values = np.empty((n, size), np.uint8)
    for i in range(n):
        off = int(rng.integers(0, 64 * 1024))
        values[i] = pool[off : off + size]
        values[i, :8] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)  # all distinct
    return keys, values


class Driver(Protocol):
    """What the worker asks of each system it drives."""

    def put(self, keys: list[bytes], values: np.ndarray) -> None: ...

    def get(self, keys: list[bytes]) -> Any: ...

    def close(self) -> None: ...


class KVStoreDriver:
    def __init__(self, cfg: dict[str, Any]) -> None:
        from clients.config import ClientConfig
        from clients.sync_client import GrpcStore
        from kvstore.keys import Namespace

        size = cfg["size"]
        self.ns = Namespace(
            f"bench-{size}", "r1", "uint8", "mha", (0,), 1, size // 128, block_tokens=64
        )
        assert self.ns.block_bytes == size
        shm = "off" if cfg["system"] == "kvstore-grpc" else "auto"
        self.store = GrpcStore(
            ClientConfig(target=cfg["target"], shm=shm, shm_bytes=256 << 20, default_timeout_s=120)
        )
        if shm == "auto" and not self.store.uses_shm:
            raise SystemExit("shared-memory path not available")
        self.store.register(self.ns)
        b = cfg["batch"]
        self.zc = cfg["system"] == "kvstore-shm-zc"
        if self.zc:
            got = self.store.staging_buffer(b * size)
            assert got is not None
            self.dst = got[1].reshape(b, size)
        else:
            self.dst = np.empty((b, size), np.uint8)

    def put(self, keys: list[bytes], values: np.ndarray) -> None:
        self.store.commit(self.ns, keys, {i: values[i] for i in range(len(keys))})

    def get(self, keys: list[bytes]) -> np.ndarray:
        dst = self.dst[: len(keys)]
        hit = self.store.get_into(self.ns, keys, dst)
        if hit != len(keys):
            raise RuntimeError(f"kvstore get: {hit} of {len(keys)} blocks")
        return dst

    def close(self) -> None:
        self.store.close()


class RedisDriver:
    def __init__(self, cfg: dict[str, Any]) -> None:
        import redis

        self.r = redis.Redis(host="127.0.0.1", port=cfg["redis_port"])

    def put(self, keys: list[bytes], values: np.ndarray) -> None:
        if len(keys) == 1:
            self.r.set(keys[0], values[0].tobytes())
            return
        p = self.r.pipeline(transaction=False)
        for k, v in zip(keys, values, strict=True):
            p.set(k, v.tobytes())
        p.execute()

    def get(self, keys: list[bytes]) -> list[Any]:
        return [self.r.get(keys[0])] if len(keys) == 1 else self.r.mget(keys)

    def close(self) -> None:
        self.r.close()


class MooncakeDriver:
    def __init__(self, cfg: dict[str, Any]) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.s = MooncakeDistributedStore()
        rc = self.s.setup(
            "127.0.0.1",
            "P2PHANDSHAKE",
            cfg["mooncake_seg_mb"] << 20,
            cfg["mooncake_buf_mb"] << 20,
            "tcp",
            "",
            f"127.0.0.1:{cfg['mooncake_port']}",
        )
        if rc != 0:
            raise SystemExit(f"mooncake setup rc={rc}")

    def put(self, keys: list[bytes], values: np.ndarray) -> None:
        ks = [k.hex() for k in keys]
        rc = (
            self.s.put(ks[0], values[0].tobytes())
            if len(ks) == 1
            else self.s.put_batch(ks, [v.tobytes() for v in values])
        )
        if rc != 0:
            raise RuntimeError(f"mooncake put rc={rc}")

    def get(self, keys: list[bytes]) -> list[Any]:
        ks = [k.hex() for k in keys]
        return [self.s.get(ks[0])] if len(ks) == 1 else self.s.get_batch(ks)

    def close(self) -> None:
        self.s.close()


class MemcpyDriver:
    """The limit: the same bytes copied into and out of one process's memory."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.store = np.empty((cfg["n"], cfg["size"]), np.uint8)
        self.slot: dict[bytes, int] = {}
        self.dst = np.empty((cfg["batch"], cfg["size"]), np.uint8)

    def put(self, keys: list[bytes], values: np.ndarray) -> None:
        for k, v in zip(keys, values, strict=True):
            s = self.slot.setdefault(k, len(self.slot))
            np.copyto(self.store[s], v)

    def get(self, keys: list[bytes]) -> np.ndarray:
        for j, k in enumerate(keys):
            np.copyto(self.dst[j], self.store[self.slot[k]])
        return self.dst[: len(keys)]

    def close(self) -> None:
        pass


DRIVERS: dict[str, Callable[[dict[str, Any]], Driver]] = {
    "kvstore-grpc": KVStoreDriver,
    "kvstore-shm": KVStoreDriver,
    "kvstore-shm-zc": KVStoreDriver,
    "redis": RedisDriver,
    "mooncake": MooncakeDriver,
    "memcpy": MemcpyDriver,
}


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_phase(
    driver: Driver,
    op: str,
    keys: list[bytes],
    values: np.ndarray,
    order: list[int],
    b: int,
    min_s: float,
) -> dict[str, Any]:
    """One pass of ``op`` over ``order`` in calls of ``b`` values; gets repeat the pass
    until ``min_s`` has elapsed (at most 8 passes) so that fast systems are not timed over
    a few milliseconds of a noisy machine."""
    lat: list[int] = []
    nbytes = 0
    t0 = time.monotonic_ns()
    for _ in range(1 if op == "put" else 8):
        for s in range(0, len(order), b):
            idx = order[s : s + b]
            ks = [keys[i] for i in idx]
            t = time.monotonic_ns()
            if op == "put":
                contiguous = idx == list(range(idx[0], idx[0] + len(idx)))
                driver.put(ks, values[idx[0] : idx[0] + len(idx)] if contiguous else values[idx])
            else:
                got = driver.get(ks)
                for j, i in enumerate(idx):  # spot-check every value: size and first bytes
                    v = got[j]
                    if (
                        v is None
                        or len(v) != values.shape[1]
                        or bytes(v[:64]) != values[i, :64].tobytes()
                    ):
                        raise RuntimeError(f"{op}: wrong value for key {i}")
            lat.append(time.monotonic_ns() - t)
            nbytes += len(idx) * values.shape[1]
        if time.monotonic_ns() - t0 >= min_s * 1e9:
            break
    return {"start_ns": t0, "end_ns": time.monotonic_ns(), "lat_ns": lat, "bytes": nbytes}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    keys, values = make_data(cfg["n"], cfg["size"], cfg["seed"])
    driver = DRIVERS[cfg["system"]](cfg)
    b = cfg["batch"]
    say({"ready": True})
    sys.stdin.readline()
    say({"put": run_phase(driver, "put", keys, values, list(range(cfg["n"])), b, 0)})
    sys.stdin.readline()
    order = list(np.random.default_rng(cfg["seed"] + 1).permutation(cfg["n"]))
    say(
        {
            "get": run_phase(
                driver, "get", keys, values, [int(i) for i in order], b, cfg.get("min_s", 1.0)
            )
        }
    )
    sys.stdin.readline()
    driver.close()


if __name__ == "__main__":
    main()
