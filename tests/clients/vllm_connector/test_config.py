"""``kv_connector_extra_config``: a bad value refuses the connector at start with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.vllm_connector.config import ConnectorConfig, ConnectorConfigError


def test_defaults_and_sizes() -> None:
    cfg = ConnectorConfig.from_extra({"store": "embedded:/x", "dram": "2GiB",
                                      "ssd_capacity": "4GiB"})
    assert cfg.is_embedded and cfg.dram_bytes == 2 << 30 and cfg.ssd_capacity_bytes == 4 << 30
    assert cfg.block_tokens == 64 and cfg.call_timeout_s == 5.0
    assert not ConnectorConfig.from_extra({"store": "grpc://127.0.0.1:1"}).is_embedded


@pytest.mark.parametrize("extra", [
    {},
    {"store": "redis://h:1"},
    {"store": "embedded:/x", "dram": "lots"},
    {"store": "embedded:/x", "colour": "blue"},
    {"store": "grpc://h:1", "call_timeout_s": 0},
])
def test_a_bad_config_is_one_line(extra: dict[str, object]) -> None:
    with pytest.raises(ConnectorConfigError) as e:
        ConnectorConfig.from_extra(extra)
    assert "\n" not in str(e.value) and str(e.value).startswith("KVStoreConnector: ")


def test_an_unreadable_token_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConnectorConfigError, match="auth_token_file"):
        ConnectorConfig.from_extra({"store": "grpc://h:1",
                                    "auth_token_file": str(tmp_path / "missing")})
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ConnectorConfigError, match="no token"):
        ConnectorConfig.from_extra({"store": "grpc://h:1", "auth_token_file": str(empty)})
