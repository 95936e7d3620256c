"""Every module of the package imports on its own (no import cycles hidden by a lucky import order), and the import
graph read from the source, function-level imports included, has no cycle."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import ENTRY_POINTS, package_modules

import dsl_llada

# One fresh interpreter; before each module every dsl_llada module is dropped from sys.modules, so each import starts
# from that module alone (third-party packages stay loaded: only our own import order matters for a cycle).
_SCRIPT = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    for m in [m for m in sys.modules if m == "dsl_llada" or m.startswith("dsl_llada.")]:
        del sys.modules[m]
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_module_discovery_finds_the_whole_package():
    names = package_modules()
    root = Path(dsl_llada.__file__).parent
    on_disk = {".".join(("dsl_llada", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
               for p in root.rglob("*.py")}
    assert set(names) == on_disk - ENTRY_POINTS  # nothing skipped silently (e.g. a package without __init__)
    assert len(names) >= 30
    for expected in ("dsl_llada.core.checkpoint", "dsl_llada.core.backbones.base", "dsl_llada.train.trainer",
                     "dsl_llada.sampling.sde", "dsl_llada.toy.demo"):
        assert expected in names


def test_every_module_imports_on_its_own():
    names = package_modules()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(dsl_llada.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(names)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{k}:\n{v}" for k, v in failed.items())


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, from every import statement in its AST (top-level, in functions,
    in classes), except those under `if TYPE_CHECKING:` (never executed). `from .m import x` counts as importing
    `m.x` when that is a module, else `m`."""
    modules = {_module_name(p, root, package): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _module_name(path: Path, root: Path, package: str) -> str:
    return ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` outside `if TYPE_CHECKING:` bodies."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        todo += list(ast.iter_child_nodes(node))
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), or of one module importing
    itself: every import cycle, found by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_import_graph_has_no_cycle():
    root = Path(dsl_llada.__file__).parent
    graph = import_graph(root, "dsl_llada")
    assert len(graph) == len(package_modules()) + len(ENTRY_POINTS)
    assert {"dsl_llada.core.model", "dsl_llada.toy.frontier_report"} <= graph["dsl_llada.toy.demo"]  # relative, top level
    assert "dsl_llada.artifacts.outputs" in graph["dsl_llada.toy.demo_command"]  # imported inside a function
    assert find_cycles(graph) == []


def test_the_graph_sees_a_cycle_made_only_of_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "a.py").write_text("def f():\n    from .sub.b import g\n    return g\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from ..a import f\n    return f\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
                              "from .sub import g\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.sub"}  # the TYPE_CHECKING import is not an edge
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    (pkg / "a.py").write_text("def f():\n    return 1\n")
    assert find_cycles(import_graph(pkg, "pkg")) == []


def imported_names(path: Path, module: str) -> set[str]:
    """The absolute dotted names every import statement of the module at `path` (named `module`) refers to, at any
    depth (top level, in functions and classes, under `if TYPE_CHECKING:`): `import a.b` gives 'a.b', `from .x import
    y` gives 'pkg.x.y' and 'pkg.x', `from .. import toy` gives 'root.toy'."""
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def toy_imports_in_train(root: Path, package: str) -> dict[str, set[str]]:
    """Module of `package.train` -> the names under `package.toy` it imports (modules that import none left out)."""
    toy = f"{package}.toy"
    out: dict[str, set[str]] = {}
    for path in sorted((root / "train").rglob("*.py")):
        found = {n for n in imported_names(path, _module_name(path, root, package)) if n == toy or n.startswith(toy + ".")}
        if found:
            out[_module_name(path, root, package)] = found
    return out


def test_training_never_imports_the_toy_world():
    """`train` defines the world protocol (`train.world_source`) and `toy` implements it: no module under train/
    imports dsl_llada.toy, not even inside a function or for type checking."""
    root = Path(dsl_llada.__file__).parent
    assert len(list((root / "train").rglob("*.py"))) >= 15
    assert toy_imports_in_train(root, "dsl_llada") == {}
    assert "dsl_llada.train.world_source" in imported_names(root / "toy" / "training.py", "dsl_llada.toy.training")


def test_the_train_import_check_sees_every_form_of_toy_import(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("train", "toy"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "toy" / "world.py").write_text("")
    (pkg / "train" / "clean.py").write_text("from ..config import x\nimport os\n")
    assert toy_imports_in_train(pkg, "pkg") == {}
    (pkg / "train" / "a.py").write_text("def f():\n    from ..toy.world import W\n    return W\n")
    (pkg / "train" / "b.py").write_text("from .. import toy\n")
    (pkg / "train" / "c.py").write_text("class C:\n    def m(self):\n        import pkg.toy.world\n")
    (pkg / "train" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..toy import world\n")
    found = toy_imports_in_train(pkg, "pkg")
    assert sorted(found) == ["pkg.train.a", "pkg.train.b", "pkg.train.c", "pkg.train.d"]
    assert found["pkg.train.a"] == {"pkg.toy.world", "pkg.toy.world.W"}
    assert found["pkg.train.b"] == {"pkg.toy"}


def design_floors(design: str) -> dict[str, int]:
    """The floors table of docs/design.md ("## Modules (floors ...)"): each `name.py`, `pkg/` or `pkg/__main__.py`
    it names -> its floor ('top' is above every number)."""
    section = design.split("## Modules (floors")[1].split("\n## ")[0]
    floors: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"\d+|top", cells[0]):
            continue
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", cells[1]):
            floors[name] = 1_000 if cells[0] == "top" else int(cells[0])
    return floors


def floor_of(module: str, package: str, floors: dict[str, int]) -> int | None:
    """A module's floor: its own file's entry (`train/__main__.py`), else its top-level package's (`train/`) or
    file's (`loading.py`); the package root is floor 0. None when the table does not place it."""
    parts = module.split(".")[1:] if module != package else []
    if not parts:
        return 0
    own = "/".join(parts) + ".py"
    for key in (own, parts[0] + "/", parts[0] + ".py"):
        if key in floors:
            return floors[key]
    return None


def upward_imports(graph: dict[str, set[str]], package: str, floors: dict[str, int]) -> list[str]:
    """Every import that goes to a higher floor, every module the table does not place, and every import between
    `train` and `eval` (siblings), as readable lines."""
    problems = [f"{m}: not placed in the floors table" for m in sorted(graph) if floor_of(m, package, floors) is None]
    for a, deps in sorted(graph.items()):
        fa = floor_of(a, package, floors)
        for b in sorted(deps):
            fb = floor_of(b, package, floors)
            if fa is not None and fb is not None and fb > fa:
                problems.append(f"{a} (floor {fa}) imports {b} (floor {fb})")
            top_a, top_b = a.split(".")[1:2], b.split(".")[1:2]
            if {*top_a, *top_b} == {"train", "eval"}:
                problems.append(f"{a} imports its sibling {b}")
    return problems


def test_the_floors_written_in_the_design_hold():
    root = Path(dsl_llada.__file__).parent
    floors = design_floors((root.parents[1] / "docs" / "design.md").read_text(encoding="utf-8"))
    assert {"errors.py", "runtime/", "artifacts/", "core/", "sampling/", "generate/", "train/", "eval/", "toy/",
            "serve/", "cli/"} <= set(floors)
    assert floors["errors.py"] <= floors["artifacts/"] < floors["core/"] < floors["sampling/"] < floors["toy/"] < floors["cli/"]
    assert len([p for p in root.glob("*.py") if p.name != "__init__.py"]) <= 8  # the top level stays small
    assert upward_imports(import_graph(root, "dsl_llada"), "dsl_llada", floors) == []


def test_the_floor_check_sees_an_upward_import_inside_a_function_and_an_unplaced_module(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from ..high import g\n    return g\n")
    (pkg / "high.py").write_text("from .low.a import f\n")
    (pkg / "stray.py").write_text("")
    floors = design_floors("## Modules (floors: x)\n\n| floor | module | concern |\n|---|---|---|\n"
                           "| 0 | `low/` | the base |\n| top | `high.py` | the top |\n\n## Next\n| 5 | `stray.py` | no |\n")
    assert floors == {"low/": 0, "high.py": 1_000}
    assert upward_imports(import_graph(pkg, "pkg"), "pkg", floors) == [
        "pkg.stray: not placed in the floors table", "pkg.low.a (floor 0) imports pkg.high (floor 1000)"]
    (pkg / "low" / "a.py").write_text("def f():\n    return 1\n")
    floors["stray.py"] = 0
    assert upward_imports(import_graph(pkg, "pkg"), "pkg", floors) == []
