#!/usr/bin/env bash
# One short visit to a GPU machine (shared/GPU.md has the recipe and its pitfalls), as one command:
#   bash bench/gpu_visit.sh            # from the checkout's root; logs and figures under $OUT (or build/gpu-visit)
# 1. the redis/pandas wheels carried in .whl/ (if any) into the machine's own Python;
# 2. the CUDA tests of the GPU-shaped step and the packed sweep (they skip without a GPU), at most 150 s;
# 3. python -m bench.gpu (CUDA, then the CPU section), at most 360 s.
# Every part writes its log as it goes, so a visit cut short keeps what it saw. Add --write by hand to
# record the figures in docs/benchmarks.md once they are back.
set -u
OUT=${OUT:-build/gpu-visit}
mkdir -p "$OUT"
export PYTHONPATH=$PWD CUBLAS_WORKSPACE_CONFIG=:4096:8
PY=${PY:-python3}
started=$(date +%s)
say() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$OUT/visit.log"; }

say "visit: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$OUT/visit.log" 2>&1
if compgen -G ".whl/*.whl" >/dev/null; then
  say "installing the carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl >>"$OUT/visit.log" 2>&1
fi
say "CUDA tests: started"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/model/test_gpustep.py tests/model/test_packed.py \
  >"$OUT/tests.log" 2>&1
say "CUDA tests: exit $? ($(tail -n 1 "$OUT/tests.log"))"
say "bench.gpu: started"
timeout 360 "$PY" -m bench.gpu --out "$OUT/bench" >"$OUT/bench.log" 2>&1
say "bench.gpu: exit $?"
