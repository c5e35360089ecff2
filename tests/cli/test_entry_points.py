"""Every command's ``main()`` and argument parser lives in ``sve/cli``: the library modules
take plain arguments, and a process the package starts (``python -m ...``) runs a module of ``sve/cli``."""

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "sve"


def entry_points(tree: ast.Module) -> list[str]:
    """What in ``tree`` is an entry point: a function named ``main``, an ``argparse.ArgumentParser`` built, an
    ``if __name__ == "__main__"`` block; each as ``line: what``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main":
            found.append(f"{node.lineno}: def main")
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called == "ArgumentParser":
                found.append(f"{node.lineno}: an argument parser")
        elif isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            found.append(f"{node.lineno}: a __main__ block")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def library_modules():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "cli" not in p.parents]


def test_no_module_outside_cli_defines_main_or_builds_an_argument_parser():
    misplaced = {
        str(p.relative_to(ROOT)): found for p in library_modules() if (found := entry_points(ast.parse(p.read_text())))
    }
    assert misplaced == {}


def test_the_check_finds_each_kind_of_entry_point():
    source = "import argparse\ndef main():\n    argparse.ArgumentParser()\nif __name__ == '__main__':\n    main()\n"
    assert entry_points(ast.parse(source)) == ["2: def main", "3: an argument parser", "4: a __main__ block"]


def test_every_process_the_package_starts_runs_a_module_of_cli():
    started = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List | ast.Tuple):
                items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                started += [str(items[i + 1]) for i, item in enumerate(items[:-1]) if item == "-m"]
    assert started, "no python -m command found: the check reads nothing"
    assert [m for m in started if m.startswith("sve.") and not m.startswith("sve.cli.")] == []
