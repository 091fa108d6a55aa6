#!/usr/bin/env bash
# On a GPU machine: install the package from this tree, run the kernel tests at real dims,
# then the decode benchmark. Logs and JSON go to ${OUT:-/tmp/out}.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rm -rf /tmp/site build *.egg-info
python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -x -p no:cacheprovider -rA tests/test_kernels.py tests/test_unchecked.py ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/tests.log" | tail -25
fi
timeout "${BENCH_TIMEOUT:-280}" python3 benchmarks/bench_decode.py --peers .peers --json "$OUT/bench.json" --jsonl "$OUT/bench.jsonl" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80
