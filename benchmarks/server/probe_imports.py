"""Import the modules a SGLang server process loads and list every module that is missing, in one go.

    python benchmarks/server/probe_imports.py [--modules M ...]

Each round imports them in a fresh process; a module that was not found is replaced by an empty
placeholder in the next round, so the import goes on to the next missing one. The probe then exits 1
naming them all (0 when none is missing). It only imports, and runs
nothing of SGLang's: use it to check a kit (``kit.py``) before starting a server.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import subprocess
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
    "sglang.srt.layers.attention.dsa_backend",   # speculative decoding's draft worker imports it (deep_gemm)
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


def child(modules: list[str], placeholders: list[str]) -> None:
    """Import ``modules`` with ``placeholders`` in place; print one JSON line: the modules that were
    not found (with where they were imported), and the other import errors."""
    sys.meta_path.insert(0, _Placeholders(placeholders))
    missing, failed = {}, {}
    for name in modules:
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


def probe(modules: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(missing module -> where it is imported, module -> other import error)`` for ``modules``."""
    placeholders: list[str] = []
    where: dict[str, str] = {}
    for _ in range(ROUNDS):
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps([modules, placeholders])],
                             capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            raise RuntimeError(f"probe process failed ({out.returncode}): {out.stderr[-4000:]}")
        found = json.loads(lines[-1])
        new = [m for m in found["missing"] if m not in placeholders]
        placeholders += new
        where.update(found["missing"])
        if not new:
            break
    return {name: where[name] for name in placeholders}, found["failed"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="+", default=list(MODULES), help="modules to import (default: a server's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(*json.loads(args.child))
        return 0
    missing, failed = probe(args.modules)
    for name, why in failed.items():
        print(f"import {name}: {why}")
    for name, where in missing.items():
        print(f"missing module: {name} (imported at {where})")
    print(f"probe: {len(args.modules)} modules, {len(missing)} missing, {len(failed)} failed otherwise")
    return 1 if missing or failed else 0


if __name__ == "__main__":
    sys.exit(main())
