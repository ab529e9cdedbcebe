"""Compile the Triton kernels for NVIDIA targets without a GPU, as the backend would
launch them, and report registers, spills and shared memory per specialisation.

``python -m kernels.triton_backend.compile_check [--arch 80,90,100] [--dtype bf16,fp16]``
exits 1 when a kernel fails to compile or needs more shared memory than the target has.
Triton's own ``ptxas`` (shipped in its wheel) produces real cubins, so this catches what the
interpreter cannot (layouts, ``tl.dot`` shapes, register pressure); it does not run them.
Run it without ``TRITON_INTERPRET`` (Triton must be imported in compiler mode). Written
against Triton 3.9's ``ASTSource``/``GPUTarget`` API.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

from kernels.triton_backend import launch
from kernels.triton_backend.plan import TritonConfig, plan_attention

#: Shared memory per block a kernel may use, per compute capability (the smallest part
#: of each family: SM86/SM89 consumer cards have 99 KiB).
SMEM_LIMIT = {80: 163 << 10, 86: 99 << 10, 89: 99 << 10, 90: 227 << 10, 100: 227 << 10}
_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
          torch.int32: "i32", torch.int64: "i64"}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
INDEX = {"i32": torch.int32, "i64": torch.int64}


@dataclass(frozen=True, slots=True)
class Usage:
    kernel: str
    arch: int
    what: str
    registers: int
    spill_bytes: int
    shared_bytes: int


def _signature(fn: object, spec: launch.Launch) -> tuple[dict, dict, dict]:
    """The signature, constants and divisibility hints Triton's JIT would derive from
    these arguments (16-aligned pointers; integers divisible by 16 marked so)."""
    names = fn.arg_names  # type: ignore[attr-defined]
    generic = launch.NOT_SPECIALIZED[fn.__name__]  # type: ignore[attr-defined]
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, (name, arg) in enumerate(zip(names, spec.args, strict=False)):
        if isinstance(arg, torch.Tensor):
            signature[name] = "*" + _TYPES[arg.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(arg, bool):
            signature[name] = "i1"
        elif isinstance(arg, int):
            signature[name] = "i32" if -(2**31) <= arg < 2**31 else "i64"
            if arg % 16 == 0 and name not in generic:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    for name in spec.constexprs:
        signature[name] = "constexpr"
    return signature, dict(spec.constexprs), attrs


def compile_usage(fn: object, spec: launch.Launch, arch: int, what: str) -> Usage:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = _signature(fn, spec)
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", arch, 32), options=dict(spec.options),
    )
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                             "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        dump = subprocess.run([cuobjdump, "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", dump)
    regs, stack = (int(m[1]), int(m[2])) if m else (-1, -1)
    return Usage(fn.__name__, arch, what, regs, stack,  # type: ignore[attr-defined]
                 int(compiled.metadata.shared))


def specs(dtype: torch.dtype, head_dim: int, index: torch.dtype = torch.int32,
          group: int = 4, block_tokens: int = 16) -> list[tuple[str, str, launch.Launch]]:
    """The launches of a decode step and of a prefill chunk over a long context, on tensors
    shaped as the engine's (tiny: only their strides and dtypes reach the compiler)."""
    kv_heads, heads = 2, 2 * group
    pool = torch.empty(8, block_tokens, kv_heads, head_dim, dtype=dtype)
    idx = torch.zeros(4, dtype=index)
    tables = torch.zeros(2, 64, dtype=index)
    out: list[tuple[str, str, launch.Launch]] = []
    for decode in (True, False):
        q = torch.empty(1 if decode else 512, heads, head_dim, dtype=dtype)
        plan = plan_attention(
            TritonConfig(), decode=decode, batch=1, kv_heads=kv_heads, group=group,
            head_dim=head_dim, elem_bytes=q.element_size(), total_q=q.shape[0],
            max_q_len=q.shape[0], max_seq_len=32768, window=None, cores=132,
        )
        part_o = torch.empty(1, heads, 2, head_dim)
        part_lse = torch.empty(1, heads, 2)
        what = (f"{_TYPES[dtype]} D={head_dim} {_TYPES[index]} "
                f"{'decode' if decode else 'prefill'}")
        out.append(("attention", what, launch.attention_launch(
            plan, q, pool, pool, q, part_o, part_lse, idx, tables, idx, idx, 0.1, 128,
            decode=decode, interpret=False)))
        if decode:
            out.append(("merge", what, launch.merge_launch(plan, part_o, part_lse, q)))
    kv = torch.empty(4, kv_heads, head_dim, dtype=dtype)
    out.append(("write_slots", f"{_TYPES[dtype]} D={head_dim} {_TYPES[index]}",
                launch.write_slots_launch(kv, kv, pool, pool, idx)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="80,90,100",
                   help="compute capabilities (default %(default)s)")
    p.add_argument("--dtype", default="bf16,fp16,fp32", help="default %(default)s")
    p.add_argument("--head-dim", default="128", help="default %(default)s")
    p.add_argument("--index", default="i32", help="block-table/seq_lens dtypes: i32, i64 "
                   "(default %(default)s)")
    args = p.parse_args(argv)
    from kernels.triton_backend.backend import build, interpreting

    if interpreting():
        print("compile_check: unset TRITON_INTERPRET (Triton is in interpreter mode)",
              file=sys.stderr)
        return 2
    kernels = build(False)
    fns = {"attention": kernels.attention, "merge": kernels.merge,
           "write_slots": kernels.write_slots}
    failed = 0
    for arch in (int(a) for a in args.arch.split(",")):
        for name in args.dtype.split(","):
            for head_dim, index in itertools.product(
                (int(d) for d in args.head_dim.split(",")), args.index.split(",")
            ):
                for kernel, what, spec in specs(DTYPES[name], head_dim, INDEX[index]):
                    try:
                        u = compile_usage(fns[kernel], spec, arch, what)
                    except Exception as exc:  # report every failure, then exit 1
                        failed += 1
                        print(f"sm{arch} {kernel:<11} {what:<26} FAILED: {exc}")
                        continue
                    limit = SMEM_LIMIT.get(arch, 99 << 10)
                    over = u.shared_bytes > limit
                    failed += over
                    print(f"sm{arch} {kernel:<11} {what:<26} regs {u.registers:>3} "
                          f"spill {u.spill_bytes:>5} B smem {u.shared_bytes:>6} B"
                          + (f" > {limit} FAILED" if over else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
