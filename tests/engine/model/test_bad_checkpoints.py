"""A checkpoint the engine cannot serve is one line naming the tensor, field or file: a
typed ``CheckpointError`` from ``load_model``, exit status 2 from the CLI (``model-info``
and ``generate``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.entrypoints import cli
from engine.errors import (
    CheckpointError,
    ConfigError,
    TokenizerError,
    UnsupportedModel,
    WeightsError,
)
from engine.model import load_model
from engine.model.make_model import make_model

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("qwen3", "tiny", tmp_path_factory.mktemp("good") / "m").path


def _edit_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(path / WEIGHTS)
    edit(tensors)
    save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})


def _edit_config(path: Path, edit: Callable[[dict], None]) -> None:
    raw = json.loads((path / "config.json").read_text())
    edit(raw)
    (path / "config.json").write_text(json.dumps(raw))


def _drop_q_proj(t: dict) -> None:
    del t["model.layers.1.self_attn.q_proj.weight"]


def _widen_k_proj(t: dict) -> None:
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(40, 64)


def _extra_layer(t: dict) -> None:
    t["model.layers.2.mlp.down_proj.weight"] = torch.zeros(64, 128)


def _int_norm(t: dict) -> None:
    t["model.norm.weight"] = torch.ones(64, dtype=torch.int32)


def _shard_index(path: Path) -> None:
    names = list(load_file(path / WEIGHTS))
    index = {"metadata": {}, "weight_map": {n: "model-00001-of-00002.safetensors"
                                            for n in names}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / WEIGHTS).unlink()


CASES: list[tuple[str, Callable[[Path], object], type, str]] = [
    ("missing tensor", lambda p: _edit_tensors(p, _drop_q_proj), WeightsError,
     "model.layers.1.self_attn.q_proj.weight"),
    ("wrong shape", lambda p: _edit_tensors(p, _widen_k_proj), WeightsError,
     "model.layers.0.self_attn.k_proj.weight"),
    ("unknown tensor", lambda p: _edit_tensors(p, _extra_layer), WeightsError,
     "model.layers.2.mlp.down_proj.weight"),
    ("integer tensor", lambda p: _edit_tensors(p, _int_norm), WeightsError,
     "model.norm.weight"),
    ("unsupported architecture",
     lambda p: _edit_config(p, lambda c: c.update(architectures=["GPTNeoXForCausalLM"])),
     UnsupportedModel, "GPTNeoXForCausalLM"),
    ("unknown rope type",
     lambda p: _edit_config(p, lambda c: c.update(rope_parameters={"rope_type": "longrope"})),
     UnsupportedModel, "longrope"),
    ("config size disagrees with the tensors",
     lambda p: _edit_config(p, lambda c: c.update(intermediate_size=96)), WeightsError,
     "mlp.down_proj.weight' has shape [64, 128], expected [64, 96]"),
    ("unsupported dtype", lambda p: _edit_config(p, lambda c: c.update(dtype="int8")),
     UnsupportedModel, "int8"),
    ("config is not JSON", lambda p: (p / "config.json").write_text("{nope"), ConfigError,
     "config.json"),
    ("no config", lambda p: (p / "config.json").unlink(), ConfigError, "config.json"),
    ("no tokenizer", lambda p: (p / "tokenizer.json").unlink(), TokenizerError,
     "tokenizer.json"),
    ("broken tokenizer", lambda p: (p / "tokenizer.json").write_text('{"model": 1}'),
     TokenizerError, "tokenizer.json"),
    ("chat template does not compile",
     lambda p: (p / "chat_template.jinja").write_text("{% for %}"), TokenizerError,
     "chat template"),
    ("no weights", lambda p: (p / WEIGHTS).unlink(), CheckpointError, WEIGHTS),
    ("pickled weights only",
     lambda p: ((p / WEIGHTS).rename(p / "pytorch_model.bin")), UnsupportedModel,
     "safetensors"),
    ("garbage weights", lambda p: (p / WEIGHTS).write_bytes(b"\x00" * 100), CheckpointError,
     WEIGHTS),
    ("missing shard", _shard_index, CheckpointError, "model-00001-of-00002.safetensors"),
]


@pytest.mark.parametrize("what,damage,error,named", CASES, ids=[c[0] for c in CASES])
def test_bad_checkpoint_is_one_line_naming_what(good: Path, tmp_path: Path, what: str,
                                                damage: Callable[[Path], object], error: type,
                                                named: str, capsys: pytest.CaptureFixture
                                                ) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    damage(bad)
    with pytest.raises(error) as info:
        load_model(bad)
    assert named in str(info.value) and "\n" not in str(info.value)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    for argv in (["model-info", "--model", str(bad)],
                 ["generate", "--model", str(bad), "--prompt-file", str(prompt), "--json"]):
        assert cli.main(argv) == 2
        out, err = capsys.readouterr()
        (line,) = err.strip().splitlines()  # one line, no traceback, no progress bar
        assert line.startswith(f"kvengine {argv[0]}: error: ") and named in line
        assert out == ""


def test_good_checkpoint_loads(good: Path) -> None:
    lm = load_model(good)
    assert lm.spec.architecture == "Qwen3ForCausalLM"
