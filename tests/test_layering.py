"""core/ imports no triton and no host framework; integrations import their frameworks lazily."""

import subprocess
import sys


def _imports_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_core_imports_no_triton_or_framework():
    mods = _imports_after("import replayssm, replayssm.backend, replayssm.formats, replayssm.demo")
    banned = {"triton", "sglang", "tensorrt", "tensorrt_llm", "transformers"}
    assert not {m.split(".")[0] for m in mods} & banned


def test_integrations_import_without_frameworks():
    mods = _imports_after("import replayssm.integrations.sglang, replayssm.integrations.trtllm, "
                          "replayssm.integrations.transformers")
    assert not {m.split(".")[0] for m in mods} & {"sglang", "tensorrt", "tensorrt_llm", "transformers"}
