"""A model's identity in the store and its name in the API: copies of one checkpoint share
cached KV wherever they lie, and the name clients use is the model's, not its folder's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.kv.namespace import engine_namespace
from engine.model.config import read_json
from engine.model.loader import load_model, model_name


def test_copies_in_two_directories_share_a_namespace(tiny_dir: Path, tmp_path: Path) -> None:
    a = shutil.copytree(tiny_dir, tmp_path / "one" / "model-a")
    b = shutil.copytree(tiny_dir, tmp_path / "two" / "model-b")
    spec_a, spec_b = load_model(a).spec, load_model(b).spec
    assert (spec_a.name, spec_b.name) == ("model-a", "model-b")
    assert (engine_namespace(spec_a, 64).fingerprint
            == engine_namespace(spec_b, 64).fingerprint)


def test_other_tensors_get_another_namespace(tiny_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = config["rms_norm_eps"] * 2  # changes every layer's K/V
    (other / "config.json").write_text(json.dumps(config))
    assert (engine_namespace(load_model(tiny_dir).spec, 64).fingerprint
            != engine_namespace(load_model(other).spec, 64).fingerprint)


def _with_config(src: Path, dst: Path, **fields: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(fields)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_the_name_clients_see(tiny_dir: Path, tmp_path: Path) -> None:
    hub = _with_config(tiny_dir, tmp_path / "hub", _name_or_path="org/tiny-chat")
    assert model_name(hub, read_json(hub / "config.json")) == "org/tiny-chat"
    # transformers writes the local path it loaded from: a folder's path is no name.
    local = _with_config(tiny_dir, tmp_path / "local", _name_or_path="/data/ckpt/tiny")
    assert model_name(local, read_json(local / "config.json")) == "local"
    (hub / "kvengine-model.json").write_text(json.dumps({"name": "tiny-fetched"}))
    # What fetch-model installed it as wins.
    assert model_name(hub, read_json(hub / "config.json")) == "tiny-fetched"
