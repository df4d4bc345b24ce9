"""The layering of ``fakeviz/``, read from the source with :mod:`ast`, so it cannot silently decay.

Layers, lowest first (CONTRIBUTING.md describes each):

    core (fakeviz._core) <- engine (fakeviz._engine) <- analysis (fakeviz._analysis)
    <- views (fakeviz._views, fakeviz.views) <- facade (fakeviz._trace, fakeviz._api, fakeviz._fx, fakeviz._export,
    fakeviz.models)
    <- front ends (fakeviz._frontends, fakeviz.__main__) <- the package (fakeviz/__init__.py)

Checked for every import in every function, lazy or not (imports under ``if TYPE_CHECKING:`` excepted):
* a module imports only its own layer or lower ones;
* the imports between modules have no cycle;
* ``fakeviz._core`` imports nothing else of fakeviz, and only the standard library and NumPy;
* the engine and analysis import no IPython, ipywidgets, anywidget, traitlets or plotly;
* no source file has more than 600 lines of code (docstrings and comments are free);
* no module reads another module's private names (``from x import _name``, ``x._name`` on a module,
  or a private attribute that only another module's classes define).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "fakeviz"

LAYERS = ("core", "engine", "analysis", "views", "facade", "frontends", "package")
UI_PACKAGES = ("IPython", "ipywidgets", "anywidget", "traitlets", "plotly")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module == "fakeviz":
        return "package"
    top = parts[1]
    return {
        "_core": "core",
        "_engine": "engine",
        "_analysis": "analysis",
        "_views": "views",
        "views": "views",
        "_trace": "facade",
        "_api": "facade",
        "_fx": "facade",
        "_export": "facade",
        "models": "facade",
        "configs": "facade",
        "_frontends": "frontends",
        "__main__": "frontends",
    }[top]


def unit_of(module: str) -> str:
    """What may share private names: a module, or a package split out of one (fakeviz._engine.recorder)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 else module


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: list[tuple[str, int]] = field(default_factory=list)  # (module, line)
    externals: list[tuple[str, int]] = field(default_factory=list)
    private_imports: list[tuple[str, str, int]] = field(default_factory=list)  # (module, name, line)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve(current: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = current.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def load_modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(PKG.rglob("*.py")):
        name = module_name(path)
        modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    names = set(modules)
    for mod in modules.values():
        is_pkg = mod.path.name == "__init__.py"
        skip: set[int] = set()
        for node in ast.walk(mod.tree):
            if _type_checking_block(node):
                skip.update(id(n) for n in ast.walk(node))
        for node in ast.walk(mod.tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    (mod.imports if a.name.split(".")[0] == "fakeviz" else mod.externals).append((a.name, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and not (node.module or "").startswith("fakeviz"):
                    mod.externals.append((node.module or "", node.lineno))
                    continue
                target = resolve(mod.name, is_pkg, node.level, node.module) if node.level else node.module
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if sub in names:  # "from . import native": the submodule itself
                        mod.imports.append((sub, node.lineno))
                    else:
                        mod.imports.append((target, node.lineno))
                        if a.name.startswith("_") and not a.name.startswith("__") and target != mod.name:
                            mod.private_imports.append((target, a.name, node.lineno))
    return modules


MODULES = load_modules()


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        assert layer_of(name) in LAYERS


def test_imports_point_down_only() -> None:
    bad = []
    for mod in MODULES.values():
        mine = LAYERS.index(layer_of(mod.name))
        for target, line in mod.imports:
            if target not in MODULES:
                bad.append(f"{mod.path.relative_to(PKG.parent)}:{line} imports {target}, which does not exist")
                continue
            theirs = LAYERS.index(layer_of(target))
            if theirs > mine:
                bad.append(
                    f"{mod.path.relative_to(PKG.parent)}:{line}: {layer_of(mod.name)} imports {target} "
                    f"({layer_of(target)}, a higher layer)"
                )
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    graph = defaultdict(set)
    for mod in MODULES.values():
        for target, _ in mod.imports:
            # importing a.b.c runs the __init__ of a.b first: an edge to each package on the way
            parts = target.split(".")
            for k in range(2, len(parts) + 1):
                t = ".".join(parts[:k])
                if t in MODULES and t != mod.name and not _is_ancestor(t, mod.name):
                    graph[mod.name].add(t)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _is_ancestor(pkg: str, module: str) -> bool:
    """``fakeviz._engine`` is imported implicitly by any ``fakeviz._engine.x``: not an edge."""
    return module.startswith(pkg + ".")


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_core_imports_only_stdlib_and_numpy() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for mod in MODULES.values():
        if layer_of(mod.name) != "core":
            continue
        for target, line in mod.imports:
            if layer_of(target) != "core":
                bad.append(f"{mod.name}:{line} imports {target}")
        for ext, line in mod.externals:
            if ext.split(".")[0] not in stdlib | {"numpy"}:
                bad.append(f"{mod.name}:{line} imports {ext}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", ["core", "engine", "analysis"])
def test_no_notebook_or_widget_imports_below_views(layer: str) -> None:
    bad = [
        f"{mod.name}:{line} imports {ext}"
        for mod in MODULES.values()
        if layer_of(mod.name) == layer
        for ext, line in mod.externals
        if ext.split(".")[0] in UI_PACKAGES
    ]
    assert not bad, "\n".join(bad)


def _private_definitions() -> dict[str, set[str]]:
    """Per unit: the private attribute names its classes define (``self._x = ...``, ``def _x``, ``_x = ...``)."""
    defs: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES.values():
        unit = unit_of(mod.name)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                        defs[unit].add(item.name)
                    elif isinstance(item, ast.Assign):
                        defs[unit].update(t.id for t in item.targets if isinstance(t, ast.Name) and _private(t.id))
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        if _private(item.target.id):
                            defs[unit].add(item.target.id)
                    elif isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant):
                        continue
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for t in targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                                if t.value.id in ("self", "cls") and _private(t.attr):
                                    defs[unit].add(t.attr)
    return defs


def _private(name: str) -> bool:
    """``_x`` is private; dunders and the display protocols of IPython (``_repr_html_``) are not."""
    return name.startswith("_") and not name.startswith(("__", "_repr_", "_ipython_"))


def test_no_module_reads_anothers_private_names() -> None:
    defs = _private_definitions()
    owners: dict[str, set[str]] = defaultdict(set)
    for unit, names in defs.items():
        for n in names:
            owners[n].add(unit)
    bad = []
    for mod in MODULES.values():
        unit = unit_of(mod.name)
        where = mod.path.relative_to(PKG.parent)
        for target, name, line in mod.private_imports:
            if unit_of(target) != unit:
                bad.append(f"{where}:{line} imports {name} from {target}")
        module_aliases = _module_aliases(mod)
        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in module_aliases:
                target = module_aliases[node.value.id]
                if unit_of(target) != unit:
                    bad.append(f"{where}:{node.lineno} reads {node.attr} of module {target}")
                continue
            others = owners.get(node.attr, set()) - {unit}
            if others and unit not in owners.get(node.attr, set()):
                bad.append(f"{where}:{node.lineno} reads .{node.attr}, private to {', '.join(sorted(others))}")
    assert not bad, "private names read across modules:\n" + "\n".join(bad)


def _module_aliases(mod: Module) -> dict[str, str]:
    """Local names bound to fakeviz modules (``from . import native as _native``, ``import fakeviz._core.fvz``)."""
    out = {}
    is_pkg = mod.path.name == "__init__.py"
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            target = resolve(mod.name, is_pkg, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:
                    out[a.asname or a.name] = sub
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    out[a.asname] = a.name
    return out


def _code_lines(path: Path) -> int:
    """Lines of code: not blank, not a comment, not inside a docstring (module, class or function). Long
    explanations are welcome; what the rule limits is how much a file does."""
    text = path.read_text()
    skip: set[int] = set()
    if path.suffix == ".py":
        comment: tuple[str, ...] = ("#",)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if (
                    isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                ):
                    skip.update(range(first.lineno - 1, first.end_lineno or first.lineno))
    else:
        comment = ("//", "/*", "*")
    return sum(1 for i, line in enumerate(text.splitlines())
               if i not in skip and line.strip() and not line.strip().startswith(comment))  # fmt: skip


def test_no_source_file_is_too_long() -> None:
    """At most 600 lines of code (Python, C, JavaScript, CSS; docstrings, comments and blank lines not counted): a
    longer file is doing several jobs; split it by concern, not by count."""
    repo = PKG.parent
    sources = [p for p in PKG.rglob("*") if p.suffix in (".py", ".c", ".h", ".cpp") and "static" not in p.parts]
    sources += [p for p in (repo / "js" / "src").rglob("*") if p.suffix in (".js", ".css")]
    long = {str(p.relative_to(repo)): n for p in sources if (n := _code_lines(p)) > 600}
    assert not long, long
