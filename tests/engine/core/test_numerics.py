"""``--deterministic``: one request's logits are bitwise the same alone, among seven
others, chunked at 128 tokens, with its prefix from the pool and from a store another
engine filled (exact mode), in float32 and bfloat16, on the random ``tiny`` checkpoint and
on trained SmolLM2; seeded sampling then gives the same text. Without the flag the same
comparisons differ, so these tests can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from engine import cli
from engine.core.numerics import BatchInvariantNumerics, DeterminismUnavailable, check_linears
from engine.core.sampling_params import SamplingParams
from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model
from tests.engine.determinism import differing, outcomes
from tests.engine.model.real_models import real_model, real_text
from tests.engine.replay.harness import tokens

GREEDY = SamplingParams(max_new_tokens=4, ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.9, seed=11)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny_lm(request: pytest.FixtureRequest, tiny_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(tiny_dir, dtype=request.param,
                      revision_cache_dir=tmp_path_factory.mktemp("revisions"))


def test_tiny_logits_are_bitwise_the_same_in_every_condition(tiny_lm: LoadedModel) -> None:
    prompt = tokens(300, 5, tiny_lm.spec.vocab_size)
    assert differing(outcomes(tiny_lm, prompt, GREEDY, deterministic=True)) == []


def test_a_hybrid_model_in_exact_mode(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Sliding-window layers (their own store namespace in exact mode) as well."""
    path = make_model("qwen3", "tiny", tmp_path_factory.mktemp("models") / "hybrid",
                      hybrid=True).path
    lm = load_model(path, dtype="bfloat16", revision_cache_dir=tmp_path_factory.mktemp("rev"))
    assert any(w is not None for w in lm.spec.layer_windows)
    prompt = tokens(300, 7, lm.spec.vocab_size)
    assert max(w or 0 for w in lm.spec.layer_windows) < 300
    assert differing(outcomes(lm, prompt, GREEDY, deterministic=True)) == []


def test_without_the_flag_the_conditions_differ(tiny_lm: LoadedModel) -> None:
    prompt = tokens(300, 5, tiny_lm.spec.vocab_size)
    found = differing(outcomes(tiny_lm, prompt, GREEDY, deterministic=False))
    # Chunking changes the attention's reduction order in any dtype (the reference's
    # prefix/diagonal split), and a cached prefix is a chunk boundary.
    assert {"chunked at 128", "prefix from the pool", "prefix from the store"} <= set(found)


def test_seeded_sampling_gives_the_same_text(tiny_dir: Path, tiny_lm: LoadedModel) -> None:
    prompt = tokens(300, 6, tiny_lm.spec.vocab_size)
    results = outcomes(tiny_lm, prompt, SEEDED, deterministic=True)
    assert differing(results) == []
    texts = {name: tiny_lm.tokenizer.decode(list(o.token_ids)) for name, o in results.items()}
    assert len(set(texts.values())) == 1, texts
    assert len(results["alone"].token_ids) == SEEDED.max_new_tokens


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(real_model("smollm2-135m-instruct"), dtype="bfloat16",
                      revision_cache_dir=tmp_path_factory.mktemp("revisions"))


def _real_prompt(lm: LoadedModel) -> list[int]:
    prompt = lm.tokenizer.encode(real_text(1000))[:160]
    assert len(prompt) == 160  # past one 128-token chunk
    return prompt


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about a minute idle; measured 21 min at load average 16
def test_trained_smollm2_bf16_is_bitwise_the_same(smollm2: LoadedModel) -> None:
    """Five engines over a 160-token prompt (about a minute on two idle cores)."""
    assert differing(outcomes(smollm2, _real_prompt(smollm2), GREEDY, deterministic=True)) == []


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_trained_smollm2_bf16_differs_without_the_flag(smollm2: LoadedModel) -> None:
    # Measured on a 300-token prompt: every condition differs, by up to 0.75 in a logit.
    assert differing(outcomes(smollm2, _real_prompt(smollm2), GREEDY, deterministic=False))


def test_the_start_up_check_refuses_a_non_cpu_model(tiny: LoadedModel) -> None:
    check_linears(tiny.model)  # passes on this machine's BLAS, as the tests above need
    with pytest.raises(DeterminismUnavailable, match="CPU only"):
        check_linears(nn.Linear(8, 8, device="meta"))


def test_other_attention_backends_are_refused() -> None:
    with pytest.raises(DeterminismUnavailable, match="triton"):
        BatchInvariantNumerics().backend_name("triton")
    assert BatchInvariantNumerics().backend_name(None) == "invariant"


def test_cli_runs_deterministic_and_refuses_triton(
        tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("The batch does not change this answer.")
    base = ["generate", "--model", str(tiny_dir), "--prompt-file", str(prompt),
            "--max-new-tokens", "6", "--temperature", "0.8", "--seed", "3", "--json",
            "--deterministic"]
    runs = []
    for budget in ("2048", "8"):  # the second prefills the prompt in 8-token chunks
        assert cli.main([*base, "--max-batched-tokens", budget]) == 0
        runs.append(json.loads(capsys.readouterr().out)["turns"][0]["token_ids"])
    assert runs[0] == runs[1] and len(runs[0]) == 6
    assert cli.main([*base, "--attention-backend", "triton"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvengine generate: error:") and "invariant" in err
    assert len(err.splitlines()) == 1
