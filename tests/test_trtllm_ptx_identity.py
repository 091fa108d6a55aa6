"""CPU proof that a plugin layer's PTX is the kernel the torch op runs: ``plugin_desc.compile_kernel``
(what TensorRT and ``ptx_launch`` load) against the PTX Triton's own JIT compiles for the torch op's
launch of the same buffers (``JITFunction.warmup`` with a CUDA sm_90 target standing in for the
driver: Triton's binder specializes the real arguments: contiguous CPU pools shaped as the GPU tests'
``n = 4`` rows and ``S = 6`` slots), compared as text. Triton compiles in a subprocess without ``TRITON_INTERPRET``
(which tests/conftest.py sets on a CPU).

Normalizations, each a difference that changes no instruction:
- the ``.entry`` parameter declarations are compared as a set: ``compile_kernel`` reorders them to
  TensorRT's order (inputs, extra args, outputs); instructions name parameters, not positions.
Nothing else is normalized: the entry name, every instruction, register and ``.loc`` line match.

``sr_base`` >= 2**31 is the one known difference: the JIT types that value i64, TensorRT passes
int32 only, so the plugin compiles its int32 twin (same uint32 bits, which is all the kernels read);
``test_sr_base_twin`` pins it (the JIT of the twin gives the plugin's PTX)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import SPECS

from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.kernels import ops

CONFIGS = (("checkpoint", "float32"), ("fp8", "bfloat16"), ("nvfp4", "float16_sr"))
CASES = [(f, op, rf, ck, "kv") for f in SPECS for op in pd.OPS for rf, ck in CONFIGS]
# the hosts' [S, HV, V, K] checkpoint, whose flush pass behind a read copy moves it in runs of key channels
CASES += [(f, op, rf, "float32", "vk") for f in ("gdn", "kda") for op in pd.OPS for rf in ("fp8", "nvfp4")]
SEED, LAYER = 7, 1  # sr_base(7, 1) < 2**31; sr_base(7, 3) >= 2**31

_COMPARE = """
import json, re, sys
from collections import defaultdict
from dataclasses import replace

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

import replayssm as rs
from replayssm.integrations.trtllm import plugin_desc as pd, steps
from helpers import SPECS

N, S = 4, 6  # the GPU tests' rows and slots: no size 1, no multiple of 16 (advance specializes n, S)


class Sm90Driver:  # what JITFunction.run asks the active driver before it compiles
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


driver.set_active(Sm90Driver())


def jit_ptx(lc):
    lc.kernel.device_caches = defaultdict(lc.kernel.create_binder)
    grid = tuple(lc.n if d == "n" else d for d in lc.grid)
    return lc.kernel.warmup(*lc.args, grid=grid, **lc.options(), **lc.constexprs).asm["ptx"]


def split(ptx, name):  # (PTX without the entry's parameter declarations, the declarations sorted)
    m = re.search(r"\\.entry\\s+" + re.escape(name) + r"\\s*\\(\\n(.*?)\\n\\)", ptx, re.S)
    return ptx[:m.start(1)] + ptx[m.end(1):], sorted(m.group(1).split(",\\n"))


family, op, rf, ck, layer, twin = sys.argv[1:7]
spec, T, layer, layout = SPECS[family], 1 if op == "decode" else 3, int(layer), sys.argv[8]
cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format=rf, checkpoint_dtype=ck, ring_dtype="bfloat16",
                      seed=int(sys.argv[7]))
has_z = family == "mamba2"
descs = pd.describe_step(spec, cfg, op=op, tokens=T, layer=layer, has_z=has_z, state_layout=layout)
t = steps.allocate(steps.step_buffers(spec, cfg, T, has_z=has_z, state_layout=layout), N, S, device="cpu")
plan = steps.step_plan(spec, cfg, t, committed=op == "decode", layer=layer, state_layout=layout)
cur = [torch.zeros(S + 1, dtype=torch.int32) for _ in range(4)] + [torch.zeros(N, dtype=torch.int64)]
adv = descs[-1].kernel.launch
plan.append(replace(adv, n=N, args=cur + [N, S] + [a for a in adv.args[7:]]))
out = []
for desc, lc in zip(descs, plan):
    if twin == "1":  # the JIT's PTX for sr_base passed as its int32 twin (same uint32 bits)
        lc = replace(lc, args=[a - 2 ** 32 if i == len(lc.args) - 1 and a >= 2 ** 31 else a
                               for i, a in enumerate(lc.args)])
    plugin = pd.compile_kernel(desc, "sm_90")
    (body, decls), (want_body, want_decls) = split(plugin["ptx"], plugin["name"]), split(jit_ptx(lc), plugin["name"])
    diff = [(a, b) for a, b in zip(want_body.splitlines(), body.splitlines()) if a != b]
    out.append(dict(plugin_id=desc.plugin_id, decls=decls == want_decls, body=body == want_body,
                    lines=[len(want_body.splitlines()), len(body.splitlines())], first_diff=diff[:3]))
print(json.dumps(out))
"""


def _compare(family, op, rf, ck, layer=LAYER, twin=False, seed=SEED, layout="kv") -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _COMPARE, family, op, rf, ck, str(layer), str(int(twin)), str(seed),
                        layout], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("family,op,rf,ck,layout", CASES, ids=["-".join(c) for c in CASES])
def test_plugin_ptx_is_the_torch_ops_ptx(family, op, rf, ck, layout):
    """Step, flush (where the step has one) and advance layers of one step: same declarations,
    same text otherwise."""
    assert ops.sr_base(SEED, LAYER) < 2 ** 31
    for layer in _compare(family, op, rf, ck, layout=layout):
        assert layer["decls"] and layer["body"], layer


def test_sr_base_twin():
    """sr_base >= 2**31: the plugin's PTX is the JIT's for the int32 twin, not for the i64 value."""
    assert ops.sr_base(SEED, 3) >= 2 ** 31
    step, adv = _compare("gdn", "decode", "checkpoint", "float16_sr", layer=3, twin=True)  # one launch folds
    assert step["body"] and adv["body"]
    step, adv = _compare("gdn", "decode", "checkpoint", "float16_sr", layer=3)
    assert not step["decls"]  # the JIT declares sr_base .u64
