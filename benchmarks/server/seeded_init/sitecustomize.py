"""Put ``seeded_weights.initialize`` in place of SGLang's ``initialize_dummy_weights`` in this process
(see ``benchmarks/server/seeded_weights.py``): active when ``REPLAYSSM_SEEDED_WEIGHTS`` is set. Runs at
interpreter start, before SGLang is imported, so it waits for SGLang's loader module and patches it as
the module is executed; then it runs any other ``sitecustomize`` further down ``sys.path``."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
import seeded_weights  # noqa: E402

sys.path.remove(str(_HERE.parent))


class _PatchOnLoad(importlib.abc.MetaPathFinder):
    """Finds SGLang's loader module with the other finders and wraps its ``exec_module``."""

    def find_spec(self, fullname, path, target=None):
        if fullname != seeded_weights.TARGET_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.initialize_dummy_weights = seeded_weights.initialize

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(seeded_weights.ENV_VAR) is not None:
    sys.meta_path.insert(0, _PatchOnLoad())

_rest = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.origin and pathlib.Path(_next.origin).resolve().parent != _HERE:
    _mod = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_mod)
