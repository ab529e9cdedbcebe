"""Authentication and tenant isolation against a real daemon (DESIGN §7)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from clients.config import ClientConfig
from clients.errors import AccessDenied, AuthenticationFailed
from clients.sync_client import GrpcStore
from kvstore.errors import InvalidArgument
from kvstore.rpcserver.auth import AuthError, OpenAuth, load_token_file
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads, write_tokens

NS_A = small_ns(tenant="alice")
NS_B = small_ns(tenant="bob")


def test_token_file_parsing(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    tokens = write_tokens(f, ["alice", "bob"])
    auth = load_token_file(str(f))
    assert auth.tenant_of([("authorization", f"Bearer {tokens['bob']}")]) == "bob"
    with pytest.raises(AuthError):
        auth.tenant_of([("authorization", "Bearer " + "x" * 32)])
    with pytest.raises(AuthError):
        auth.tenant_of([])
    with pytest.raises(AuthError):
        auth.tenant_of([("authorization", tokens["bob"])])  # no "Bearer "
    for bad in ("onlytoken\n", "short alice\n", f"{'a' * 20} x\n{'a' * 20} y\n", ""):
        f.write_text(bad)
        with pytest.raises(InvalidArgument):
            load_token_file(str(f))
    with pytest.raises(InvalidArgument):
        load_token_file(str(tmp_path / "missing"))
    assert OpenAuth().tenant_of([]) is None


@pytest.fixture
def auth_daemon(spawn_daemon: SpawnDaemon, tmp_path: Path) -> tuple[str, dict[str, str]]:
    tokens = write_tokens(tmp_path / "tokens", ["alice", "bob"])
    d = spawn_daemon("--auth-token-file", str(tmp_path / "tokens"))
    return d.target, tokens


def client(target: str, token: str | None, shm: str = "off") -> GrpcStore:
    return GrpcStore(ClientConfig(target=target, auth_token=token, shm=shm, default_timeout_s=10))


def test_missing_or_wrong_token_is_refused(auth_daemon: tuple[str, dict[str, str]]) -> None:
    target, _ = auth_daemon
    for token in (None, "f" * 32):
        with client(target, token) as c, pytest.raises(AuthenticationFailed):
            c.register(NS_A)
    # Health stays reachable without a token (load balancers probe it).
    with grpc.insecure_channel(target) as ch:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("shm", ["off", "auto"])
def test_tenant_cannot_touch_another_tenants_namespace(
    auth_daemon: tuple[str, dict[str, str]], shm: str
) -> None:
    target, tokens = auth_daemon
    keys = make_chain(NS_B, 3, seed=1)
    with client(target, tokens["alice"], shm) as alice, client(target, tokens["bob"], shm) as bob:
        bob.register(NS_B)
        bob.commit(NS_B, keys, payloads(NS_B, keys))
        alice.register(NS_A)
        with pytest.raises(AccessDenied):
            alice.register(NS_B)
        with pytest.raises(AccessDenied):
            alice.lookup(NS_B, keys)
        with pytest.raises(AccessDenied):
            alice.get_into(NS_B, keys, bytearray(3 * NS_B.block_bytes))
        with pytest.raises(AccessDenied):
            alice.commit(NS_B, keys, payloads(NS_B, keys))
        with pytest.raises(AccessDenied):
            alice.delete_namespace(NS_B)
        with pytest.raises(AccessDenied):
            alice.prefetch(NS_B, keys).result(timeout=10)
        # Bob's data is untouched, and the same key chain under Alice's namespace is
        # a different chain: she cannot reach his blocks by naming his keys.
        assert bob.lookup(NS_B, keys).hit_blocks == 3
        assert alice.lookup(NS_A, keys).hit_blocks == 0
        # Deleting her own namespace removes nothing of his.
        alice.delete_namespace(NS_A)
        assert bob.lookup(NS_B, keys).hit_blocks == 3
        assert bob.delete_namespace(NS_B) == 3
        assert bob.lookup(NS_B, keys).hit_blocks == 0


def test_staging_segments_belong_to_their_tenant(auth_daemon: tuple[str, dict[str, str]]) -> None:
    target, tokens = auth_daemon
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        md_a = (("authorization", f"Bearer {tokens['alice']}"),)
        md_b = (("authorization", f"Bearer {tokens['bob']}"),)
        seg = stub.OpenStaging(pb.OpenStagingRequest(size_bytes=1 << 16), metadata=md_a, timeout=5)
        stub.RegisterNamespace(
            pb.RegisterNamespaceRequest(ns=_spec(NS_B)), metadata=md_b, timeout=5
        )
        keys = make_chain(NS_B, 1, seed=2)
        req = pb.GetStagedRequest(
            ns=_spec(NS_B), keys=keys, staging=pb.StagingRef(staging_id=seg.staging_id, offset=0)
        )
        with pytest.raises(grpc.RpcError) as e:
            stub.GetStaged(req, metadata=md_b, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError):
            stub.CloseStaging(
                pb.CloseStagingRequest(staging_id=seg.staging_id), metadata=md_b, timeout=5
            )
        stub.CloseStaging(
            pb.CloseStagingRequest(staging_id=seg.staging_id), metadata=md_a, timeout=5
        )


def _spec(ns):  # type: ignore[no-untyped-def]
    from kvstore.wire.codec import ns_to_proto

    return ns_to_proto(ns)
