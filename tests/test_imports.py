"""The package's import graph: no circles between its modules, and the names committed runs were configured
with still resolve."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "sve"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The package map's order (docs/architecture.md, top to bottom): a module imports only from its own layer or
# the layers below it. Entry points sit on top; `paper` (tables, figures, claims) and `bench` (costs) use runs;
# a run uses the library API, the LightningModule, the methods, ...; shared modules (`members`, `errors`,
# `paths`, `memory`, `offline`) are used by everyone and use no one.
LAYERS = (
    ("cli",),
    ("paper", "bench"),
    ("runs",),
    ("api",),
    ("training",),
    ("methods",),
    ("backbones",),
    ("layers",),
    ("metrics", "data"),
    ("shared",),
)
RANK = {package: len(LAYERS) - i for i, names in enumerate(LAYERS) for package in names}

# Imports against the order that are the design, each with its reason. None today: the package root's lazy
# exports (``sve.__getattr__``) and old-name aliases (``sve.MOVED``) import by string, not by statement.
LAZY_BY_DESIGN: set[tuple[str, str]] = set()


def imports(path: Path, modules: set[str]) -> dict[str, bool]:
    """The sve modules a module imports, anywhere in it (function bodies too), each with whether the import
    runs when the module is imported (top level) or later (inside a function). ``if TYPE_CHECKING:`` blocks
    never run and are left out."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
        for child in node.body
        for n in ast.walk(child)
    }
    top = {
        id(n)
        for node in tree.body
        if not isinstance(node, ast.If)
        for n in ([node] if not isinstance(node, ast.Try) else node.body)
    }
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "sve":
            children = [f"{node.module}.{a.name}" for a in node.names]  # `from sve.x import y`: a module y, or a name
            names = [child if child in modules else node.module for child in children]
        for name in names:
            if name in modules:
                found[name] = found.get(name, False) or id(node) in top
    return found


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The sve modules a module imports when it is imported (the rest run later, inside functions)."""
    return {name for name, at_import in imports(path, modules).items() if at_import}


def with_packages(names: set[str], modules: set[str]) -> set[str]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: each is an edge too."""
    out = set(names)
    for name in names:
        parts = name.split(".")
        out |= {".".join(parts[:i]) for i in range(2, len(parts))} & modules
    return out


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "configs" not in p.parts}


def import_graph(every_import: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports: every import (``every_import``) or only those run at import time."""
    paths = package_modules()
    modules = set(paths)
    graph = {}
    for name, p in paths.items():
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        found = set(imports(p, modules)) if every_import else top_level_imports(p, modules)
        # A module's own packages are being initialised when it runs: importing them is no new edge.
        graph[name] = with_packages(found, modules) - {name} - own_packages
    return graph


def layer(module: str) -> str:
    """The package map's name for a module's layer: its subpackage, or ``shared`` for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "shared"


def against_the_order(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b} ({layer(a)} imports {layer(b)}, which is above it)"
        for a, targets in graph.items()
        for b in targets
        if RANK[layer(b)] > RANK[layer(a)] and (a, b) not in LAZY_BY_DESIGN
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_a_circle_through_a_package_init_is_an_edge():
    # sve.layers.member -> sve.methods.x runs sve/methods/__init__, which imports sve.methods.base -> ...
    assert with_packages({"sve.methods.x"}, {"sve", "sve.methods", "sve.methods.x"}) == {"sve.methods.x", "sve.methods"}


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_import_is_counted_also_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nimport sve.a\nif TYPE_CHECKING:\n    import sve.c\n"
        "def f():\n    from sve.b import thing\n"
    )
    found = imports(module, {"sve.a", "sve.b", "sve.c"})
    assert found == {"sve.a": True, "sve.b": False}  # a function's import is an edge; a type-only one is not


def test_no_import_circles_between_the_package_s_modules():
    graph = import_graph()
    assert len(graph) > 40  # the whole package was read
    assert cycles(graph) == []


def test_every_layer_of_the_package_map_is_a_subpackage_and_each_subpackage_has_a_layer():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "configs"}
    assert subpackages | {"shared"} == set(RANK)


def test_imports_run_down_the_package_map():
    graph = import_graph()
    assert against_the_order(graph) == []
    used = {(a, b) for a, targets in graph.items() for b in targets}
    assert LAZY_BY_DESIGN <= used, "an allow-listed import no longer exists: remove it from LAZY_BY_DESIGN"


def test_the_order_check_catches_an_upward_import():
    assert against_the_order({"sve.layers.x": {"sve.runs.y"}, "sve.runs.y": {"sve.layers.x"}}) == [
        "sve.layers.x -> sve.runs.y (layers imports runs, which is above it)"
    ]


def test_help_and_a_config_error_load_no_torch():
    # What makes `sve-train --help` and a typo answer at once: neither imports torch or Lightning.
    import subprocess
    import sys

    code = (
        "import sys, runpy; sys.argv = ['sve-train'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('sve.cli.train', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('TORCH', 'torch' in sys.modules, 'pytorch_lightning' in sys.modules)"
    )
    said = {}
    for args in (["--help"], ["method=nope"], ["method.lr=-1"], ["dataset.batch_size=0"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert "TORCH False False" in done.stdout, (args, done.stdout[-2000:], done.stderr[-2000:])
        said[args[0]] = done.stdout + done.stderr
    assert "error: method=nope: no such option; the options of method are: " in said["method=nope"]
    assert "error: method.lr=-1 is not valid; expected a positive number or null" in said["method.lr=-1"]
    assert "error: dataset.batch_size=0 is not valid; expected a positive integer" in said["dataset.batch_size=0"]


def test_the_sweep_does_not_load_the_table_builder():
    import subprocess
    import sys

    code = "import sys, sve.paper.sweep; print(sorted(m for m in sys.modules if m.startswith('sve.paper')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "sve.paper.store" in done.stdout and "sve.paper.report" not in done.stdout, done.stdout + done.stderr


def test_old_module_names_are_the_moved_modules():
    import sve.checkpoint
    import sve.training.checkpoint

    assert sve.checkpoint is sve.training.checkpoint  # one module object: classes keep their identity
    from sve.optim import warmup_schedule
    from sve.training.optim import warmup_schedule as moved

    assert warmup_schedule is moved


def test_a_renamed_module_imports_by_its_old_name_with_a_warning():
    import importlib
    import sys
    import warnings

    import sve.runs.reevaluate

    sys.modules.pop("sve.runs.evaluate", None)  # each name warns once per process: this test sees the first
    sve._warned.discard("sve.runs.evaluate")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("sve.runs.evaluate")
    assert old is sve.runs.reevaluate
    assert any("sve.runs.evaluate is now sve.runs.reevaluate" in str(w.message) for w in caught), caught
