"""``generation_config.json``'s sampling values: read where present, refused where no
request could hold them, and used by the server for what a request leaves out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.model.generation_config import SamplingDefaults, sampling_defaults
from engine.server.protocol import parse_request


def _with_generation_config(src: Path, dst: Path, **fields: object) -> Path:
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    raw.update(fields)
    path.write_text(json.dumps(raw))
    return dst


def test_the_checkpoints_values_are_read(tiny_dir: Path, tmp_path: Path) -> None:
    d = _with_generation_config(tiny_dir, tmp_path / "m", temperature=0.7, top_p=0.95,
                                top_k=64, do_sample=True)
    got = sampling_defaults(d).as_dict()
    assert got == {"temperature": 0.7, "top_p": 0.95, "top_k": 64.0}


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 1.5),
                                         ("temperature", "hot"), ("min_p", True)])
def test_values_no_request_could_hold_are_refused(tiny_dir: Path, tmp_path: Path,
                                                  field: str, value: object) -> None:
    d = _with_generation_config(tiny_dir, tmp_path / "m", **{field: value})
    with pytest.raises(ConfigError, match=f"generation_config.json: {field}"):
        sampling_defaults(d)


def test_a_request_leaving_them_out_gets_them() -> None:
    defaults = SamplingDefaults((("temperature", 0.3), ("top_p", 0.8)))
    body = {"model": "m", "prompt": "x"}
    assert parse_request(body, "completion", 100).params.temperature == 1.0
    params = parse_request(body, "completion", 100, defaults).params
    assert (params.temperature, params.top_p) == (0.3, 0.8)
    # A value the request gives wins, greedy included.
    asked = parse_request({**body, "temperature": 0}, "completion", 100, defaults).params
    assert asked.greedy and asked.top_p == 0.8
