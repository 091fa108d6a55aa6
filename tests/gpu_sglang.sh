#!/usr/bin/env bash
# The SGLang lifecycle tests on the GPU (REPLAYSSM_TEST_DEVICE=cuda: SGLang's pools on cuda, the Triton
# kernels compiled for the GPU), on a GPU machine with Python 3.12, torch, triton, transformers and
# pytest, but no sglang and no network access. SGLang 0.5.23 and the packages its modules import that
# such a machine lacks travel as wheels in .whl (tests/gpu_sglang_wheels.sh fills it); this package is installed from the tree.
#
#   run from the repository root, .whl carried:  bash tests/gpu_sglang.sh [pytest arguments]
#   log: ${OUT:-/tmp/out}/sglang.log
#
# Two stand-ins for what cannot travel:
# - sgl_kernel (sglang-kernel, 373 MB of CUDA ops built for torch 2.14): SGLang's modules import names
#   from it at import time on CUDA; none is called on these tests' paths. A stub package whose every
#   name raises when called is written into the install folder (skipped where a real sgl_kernel imports).
# - SGLang's bundled Rust radix TreeCore is built for torch 2.14 and misreads tensor dtypes under the
#   torch 2.11 of such a machine ("insert value must be an int64 tensor, got QInt32"): the Python TreeCore is used.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/out}
LOG=$OUT/sglang.log
mkdir -p "$OUT" "$SITE"
: > "$LOG"
log() { "$@" 2>&1 | tee -a "$LOG"; }

shopt -s nullglob
wheels=(.whl/*.whl)
[ ${#wheels[@]} -gt 0 ] || { log echo "no wheels in .whl (carry .whl)"; exit 2; }
log "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" . || exit 2
log "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "${wheels[@]}" || exit 2
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

if ! "$PYTHON" -c "import sgl_kernel" >/dev/null 2>&1; then
    mkdir -p "$SITE/sgl_kernel"
    cat > "$SITE/sgl_kernel/__init__.py" <<'EOF'
"""Stand-in for sglang-kernel, written by tests/gpu_sglang.sh: every name is a function that raises.

Submodules (sgl_kernel.kvcacheio, ...) are stand-ins too, except scalar_type: its ImportError makes
SGLang use its own placeholder scalar types."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+replayssm-stub"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(__name__, name)


def _missing(module, name):
    def missing(*args, **kwargs):
        raise RuntimeError(f"{module}.{name}: sglang-kernel is not installed (a tests/gpu_sglang.sh stub)")
    missing.__name__ = missing.__qualname__ = name
    return missing


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(self.__name__, name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(__name__ + ".") and name != __name__ + ".scalar_type":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
EOF
    log echo "sgl_kernel: stub written to $SITE/sgl_kernel"
fi

export REPLAYSSM_TEST_DEVICE=${REPLAYSSM_TEST_DEVICE:-cuda}
[ "$REPLAYSSM_TEST_DEVICE" = cuda ] && unset TRITON_INTERPRET
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=${SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND:-python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
log "$PYTHON" - <<'EOF'
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
print(" | ".join(f"{d} {md.version(d)}" for d in ("triton", "transformers", "sglang", "replayssm")))
EOF

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(tests/test_sglang_replay.py tests/test_sglang_gdn.py tests/test_sglang_kda.py
                              tests/test_sglang_radix.py tests/test_sglang_hicache.py tests/test_sglang_disagg.py tests/test_sglang_mixed.py
                              tests/test_sglang_int8.py
                              tests/test_sglang_track.py
                              tests/test_sglang_extra_buffer.py tests/test_sglang_cuda_graph.py)
extra=()
"$PYTHON" -c "import xdist" >/dev/null 2>&1 && extra+=(-n "${WORKERS:-4}")
"$PYTHON" -c "import pytest_timeout" >/dev/null 2>&1 && extra+=(--timeout "${TEST_TIMEOUT:-240}")
timeout -k 10 "${TIMEOUT:-420}" "$PYTHON" -m pytest -v -rfEs -p no:cacheprovider "${extra[@]}" "${args[@]}" 2>&1 \
    | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "gpu_sglang.sh: pytest exit $rc (log $LOG)" | tee -a "$LOG"
exit "$rc"
