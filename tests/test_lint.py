"""The repository passes ``ruff check`` with the rules of pyproject.toml ([tool.ruff]) and is formatted as
``ruff format`` formats it (``make format`` rewrites it so)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def ruff_command() -> list[str]:
    """``ruff`` from this interpreter's environment (the dev extra), else from PATH; skips when neither has it."""
    try:
        import ruff  # noqa: F401 - only whether it is installed
    except ImportError:
        exe = shutil.which("ruff")
        if exe is None:
            pytest.skip("ruff is not installed (pip install -e '.[dev]' installs the pinned version)")
        return [exe]
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_finds_nothing():
    cmd = [*ruff_command(), "check", "--output-format", "json", "--no-cache", str(ROOT)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode in (0, 1), f"ruff failed to run ({done.returncode}): {done.stderr[-2000:]}"
    findings = json.loads(done.stdout or "[]")
    findings.sort(key=lambda f: (f["filename"], f["location"]["row"]))
    lines = [
        f"{f['filename'].removeprefix(str(ROOT) + '/')}:{f['location']['row']}: {f['code']} {f['message']}"
        for f in findings
    ]
    assert not lines, f"ruff check: {len(lines)} finding(s)\n" + "\n".join(lines)


def test_ruff_format_would_change_nothing():
    cmd = [*ruff_command(), "format", "--check", "--no-cache", str(ROOT)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode in (0, 1), f"ruff format failed to run ({done.returncode}): {done.stderr[-2000:]}"
    assert done.returncode == 0, f"files ruff format would rewrite (run `make format`):\n{done.stdout[-4000:]}"


def test_no_code_comment_or_config_names_an_issue_number():
    # History belongs in git and CHANGELOG.md: "issue 52" in a comment or a help line tells a reader nothing.
    import re

    pattern = re.compile(r"\b[Ii]ssue #?\d+")
    found = []
    for path in [ROOT / "Makefile", *(p for d in ("sve", "scripts", "tests") for p in (ROOT / d).rglob("*"))]:
        if path.is_file() and path.suffix in ("", ".py", ".yaml", ".md", ".toml") and path != Path(__file__):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "issue numbers in the code (say what it does, not which issue asked):\n" + "\n".join(found)
