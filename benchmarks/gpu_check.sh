#!/usr/bin/env bash
# The GPU checks, as one command for a lent accelerator (issue 11): the CUDA tests, the fidelity
# corpus on CUDA, then the benchmark on --device cuda, everything written under $OUT (default
# build/gpu-check).  Uses the machine's own python3 with its CUDA torch (the device image has
# torch, wrapt, pytest and hypothesis); the package is imported from this checkout.
#
#   OUT=/some/dir benchmarks/gpu_check.sh          # on the GPU machine
#   benchmarks/gpu_check.sh                        # here, without a GPU: the tests skip, no benchmark
#
# Exit status: non-zero if a test failed or the benchmark could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
{
  echo "== $(date -u +%FT%TZ) $(uname -m)"
  "$PY" - <<'PY'
import platform, torch, wrapt
print("python", platform.python_version(), "torch", torch.__version__, "wrapt", wrapt.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
} 2>&1 | tee "$OUT/environment.txt"
"$PY" -m pytest tests/test_cuda.py -q -rA -p no:cacheprovider -p no:deepcopy_shim 2>&1 | tee "$OUT/tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$PY" benchmarks/bench_copy.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/benchmark.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "no CUDA device: the CUDA tests skipped and the benchmark did not run" | tee "$OUT/benchmark.txt"
fi
exit $status
