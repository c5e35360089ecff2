"""The repository passes ``ruff check`` with the rules of pyproject.toml ([tool.ruff]) and is formatted as
``ruff format`` formats it (``make format`` rewrites it so)."""

import json
import shutil
import subprocess
import sys

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
