"""``kv_transfer_params`` as a request carries them (``engine.server.kv_transfer``), without
a server: any JSON value parses or is a 400, never another error; the role rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.server.errors import APIError
from engine.server.kv_transfer import (
    KV_ROLES,
    OUR_FIELDS,
    VLLM_FIELDS,
    KVTransfer,
    check_role,
    parse_kv_transfer,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 100) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)
fields = st.sampled_from(sorted(OUR_FIELDS | VLLM_FIELDS
                                | {"other", "remote_prefill_cached_tokens"}))


@given(st.one_of(json_values, st.dictionaries(fields, json_values, max_size=6)))
def test_any_value_parses_or_is_a_400(value: object) -> None:
    try:
        got = parse_kv_transfer(value)
    except APIError as e:
        assert e.status == 400 and e.param == "kv_transfer_params"
        return
    if value is None:
        assert got is None
        return
    assert isinstance(value, dict) and isinstance(got, KVTransfer)
    assert got.remote_decode == (value.get("do_remote_decode") is True)
    assert got.remote_prefill == (value.get("do_remote_prefill") is True)
    assert got.blocks == value.get("kvstore_blocks")


def test_vllm_fields_and_unknown_ones_are_accepted() -> None:
    got = parse_kv_transfer({"do_remote_prefill": True, "remote_block_ids": [1, 2],
                             "remote_engine_id": "e", "remote_prefill_cached_tokens": 0,
                             "kvstore_blocks": 3, "kvstore_namespace": "ab"})
    assert got == KVTransfer(remote_decode=False, remote_prefill=True, blocks=3,
                             namespace="ab")


@pytest.mark.parametrize("role", KV_ROLES)
@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("prefill", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_roles(role: str, decode: bool, prefill: bool, stream: bool) -> None:
    transfer = KVTransfer(remote_decode=decode, remote_prefill=prefill)
    fits = not (decode and prefill) and not (decode and role == "decode") \
        and not (prefill and role == "prefill") and not (decode and stream)
    if fits:
        check_role(role, transfer, stream)
    else:
        with pytest.raises(APIError) as e:
            check_role(role, transfer, stream)
        assert e.value.status == 400 and e.value.code == "kv_role_mismatch"
    check_role(role, None, stream)  # a plain request fits every role
