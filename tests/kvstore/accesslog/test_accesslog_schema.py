"""The access-log schema is DESIGN §8, field for field."""

from __future__ import annotations

import pyarrow as pa

from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA


def test_fields_names_and_types_are_design_section_8() -> None:
    assert [(f.name, f.type) for f in ACCESS_LOG_SCHEMA] == [
        ("ts_us", pa.int64()),
        ("tenant", pa.string()),
        ("namespace", pa.binary(16)),
        ("block_tokens", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("keys", pa.list_(pa.binary(16))),
        ("hit_blocks", pa.int32()),
        ("hit_hbm", pa.int32()),
        ("hit_dram", pa.int32()),
        ("hit_ssd", pa.int32()),
    ]
