#!/usr/bin/env bash
# On the GPU machine (Python 3.12, torch 2.11, no network): unpack the kit that kit.py packed into .kit/
# (copied beside the tree), install replayssm from the tree beside it, check that every module a server
# imports is there, then run check_server.py (or, with RUN=bench_serving, bench_serving.py) with the
# given arguments.
#
#   bash benchmarks/server/gpu_server.sh [check_server.py arguments]      (.kit/ beside the tree)
#   RUN=bench_serving bash benchmarks/server/gpu_server.sh [bench_serving.py arguments]
#   PROBE_ONLY=1 bash benchmarks/server/gpu_server.sh                       (the import probe alone)
#
# Output and JSON go to ${OUT:-build/server}.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/kit-site}
OUT=${OUT:-build/server}
mkdir -p "$OUT"
kit=.kit
[ -f "$kit/manifest.json" ] && [ -f "$kit/site.tar.xz" ] || {
    echo "gpu_server.sh: $kit/manifest.json and $kit/site.tar.xz are missing: run 'python benchmarks/server/kit.py' on a machine with network and copy $kit beside the tree"
    exit 2; }
want=$("$PYTHON" -c "import json; print(json.load(open('$kit/manifest.json'))['sha256'])")
have=$(sha256sum "$kit/site.tar.xz" | cut -d' ' -f1)
[ "$want" = "$have" ] || { echo "gpu_server.sh: $kit/site.tar.xz does not match $kit/manifest.json (sha256 $have, expected $want): rebuild the kit"; exit 2; }
rm -rf "$SITE" && mkdir -p "$SITE"
tar -C "$SITE" -xJf "$kit/site.tar.xz" || exit 2
# the kit carries no bytecode: compile it now (pip compiles replayssm below), so that no server or client
# of a run compiles a module it first imports while a load is timed (the processes that run first would
# pay for the later ones)
"$PYTHON" -m compileall -q -j 0 "$SITE" > "$OUT/compileall.log" 2>&1 \
    || echo "gpu_server.sh: some modules of the kit did not compile (compileall.log); they compile when imported"
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" . > "$OUT/install.log" 2>&1 \
    || { cat "$OUT/install.log"; exit 2; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PYTHON" - <<'PY'
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "|", torch.cuda.get_device_name(), "|",
      " | ".join(f"{d} {md.version(d)}" for d in ("triton", "transformers", "sglang", "sglang-kernel", "replayssm")))
PY
"$PYTHON" benchmarks/server/probe_imports.py || exit 2
[ "${PROBE_ONLY:-0}" = 1 ] && exit 0
case "${RUN:-check_server}" in
    check_server|bench_serving) ;;
    *) echo "gpu_server.sh: RUN: expected check_server or bench_serving, got '$RUN'"; exit 2 ;;
esac
# exec: a SIGTERM to this script (timeout, a job's end) reaches the runner, which stops its servers
exec "$PYTHON" "benchmarks/server/${RUN:-check_server}.py" --out "$OUT" "$@"
