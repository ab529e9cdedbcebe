"""``kvengine make-model``: checkpoints transformers loads and agrees with, reproducible,
written whole or not at all."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.entrypoints import cli
from engine.model import load_model
from engine.model.config import parse_config
from engine.model.make_model import make_model
from engine.model.presets import PRESETS, hf_config
from tests.engine.model.compare import assert_greedy_close, assert_logits_close
from tests.engine.model.hf_checkpoints import load_reference
from tests.engine.model.paged import PagedHarness

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json")


def _digests(path: Path) -> dict[str, str]:
    return {f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in FILES}


@pytest.mark.parametrize("arch,hybrid", [("llama", False), ("qwen2", True), ("qwen3", False),
                                         ("qwen3", True), ("gemma3", True)])
def test_made_model_agrees_with_transformers(tmp_path: Path, arch: str, hybrid: bool) -> None:
    path = make_model(arch, "tiny", tmp_path / "m", hybrid=hybrid, seed=3).path
    ref, lm = load_reference(path), load_model(path)
    assert (128 in lm.spec.layer_windows) == hybrid
    # A prompt longer than the hybrid window, so the sliding layers cut keys off.
    prompt = lm.tokenizer.encode_chat([{"role": "user", "content": "word " * 150}])
    assert len(prompt) > 150
    with torch.no_grad():
        want = ref(torch.tensor([prompt])).logits[0]
        gen = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                           max_new_tokens=8, do_sample=False,
                           output_logits=True, return_dict_in_generate=True,
                           eos_token_id=None, pad_token_id=0)
    h = PagedHarness(lm.model, num_blocks=32, block_tokens=16)
    h.add("a", prompt)
    got = h.prefill("a", [100, len(prompt) - 100])
    assert_logits_close(got, want, f"{arch} prefill")
    ref_tokens = gen.sequences[0, len(prompt):].tolist()
    ref_logits = torch.stack([x[0] for x in gen.logits])
    if len(ref_tokens) < 8:  # generate stopped on one of the checkpoint's stop tokens
        assert ref_tokens[-1] in lm.spec.eos_token_ids
    ours, ours_logits = h.greedy("a", got[-1], len(ref_tokens))
    agreed = assert_greedy_close(ours, ours_logits, ref_tokens, ref_logits, arch)
    assert_logits_close(ours_logits[: agreed + 1], ref_logits[: agreed + 1], f"{arch} decode")


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = make_model("qwen2", "tiny", tmp_path / "a", seed=7).path
    b = make_model("qwen2", "tiny", tmp_path / "b", seed=7).path
    c = make_model("qwen2", "tiny", tmp_path / "c", seed=8).path
    assert _digests(a) == _digests(b)
    assert _digests(a)["model.safetensors"] != _digests(c)["model.safetensors"]


def test_small_preset_shape() -> None:
    """The bench model: 8 layers, hidden 512, 8/2 heads of 64, bf16, 256 KiB per block."""
    small = PRESETS["small"]
    ids = {t: i for i, t in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))}
    cfg = parse_config(hf_config("qwen2", small, True, ids))
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) \
        == (8, 512, 8, 2, 64)
    assert cfg.dtype == torch.bfloat16
    assert cfg.num_layers * 2 * 64 * cfg.num_kv_heads * cfg.head_dim * 2 == 256 * 1024
    assert cfg.max_position_tokens >= 64 * 1024 + 4096
    assert cfg.layer_windows == (128, None) * 4


def test_cli_writes_and_refuses_to_overwrite(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "m"
    assert cli.main(["make-model", "--arch", "qwen3", "--preset", "tiny", "--out",
                     str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    before = _digests(out)
    assert cli.main(["make-model", "--arch", "qwen3", "--preset", "tiny", "--out", str(out),
                     "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"kvengine make-model: error: --out {out}: directory is not empty " \
                      f"(--force replaces it)"
    assert _digests(out) == before
    assert cli.main(["make-model", "--arch", "qwen3", "--preset", "tiny", "--out", str(out),
                     "--seed", "1", "--force"]) == 0
    assert _digests(out) != before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no partial directory left


def test_cli_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["make-model", "--arch", "llama", "--preset", "tiny", "--hybrid",
                     "--out", str(tmp_path / "x")]) == 2
    assert "--hybrid needs --arch gemma3, qwen2 or qwen3" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as info:
        cli.main(["make-model", "--arch", "gpt2", "--preset", "tiny", "--out", "x"])
    assert info.value.code == 2


def test_console_script_help() -> None:
    exe = Path(sys.executable).with_name("kvengine")
    run = subprocess.run([str(exe), "make-model", "--help"], capture_output=True, text=True,
                         timeout=120, check=True)
    for flag in ("--arch", "--preset", "--hybrid", "--out", "--seed"):
        assert flag in run.stdout


def test_gemma3_presets_and_model_info(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``small`` as a Gemma 3: the bench shapes with Gemma's switches; ``model-info`` shows
    the windows and both RoPEs of a made ``tiny``."""
    ids = {t: i for i, t in enumerate(("<pad>", "<eos>", "<bos>", "<start_of_turn>",
                                       "<end_of_turn>"))}
    cfg = parse_config(hf_config("gemma3", PRESETS["small"], True, ids))
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.tie_word_embeddings
    assert (cfg.num_layers, cfg.hidden_size, cfg.head_dim, cfg.dtype) \
        == (8, 512, 64, torch.bfloat16)
    assert cfg.layer_windows == (128, None) * 4
    assert cfg.sliding_rope is not None and cfg.sliding_rope.theta == 1e4
    assert cfg.rope.theta == 1e6 and cfg.attention_scale == 64**-0.5
    assert parse_config(hf_config("gemma3", PRESETS["small"], False, ids)).layer_windows \
        == (None,) * 8
    out = tmp_path / "g"
    assert cli.main(["make-model", "--arch", "gemma3", "--preset", "tiny", "--hybrid",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["model-info", "--model", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "Gemma3ForCausalLM"
    assert info["layer_windows"] == [128, None]
    assert (info["rope"], info["sliding_rope"]) == ("default theta 1e+06", "default theta 10000")
    assert info["activation"] == "gelu_pytorch_tanh" and info["attention_scale"] == 0.25
    assert info["kv_bytes_per_block"] == 2 * 2 * 64 * 2 * 16 * 4
