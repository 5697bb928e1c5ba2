"""The package layers, read from the code's own imports with :mod:`ast`.

The project's packages sit in one direction, bottom to top (:data:`LAYERS`):

0. ``traces`` -- workload table, loaders, synthesis, the data directory, argument parsers;
1. the ``twin`` core -- config, model spec, performance model, interfaces, registry, engine
   and its memory/extension modules, metrics, ``simulate``;
2. ``policies`` -- the built-in schedulers and cache policies;
3. the layers that use them -- ``calibration``, ``twin.validation``, ``twin.compare``,
   ``twin.sweep``, ``twin.configurator``, ``twin.reproduce``;
4. the command-line modules (:data:`CLI_MODULES`).

Four rules, one test each:

* **no import loop** between project modules. Counted: imports executed when the file is
  imported (module level, including those under ``if``/``try`` and in class bodies). Not
  counted: ``if TYPE_CHECKING:`` imports (never executed, so they cannot form a runtime
  loop) and imports inside functions (rule three forbids those instead).
* **no upward import**: a module imports only from its own layer and lower ones. Every
  import counts here, ``if TYPE_CHECKING:`` and in-function ones included.
* **no project import inside a function** outside the command-line modules (inside
  functions only optional heavy third-party dependencies: torch, triton, matplotlib, tqdm,
  the distributed executors). A project module that imports one of those
  (:data:`HEAVY_DEPENDENCIES`) at file level is itself such a dependency (e.g. the GPU
  harness's kernels, which need torch and triton), so it may be imported inside a function.
* **every module is imported by a test** (the tests' imports, read the same way): a module's contract is
  tested where a reader looks for it; the few exercised only through a subprocess or a registry are named
  with that test in :data:`TESTED_THROUGH`, and an entry that goes stale fails too.

An import names its module only: ``import twin.perf.forms`` is an edge to ``twin.perf.forms``
(not to ``twin`` or ``twin.perf``, whose ``__init__`` files are kept free of imports);
``from twin.perf import forms`` is an edge to ``twin.perf.forms`` when that is a module, and
``from twin.engine import Engine`` an edge to ``twin.engine``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("traces", "twin", "policies", "calibration")

#: Module prefix -> layer (0 lowest). The most specific (longest) matching prefix wins.
LAYERS: dict[str, int] = {
    "traces": 0,
    "twin": 1,
    "policies": 2,
    "calibration": 3,
    "twin.validation": 3,
    "twin.compare": 3,
    "twin.sweep": 3,
    "twin.configurator": 3,
    "twin.reproduce": 3,
    "twin.cli": 4,
    "twin.__main__": 4,
    "traces.cli": 4,
    "calibration.cli": 4,
    "calibration.bench.cli": 4,
    "calibration.bench.__main__": 4,
    "twin.validation.cli": 4,
    "twin.sweep.cli": 4,
    "twin.configurator.cli": 4,
    "twin.reproduce.cli": 4,
}
#: The layer of the command-line modules: the only place a project import may sit inside a function.
CLI_LAYER = 4
#: Optional heavy third-party packages (top-level names): a project module that imports one of
#: them at file level may be imported inside a function. ``sklearn`` is needed to train a
#: configurator only: the saved models predict without it.
HEAVY_DEPENDENCIES = frozenset({"torch", "triton", "safetensors", "matplotlib", "tqdm", "joblib", "dask", "ray",
                                "sklearn"})


@dataclass(frozen=True)
class Import:
    """One import of a project module by a project module."""

    importer: str
    imported: str
    line: int
    where: str  # 'file' (runs on import), 'type_checking' (if TYPE_CHECKING:), 'function'


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> file."""
    mods: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            mods[module_name(root, path)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to (its longest prefix that is a module), or None."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in modules:
            return cand
    return None


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
             modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative import: resolve against the importer's package
            pkg = importer.split(".") if is_package else importer.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for n in names:
        m = _resolve(n, modules)
        if m is not None and m != importer and m not in out:
            out.append(m)
    return out


def _top_level_names(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name.split(".")[0] for a in node.names}
    return {node.module.split(".")[0]} if node.module and not node.level else set()


def scan(root: Path, packages: tuple[str, ...]) -> tuple[list[Import], set[str]]:
    """Every import of a project module in ``packages``, with where it sits; and the project
    modules that import a :data:`HEAVY_DEPENDENCIES` package at file level."""
    modules = find_modules(root, packages)
    found: list[Import] = []
    heavy: set[str] = set()

    def visit(node: ast.AST, importer: str, is_package: bool, where: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(node, importer, is_package, modules):
                found.append(Import(importer, target, node.lineno, where))
            if where == "file" and _top_level_names(node) & HEAVY_DEPENDENCIES:
                heavy.add(importer)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = "function"
        if isinstance(node, ast.If) and _is_type_checking(node.test) and where == "file":
            for child in node.body:
                visit(child, importer, is_package, "type_checking")
            for child in node.orelse:
                visit(child, importer, is_package, where)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, importer, is_package, where)

    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        visit(tree, name, path.name == "__init__.py", "file")
    return found, heavy


def layer_of(module: str, layers: dict[str, int]) -> int:
    best = None
    for prefix in layers:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    if best is None:
        raise KeyError(f"module {module} matches no prefix of the layer map")
    return layers[best]


def import_loops(imports: list[Import]) -> list[str]:
    """One message per import loop (strongly connected set of modules) among runtime imports."""
    graph: dict[str, dict[str, int]] = {}
    for imp in imports:
        if imp.where == "file":
            graph.setdefault(imp.importer, {}).setdefault(imp.imported, imp.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan, iterative over an explicit stack
        work = [(v, iter(sorted(graph.get(v, {}))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    messages = []
    for comp in sorted(sccs):
        members = set(comp)
        edges = [f"{a}:{line} -> {b}" for a in comp for b, line in sorted(graph.get(a, {}).items()) if b in members]
        messages.append(f"import loop among {len(comp)} modules ({', '.join(comp)}): " + "; ".join(edges))
    return messages


def upward_imports(imports: list[Import], layers: dict[str, int]) -> list[str]:
    out = []
    for imp in imports:
        lo, hi = layer_of(imp.importer, layers), layer_of(imp.imported, layers)
        if hi > lo:
            out.append(f"{imp.importer}:{imp.line} imports {imp.imported} ({imp.where}): "
                       f"layer {lo} must not import from layer {hi}")
    return out


def imports_in_functions(imports: list[Import], layers: dict[str, int], cli_layer: int,
                         heavy: set[str] = frozenset()) -> list[str]:
    return [f"{imp.importer}:{imp.line} imports {imp.imported} inside a function: project imports belong at "
            f"file level (only the command-line modules may defer them)"
            for imp in imports if imp.where == "function" and layer_of(imp.importer, layers) < cli_layer
            and imp.imported not in heavy]


def _fail(messages: list[str], rule: str) -> None:
    if messages:
        pytest.fail(f"{len(messages)} violation(s) of '{rule}':\n  " + "\n  ".join(messages), pytrace=False)


@pytest.fixture(scope="module")
def project_imports() -> list[Import]:
    return scan(ROOT, PACKAGES)[0]


@pytest.fixture(scope="module")
def heavy_modules() -> set[str]:
    return scan(ROOT, PACKAGES)[1]


def test_every_module_has_a_layer():
    for name in find_modules(ROOT, PACKAGES):
        layer_of(name, LAYERS)


def test_no_import_loops(project_imports):
    _fail(import_loops(project_imports), "no file-level import loop")


def test_layers_point_down(project_imports):
    _fail(upward_imports(project_imports, LAYERS), "no import from a lower layer to a higher one")


def test_no_project_imports_inside_functions(project_imports, heavy_modules):
    _fail(imports_in_functions(project_imports, LAYERS, CLI_LAYER, heavy_modules),
          "no project import inside a function outside the command-line modules")


#: Modules no test imports by name, each with the test module that exercises it and how. Everything else
#: must be imported by at least one test (Ciw's "a test module per module": the module's contract is tested
#: where a reader looks for it, not only through whatever happens to call it).
TESTED_THROUGH: dict[str, tuple[str, str]] = {
    "twin.__main__": ("tests/sweep/test_sweep_run.py", "python -m twin in a subprocess"),
    "calibration.bench.__main__": ("tests/calibration/test_bench_robust.py", "python -m calibration.bench in a subprocess"),
    "calibration.bench.linear_ops": ("tests/calibration/test_bench_harness.py",
                                     "the harness imports it on demand (torch); linear_ops.csv checked"),
    "twin.reproduce.cli": ("tests/reproduce/test_cli.py", "the twin reproduce command"),
    "traces.loaders.azure_functions": ("tests/traces/test_loader_validation.py", "traces.loaders.load_trace"),
    "traces.loaders.azure_llm": ("tests/traces/test_loaders.py", "traces.loaders.load_trace"),
    "traces.loaders.burstgpt": ("tests/traces/test_loaders.py", "traces.loaders.load_trace"),
}


def modules_imported_by_tests(root: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules some test file imports by name (anywhere in the file: tests import in functions too)."""
    seen: set[str] = set()
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            seen.update(m for n in names if (m := _resolve(n, modules)) is not None)
    return seen


def untested_modules(root: Path, packages: tuple[str, ...], through: dict[str, tuple[str, str]]) -> list[str]:
    """One message per module no test imports and ``through`` does not account for, and per stale ``through``
    entry (its module gone, imported by a test after all, or its test file missing)."""
    modules = find_modules(root, packages)
    seen = modules_imported_by_tests(root, modules)
    out = [f"{m} ({p.relative_to(root)}): no test imports it; add tests/.../test_{m.rsplit('.', 1)[-1]}.py for its "
           f"contract, or name the test that exercises it in TESTED_THROUGH"
           for m, p in modules.items() if p.name != "__init__.py" and m not in seen and m not in through]
    for m, (test, _how) in through.items():
        if m not in modules:
            out.append(f"TESTED_THROUGH names {m}, which is not a module: remove the entry")
        elif m in seen:
            out.append(f"TESTED_THROUGH names {m}, which a test now imports: remove the entry")
        elif not (root / test).is_file():
            out.append(f"TESTED_THROUGH says {test} exercises {m}, but that file does not exist")
    return out


def test_every_module_is_imported_by_a_test():
    _fail(untested_modules(ROOT, PACKAGES, TESTED_THROUGH), "every module has tests that import it")


# -- the checker itself, on a tiny synthetic project ---------------------------------------

TOY_LAYERS = {"low": 0, "high": 1, "high.cli": 2}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _toy(root: Path, files: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    base = {"low/__init__.py": "", "high/__init__.py": "", "high/cli.py": ""}
    _write(root, {**base, **files})
    imps, heavy = scan(root, ("low", "high"))
    return import_loops(imps), upward_imports(imps, TOY_LAYERS), imports_in_functions(imps, TOY_LAYERS, 2, heavy)


def test_checker_passes_a_clean_layout(tmp_path):
    loops, up, inner = _toy(tmp_path, {
        "low/a.py": "import json\n",
        "low/b.py": "from low import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low.c import X\n",
        "low/c.py": "from .b import a\nX = 1\n",
        "high/d.py": "from low.c import X\ndef f():\n    import torch\n    from high import gpu\n",
        "high/gpu.py": "import torch\n",  # a heavy optional dependency: may be imported lazily
        "high/cli.py": "from high import d\ndef main():\n    from low import a\n",
    })
    assert (loops, up, inner) == ([], [], [])


def test_checker_finds_a_loop_an_upward_import_and_an_import_in_a_function(tmp_path):
    loops, up, inner = _toy(tmp_path, {
        "low/a.py": "from low.b import f\n",
        "low/b.py": "import low.a\ndef f():\n    from high.d import g\n",
        "high/d.py": "def g():\n    pass\n",
        "high/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from high.cli import main\n",
    })
    assert len(loops) == 1 and "low.a:1 -> low.b" in loops[0] and "low.b:1 -> low.a" in loops[0]
    assert sorted(up) == sorted([
        "low.b:3 imports high.d (function): layer 0 must not import from layer 1",
        "high.e:3 imports high.cli (type_checking): layer 1 must not import from layer 2",
    ])
    assert inner == ["low.b:3 imports high.d inside a function: project imports belong at file level "
                     "(only the command-line modules may defer them)"]


def test_type_checking_imports_do_not_make_a_runtime_loop(tmp_path):
    loops, up, inner = _toy(tmp_path, {
        "low/a.py": "from low.b import f\n",
        "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low.a import x\ndef f():\n    pass\n",
    })
    assert (loops, up, inner) == ([], [], [])


def test_checker_finds_a_module_no_test_imports_and_a_stale_exception(tmp_path):
    _write(tmp_path, {"low/__init__.py": "", "low/used.py": "", "low/orphan.py": "", "low/entry.py": "",
                      "tests/test_used.py": "def test_x():\n    from low.used import thing\n",
                      "tests/test_entry.py": ""})
    through = {"low.entry": ("tests/test_entry.py", "a subprocess"), "low.used": ("tests/test_used.py", "stale"),
               "low.gone": ("tests/test_entry.py", "stale")}
    msgs = untested_modules(tmp_path, ("low",), through)
    assert len(msgs) == 3, msgs
    assert msgs[0].startswith("low.orphan (low/orphan.py): no test imports it")
    assert "names low.used, which a test now imports" in msgs[1]
    assert "names low.gone, which is not a module" in msgs[2]
    assert untested_modules(tmp_path, ("low",), {"low.entry": through["low.entry"],
                                                 "low.orphan": ("tests/none.py", "x")}) == [
        "TESTED_THROUGH says tests/none.py exercises low.orphan, but that file does not exist"]
