#!/usr/bin/env bash
# Unattended GPU check of the kernels, for a CUDA machine with no network and only this
# repository: uses the torch and triton installed there (no pip), FlashInfer only if it
# is already importable. Runs, in under 8 minutes:
#   1. the kernel tests on CUDA (tests/kernels/triton compiled for the card, the launch
#      planning tests), 4 min at most;
#   2. bench/gpu_decode.py: split-KV paged decode vs the card's copy bandwidth, torch SDPA
#      and FlashInfer, at contexts well beyond L2, 200 s at most.
# Writes into DIR (default $OUT, else ./gpu_check_out): env.txt, tests.txt, tests.xml,
# decode.json, summary.json. Exit status: 0 all ran and passed, 1 a step failed,
# 3 no CUDA device (nothing run).
#
#   bench/gpu_check.sh [DIR] [--dry-run]     (PYTHON=... picks the interpreter)
set -uo pipefail

cd "$(dirname "$0")/.."
DRY=0
DIR=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $arg" >&2; exit 2 ;;
    *) DIR="$arg" ;;
  esac
done
DIR="${DIR:-${OUT:-gpu_check_out}}"
PY="${PYTHON:-python3}"
mkdir -p "$DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels on the card, never the interpreter

# What is installed; CUDA present or a clear failure.
"$PY" - >"$DIR/env.txt" 2>&1 <<'PYEOF'
import importlib.util, platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
for mod in ("triton", "pytest", "hypothesis", "flashinfer"):
    spec = importlib.util.find_spec(mod)
    version = "absent"
    if spec is not None:
        try:
            version = getattr(__import__(mod), "__version__", "present")
        except Exception as exc:  # importable in name only
            version = f"broken: {exc}"
    print(mod, version)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", torch.cuda.get_device_name(0), f"sm{p.major}{p.minor}",
          p.multi_processor_count, "SMs", p.total_memory >> 30, "GiB")
else:
    print("device none")
PYEOF
status=$?
cat "$DIR/env.txt"
if [ $status -ne 0 ]; then
  echo "gpu_check: $PY cannot import torch (see $DIR/env.txt)" >&2
  exit 3
fi
if grep -q '^triton absent' "$DIR/env.txt"; then
  echo "gpu_check: triton is not importable with $PY" >&2
  [ $DRY -eq 1 ] || exit 3
fi
if grep -q '^device none' "$DIR/env.txt" && [ $DRY -eq 0 ]; then
  echo "gpu_check: no CUDA device visible to torch ($PY); nothing run" >&2
  exit 3
fi

TESTS=(timeout 240 "$PY" -m pytest -q -p no:cacheprovider --confcutdir=tests/kernels
       -o addopts="" --junitxml="$DIR/tests.xml" --durations=10
       tests/kernels/triton tests/kernels/test_triton_plan.py)
BENCH=(timeout 200 "$PY" -m bench.gpu_decode --json "$DIR/decode.json")
if [ $DRY -eq 1 ]; then
  echo "dry run: would run"
  echo "  KERNELS_TEST_DEVICE=cuda ${TESTS[*]}"
  echo "  ${BENCH[*]}"
  exit 0
fi

tests_rc=0
if grep -q '^pytest absent\|^hypothesis absent' "$DIR/env.txt"; then
  echo "gpu_check: pytest or hypothesis is not installed: kernel tests skipped" | tee "$DIR/tests.txt"
  tests_rc=4
else
  KERNELS_TEST_DEVICE=cuda "${TESTS[@]}" 2>&1 | tee "$DIR/tests.txt"
  tests_rc=${PIPESTATUS[0]}
fi
"${BENCH[@]}" 2>&1 | tee "$DIR/bench.txt"
bench_rc=${PIPESTATUS[0]}

"$PY" - "$DIR" "$tests_rc" "$bench_rc" <<'PYEOF'
import json, pathlib, sys
out, tests_rc, bench_rc = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
summary = {"tests_exit": tests_rc, "bench_exit": bench_rc,
           "tests": {0: "passed", 4: "skipped (no pytest/hypothesis)", 124: "timed out"}.get(
               tests_rc, "FAILED")}
decode = out / "decode.json"
if decode.exists():
    doc = json.loads(decode.read_text())
    summary["device"] = doc.get("device")
    summary["copy_gbps"] = doc.get("copy_gbps_read_plus_write")
    summary["cases"] = [
        {k: c.get(k) for k in ("batch", "context_tokens", "block_tokens", "triton_vs_copy",
                                "triton_vs_flashinfer")} | {"gbps": c.get("gbps")}
        for c in doc.get("cases", [])]
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PYEOF
if [ "$tests_rc" -ne 0 ] || [ "$bench_rc" -ne 0 ]; then exit 1; fi
exit 0
