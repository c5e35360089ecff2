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


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The sve modules a module imports when it is imported (function-level imports run later: not edges)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        nodes = [node]
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks never run
            continue
        if isinstance(node, ast.Try):
            nodes = node.body
        for n in nodes:
            if isinstance(n, ast.Import):
                found |= {a.name for a in n.names if a.name in modules}
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.startswith("sve"):
                for a in n.names:
                    child = f"{n.module}.{a.name}"
                    found.add(child if child in modules else n.module)
    return {m for m in found if m in modules}


def with_packages(names: set[str], modules: set[str]) -> set[str]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: each is an edge too."""
    out = set(names)
    for name in names:
        parts = name.split(".")
        out |= {".".join(parts[:i]) for i in range(2, len(parts))} & modules
    return out


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "configs" not in p.parts]
    modules = {module_name(p) for p in paths}
    graph = {}
    for p in paths:
        name = module_name(p)
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        # A module's own packages are being initialised when it runs: importing them is no new edge.
        graph[name] = with_packages(top_level_imports(p, modules), modules) - {name} - own_packages
    return graph


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


def test_no_import_circles_between_the_package_s_modules():
    graph = import_graph()
    assert len(graph) > 40  # the whole package was read
    assert cycles(graph) == []


def test_help_and_a_config_error_load_no_torch():
    # What makes `sve-train --help` and a typo answer at once: neither imports torch or Lightning.
    import subprocess
    import sys

    code = ("import sys, runpy; sys.argv = ['sve-train'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('sve.cli.train', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules, 'pytorch_lightning' in sys.modules)")  # fmt: skip
    said = {}
    for args in (["--help"], ["method=nope"], ["method.lr=-1"], ["dataset.batch_size=0"]):
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
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
