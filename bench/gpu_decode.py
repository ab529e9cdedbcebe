"""GPU: split-KV paged decode (Triton backend) against the card's copy bandwidth, torch
SDPA and FlashInfer's paged decode (when importable), at contexts well beyond L2.

For each case (batch × context, 32 query / 8 KV heads of 128, bfloat16, shuffled blocks):

- ``copy``: device-to-device ``copy_`` of a 4 GiB buffer; its rate counts the bytes read
  and written (the HBM traffic of a copy), measured in the same run;
- ``triton``: ``TritonBackend.paged_decode`` (planned on the host, no sync), rate = bytes of
  K and V read / time; the target is ≥ 70 % of the copy rate;
- ``sdpa``: ``scaled_dot_product_attention`` on the same KV already contiguous (the
  unpaged ideal), and ``gather+sdpa``: gathering it from the pool first (what a backend
  without a paged kernel pays);
- ``flashinfer``: ``BatchDecodeWithPagedKVCacheWrapper`` on the same pools (NHD layout);
  the target is triton ≥ 0.8 × its rate.

Times are CUDA-event medians of interleaved rounds. ``--device cpu --tiny`` runs the same
code under Triton's interpreter (``TRITON_INTERPRET=1``) with toy sizes: it checks the
plumbing, not speed. Writes JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from kernels.triton_backend.backend import TritonBackend

COPY_TARGET, FLASHINFER_TARGET = 0.70, 0.80


@dataclass
class Case:
    batch: int
    context_tokens: int
    block_tokens: int
    kv_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    gbps: dict[str, float] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Clock:
    """Seconds per call: CUDA events on a GPU, perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn: Callable[[], object], iters: int) -> float:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) / iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters


def median_rounds(clock: Clock, fns: Mapping[str, Callable[[], object]], iters: int,
                  rounds: int) -> dict[str, float]:
    for fn in fns.values():  # warm up: compile, plan, allocate
        fn()
    got: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            got[name].append(clock(fn, iters))
    return {name: statistics.median(v) for name, v in got.items()}


def copy_rate(clock: Clock, device: torch.device, nbytes: int, iters: int, rounds: int
              ) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    s = median_rounds(clock, {"copy": lambda: dst.copy_(src)}, iters, rounds)["copy"]
    return 2 * nbytes / s / 1e9


def flashinfer_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      tables: torch.Tensor, seq_lens: torch.Tensor, scale: float
                      ) -> Callable[[], torch.Tensor]:
    import flashinfer

    batch, heads, head_dim = q.shape
    _, bt, kv_heads, _ = k_pool.shape
    pages = (seq_lens + bt - 1) // bt
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(tables.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = tables[used].to(torch.int32)
    last = (seq_lens - (pages - 1) * bt).to(torch.int32)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last, heads, kv_heads, head_dim, bt,
                 sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_pool.dtype)
    return lambda: wrapper.run(q, (k_pool, v_pool))


def run_case(case: Case, clock: Clock, device: torch.device, heads: int, kv_heads: int,
             head_dim: int, dtype: torch.dtype, iters: int, rounds: int,
             gen: torch.Generator) -> None:
    bt, batch, ctx = case.block_tokens, case.batch, case.context_tokens
    per_seq = -(-ctx // bt)
    blocks = batch * per_seq
    k_pool = torch.empty(blocks, bt, kv_heads, head_dim, dtype=dtype, device=device).normal_()
    v_pool = torch.empty_like(k_pool).normal_()
    tables = torch.randperm(blocks, generator=gen).view(batch, per_seq).to(device,
                                                                          torch.int32)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = torch.empty(batch, heads, head_dim, dtype=dtype, device=device).normal_()
    scale = head_dim**-0.5
    case.kv_bytes = 2 * batch * ctx * kv_heads * head_dim * k_pool.element_size()
    backend = TritonBackend()

    def triton() -> torch.Tensor:
        return backend.paged_decode(q, k_pool, v_pool, tables, seq_lens, scale,
                                    max_seq_len=ctx)

    def gathered(pool: torch.Tensor) -> torch.Tensor:  # [batch, kv_heads, ctx, D]
        seqs = pool[tables.long()].view(batch, per_seq * bt, kv_heads, head_dim)[:, :ctx]
        return seqs.permute(0, 2, 1, 3)

    k_seq, v_seq = gathered(k_pool).contiguous(), gathered(v_pool).contiguous()
    qg = q.view(batch, kv_heads, heads // kv_heads, head_dim)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(qg, k_seq, v_seq, scale=scale).reshape(q.shape)

    def gather_sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(qg, gathered(k_pool), gathered(v_pool),
                                              scale=scale).reshape(q.shape)

    fns: dict[str, Callable[[], torch.Tensor]] = {"triton": triton, "sdpa": sdpa,
                                                  "gather+sdpa": gather_sdpa}
    try:
        fns["flashinfer"] = flashinfer_decode(q, k_pool, v_pool, tables, seq_lens, scale)
    except ImportError:
        case.notes.append("flashinfer not importable")
    except Exception as exc:  # an API this script does not know: report, carry on
        case.notes.append(f"flashinfer failed: {type(exc).__name__}: {exc}")
    want = sdpa().float()
    for name, fn in list(fns.items()):
        try:
            case.max_abs_diff[name] = (fn().float() - want).abs().max().item()
        except Exception as exc:
            case.notes.append(f"{name} failed: {type(exc).__name__}: {exc}")
            del fns[name]
    case.seconds = median_rounds(clock, fns, iters, rounds)
    case.gbps = {name: case.kv_bytes / s / 1e9 for name, s in case.seconds.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu with --tiny")
    p.add_argument("--tiny", action="store_true",
                   help="toy sizes (for the CPU under TRITON_INTERPRET=1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_decode: CUDA is not available (torch "
              f"{torch.__version__}, built for CUDA {torch.version.cuda})", file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.tiny:
        print("gpu_decode: off CUDA only --tiny runs (a plumbing check)", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    clock = Clock(device)
    if args.tiny:
        heads, kv_heads, head_dim, dtype = 4, 2, 16, torch.float32
        shapes = [(2, 200, 16), (1, 700, 64)]
        iters, copy_bytes = 1, 1 << 20
    else:
        heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
        # KV read per call: 1-4 GiB, far beyond any L2 (H100/H200: 50-60 MB).
        shapes = [(64, 8192, 16), (16, 32768, 16), (16, 32768, 64), (4, 131072, 16),
                  (1, 131072, 64)]
        iters, copy_bytes = 10, 4 << 30
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=str(dtype)),
        "copy_gbps_read_plus_write": copy_rate(clock, device, copy_bytes, iters, args.rounds),
        "targets": dict(triton_vs_copy=COPY_TARGET, triton_vs_flashinfer=FLASHINFER_TARGET),
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    cases = []
    for batch, ctx, bt in shapes:
        case = Case(batch, ctx, bt)
        run_case(case, clock, device, heads, kv_heads, head_dim, dtype, iters, args.rounds,
                 gen)
        copy_gbps = float(result["copy_gbps_read_plus_write"])  # type: ignore[arg-type]
        row = asdict(case)
        row["triton_vs_copy"] = case.gbps.get("triton", 0.0) / copy_gbps
        if "flashinfer" in case.gbps:
            row["triton_vs_flashinfer"] = case.gbps["triton"] / case.gbps["flashinfer"]
        cases.append(row)
        print(json.dumps({k: row[k] for k in ("batch", "context_tokens", "block_tokens",
                                              "gbps", "triton_vs_copy", "notes")}),
              flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["cases"] = cases
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
