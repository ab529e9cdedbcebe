"""Shared fixtures: namespaces, deterministic payloads, trace location."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import storage_nodes.testing.ssd_backends  # noqa: F401  (registers "crashsim" and "faulty")
from kvstore.keys import Namespace

settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parent.parent


def pytest_report_header(config: pytest.Config) -> str:
    from tests.io_backends import report_header

    return report_header()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The header is hidden by ``-q`` (our addopts): say the backends at the end too."""
    from tests.io_backends import report_header

    terminalreporter.write_line(report_header())


def traces_dir() -> Path | None:
    """The sample traces: $KVSTORE_TRACES_DIR, else ../shared/traces beside the repo."""
    env = os.environ.get("KVSTORE_TRACES_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "traces"
    return path if path.is_dir() else None


@pytest.fixture
def shared_traces() -> Path:
    path = traces_dir()
    if path is None:
        pytest.skip("sample traces not found: set KVSTORE_TRACES_DIR or provide ../shared/traces")
    return path


def small_ns(**overrides: object) -> Namespace:
    """A namespace with small blocks (2 KiB) so tests move little data."""
    fields: dict[str, object] = dict(
        model_id="test-model",
        model_revision="r1",
        kv_dtype="float16",
        kv_layout="mha",
        cached_layers=(0, 1),
        kv_heads=2,
        head_dim=8,
        block_tokens=16,
    )
    fields.update(overrides)
    return Namespace(**fields)  # type: ignore[arg-type]


def payload_for(ns: Namespace, key: bytes) -> bytes:
    """Deterministic payload derived from the key: any reader can re-derive and check it."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.integers(0, 256, ns.block_bytes, dtype=np.uint8).tobytes()


@pytest.fixture
def ns() -> Namespace:
    return small_ns()


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1/localhost (needs the openssl binary)."""
    import subprocess

    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="session", autouse=True)
def _stop_dfs_clusters():
    """Loopback distributed file systems started by tests (tests/dfs) end with the
    session: lazy unmounts first, then every server by PID."""
    yield
    from tests.dfs.cluster import stop_all

    stop_all()
