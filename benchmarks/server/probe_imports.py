"""Import the modules a SGLang server process loads and list every module that is missing, in one go.

    python benchmarks/server/probe_imports.py [--pretend-cuda]

Each round imports them in a fresh process; a module that was not found is replaced by an empty
placeholder in the next round, so the import goes on to the next missing one. The probe then exits 1
naming them all (0 when none is missing). It only imports, and runs
nothing of SGLang's: use it to check a kit (``kit.py``) before starting a server.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import importlib.abc
import importlib.machinery
import sys
import traceback
import types

MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.layers.attention.linear.gdn_backend",
    "sglang.srt.layers.attention.linear.kda_backend",
    "sglang.srt.models.nemotron_h",
    "sglang.srt.models.qwen3_next",
    "sglang.srt.models.qwen3_5",
    "sglang.srt.models.kimi_linear",
    "sglang.bench_serving",
    "replayssm.integrations.sglang.hooks",
)
ROUNDS = 12


class _Placeholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path``: the modules in ``names`` (and their submodules) import as empty
    placeholders, so an import past a missing module can find the next one."""

    def __init__(self, names: list[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__file__ = f"<placeholder {spec.name}>"
        module.__version__ = "0"
        module.__getattr__ = lambda attr: type(attr, (), {})
        return module

    def exec_module(self, module):
        pass


def _pretend_hopper() -> None:
    """``--pretend-cuda``: torch reports one sm90 GPU, so a probe on a machine without one follows the
    import branches SGLang takes on CUDA (it then finds missing modules, not CUDA errors)."""
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200"


def child(placeholders: list[str], pretend_cuda: bool) -> None:
    """Import ``MODULES`` with ``placeholders`` in place; print one JSON line: the modules that were
    not found (with where), and the other import errors."""
    if pretend_cuda:
        _pretend_hopper()
    sys.meta_path.insert(0, _Placeholders(placeholders))
    missing, failed = {}, {}
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] not in ("sglang", "replayssm"):
                frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")]
                missing.setdefault(e.name, f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?")
            else:
                failed[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
        except Exception as e:                  # noqa: BLE001 - reported
            failed[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
    print(json.dumps(dict(missing=missing, failed=failed)))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]), sys.argv[3] == "1")
        return 0
    pretend = "1" if "--pretend-cuda" in sys.argv[1:] else "0"
    placeholders: list[str] = []
    where: dict[str, str] = {}
    for _ in range(ROUNDS):
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(placeholders), pretend], capture_output=True,
                             text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            print(out.stdout[-4000:], out.stderr[-4000:])
            return 2
        found = json.loads(lines[-1])
        new = [m for m in found["missing"] if m not in placeholders]
        placeholders += new
        where.update(found["missing"])
        if not new:
            break
    for name, why in found["failed"].items():
        print(f"import {name}: {why}")
    for name in placeholders:
        print(f"missing module: {name} (imported at {where[name]})")
    print(f"probe: {len(MODULES)} modules, {len(placeholders)} missing, {len(found['failed'])} failed otherwise")
    return 1 if placeholders or found["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
