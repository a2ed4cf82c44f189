#!/usr/bin/env bash
# One short visit to a GPU machine (shared/GPU.md has the recipe and its pitfalls), as one command of at most
# ~9 minutes (the kill-and-resume tests' 240 s beside the unit tests, then the benchmark's 280 s):
#   bash bench/gpu_visit.sh            # from the checkout's root; logs and figures under $OUT (or build/gpu-visit)
# 1. the redis/pandas wheels carried in .whl/ (if any) into the machine's own Python;
# 2. at once, side by side (correctness only, nothing timed): the CUDA unit tests (the GPU-shaped step, the packed
#    sweep, the trainer, the GPU pod) and the kill-and-resume tests on CUDA (test_worker_faults.py,
#    test_late_days.py, test_packing_faults.py, the short chaos run; each worker a fresh interpreter, as in a pod);
# 3. then alone on the machine: python -m bench.gpu --keep-going --write (CUDA, then the CPU section).
# Every part writes its log as it goes, so a visit cut short keeps what it saw; the GPU section comes back as
# $OUT/bench/gpu.md (`python -m bench.gpu --write` writes the same block into docs/benchmarks.md there).
# BENCH_ARGS adds bench.gpu options (default "--profile --per-replay 4,16": what a step launches, the next cut's
# map, and the step and the worker with graphs of several steps, gpustep.STEPS_PER_REPLAY's candidates; add e.g.
# "--batch-sizes 1024,8192"); FAULTS_S, UNIT_S, BENCH_S bound each part. STEPS_PER_REPLAY=N in the environment runs
# the kill-and-resume tests' workers (each a `python -m workload worker`) with N steps a replay instead of 1.
set -u
OUT=${OUT:-build/gpu-visit}
mkdir -p "$OUT"
export PYTHONPATH=$PWD CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
PY=${PY:-python3}
JOBS=${JOBS:-12}
started=$(date +%s)
say() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$OUT/visit.log"; }

say "visit: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$OUT/visit.log" 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
  >>"$OUT/visit.log" 2>&1
if compgen -G ".whl/*.whl" >/dev/null; then
  say "installing the carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl >>"$OUT/visit.log" 2>&1
  say "wheels: exit $?"
fi
PYTEST=("$PY" -m pytest -q -p no:cacheprovider --durations=15)
# The fault tests name each test as it passes (-v): a run the visit's time cuts short still says which ran.

say "kill-and-resume tests on CUDA: started (background, at most ${FAULTS_S:-240}s)"
( ZYGOTE=0 timeout "${FAULTS_S:-240}" "${PYTEST[@]}" -v -n "$JOBS" tests/workload/test_worker_faults.py \
    tests/workload/test_late_days.py tests/workload/test_packing_faults.py tests/chaos/test_chaos_short.py \
    >"$OUT/faults.log" 2>&1; echo "exit $?" >>"$OUT/faults.log" ) &
faults=$!
say "CUDA unit tests: started"
timeout "${UNIT_S:-150}" "${PYTEST[@]}" -n 4 tests/model/test_gpustep.py tests/model/test_packed.py tests/workload/test_gpu.py \
  tests/workload/test_trainer.py tests/workload/test_checkpoint_rules.py >"$OUT/unit.log" 2>&1
say "CUDA unit tests: exit $? ($(grep -E 'passed|failed|error' "$OUT/unit.log" | tail -n 1))"
wait "$faults"
say "kill-and-resume tests: $(tail -n 1 "$OUT/faults.log") ($(grep -c ' PASSED ' "$OUT/faults.log") PASSED, $(grep -c ' FAILED ' "$OUT/faults.log") FAILED; $(grep -E '(passed|failed|error).* in ' "$OUT/faults.log" | tail -n 1))"

say "bench.gpu: started (at most ${BENCH_S:-280}s)"
timeout "${BENCH_S:-280}" "$PY" -m bench.gpu --keep-going --write --budget-s "${BUDGET_S:-12}" ${BENCH_ARGS:---profile --per-replay 4,16} --out "$OUT/bench" \
  >"$OUT/bench.log" 2>&1
say "bench.gpu: exit $?"
say "done (the GPU section: $OUT/bench/gpu.md, written into docs/benchmarks.md here)"
