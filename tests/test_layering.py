"""Layers point one way: core (``replayssm``) < kernels (``replayssm.kernels``) < integrations.

Import-time checks run the interpreter; the rest parses every module of the package with ``ast``
(as pyproject.toml maps ``replayssm.*`` onto core/, kernels/ and integrations/): no import cycle
between modules (imports inside functions included), no import of a higher layer from a lower one,
no use of another module's private name (``_x``; but among the kernel files: ``kernels/ops.py``
launches the ``_``-named Triton kernels of ``kernels/*/triton.py``), and no use of a private member
of a class another module defines (a pool's ``_x`` from an adapter).
"""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("replayssm", "replayssm.kernels", "replayssm.integrations")
# ``python -m replayssm.demo`` runs the transformers demo: a command-line entry, imported when run
UPWARD_ALLOWED = {("replayssm.demo", "replayssm.integrations.transformers.demo")}
FRAMEWORKS = {"triton", "sglang", "tensorrt", "tensorrt_llm", "transformers"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_core_imports_no_kernel_triton_or_framework():
    mods = _imports_after("import replayssm, replayssm.backend, replayssm.formats, replayssm.demo")
    assert "replayssm.pool" in mods and not {m for m in mods if m.startswith("replayssm.kernels")}
    assert not {m.split(".")[0] for m in mods} & FRAMEWORKS
    mods = _imports_after("import replayssm.kernels.backend_reference")       # the CPU backend: no Triton
    assert "replayssm.kernels.delta.reference" in mods and not {m.split(".")[0] for m in mods} & FRAMEWORKS


def test_integrations_import_without_frameworks():
    mods = _imports_after("import replayssm.integrations.sglang, replayssm.integrations.trtllm, "
                          "replayssm.integrations.transformers")
    assert not {m.split(".")[0] for m in mods} & {"sglang", "tensorrt", "tensorrt_llm", "transformers"}


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert set(dirs) == set(LAYERS)
    mods = {}
    for package, folder in dirs.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            mods[".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))] = path
    return mods


MODULES = _modules()


def _layer(module: str) -> int:
    return max(i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + "."))


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


class _Uses(ast.NodeVisitor):
    """Imports (package modules, with whether they run at import time), private names imported
    from package modules, and private attributes read through an imported package module or on
    any other object."""

    def __init__(self, module: str):
        self.module, self.depth = module, 0
        self.imports: list[tuple[str, bool, int]] = []        # (target, at import time, line)
        self.private: list[tuple[str, str, int]] = []         # (owner module, name, line)
        self.attrs: list[tuple[str, str, int]] = []           # (expression, attribute, line)
        self.aliases: dict[str, str] = {}                     # local name -> package module

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _target(self, name: str) -> str | None:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        return name or None

    def visit_Import(self, node):
        for alias in node.names:
            target = self._target(alias.name)
            if target:
                self.imports.append((target, self.depth == 0, node.lineno))
                if alias.asname:
                    self.aliases[alias.asname] = target

    def visit_ImportFrom(self, node):
        source = _absolute(self.module, node)
        if self._target(source) is None:
            return
        for alias in node.names:
            full = f"{source}.{alias.name}"
            if full in MODULES:
                self.imports.append((full, self.depth == 0, node.lineno))
                self.aliases[alias.asname or alias.name] = full
            else:
                self.imports.append((self._target(source), self.depth == 0, node.lineno))
                if alias.name.startswith("_"):
                    self.private.append((self._target(source), alias.name, node.lineno))

    def visit_Attribute(self, node):
        if _private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in self.aliases:
                self.private.append((self.aliases[owner], node.attr, node.lineno))
            elif owner not in ("self", "cls"):
                self.attrs.append((ast.unparse(node.value), node.attr, node.lineno))
        self.generic_visit(node)


def _parse(module: str, source: str) -> _Uses:
    uses = _Uses(module)
    uses.visit(ast.parse(source))
    return uses


USES = {name: _parse(name, path.read_text()) for name, path in MODULES.items()}


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in u.imports if t != m} for m, u in USES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _class_private_members() -> dict[str, set[str]]:
    """Private methods and attributes (``self._x``) of the classes the package defines (a
    StatePool's, a ReplayMambaStates'...): name -> the modules defining them."""
    owners: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                    owners.setdefault(node.name, set()).add(module)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                        and _private(node.attr):
                    owners.setdefault(node.attr, set()).add(module)
    return owners


def test_the_parse_sees_the_package():
    """Not vacuous: the modules and import edges this test is about exist and are seen."""
    assert {"replayssm", "replayssm.pool", "replayssm.api", "replayssm.backend", "replayssm.kernels",
            "replayssm.kernels.ops", "replayssm.kernels.backend", "replayssm.kernels.backend_reference",
            "replayssm.kernels.delta.reference", "replayssm.integrations.sglang.pool",
            "replayssm.integrations.sglang.hooks", "replayssm.integrations.trtllm.aot",
            "replayssm.integrations.trtllm.plugin_desc", "replayssm.integrations.trtllm.ptx_launch",
            "replayssm.integrations.transformers.cache"} <= set(MODULES)
    assert len(MODULES) >= 45 and {_layer(m) for m in MODULES} == {0, 1, 2}
    graph = _graph()
    for src, dst in (("replayssm", "replayssm.pool"), ("replayssm.pool", "replayssm.backend"),
                     ("replayssm.kernels.backend", "replayssm.kernels.backend_reference"),
                     ("replayssm.kernels.backend_reference", "replayssm.kernels.delta.reference"),
                     ("replayssm.kernels.backend_reference", "replayssm.pool"),
                     ("replayssm.kernels.ops", "replayssm.formats"),
                     ("replayssm.integrations.sglang.hooks", "replayssm.integrations.sglang.pool"),
                     ("replayssm.integrations.trtllm.ptx_launch", "replayssm.integrations.trtllm.plugin_desc"),
                     ("replayssm.demo", "replayssm.integrations.transformers.demo")):
        assert dst in graph[src], (src, dst)
    assert sum(map(len, graph.values())) >= 80
    assert any(not top for u in USES.values() for _, top, _ in u.imports)      # imports in functions are seen


def test_the_checks_catch_what_they_look_for():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    members = _class_private_members()
    assert members["_make_checkpoint"] == {"replayssm.pool"} and members["_rows"] == {"replayssm.integrations.trtllm.cache"}
    src = ("from . import aot\nimport replayssm.kernels.ops as ops\nfrom replayssm.pool import _x\n"
           "def f(pool):\n    from replayssm.kernels import backend\n    return aot._dim, ops._y, pool._make_checkpoint\n")
    uses = _parse("replayssm.integrations.trtllm.ptx_launch", src)
    assert {(t, top) for t, top, _ in uses.imports} == {
        ("replayssm.integrations.trtllm.aot", True), ("replayssm.kernels.ops", True), ("replayssm.pool", True),
        ("replayssm.kernels.backend", False)}
    assert {(o, n) for o, n, _ in uses.private} == {
        ("replayssm.pool", "_x"), ("replayssm.integrations.trtllm.aot", "_dim"), ("replayssm.kernels.ops", "_y")}
    assert [(e, a) for e, a, _ in uses.attrs] == [("pool", "_make_checkpoint")]


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_layers_point_one_way():
    upward = [(m, t, line) for m, u in USES.items() for t, _, line in u.imports
              if _layer(t) > _layer(m) and (m, t) not in UPWARD_ALLOWED]
    assert upward == []
    at_import = [(m, t) for m, u in USES.items() for t, top, _ in u.imports if top and (m, t) in UPWARD_ALLOWED]
    assert at_import == []


def test_no_private_name_of_another_module():
    kernel_files = lambda m: _layer(m) == 1  # noqa: E731
    used = [(m, owner, name, line) for m, u in USES.items() for owner, name, line in u.private
            if owner != m and not (kernel_files(m) and kernel_files(owner))]
    assert used == []


def test_no_private_member_of_another_modules_class():
    """E.g. an adapter calling ``pool._make_checkpoint``: the pool's operations it needs are public."""
    members = _class_private_members()
    used = [(m, expr, attr, line) for m, u in USES.items() for expr, attr, line in u.attrs
            if attr in members and m not in members[attr]]
    assert used == []
