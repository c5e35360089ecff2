"""``sve.runs.run`` reads as a straight sequence of named steps: no function of it is longer than 60 lines (the
results record is built by ``sve.runs.results.run_record``, not by hand in the run)."""

import ast

from tests.conftest import ROOT

LONGEST = 60


def test_no_function_of_the_run_is_longer_than_60_lines():
    tree = ast.parse((ROOT / "sve" / "runs" / "run.py").read_text())
    lengths = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert lengths and not {name: n for name, n in lengths.items() if n > LONGEST}
