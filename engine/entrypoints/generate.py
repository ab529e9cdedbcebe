"""``kvengine generate``: run a prompt or a multi-turn session through the engine, with the
KV store of ``--kv-store`` behind the pool, and report per turn where the prompt's tokens
came from (pool ``hbm``, store ``dram``/``ssd``, or computed) and how long the first token
took.

``--json`` prints exactly ``{"namespace": HEX, "turns": [{"prompt_tokens", "hit_tokens":
{"hbm", "dram", "ssd"}, "computed_tokens", "replayed_tokens", "stored_bytes_per_token",
"ttft_s", "decode_tokens_per_s", "token_ids", "text"}]}`` (``token_ids`` and ``text`` are
the generated answer). ``computed_tokens`` counts every prompt token that went through the
model, the ``replayed_tokens`` of a bounded replay included (so hit + computed = prompt +
replayed); ``stored_bytes_per_token`` is what the store keeps per token of the turn's
context (prompt and answer) under the replay policy: every token's stored layers, plus in
bounded mode one window tail (the sliding layers of the last window) per committed end,
spread over the context. Otherwise a table, one row per turn as it finishes, and a summary
of the pool, the store and the replay policy.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from bounded_replay.measured import help_summary
from engine.connector.stores import StoreOptions, default_store_dir, open_store_link
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import TIERS, Sequence
from engine.entrypoints.session import Conversation, SessionTurn, read_session_file
from engine.errors import EngineInputError
from engine.kv.namespace import engine_namespace
from engine.model.loader import load_model
from kvstore.textfile import read_text
from kvstore.units import parse_size

_DEFAULTS = EngineConfig()


@dataclass(frozen=True, slots=True)
class TurnResult:
    session: str
    prompt_tokens: int
    hit_tokens: dict[str, int]
    computed_tokens: int
    replayed_tokens: int
    stored_bytes_per_token: float
    ttft_s: float
    decode_tokens_per_s: float
    token_ids: list[int]
    text: str

    @classmethod
    def of(cls, seq: Sequence, session: str, text: str, stored_bytes_per_token: float = 0.0
           ) -> TurnResult:
        s = seq.stats
        return cls(
            session=session,
            prompt_tokens=seq.num_prompt_tokens,
            hit_tokens={t: s.hit_tokens[t] for t in TIERS},
            computed_tokens=s.computed_tokens,
            replayed_tokens=s.replayed_tokens,
            stored_bytes_per_token=stored_bytes_per_token,
            ttft_s=s.ttft_s,
            decode_tokens_per_s=s.decode_tokens_per_s(len(seq.output_ids)),
            token_ids=seq.output_ids,
            text=text,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": dict(self.hit_tokens),
            "computed_tokens": self.computed_tokens,
            "replayed_tokens": self.replayed_tokens,
            "stored_bytes_per_token": self.stored_bytes_per_token,
            "ttft_s": self.ttft_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "token_ids": self.token_ids,
            "text": self.text,
        }


_EPILOG = """\
Each turn prints one row: prompt tokens, the tokens that hit in the pool (hbm), in the
store's DRAM and SSD tiers, the tokens computed (of which replayed: recomputed past a
bounded-replay hit), the time to the first token and the decode rate. A store that is
unreachable or dies mid-run costs misses, not errors: one warning, and the failed calls are
counted at the end (one unreachable at start is asked its tenant again for 10 s, then
before each call). Bad input (flags, files, checkpoint) is one line on stderr and exit
status 2.
"""


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """``--model`` and ``--kv-store``, as ``kvengine generate`` and ``kvengine serve`` take
    them."""
    p.add_argument("--model", required=True, metavar="DIR",
                   help="Hugging Face checkpoint directory: config.json, model.safetensors (or "
                        "its sharded index), tokenizer.json, tokenizer_config.json")
    p.add_argument("--kv-store", default="none", metavar="STORE",
                   help="none (pool prefix caching only), embedded[:DIR] (DRAM + SSD in this "
                        f"process; DIR defaults to {default_store_dir()}) or grpc://HOST:PORT "
                        "(a running `kvstore serve`)")


def configure(p: argparse.ArgumentParser) -> None:
    p.epilog = _EPILOG
    add_model_flags(p)
    p.add_argument("--auth-token-file", metavar="F",
                   help="grpc: file holding the daemon's bearer token (else $KVSTORE_AUTH_TOKEN)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-file", metavar="F", help="one prompt, as plain text")
    src.add_argument("--session-file", metavar="F.jsonl",
                     help='one {"user": "..."} per line (optional "session": NAME interleaves '
                          "conversations); each turn extends the previous prompt and answer")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                   help="tokens to generate per turn (fewer on an end-of-turn token)")
    p.add_argument("--greedy", action="store_true",
                   help="argmax decoding (the default; excludes --temperature)")
    p.add_argument("--temperature", type=float, metavar="T",
                   help="sample at this temperature instead of greedy")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling mass (with --temperature)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="sampling seed with --temperature (turn i of a session uses S + i)")
    p.add_argument("--pool-tokens", type=int, default=_DEFAULTS.pool_tokens, metavar="N",
                   help="KV pool (the hbm tier) size in tokens, rounded down to whole "
                        "64-token blocks; it must hold one turn's prompt (an answer that "
                        "outgrows it stops there, finish reason length). The bytes are N "
                        "tokens of every layer's KV; a hybrid model whose full-attention "
                        "layer count divides its sliding one (Gemma 3) keeps its sliding "
                        "layers to their window in them, so they hold more: Gemma 3 270M, "
                        "bfloat16, 18,432 B per token in the window of a running request, "
                        "3,072 B per token out of it (5.8x the tokens at the default size); "
                        "the store keeps 18,432 B/token in exact mode, 3,072 bounded")
    p.add_argument("--max-batched-tokens", type=int, default=_DEFAULTS.max_batched_tokens,
                   metavar="N", help="per-step token budget (prefill chunk size)")
    add_engine_flags(p)
    p.add_argument("--show-answers", action="store_true",
                   help="print each turn's answer (its first line's worth) under its row")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object instead of the table: {"namespace": HEX, '
                        '"turns": [{"prompt_tokens", "hit_tokens": {"hbm", "dram", "ssd"}, '
                        '"computed_tokens", "replayed_tokens", "stored_bytes_per_token", '
                        '"ttft_s", "decode_tokens_per_s", "token_ids", "text"}]}')


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The model's device and dtype, the replay policy and the embedded store's sizes: the
    flags ``kvengine generate`` and ``kvengine serve`` share."""
    p.add_argument("--attention-backend", choices=("torch", "cpu_paged", "triton"),
                   help="attention and KV-copy kernels (default: the device's: on CPU "
                        "cpu_paged, the compiled prefill and decode kernels, when built and "
                        "passing their self-checks, else torch)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default: the checkpoint's)")
    p.add_argument("--device", default="cpu",
                   help="torch device of the model and the pool (cpu, cuda, cuda:1)")
    p.add_argument("--replay-keep", type=int, metavar="N",
                   help="opt into bounded replay (hybrid models): the store keeps the "
                        "full-attention layers, plus the sliding ones of the last window at "
                        "each committed end (a session's next turn, hitting there, replays "
                        "nothing); any other hit recomputes its last N tokens "
                        "(safe minimum: the largest sliding window + 12); 0 = exact, as "
                        "--cache-all-layers, the default. " + help_summary())
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="the context served, prompt and answer (default: the model's "
                        "max_position_embeddings; more is refused)")
    p.add_argument("--force", action="store_true",
                   help="accept a --replay-keep below the safe default (more drift)")
    p.add_argument("--cache-all-layers", action="store_true",
                   help="exact mode: the store keeps every layer; a hit recomputes nothing")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant numerics (CPU): a request's logits are bitwise the "
                        "same whatever shares its batch, however its prefill is chunked and, "
                        "in exact mode, wherever its prefix's KV came from; seeded sampling "
                        "then repeats its text. Slower (the cost: bench/RESULTS.md)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="torch.compile the model's step (inductor's CPU C++ backend; "
                        "attention stays the backend's kernel). Measured on 2 cores: decode "
                        "steps ~7-10%% faster at 1 request, ~12%% slower at 8; the first "
                        "step of each size class "
                        "(one row, several rows) builds a graph: ~2 min for a 30-layer "
                        "model on 2 cores at load 6–11, far more under heavier load, ~40 s when "
                        "inductor's disk cache (TORCHINDUCTOR_CACHE_DIR) has it. If a "
                        "compile fails: one warning, then eager. Off under --deterministic. "
                        "Figures: bench/RESULTS.md")
    p.add_argument("--dram", default="1GiB", metavar="SIZE",
                   help="embedded: DRAM tier size (like 512MiB or 2GiB)")
    p.add_argument("--ssd-capacity", default="8GiB", metavar="SIZE",
                   help="embedded: SSD tier capacity in DIR (like 8GiB)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    if args.temperature is None:
        return SamplingParams(max_new_tokens=args.max_new_tokens)
    if args.greedy:
        raise EngineInputError("--greedy and --temperature exclude each other")
    return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(format="kvengine: warning: %(message)s", level=logging.WARNING)
    params = sampling_params(args)
    store_opts = StoreOptions(
        dram_bytes=parse_size(args.dram),
        ssd_capacity_bytes=parse_size(args.ssd_capacity),
        auth_token_file=args.auth_token_file,
    )
    config = EngineConfig(pool_tokens=args.pool_tokens, max_batched_tokens=args.max_batched_tokens,
                          attention_backend=args.attention_backend,
                          replay_keep_tokens=args.replay_keep, replay_force=args.force,
                          cache_all_layers=args.cache_all_layers,
                          max_model_len=args.max_model_len, deterministic=args.deterministic,
                          compile_step=args.compile)
    turns = (read_session_file(args.session_file) if args.session_file
             else [SessionTurn("", read_text(args.prompt_file, "--prompt-file"))])
    loaded = load_model(args.model, dtype=args.dtype, device=args.device,
                        progress=not args.json)
    policy = config.replay_policy(loaded.spec.layer_windows)  # refusals before the store opens
    config.context_tokens(loaded.spec.max_context_tokens)
    link = open_store_link(
        args.kv_store,
        lambda tenant: engine_namespace(loaded.spec, config.block_tokens, tenant, policy),
        store_opts,
    )
    table = None if args.json else TurnTable(show_answers=args.show_answers)
    with LLMEngine(loaded.model, config, link) as engine:
        results = play(engine, loaded.tokenizer, turns, params, raw_prompt=not args.session_file,
                       on_turn=None if table is None else table.row,
                       progress=not args.json)
        store_counters = engine.store_counters()
        hbm = engine.hbm_stats()
        stored = engine.namespaces
    failed = store_counters.get("store_errors_total", 0)
    if failed:
        calls = "call" if failed == 1 else "calls"
        print(f"kvengine: kv store {link.name}: {failed} {calls} failed; their blocks were "
              f"served as misses", file=sys.stderr)
    if args.json:
        json.dump({"namespace": link.ns.fingerprint.hex(),
                   "turns": [r.to_json() for r in results]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"\nnamespace {link.ns.fingerprint.hex()}  store {args.kv_store}  "
              f"pool {config.num_blocks} blocks of {config.block_tokens} tokens, "
              f"{hbm.counters.get('evicted_blocks_total', 0)} evicted, "
              f"{store_counters.get('loaded_blocks_total', 0)} loaded from the store, "
              f"{store_counters.get('committed_blocks_total', 0)} committed")
        tail = (f" + a window tail of {stored.tail_bytes} bytes per committed end"
                if stored.tail_bytes else "")
        print(f"replay: {policy.describe()}; the store keeps "
              f"{stored.block_bytes / config.block_tokens:.0f} bytes of KV per token "
              f"({policy.stored_layer_fraction:.0%} of the layers){tail}")
    return 0



def play(
    engine: LLMEngine,
    tokenizer: Any,
    turns: list[SessionTurn],
    params: SamplingParams,
    *,
    raw_prompt: bool = False,
    on_turn: Callable[[int, TurnResult], None] | None = None,
    progress: bool = False,
) -> list[TurnResult]:
    """Run the turns in order, each to completion (its conversation's next turn needs its
    answer). ``raw_prompt``: one plain-text prompt, no chat template."""
    eos = engine.model.spec.eos_token_ids
    conversations: dict[str, Conversation] = {}
    results: list[TurnResult] = []
    for i, turn in enumerate(turns):
        conv = conversations.setdefault(turn.session, Conversation(tokenizer, eos))
        if raw_prompt:
            ids = tokenizer.encode(turn.user, add_special_tokens=True)
        else:
            ids = conv.next_prompt(turn.user)
        turn_params = params if params.greedy else replace(params, seed=(params.seed or 0) + i)
        seq = engine.add_request(ids, turn_params)
        _run_to_end(engine, seq, progress)
        result = TurnResult.of(seq, turn.session, conv.record_answer(seq.output_ids),
                               engine.stored_bytes_per_token(max(1, len(seq.token_ids))))
        results.append(result)
        if on_turn is not None:
            on_turn(i, result)
    return results


def _run_to_end(engine: LLMEngine, seq: Sequence, progress: bool) -> None:
    with tqdm(total=seq.num_prompt_tokens, unit="tok", desc="prefill", leave=False,
              disable=None if progress else True) as bar:
        while not seq.is_finished:
            engine.step()
            bar.update(min(seq.num_computed_tokens, seq.num_prompt_tokens) - bar.n)


class TurnTable:
    """The human table: a header, then one row per turn as it finishes."""

    COLUMNS = ("turn", "session", "prompt", "hbm", "dram", "ssd", "computed", "replayed",
               "ttft_s", "decode tok/s")
    WIDTHS = (4, 8, 7, 7, 7, 7, 8, 8, 8, 12)

    ANSWER_CHARS = 160  # one terminal line or so: the table stays readable

    def __init__(self, show_answers: bool = False) -> None:
        self._printed = False
        self.show_answers = show_answers

    def row(self, i: int, r: TurnResult) -> None:
        if not self._printed:
            print(" ".join(c.rjust(w) for c, w in zip(self.COLUMNS, self.WIDTHS, strict=True)))
            self._printed = True
        cells = (str(i + 1), r.session[:8] or "-", str(r.prompt_tokens),
                 str(r.hit_tokens["hbm"]), str(r.hit_tokens["dram"]), str(r.hit_tokens["ssd"]),
                 str(r.computed_tokens), str(r.replayed_tokens), f"{r.ttft_s:.3f}",
                 f"{r.decode_tokens_per_s:.1f}")
        print(" ".join(c.rjust(w) for c, w in zip(cells, self.WIDTHS, strict=True)), flush=True)
        if self.show_answers:
            text = " ".join(r.text.split())
            if len(text) > self.ANSWER_CHARS:
                text = text[: self.ANSWER_CHARS - 1] + "…"
            print(f"{'':>5}> {text}", flush=True)
