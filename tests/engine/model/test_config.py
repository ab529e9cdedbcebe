"""config.json parsing: windows, defaults and RoPE agree with transformers' config classes;
bad or unsupported values are one-line errors naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import ConfigError, UnsupportedModel
from engine.model.config import parse_config
from engine.model.rope import inverse_frequencies
from tests.engine.model.hf_checkpoints import BASE

ARCH_CONFIG = {
    "LlamaForCausalLM": "LlamaConfig",
    "MistralForCausalLM": "MistralConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen3ForCausalLM": "Qwen3Config",
    "Gemma3ForCausalLM": "Gemma3TextConfig",
}


def _ours(arch: str, fields: dict[str, Any]) -> Any:
    return parse_config({"architectures": [arch], **fields})


def _theirs(arch: str, fields: dict[str, Any]) -> Any:
    return getattr(transformers, ARCH_CONFIG[arch]).from_dict(dict(fields))


def _their_windows(arch: str, cfg: Any) -> list[int | None]:
    n = cfg.num_hidden_layers
    if arch == "LlamaForCausalLM":
        return [None] * n
    if arch == "MistralForCausalLM":
        return [cfg.sliding_window] * n
    return [cfg.sliding_window if t == "sliding_attention" else None for t in cfg.layer_types]


qwen_window_fields = st.fixed_dictionaries(
    {"num_hidden_layers": st.integers(1, 6)},
    optional={
        "use_sliding_window": st.booleans(),
        "sliding_window": st.none() | st.integers(1, 64),
        "max_window_layers": st.integers(0, 7),
        "layer_types": st.just("random"),
    },
)


@given(arch=st.sampled_from(["Qwen2ForCausalLM", "Qwen3ForCausalLM"]),
       fields=qwen_window_fields, kinds=st.lists(st.booleans(), min_size=6, max_size=6))
def test_qwen_sliding_layers_follow_transformers(arch: str, fields: dict[str, Any],
                                                 kinds: list[bool]) -> None:
    if fields.get("layer_types") == "random":
        fields["layer_types"] = ["sliding_attention" if k else "full_attention"
                                 for k in kinds[: fields["num_hidden_layers"]]]
    fields = {**BASE, **fields}
    theirs = _theirs(arch, fields)
    expected = _their_windows(arch, theirs)
    if theirs.sliding_window is None and "sliding_attention" in theirs.layer_types:
        # transformers cannot build this model (no window for a sliding layer): we refuse.
        with pytest.raises(ConfigError, match="sliding_window"):
            _ours(arch, fields)
        return
    assert list(_ours(arch, fields).layer_windows) == expected


DEFAULT_CASES: list[dict[str, Any]] = [
    {},  # every default
    {"sliding_window": None},
    {"sliding_window": 16, "use_sliding_window": True, "max_window_layers": 1},
    {"num_key_value_heads": None, "head_dim": None},  # null: derive them
    {"head_dim": 32, "num_key_value_heads": 1, "tie_word_embeddings": True},
    {"max_position_embeddings": 777, "rms_norm_eps": 1e-5},
]
# (8 heads: Mistral's default of 8 KV heads must divide them)
SIZES = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 128,
         "num_hidden_layers": 3, "num_attention_heads": 8}


def _accepted_by_transformers(arch: str, fields: dict[str, Any]) -> bool:
    # Some families' strict config classes refuse a null (Mistral's num_key_value_heads,
    # Qwen3's head_dim): there is no reference to compare with then.
    try:
        _theirs(arch, {**SIZES, **fields})
    except (TypeError, ValueError, StrictDataclassError):
        return False
    return True


@pytest.mark.parametrize("arch,fields", [
    (arch, fields) for arch in sorted(ARCH_CONFIG) for fields in DEFAULT_CASES
    if _accepted_by_transformers(arch, fields)
])
def test_defaults_follow_transformers(arch: str, fields: dict[str, Any]) -> None:
    # Only the sizes are given; whatever is left out takes the family's default.
    raw = {**SIZES, **fields}
    theirs = _theirs(arch, raw)
    if theirs.num_attention_heads % theirs.num_key_value_heads:
        # e.g. Qwen's default of 32 KV heads for 8 query heads: transformers builds a
        # broken model, we refuse.
        with pytest.raises(ConfigError, match="num_key_value_heads"):
            _ours(arch, raw)
        return
    if getattr(theirs, "sliding_window", 0) is None and "sliding_attention" in (
            getattr(theirs, "layer_types", None) or ()):
        # Gemma 3 without a window: transformers fails on the first forward, we on load.
        with pytest.raises(ConfigError, match="sliding_window"):
            _ours(arch, raw)
        return
    ours = _ours(arch, raw)
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert ours.head_dim == head_dim
    assert ours.num_kv_heads == theirs.num_key_value_heads
    assert ours.max_position_tokens == theirs.max_position_embeddings
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings
    assert list(ours.layer_windows) == _their_windows(arch, theirs)


@pytest.mark.parametrize("rope", [
    {"rope_theta": 500000.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}},
    {"rope_scaling": {"type": "linear", "factor": 2.5}, "rope_theta": 2e4},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
     "max_position_embeddings": 131072, "hidden_size": 512, "num_attention_heads": 4},
    {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0}, "max_position_embeddings": 64},
])
def test_rope_frequencies_match_transformers(rope: dict[str, Any]) -> None:
    fields = {**BASE, **rope}
    ours = _ours("LlamaForCausalLM", fields)
    theirs = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(
        _theirs("LlamaForCausalLM", fields))
    torch.testing.assert_close(inverse_frequencies(ours.rope, ours.head_dim), theirs.inv_freq,
                               rtol=0, atol=0)
    assert theirs.attention_scaling == 1.0


@pytest.mark.parametrize("fields,error,field", [
    ({"architectures": ["GPT2LMHeadModel"]}, UnsupportedModel, "GPT2LMHeadModel"),
    ({"architectures": []}, ConfigError, "architectures"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, UnsupportedModel, "yarn"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, UnsupportedModel, "dynamic"),
    ({"rope_parameters": {"rope_type": "linear"}}, ConfigError, "factor"),
    ({"hidden_act": "gelu"}, UnsupportedModel, "hidden_act"),
    ({"num_key_value_heads": 3}, ConfigError, "num_key_value_heads"),
    ({"hidden_size": None}, ConfigError, "hidden_size"),
    ({"hidden_size": "64"}, ConfigError, "hidden_size"),
    ({"head_dim": 15}, ConfigError, "head_dim"),
    ({"dtype": "float8_e4m3fn"}, UnsupportedModel, "dtype"),
    ({"quantization_config": {"quant_method": "gptq"}}, UnsupportedModel, "quantization"),
    ({"partial_rotary_factor": 0.5}, UnsupportedModel, "partial_rotary_factor"),
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
      "sliding_window": 8, "layer_types": ["full_attention"]}, ConfigError, "layer_types"),
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 8,
      "layer_types": ["chunked_attention"] * 3}, UnsupportedModel, "chunked_attention"),
])
def test_bad_config_is_one_line_naming_the_field(fields: dict[str, Any], error: type,
                                                  field: str) -> None:
    raw = {"architectures": ["LlamaForCausalLM"], **BASE, **fields}
    if raw.get("hidden_size", 0) is None:
        del raw["hidden_size"]
    with pytest.raises(error) as info:
        parse_config(raw)
    message = str(info.value)
    assert field in message and "\n" not in message


# Gemma 3 (Gemma3TextConfig): windows from layer_types or sliding_window_pattern, a RoPE per
# layer type in both config forms, its defaults and its refusals.
GEMMA = "Gemma3ForCausalLM"
GEMMA_SIZES = {**SIZES, "num_hidden_layers": 7}


def _gemma(fields: dict[str, Any]) -> tuple[Any, Any]:
    raw = {**GEMMA_SIZES, **fields}
    return _ours(GEMMA, raw), transformers.Gemma3TextConfig.from_dict(dict(raw))


def test_gemma_defaults_follow_transformers() -> None:
    ours, theirs = _gemma({})
    assert (ours.head_dim, ours.num_kv_heads) == (theirs.head_dim, theirs.num_key_value_heads)
    assert ours.max_position_tokens == theirs.max_position_embeddings == 131072
    assert ours.tie_word_embeddings and theirs.tie_word_embeddings
    assert ours.activation == theirs.hidden_activation == "gelu_pytorch_tanh"
    assert ours.attention_scale == theirs.query_pre_attn_scalar**-0.5 == 1 / 16
    assert ours.final_logit_softcap is None and not ours.qkv_bias and not ours.mlp_bias
    assert list(ours.layer_windows) == _their_windows(GEMMA, theirs) \
        == [4096] * 5 + [None, 4096]
    assert (ours.eos_token_ids, ours.bos_token_id) == ((theirs.eos_token_id,),
                                                        theirs.bos_token_id)
    assert ours.rope.theta == 1e6 and ours.sliding_rope is not None \
        and ours.sliding_rope.theta == 1e4


@pytest.mark.parametrize("fields", [
    {"sliding_window_pattern": 2},
    {"sliding_window_pattern": 1},  # every layer full
    {"sliding_window": 16, "sliding_window_pattern": 9},  # every layer sliding
    {"sliding_window": 512, "layer_types": ["full_attention"] * 3 + ["sliding_attention"] * 4},
    {"sliding_window": None, "layer_types": ["full_attention"] * 7},
])
def test_gemma_windows_follow_transformers(fields: dict[str, Any]) -> None:
    ours, theirs = _gemma(fields)
    assert list(ours.layer_windows) == _their_windows(GEMMA, theirs)


@pytest.mark.parametrize("rope", [
    {},
    {"rope_theta": 5e5, "rope_local_base_freq": 2e3},  # gemma-3-270m's form
    {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    {"rope_local_base_freq": 50.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 7.0}}},
    {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_theta": 3.0, "rope_local_base_freq": 3.0},  # the nested thetas win
    {"rope_parameters": {"sliding_attention": None}, "rope_theta": 9e5},
])
def test_gemma_rope_per_layer_type_matches_transformers(rope: dict[str, Any]) -> None:
    ours, theirs = _gemma({"head_dim": 32, **rope})
    rotary = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(theirs)
    assert ours.sliding_rope is not None
    for kind, mine in (("full_attention", ours.rope), ("sliding_attention", ours.sliding_rope)):
        torch.testing.assert_close(inverse_frequencies(mine, ours.head_dim),
                                   getattr(rotary, f"{kind}_inv_freq"), rtol=0, atol=0)
        assert getattr(rotary, f"{kind}_attention_scaling") == 1.0
    # Each layer takes its type's RoPE.
    assert [ours.layer_rope(i) is ours.sliding_rope for i in range(7)] \
        == [t == "sliding_attention" for t in theirs.layer_types]


@pytest.mark.parametrize("fields,error,field", [
    ({"attn_logit_softcapping": 50.0}, UnsupportedModel, "attn_logit_softcapping"),
    ({"use_bidirectional_attention": True}, UnsupportedModel, "use_bidirectional_attention"),
    ({"query_pre_attn_scalar": 0}, ConfigError, "query_pre_attn_scalar"),
    ({"query_pre_attn_scalar": None}, ConfigError, "query_pre_attn_scalar"),
    ({"final_logit_softcapping": "30"}, ConfigError, "final_logit_softcapping"),
    ({"hidden_activation": "gelu"}, UnsupportedModel, "hidden_activation"),
    ({"sliding_window_pattern": 0}, ConfigError, "sliding_window_pattern"),
    ({"sliding_window": None}, ConfigError, "sliding_window"),
    ({"rope_local_base_freq": -1.0}, ConfigError, "rope_local_base_freq"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, UnsupportedModel,
     "rope_parameters"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
     UnsupportedModel, "rope_parameters.sliding_attention.rope_type"),
    ({"rope_scaling": {"rope_type": "linear"}}, ConfigError, "rope_parameters.full_attention"),
    ({"rope_parameters": {"full_attention": 5}}, ConfigError, "rope_parameters.full_attention"),
])
def test_bad_gemma_config_is_one_line_naming_the_field(fields: dict[str, Any], error: type,
                                                        field: str) -> None:
    with pytest.raises(error) as info:
        _ours(GEMMA, {**GEMMA_SIZES, **fields})
    message = str(info.value)
    assert field in message and "\n" not in message


def test_gemma_switches_enter_the_revision_fields_others_keep_theirs() -> None:
    llama = _ours("LlamaForCausalLM", dict(BASE))
    assert len(llama.kv_fields()) == 16  # no Gemma switch: the fields before Gemma 3
    base = _ours(GEMMA, dict(GEMMA_SIZES)).kv_fields()
    for change in ({"query_pre_attn_scalar": 128}, {"rope_local_base_freq": 2e4},
                   {"hidden_activation": "silu"}):
        assert _ours(GEMMA, {**GEMMA_SIZES, **change}).kv_fields() != base, change
    # The final soft-cap changes the logits, never the K/V.
    assert _ours(GEMMA, {**GEMMA_SIZES, "final_logit_softcapping": 30.0}).kv_fields() == base
