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


def test_a_prefix_key_file_makes_the_keys_kvengine_serve_makes(tmp_path: Path) -> None:
    """The same key file in the connector and in ``kvengine serve`` (two tenants): the same
    namespace and the same chain keys, so vLLM and kvengine keep hitting each other's."""
    import torch

    from clients.vllm_connector.namespace import base_namespace, checkpoint_model_spec
    from engine.kv.namespace import engine_namespace
    from engine.model.make_model import make_model
    from engine.server.prefix_keys import prefix_hash
    from kvstore.keys import chain_keys

    key = tmp_path / "prefix.key"
    key.write_text("5a" * 32 + "\n")
    key.chmod(0o600)
    cfg = ConnectorConfig.from_extra({"store": "grpc://h:1", "prefix_key_file": str(key)})
    assert cfg.prefix_hash.alg == "blake2b_128"
    model_dir = make_model("qwen3", "tiny", tmp_path / "tiny").path
    spec = checkpoint_model_spec(str(model_dir), torch.float32)
    vllm_ns = base_namespace(spec, 64, "engine-1/alice", cfg.prefix_hash)
    serve_ns = engine_namespace(spec, 64, "engine-1/alice", None, prefix_hash("auto", str(key), 2))
    tokens = list(range(1000, 1000 + 64 * 3))
    assert vllm_ns == serve_ns and vllm_ns.hash_alg == "blake2b_128"
    assert chain_keys(vllm_ns, tokens) == chain_keys(serve_ns, tokens)
    plain = base_namespace(spec, 64, "engine-1/alice")  # no key file: xxh3, other keys
    assert plain.hash_alg == "xxh3_128"
    assert not set(chain_keys(plain, tokens)) & set(chain_keys(vllm_ns, tokens))


def test_a_bad_prefix_key_file_is_refused_at_start(tmp_path: Path) -> None:
    key = tmp_path / "prefix.key"
    key.write_text("5a" * 32)
    key.chmod(0o644)
    with pytest.raises(ConnectorConfigError, match=r"^KVStoreConnector: prefix key file .* chmod"):
        ConnectorConfig.from_extra({"store": "grpc://h:1", "prefix_key_file": str(key)})
