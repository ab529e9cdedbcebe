"""Replayed rows stop at the last sliding layer (``engine.core.row_cut``).

The cut removes only computation nothing reads, so under ``--deterministic``
(batch-invariant products and attention) the new tokens' logits are **bitwise** those of
the uncut replay: on a random ``tiny`` Gemma 3 (``kvengine make-model``; its one sliding
layer is layer 0, so the replayed rows stop there) and on a 4-layer hybrid Qwen2 (sliding
0 and 2, full 1 and 3: a full layer below the cut stays whole, the one above runs the new
rows only), on a store hit and on a pool hit, with prefill chunks that are all replay,
that mix replayed and new rows, and that are all new. The metadata of the rows kept
(``cut_rows``) is checked on its own over random step layouts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.forward_batch import DecodeMeta, ForwardBatch, PrefillMeta
from engine.core.row_cut import cut_rows, last_sliding_layer
from engine.errors import EngineIntegrityError
from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model
from kvstore.embedded import open_embedded
from tests.engine.model.hf_checkpoints import write_case
from tests.engine.replay.conftest import DEEP
from tests.engine.replay.harness import BT, Run, config, engine, fill, request, tokens

HIT_BLOCKS = 16  # 256 tokens cached
PROMPT = 400


@pytest.fixture(scope="module", params=["tiny-gemma3", "deep-qwen2"])
def lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
       ) -> LoadedModel:
    out: Path = tmp_path_factory.mktemp("models")
    if request.param == "tiny-gemma3":
        path = make_model("gemma3", "tiny", out / "gemma3", hybrid=True).path
        return load_model(path, dtype="bfloat16",
                          revision_cache_dir=tmp_path_factory.mktemp("revisions"))
    return load_model(write_case(DEEP, out), revision_cache_dir=tmp_path_factory.mktemp("rev"))


def keep_of(lm: LoadedModel) -> int:
    return max(w for w in lm.spec.layer_windows if w is not None) + 12


def _store_hit(lm: LoadedModel, cut: bool, budget: int) -> Run:
    cfg = replace(config(keep_of(lm), budget=budget, force=True), replay_row_cut=cut,
                  deterministic=True, attention_backend=None)
    prompt = tokens(PROMPT, 5, lm.spec.vocab_size)
    store = open_embedded(dram_bytes=64 << 20)
    try:
        fill(lm, cfg, store, prompt[: HIT_BLOCKS * BT])
        with engine(lm, cfg, store) as eng:
            run = request(eng, prompt)
            run.cut = eng.runner.counters["cut_rows_total"]  # type: ignore[attr-defined]
            return run
    finally:
        store.close()


def _pool_hit(lm: LoadedModel, cut: bool, budget: int) -> Run:
    """A first request leaves the shared prefix in the pool; its idle sliding rows are
    evicted (as pool pressure does, ``SlidingTables.make_room``), so the second request,
    diverging after the prefix, hits the full layers' blocks and replays the window."""
    cfg = replace(config(keep_of(lm), budget=budget, force=True), replay_row_cut=cut,
                  deterministic=True, attention_backend=None)
    vocab = lm.spec.vocab_size
    prefix = tokens(HIT_BLOCKS * BT, 6, vocab)
    with engine(lm, cfg) as eng:
        request(eng, prefix + tokens(PROMPT, 7, vocab), 1)
        eng.kv.sliding.drop_idle()
        run = request(eng, prefix + tokens(PROMPT - len(prefix), 8, vocab))
        run.cut = eng.runner.counters["cut_rows_total"]  # type: ignore[attr-defined]
        return run


@pytest.mark.parametrize("budget", [96, 2048], ids=["chunked-96", "one-step"])
@pytest.mark.parametrize("hit", [_store_hit, _pool_hit], ids=["store", "pool"])
def test_the_cut_changes_no_bit_of_the_new_tokens_logits(lm: LoadedModel, hit, budget: int  # type: ignore[no-untyped-def]
                                                          ) -> None:
    with_cut, without = hit(lm, True, budget), hit(lm, False, budget)
    replayed = with_cut.seq.stats.replayed_tokens
    assert replayed > 0 and replayed == without.seq.stats.replayed_tokens
    tier = "dram" if hit is _store_hit else "hbm"
    assert with_cut.seq.stats.hit_tokens[tier] == HIT_BLOCKS * BT
    assert with_cut.cut == replayed and without.cut == 0
    assert with_cut.forward_tokens == without.forward_tokens
    assert with_cut.seq.output_ids == without.seq.output_ids
    assert torch.equal(with_cut.logits, without.logits)


def test_a_replay_sharing_its_steps_with_other_requests(lm: LoadedModel) -> None:
    """A replayed hit batched with a cold request and a second hit (ragged chunks, decodes
    of the others in the replay's steps): every request's logits bitwise as uncut."""
    from engine.core.sampling_params import SamplingParams

    vocab = lm.spec.vocab_size
    prompts = [tokens(PROMPT, 5, vocab), tokens(150, 9, vocab), tokens(PROMPT - 37, 5, vocab)]
    prompts[2][: HIT_BLOCKS * BT] = prompts[0][: HIT_BLOCKS * BT]
    out = []
    for cut in (True, False):
        cfg = replace(config(keep_of(lm), budget=160, force=True), replay_row_cut=cut,
                      deterministic=True, attention_backend=None)
        rows: dict[int, list[torch.Tensor]] = {}

        def observe(seqs, logits, rows=rows) -> None:  # type: ignore[no-untyped-def]
            for seq, row in zip(seqs, logits, strict=True):
                rows.setdefault(seq.seq_id, []).append(row.clone())

        store = open_embedded(dram_bytes=64 << 20)
        try:
            fill(lm, cfg, store, prompts[0][: HIT_BLOCKS * BT])
            with engine(lm, cfg, store) as eng:
                eng.runner.logits_observers.append(observe)
                seqs = eng.generate(prompts, SamplingParams(max_new_tokens=3, ignore_eos=True))
                eng.check_integrity()
                assert (eng.runner.counters["cut_rows_total"] > 0) == cut
        finally:
            store.close()
        assert sum(s.stats.replayed_tokens for s in seqs) > 0
        out.append([torch.stack(rows[s.seq_id]) for s in seqs])
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)


def test_the_cut_layer_is_the_last_sliding_one() -> None:
    assert last_sliding_layer([512, 512, None, 512, None]) == 3
    assert last_sliding_layer([None, 8]) == 1
    assert last_sliding_layer([None, None]) is None


# -- the kept rows' metadata --------------------------------------------------------------

chunk = st.tuples(st.integers(0, 5), st.integers(0, 5)).filter(lambda c: sum(c) > 0)


def _step(chunks: list[tuple[int, int]], decodes: int) -> tuple[ForwardBatch, list[bool]]:
    """Prefill chunks of (cut, kept) rows, then ``decodes`` rows; a chunk ending with a
    kept row asks for its logits, as does every decode."""
    keep: list[bool] = []
    cu = [0]
    logits: list[int] = []
    lens: list[int] = []
    for c, k in chunks:
        keep += [False] * c + [True] * k
        cu.append(len(keep))
        lens.append(100 + len(keep))
        if k:
            logits.append(len(keep) - 1)
    n_pre = len(keep)
    keep += [True] * decodes
    logits += range(n_pre, len(keep))
    n = len(keep)
    i32 = torch.int32

    def meta(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = torch.arange(rows * 4, dtype=i32).view(rows, 4)
        return table, torch.arange(rows, dtype=i32) + 200

    table, _ = meta(len(chunks))
    pre = PrefillMeta(torch.tensor(cu, dtype=i32), table, torch.tensor(lens, dtype=i32),
                      torch.tensor(lens, dtype=i32) - 90, (table + 1000,)) if chunks else None
    dt, dl = meta(decodes)
    dec = DecodeMeta(dt, dl, None, (dt + 1000,)) if decodes else None
    ids = torch.arange(n, dtype=torch.int64) * 7
    batch = ForwardBatch(ids, ids + 1, ids + 2, n_pre, pre, dec,
                         torch.tensor(logits, dtype=torch.int64), "torch",
                         full_slot_mapping=torch.where(torch.tensor(keep), ids + 2, -1),
                         layer_groups=(1, 0), group_slot_mappings=(ids + 3,))
    return batch, keep


@settings(max_examples=60, deadline=None)
@given(st.lists(chunk, max_size=5), st.integers(0, 3))
def test_the_tail_describes_exactly_the_kept_rows(chunks: list[tuple[int, int]],
                                                   decodes: int) -> None:
    if not chunks and not decodes:
        return
    batch, keep = _step(chunks, decodes)
    cut = cut_rows(batch, keep, 5)
    tail, rows = cut.tail, cut.rows
    assert cut.layer == 5
    assert rows.tolist() == [i for i, k in enumerate(keep) if k]
    for name in ("input_ids", "positions", "slot_mapping", "full_slot_mapping"):
        assert torch.equal(getattr(tail, name), getattr(batch, name)[rows])
    assert torch.equal(tail.group_slot_mappings[0], batch.group_slot_mappings[0][rows])
    # The same rows ask for logits, now numbered among the kept ones.
    assert torch.equal(tail.input_ids[tail.logits_indices],
                       batch.input_ids[batch.logits_indices])
    kept = [(b, k) for b, (_, k) in enumerate(chunks) if k]
    assert tail.num_prefill_tokens == sum(k for _, k in kept)
    if not kept:
        assert tail.prefill is None
    else:
        assert batch.prefill is not None and tail.prefill is not None
        sel = [b for b, _ in kept]
        pre, tp = batch.prefill, tail.prefill
        assert tp.cu_seqlens_q.tolist() == [0, *torch.tensor([k for _, k in kept]).cumsum(0)
                                            .tolist()]
        assert tp.cu_seqlens_q.dtype == pre.cu_seqlens_q.dtype
        for name in ("block_tables", "seq_lens", "sliding_kv_start"):
            assert torch.equal(getattr(tp, name), getattr(pre, name)[sel])
        assert torch.equal(tp.group_tables[0], pre.group_tables[0][sel])
    assert tail.decode is batch.decode
    assert tail.row_cut is None and tail.layer_groups == batch.layer_groups


def test_a_kept_row_before_a_cut_one_is_refused() -> None:
    batch, keep = _step([(2, 3)], 0)
    with pytest.raises(EngineIntegrityError, match="its last ones"):
        cut_rows(batch, [True, False, True, True, True], 1)
    with pytest.raises(EngineIntegrityError, match="rows of a"):
        cut_rows(batch, keep[:-1], 1)


def test_decode_and_logits_rows_are_never_cut() -> None:
    batch, keep = _step([(2, 3)], 2)
    with pytest.raises(EngineIntegrityError, match="decode row"):
        cut_rows(batch, [*keep[:-1], False], 1)
    with pytest.raises(EngineIntegrityError, match="logits"):
        cut_rows(batch, [False] * 5 + [True, True], 1)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_trained_gemma3_270m_new_tokens_are_bitwise_unchanged(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The trained model's own pattern (the cut at sliding layer 16 skips full layer 17):
    a store hit of 640 tokens replayed from 116 (keep 524), 96 new tokens, chunked so one
    step mixes replayed and new rows, in deterministic mode."""
    from tests.engine.model.real_models import real_model, real_text

    lm = load_model(real_model("gemma3-270m"), dtype="bfloat16",
                    revision_cache_dir=tmp_path_factory.mktemp("revisions"))
    assert last_sliding_layer(lm.spec.layer_windows) == lm.spec.num_layers - 2
    prompt = lm.tokenizer.encode(real_text(6000))[:736]
    runs = []
    for cut in (True, False):
        cfg = replace(config(524, budget=512, pool_tokens=4096), replay_row_cut=cut,
                      deterministic=True, attention_backend=None)
        store = open_embedded(dram_bytes=256 << 20)
        try:
            fill(lm, cfg, store, prompt[:640])
            with engine(lm, cfg, store) as eng:
                runs.append(request(eng, prompt, 2))
                assert eng.runner.counters["cut_rows_total"] == (524 if cut else 0)
        finally:
            store.close()
    assert runs[0].seq.stats.replayed_tokens == 524
    assert runs[0].seq.output_ids == runs[1].seq.output_ids
    assert torch.equal(runs[0].logits, runs[1].logits)
