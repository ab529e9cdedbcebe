"""``--compile``: the model's dense step through ``torch.compile`` (inductor, CPU C++), the
attention kept out of the graph as one opaque op per layer.

On the random ``tiny`` checkpoint (2 layers; one graph builds in seconds on a quiet machine,
tens of seconds on a loaded one): the compiled engine's greedy tokens equal eager's and its
logits are within the dtype's rounding, over prefill chunks and decode steps of 1..3
requests, with a bounded number of graphs; a step that cannot be compiled logs one line
and runs eager; deterministic mode never compiles."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.model.compiled import CompiledModel, CompileOptions, InductorStep
from engine.model.decoder import DecoderLM
from engine.model.loader import LoadedModel, load_model
from tests.engine.model.paged import PagedHarness
from tests.engine.replay.harness import engine, tokens

GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True)
# Inductor fuses each norm's float32 math and its casts into one loop (no bf16 rounding
# in between, unlike eager): a few bf16 ulps on logits of the tiny model's size.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05}


@pytest.fixture(scope="module", params=["bfloat16"])
def tiny_lm(request: pytest.FixtureRequest, tiny_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(tiny_dir, dtype=request.param,
                      revision_cache_dir=tmp_path_factory.mktemp("revisions"))


def _config(compile_step: bool, deterministic: bool = False) -> EngineConfig:
    return EngineConfig(pool_tokens=4096, block_tokens=16, max_batched_tokens=64,
                        compile_step=compile_step, deterministic=deterministic)


def _logits_and_tokens(lm: LoadedModel, compile_step: bool, prompts: list[list[int]]
                       ) -> tuple[list[torch.Tensor], list[list[int]], object]:
    rows: list[torch.Tensor] = []
    with engine(lm, _config(compile_step)) as eng:
        eng.runner.logits_observers.append(lambda seqs, logits: rows.append(logits.clone()))
        seqs = eng.generate(prompts, GREEDY)
        eng.check_integrity()
        return rows, [list(s.output_ids) for s in seqs], eng.runner.model


@pytest.mark.slow
def test_compiled_engine_matches_eager_with_bounded_graphs(tiny_lm: LoadedModel) -> None:
    """Three requests of ragged lengths: 64-token prefill chunks (several rows), then
    decode steps of 3, 2 and 1 requests (the shortest answer first is not needed: the
    budget staggers their admissions), all through at most a graph per size class."""
    vocab = tiny_lm.spec.vocab_size
    prompts = [tokens(90, 1, vocab), tokens(33, 2, vocab), tokens(7, 3, vocab)]
    want_rows, want_tokens, _ = _logits_and_tokens(tiny_lm, False, prompts)
    torch._dynamo.reset()
    got_rows, got_tokens, model = _logits_and_tokens(tiny_lm, True, prompts)
    assert isinstance(model, CompiledModel) and not model.failed
    assert got_tokens == want_tokens
    tol = TOLERANCE[str(tiny_lm.spec.dtype)[6:]]
    assert len(got_rows) == len(want_rows)
    for got, want in zip(got_rows, want_rows, strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=0)
    # One graph per size class (one token or several; one logits row or several), never
    # one per batch size or chunk length.
    assert 1 <= len(model.events) <= 4, model.events
    assert all(e.ok for e in model.events)


class _Unsupported(DecoderLM):
    """A dense step with a data-dependent branch, which fullgraph tracing refuses."""

    def dense_step(self, input_ids: torch.Tensor, positions: torch.Tensor,
                   logits_indices: torch.Tensor, cut_rows: torch.Tensor | None = None,
                   cut_layer: int = -1) -> torch.Tensor:
        if int(input_ids.sum()) >= 0:  # reads a tensor's value on the host
            return super().dense_step(input_ids, positions, logits_indices, cut_rows,
                                      cut_layer)
        raise AssertionError("unreachable")


def test_a_failed_compile_logs_one_line_and_runs_eager(
        tiny_lm: LoadedModel, caplog: pytest.LogCaptureFixture) -> None:
    inner = tiny_lm.model
    assert isinstance(inner, DecoderLM)
    broken = _Unsupported(inner.cfg, inner.spec).to(inner.spec.dtype)
    broken.load_state_dict(inner.state_dict())
    broken.init_buffers(torch.device("cpu"))
    compiled = InductorStep(CompileOptions()).prepare(broken)
    assert isinstance(compiled, CompiledModel)
    eager, tried = PagedHarness(broken, seed=3), PagedHarness(compiled, seed=3)
    prompt = tokens(20, 4, tiny_lm.spec.vocab_size)
    for h in (eager, tried):
        h.add("a", prompt)
    with caplog.at_level(logging.WARNING, logger="engine.model.compiled"):
        want = eager.step(prefill=[("a", 20)])["a"]
        got = tried.step(prefill=[("a", 20)])["a"]
        tried.append("a", int(got[-1].argmax()))
        tried.step(decode=["a"])  # already eager: no second attempt, no second line
    assert compiled.failed
    assert torch.equal(got, want)
    lines = [r.getMessage() for r in caplog.records if "--compile" in r.getMessage()]
    assert len(lines) == 1 and "running eager" in lines[0], lines


def test_deterministic_mode_keeps_compile_off(
        tiny_lm: LoadedModel, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.core.numerics"), \
            engine(tiny_lm, _config(True, deterministic=True)) as eng:
        assert not isinstance(eng.runner.model, CompiledModel)
    assert any("--compile is off under --deterministic" in r.getMessage()
               for r in caplog.records)


def test_a_model_without_a_dense_step_is_left_eager(
        tiny_lm: LoadedModel, caplog: pytest.LogCaptureFixture) -> None:
    from engine.core.numerics import BatchInvariantModel

    wrapped = BatchInvariantModel(tiny_lm.model)
    with caplog.at_level(logging.WARNING, logger="engine.model.compiled"):
        assert InductorStep().prepare(wrapped) is wrapped
    assert "no dense step" in caplog.text
