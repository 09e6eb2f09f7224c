#!/usr/bin/env bash
# The GPU checks, as one prepared command for a lent accelerator: the doctor, the CUDA tests (with
# the fidelity corpus and every torch.nn layer on CUDA), then the benchmark's GPU plan.
#
# Expected runtime on one H200 (16 host cores, torch 2.11), estimated from the first run's timings
# (2026-12-04): about 2 minutes (the doctor ~5 s, tests/test_cuda.py ~20 s, the benchmark ~90 s).
# The benchmark runs its full-size models with a third of its rounds (at least 5 a model): with
# all of them it would take about 3 minutes, mostly the workaround rows and the garbage collection
# before each timed call (some 1,400 of them, 30-100 ms each in a process holding torch).  Each
# step has a time limit (30 + 30 + 90 + 180 s), so the script ends within 5 minutes whatever
# happens; a benchmark stopped by its limit leaves its per-model lines in benchmark.txt.
#
#   OUT=/some/dir benchmarks/gpu_check.sh          # on the GPU machine
#   PY=.venv/bin/python benchmarks/gpu_check.sh    # here, without a GPU: the tests skip, no benchmark
#
# It uses the machine's own python3 (or $PY) with its CUDA torch (the device image has torch,
# wrapt, pytest, hypothesis and matplotlib); the package is imported from this checkout, not
# installed, so the doctor's "start-up hook NOT INSTALLED" is expected and does not count.
# Writes 6 files under $OUT (default build/gpu-check):
#   environment.txt      python, torch, wrapt, the device
#   check.txt            python -m deepcopy_shim --check
#   tests.txt            pytest tests/test_cuda.py, every test's outcome
#   benchmark.txt        bench_copy.py --device cuda: a line per model, then one per target
#   benchmark-cuda.md    its table and targets
#   benchmark-cuda.png   its plot
# Exit status: 1 if the doctor found a problem, a test failed or the benchmark did not finish;
# missed targets do not count (benchmark.txt ends with how many).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

# step FILE LIMIT COMMAND...: run COMMAND for at most LIMIT seconds, its output to the screen
# and to $OUT/FILE; sets $rc to its exit status (124: stopped at the limit).
step() {
  local file=$1 limit=$2
  shift 2
  echo "== $(date -u +%T) $file: $*"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$file"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ]; then
    echo "!! stopped after $limit s" | tee -a "$OUT/$file"
  fi
}

step environment.txt 30 "$PY" -c '
import platform, shutil, subprocess, torch, wrapt
print("python", platform.python_version(), "torch", torch.__version__, "wrapt", wrapt.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
                         capture_output=True, text=True).stdout, end="")
'
[ "$rc" -eq 0 ] || status=1

step check.txt 30 "$PY" -m deepcopy_shim --check
# Each problem the doctor found is a line "  problem: ..."; only the start-up hook's is expected.
others=$(grep '^  problem: ' "$OUT/check.txt" | grep -vc 'deepcopy_shim.pth is not in')
if [ "$rc" -ne 0 ] && { [ "$others" -gt 0 ] || ! grep -q '^  problem: ' "$OUT/check.txt"; }; then
  status=1
fi

step tests.txt 90 "$PY" -m pytest tests/test_cuda.py -q -rA --durations=5 -p no:cacheprovider -p no:deepcopy_shim
[ "$rc" -eq 0 ] || status=1

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  step benchmark.txt 180 "$PY" benchmarks/bench_copy.py --device cuda --rounds-scale 0.34 --out "$OUT"
  [ "$rc" -eq 0 ] || status=1
else
  echo "no CUDA device: the CUDA tests skipped and the benchmark did not run" | tee "$OUT/benchmark.txt"
fi

echo "== $(date -u +%T) summary"
echo "doctor:    $(tail -n 1 "$OUT/check.txt")"
echo "tests:     $(tail -n 1 "$OUT/tests.txt")"
echo "benchmark: $(tail -n 1 "$OUT/benchmark.txt")"
echo "exit status $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $status
